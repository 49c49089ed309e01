"""FP8 calls of an export (mixed into ExportedAttention): e4m3 q, k, v with FlashAttention-3's descales, through
``attn_tuner::attention_fp8`` (and its packed and paged twins: tuner/serving/op_fp8.py) to an exported FP8 kernel, or
to torch SDPA on the dequantised inputs (counted by reason). The descales are checked before any launch (the runtime's
check_descales: a missing one, a wrong shape, dtype or device, values that are not finite: ValueError naming it)."""
from __future__ import annotations

import math

import torch

from tuner.serving import op_fp8
from tuner.serving.launch.plan import check_descales
from tuner.serving.paged_sdpa import check_used, gather_pages
from tuner.serving.reasons import REASONS
from tuner.serving.sdpa import check_shapes, sdpa_attention, varlen_sdpa

FP8 = torch.float8_e4m3fn


def dequantised(x, descale, heads_per_scale: int = 1, dtype=torch.bfloat16):
    """x * descale of its (batch, KV head) in ``dtype``, x (b, s, h, d); a descale serves ``heads_per_scale`` heads."""
    d = descale.repeat_interleave(heads_per_scale, dim=1) if heads_per_scale > 1 else descale
    return (x.float() * d[:, None, :, None]).to(dtype)


def dequantised_packed(x, descale, cu_seqlens, heads_per_scale: int = 1, dtype=torch.bfloat16):
    """Packed x (total, h, d) times the descale of each row's (sequence, KV head) in ``dtype``; rows past the last
    sequence's end (none in a valid call) keep the last sequence's."""
    d = descale.repeat_interleave(heads_per_scale, dim=1) if heads_per_scale > 1 else descale
    rows = torch.arange(x.shape[0], device=x.device)
    seq = (torch.searchsorted(cu_seqlens[1:].to(torch.int64), rows, right=True)).clamp_(max=d.shape[0] - 1)
    return (x.float() * d[seq][:, :, None]).to(dtype)


def _check_fp8_tensors(q, k, v) -> None:
    if q.dtype != FP8 or k.dtype != FP8 or v.dtype != FP8:
        raise ValueError(f"an FP8 call takes q, k and v in {FP8}; got {q.dtype}, {k.dtype}, {v.dtype}")


def _checked(descales: dict, batch: int, heads_kv: int, q) -> None:
    """The descales' shapes, dtypes and devices always; their values (a host sync) only in eager calls outside a CUDA
    graph capture (the capture query itself is not traceable: asked only when not compiling)."""
    eager = not torch.compiler.is_compiling() and not (q.is_cuda and torch.cuda.is_current_stream_capturing())
    check_descales(descales, batch, heads_kv, q.device, check_finite=eager)


