"""Prefill over a paged KV cache through an export: ``flash_attn_varlen_func(..., block_table=TABLE)`` (FA2's
name; ``page_table=``, FA4's, alike), mixed into ExportedAttention.

    o = attn.flash_attn_varlen_func(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    causal=True, block_table=table, seqused_k=None)
    # q (total_q, hq, d), k/v_cache (num_pages, page_size, hkv, d), table int32 (batch, max_pages) -> (total_q, hq, d_v)

Sequence b's keys are the first ``seqused_k[b]`` rows of its pages in table order; without ``seqused_k``
they are ``cu_seqlens_k[b + 1] - cu_seqlens_k[b]``, derived on the device (no host read). Causal aligns
bottom-right within each sequence (its queries are the last of its keys: chunked prefill on a cached prefix).

Dispatch: the paged config of the head dims, dtype and causality, then its serving bucket (tuner/measure/mixes.py)
from ``q.shape[0]``, the batch, ``max_seqlen_q``, ``max_seqlen_k`` (absent: the table's capacity,
``max_pages x page_size``) and the page size ``k_cache.shape[1]``; the nearest bucket whose kernel can tile
that page size. Decided while tracing when those are plain ints, per call otherwise. No paged config, or a
page size no kernel tiles, runs ``paged_sdpa`` (the pages gathered into packed K/V on the device, then torch
SDPA per sequence), through the same op, counted by reason ("no-paged-config", "page-size", ...).

e4m3 q and caches with descales (FlashAttention-3's, per (sequence, KV head)) take the same dispatch to a paged config of
dtype fp8 through ``attn_tuner::paged_attention_fp8`` (tuner/serving/fp8_calls.py).
"""
from __future__ import annotations

import torch

from tuner.serving import op
from tuner.serving.configs import pick
from tuner.serving.options import PLAIN, ModelOptions, model_options, option_arguments, reference_paged
from tuner.serving.paged_sdpa import paged_sdpa
from tuner.serving.reasons import REASONS
from tuner.serving.rule import plain_ints

_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8"}


def paged_input_errors(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, seqused_k, page_table,
                       max_seqlen_q) -> list[str]:
    """Every reason these cannot be a paged call (empty: they can). Shapes and dtypes only: nothing is read
    from the device."""
    errors = []
    shape = lambda t: tuple(getattr(t, "shape", ()))  # noqa: E731
    if not all(isinstance(t, torch.Tensor) for t in (q, k_cache, v_cache)):
        return ["q, k_cache and v_cache must be tensors"]
    if q.dim() != 3:
        errors.append(f"q must be 3-D (total_q, heads, head_dim), got {shape(q)}")
    if k_cache.dim() != 4 or v_cache.dim() != 4:
        errors.append(f"with a page table, k and v must be paged caches (num_pages, page_size, kv_heads, head_dim), "
                      f"got {shape(k_cache)} and {shape(v_cache)}")
    elif k_cache.shape[:3] != v_cache.shape[:3]:
        errors.append(f"k_cache {shape(k_cache)} and v_cache {shape(v_cache)} differ in pages, page size or heads")
    elif k_cache.shape[1] < 1:
        errors.append("the page size (k_cache.shape[1]) must be at least 1")
    if not errors:
        if q.shape[2] != k_cache.shape[3]:
            errors.append(f"q and k_cache head dims differ: {q.shape[2]} vs {k_cache.shape[3]}")
        if k_cache.shape[2] < 1 or q.shape[1] % k_cache.shape[2]:
            errors.append(f"query heads ({q.shape[1]}) must be a multiple of the KV heads ({k_cache.shape[2]})")
    if not isinstance(cu_seqlens_q, torch.Tensor) or cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] < 2:
        errors.append(f"cu_seqlens_q must be a 1-D tensor of batch + 1 >= 2 offsets, got {shape(cu_seqlens_q)}")
        return errors
    batch = cu_seqlens_q.shape[0] - 1
    if not isinstance(page_table, torch.Tensor) or page_table.dim() != 2 or page_table.dtype != torch.int32:
        errors.append(f"the page table must be a 2-D int32 tensor (batch, max_pages), got "
                      f"{getattr(page_table, 'dtype', type(page_table).__name__)} {shape(page_table)}")
    elif page_table.shape[0] != batch:
        errors.append(f"the page table has {page_table.shape[0]} rows for {batch} sequences")
    if seqused_k is None and cu_seqlens_k is None:
        errors.append("give seqused_k or cu_seqlens_k: the keys each sequence has in its pages")
    elif seqused_k is not None and (not isinstance(seqused_k, torch.Tensor) or seqused_k.shape != (batch,)):
        errors.append(f"seqused_k must hold one length per sequence ({batch}), got {shape(seqused_k)}")
    elif seqused_k is None and (not isinstance(cu_seqlens_k, torch.Tensor) or cu_seqlens_k.shape != (batch + 1,)):
        errors.append(f"cu_seqlens_k must hold batch + 1 = {batch + 1} offsets, got {shape(cu_seqlens_k)}")
    if max_seqlen_q is None:
        errors.append("max_seqlen_q is needed (the longest query sequence: it sizes the kernel's grid)")
    return errors