class Fp8Calls:
    """Mixed into ExportedAttention: uses its ``route``, ``_launch``, ``_count_fallback`` and ``_messages``."""

    def attend_fp8(self, q, k, v, causal: bool, scale: float | None, q_descale, k_descale, v_descale):
        """(b, s, h, d) e4m3 tensors -> bf16 (b, sq, hq, d_v)."""
        check_shapes(q, k, v)
        _check_fp8_tensors(q, k, v)
        _checked({"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}, int(q.shape[0]),
                 int(k.shape[2]), q)
        scale = float(scale) if scale is not None else 1.0 / math.sqrt(int(q.shape[3]))
        route = self.route(q, k, v, causal, scale)
        return op_fp8.launch_fp8(q, k, v, q_descale, k_descale, v_descale, bool(causal), scale, route)

    def run_fp8(self, route, q, k, v, q_descale, k_descale, v_descale, causal: bool, scale: float):
        """What an FP8 route runs (inside the op): the config's kernel, else SDPA on the dequantised inputs."""
        def reference(code, message):
            self._count_fallback(code, message)
            group = q.shape[2] // k.shape[2]
            return sdpa_attention(dequantised(q, q_descale, group), dequantised(k, k_descale),
                                  dequantised(v, v_descale), causal=causal, softmax_scale=scale)

        if route.config is None:
            return reference(route.code, self._messages.get(self._fallback.get(route.code), REASONS[route.code]))
        bucket = route.bucket or route.config.bucket_for(k.shape[1])
        return self._launch(route.config.kernels[bucket], bucket, route.config.variant, q.device.index or 0,
                            lambda kern: kern(q, k, v, softmax_scale=scale, q_descale=q_descale, k_descale=k_descale,
                                              v_descale=v_descale), reference)

    def attend_varlen_fp8(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal: bool,
                          scale: float, seqused_k, q_descale, k_descale, v_descale):
        """Packed e4m3 sequences (flash_attn_varlen_func's tensors, shapes checked by the caller), a descale per
        (sequence, KV head) -> bf16 (total_q, hq, d_v)."""
        _check_fp8_tensors(q, k, v)
        _checked({"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale},
                 int(cu_seqlens_q.shape[0]) - 1, int(k.shape[1]), q)
        route = self.route_varlen(q, k, v, causal, scale, max_seqlen_k, cu_seqlens_q, max_seqlen_q)
        return op_fp8.launch_varlen_fp8(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                                        q_descale, k_descale, v_descale, bool(causal), scale, route)

    def run_varlen_fp8(self, route, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                       q_descale, k_descale, v_descale, causal: bool, scale: float):
        """What a packed FP8 route runs (inside the op): the config's kernel, else SDPA per sequence on the
        dequantised inputs."""
        def reference(code, message):
            self._count_fallback(code, message)
            group = q.shape[1] // k.shape[1]
            return varlen_sdpa(dequantised_packed(q, q_descale, cu_seqlens_q, group),
                               dequantised_packed(k, k_descale, cu_seqlens_k),
                               dequantised_packed(v, v_descale, cu_seqlens_k), cu_seqlens_q, cu_seqlens_k,
                               seqused_k, causal, scale)

        descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
        return self.varlen_on_route(route, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                                    scale, descales, reference)

    def attend_paged_fp8(self, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q, max_seqlen_k,
                         causal: bool, scale: float, q_descale, k_descale, v_descale):
        """Packed e4m3 q over an e4m3 paged cache (tuner/serving/paged.py's checks done, ``seqused_k`` and
        ``max_seqlen_k`` settled), a descale per (sequence, KV head) -> bf16 (total_q, hq, d_v)."""
        _check_fp8_tensors(q, k_cache, v_cache)
        _checked({"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale},
                 int(cu_seqlens_q.shape[0]) - 1, int(k_cache.shape[2]), q)
        route = self.route_paged(q, k_cache, v_cache, causal, scale, cu_seqlens_q, max_seqlen_q, max_seqlen_k)
        return op_fp8.launch_paged_fp8(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q,
                                       max_seqlen_k, q_descale, k_descale, v_descale, bool(causal), scale, route)

    def run_paged_fp8(self, route, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q,
                      max_seqlen_k, q_descale, k_descale, v_descale, causal: bool, scale: float):
        """What a paged FP8 route runs (inside the op): the config's kernel (its V^T sized by ``max_seqlen_k``), else
        SDPA per sequence on the dequantised pages."""
        def reference(code, message):
            self._count_fallback(code, message)
            return paged_sdpa_fp8(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, q_descale, k_descale,
                                  v_descale, causal, scale)

        extra = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale,
                 "max_seqlen_k": int(max_seqlen_k)}
        return self.paged_on_route(route, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q,
                                   max_seqlen_k, scale, extra, reference)


def paged_sdpa_fp8(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, q_descale, k_descale, v_descale,
                   causal: bool, scale: float):
    """The paged FP8 fallback: each sequence's pages gathered in table order (tuner/serving/paged_sdpa.py), every row
    dequantised with its (sequence, KV head) descale, then SDPA per sequence in bf16 -> bf16 (total_q, hq, d_v)."""
    check_used(seqused_k, page_table, int(k_cache.shape[1]))
    k, v, cu_k = gather_pages(k_cache, v_cache, page_table)
    group = q.shape[1] // k_cache.shape[2]
    return varlen_sdpa(dequantised_packed(q, q_descale, cu_seqlens_q, group), dequantised_packed(k, k_descale, cu_k),
                       dequantised_packed(v, v_descale, cu_k), cu_seqlens_q, cu_k, seqused_k, causal, scale)