class PagedCalls:
    """Mixed into ExportedAttention: uses its ``_table_or_fallback``, ``_fallback``, ``_messages``, ``_routes``,
    ``_launch``, ``_count_fallback``; ``_paged_tables`` is built in its __init__."""

    def route_paged(self, q, k_cache, v_cache, causal: bool, scale: float, cu_seqlens_q, max_seqlen_q,
                    max_seqlen_k, options: ModelOptions = PLAIN) -> int:
        table, fallback = self._table_or_fallback(self._paged_tables, q, k_cache, v_cache, scale)
        if table is None:
            return fallback
        if not table:
            return self._fallback["no-paged-config"]
        config, code = pick(table, heads_q=int(q.shape[1]), heads_kv=int(k_cache.shape[2]), d_qk=int(q.shape[2]),
                            d_v=int(v_cache.shape[3]), dtype=_DTYPE_NAMES.get(q.dtype), causal=bool(causal),
                            features=options.features(bool(causal)))
        if config is None:
            return self._fallback[code]
        lengths = (q.shape[0], cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k, k_cache.shape[1])
        if not plain_ints(*lengths):
            return self._routes[(id(config), None)]      # a SymInt: the bucket is chosen per call
        bucket = config.bucket_of_call(*lengths)
        if bucket is None:
            return self._fallback["page-size"]
        return self._routes[(id(config), bucket)]

    def run_paged(self, route, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q, max_seqlen_k,
                  causal: bool, scale: float, options: ModelOptions | None = None):
        """A call over a page table on its route's kernel (built with ``options``), else its fallback: torch SDPA
        over the gathered pages, or with options the fp32 reference."""
        def fallback(code: str, message: str):
            self._count_fallback(code, message)
            args = (q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, causal, scale)
            return paged_sdpa(*args) if options is None else reference_paged(*args, options)

        extra = {} if options is None or route.config is None else option_arguments(options, route.config.causal)
        return self.paged_on_route(route, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q,
                                   max_seqlen_k, scale, extra, fallback)

    def paged_on_route(self, route, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q,
                       max_seqlen_k, scale: float, extra: dict, fallback):
        """A paged call on its route's kernel (its bucket chosen per call when the route has none), ``extra`` the
        kernel's keyword arguments beyond the layout's; ``fallback(code, message)`` where there is no config, no
        bucket tiles the page size, or the kernel refuses."""
        if route.config is None:
            message = self._messages.get(self._fallback.get(route.code), REASONS.get(route.code, route.code))
            return fallback(route.code, message)
        lengths = (int(q.shape[0]), int(cu_seqlens_q.shape[0]) - 1, int(max_seqlen_q), int(max_seqlen_k),
                   int(k_cache.shape[1]))
        bucket = route.bucket or route.config.bucket_of_call(*lengths)
        if bucket is None:
            return fallback("page-size", REASONS["page-size"])
        return self._launch(route.config.kernels[bucket], bucket, f"{route.config.variant} paged", q.device.index or 0,
                            lambda kern: kern.paged(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table,
                                                    int(max_seqlen_q), softmax_scale=scale, **extra),
                            fallback)

    def paged_varlen(self, q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal: bool,
                     scale: float, page_table, seqused_k=None, window_size=(-1, -1), softcap: float = 0.0,
                     learnable_sink=None, fp8=None):
        """flash_attn_varlen_func with a page table (see the module doc); the other arguments already checked. With
        options (a window, a cap, sinks: tuner/serving/options.py) through the paged options op, to a paged kernel
        built with them or the fp32 reference over the gathered pages. ``fp8`` (q_descale, k_descale, v_descale):
        e4m3 q and caches, through the paged FP8 op (tuner/serving/fp8_calls.py)."""
        errors = paged_input_errors(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, seqused_k, page_table,
                                    max_seqlen_q)
        if errors:
            raise ValueError("flash_attn_varlen_func with a page table: " + "; ".join(errors))
        if seqused_k is None:      # FA2's convention: the lengths in cu_seqlens_k; derived on the device
            seqused_k = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)
        if max_seqlen_k is None:   # FA4 may leave it out: the table's capacity bounds every sequence's keys
            max_seqlen_k = page_table.shape[1] * k_cache.shape[1]
        if fp8 is not None:        # e4m3 with descales (tuner/serving/fp8_calls.py): no options there
            return self.attend_paged_fp8(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q,
                                         max_seqlen_k, causal, scale, *fp8)
        options = model_options(window_size, softcap, learnable_sink, causal=bool(causal), heads_q=int(q.shape[1]),
                                device=q.device, where="flash_attn_varlen_func")
        if options.any:
            from tuner.serving.op_options import launch_paged_options

            route = self.route_paged(q, k_cache, v_cache, causal, scale, cu_seqlens_q, max_seqlen_q, max_seqlen_k,
                                     options)
            return launch_paged_options(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q,
                                        max_seqlen_k, bool(causal), scale, options, route)
        route = self.route_paged(q, k_cache, v_cache, causal, scale, cu_seqlens_q, max_seqlen_q, max_seqlen_k)
        return op.launch_paged(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q, max_seqlen_k,
                               bool(causal), scale, route)
