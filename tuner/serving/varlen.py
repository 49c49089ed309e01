"""Packed sequences through an export: FlashAttention's ``flash_attn_varlen_func`` over the varlen kernels
(tl/layout.py), mixed into ExportedAttention.

    o = attn.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    causal=True, seqused_k=None)
    # q (total_q, hq, d), k/v (total_k, hkv, d), cu_seqlens int32 (batch + 1) -> (total_q, hq, d_v)

Dispatch: the varlen config of the head dims, dtype and causality (its variant preferred by the head
layout, as for dense calls), then its bucket by the config's rule: serving buckets (tuner/measure/mixes.py) from
``q.shape[0]`` (packed queries), ``cu_seqlens_q.shape[0] - 1`` (batch), ``max_seqlen_q`` and
``max_seqlen_k``; key-length buckets (configs exported before the serving rule) nearest to
``max_seqlen_k``. Decided while tracing when those are plain ints, per call otherwise. Everything else runs
``tuner.serving.sdpa.varlen_sdpa`` (torch SDPA sequence by sequence; the lengths are read on the host),
through the same op, counted by reason.

A paged cache (``block_table=``, FA2's name, or ``page_table=``, FA4's) goes to tuner/serving/paged.py.
"""
from __future__ import annotations

import math

import torch

from tuner.serving import op
from tuner.serving.configs import pick
from tuner.serving.options import PLAIN, ModelOptions, option_arguments, reference_varlen
from tuner.serving.reasons import REASONS
from tuner.serving.rule import plain_ints
from tuner.serving.sdpa import varlen_sdpa

_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8"}


class VarlenCalls:
    """Mixed into ExportedAttention: uses its ``devices``, ``_fallback``, ``_messages``, ``_routes``, ``_launch``,
    ``_count_fallback``; ``_varlen_tables`` is built in its __init__."""

    def route_varlen(self, q, k, v, causal: bool, scale: float, max_seqlen_k, cu_seqlens_q=None,
                     max_seqlen_q=None, options: ModelOptions = PLAIN) -> int:
        table, fallback = self._table_or_fallback(self._varlen_tables, q, k, v, scale)
        if table is None:
            return fallback
        config, code = pick(table, heads_q=int(q.shape[1]), heads_kv=int(k.shape[1]), d_qk=int(q.shape[2]),
                            d_v=int(v.shape[2]), dtype=_DTYPE_NAMES.get(q.dtype), causal=bool(causal),
                            features=options.features(bool(causal)))
        if config is None:
            return self._fallback[code]
        if config.serving is None:    # key-length buckets: max_seqlen_k alone
            bucket = config.bucket_for(max(1, max_seqlen_k)) if type(max_seqlen_k) is int else None
        else:
            batch = None if cu_seqlens_q is None else cu_seqlens_q.shape[0] - 1
            bucket = config.bucket_of_call(q.shape[0], batch, max_seqlen_q, max_seqlen_k) \
                if plain_ints(q.shape[0], batch, max_seqlen_q, max_seqlen_k) else None
        return self._routes[(id(config), bucket)]

    def run_varlen(self, route, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                   causal: bool, scale: float, options: ModelOptions | None = None):
        """A packed call on its route's kernel (built with ``options``: a window, a cap, sinks), else its fallback:
        torch SDPA per sequence, or with options the fp32 reference."""
        def fallback(code: str, message: str):
            self._count_fallback(code, message)
            if options is None:
                return varlen_sdpa(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, causal, scale)
            return reference_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, causal, scale, options)

        extra = {} if options is None or route.config is None else option_arguments(options, route.config.causal)
        return self.varlen_on_route(route, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                                    scale, extra, fallback)

    def varlen_on_route(self, route, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                        scale: float, extra: dict, fallback):
        """A packed call on its route's kernel (its bucket chosen per call when the route has none), ``extra`` the
        kernel's keyword arguments beyond the layout's; ``fallback(code, message)`` where there is no config or the
        kernel refuses."""
        if route.config is None:
            message = self._messages.get(self._fallback.get(route.code), REASONS.get(route.code, route.code))
            return fallback(route.code, message)
        bucket = route.bucket or route.config.bucket_of_call(int(q.shape[0]), int(cu_seqlens_q.shape[0]) - 1,
                                                             int(max_seqlen_q), int(max_seqlen_k))
        return self._launch(route.config.kernels[bucket], bucket, f"{route.config.variant} varlen", q.device.index or 0,
                            lambda kern: kern.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                                                     int(max_seqlen_k), seqused_k=seqused_k, softmax_scale=scale,
                                                     **extra),
                            fallback)

    def flash_attn_varlen_func(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               dropout_p: float = 0.0, softmax_scale: float | None = None, causal: bool = False,
                               window_size=(-1, -1), softcap: float = 0.0, alibi_slopes=None,
                               deterministic: bool = False, return_attn_probs: bool = False, block_table=None,
                               seqused_k=None, page_table=None, learnable_sink=None, q_descale=None,
                               k_descale=None, v_descale=None):
        """``flash_attn.flash_attn_varlen_func``'s signature (FlashAttention 2; ``seqused_k``, ``page_table`` and
        ``learnable_sink`` as FA3/FA4 name them): causal aligned bottom-right within each sequence,
        ``max_seqlen_q`` at least every sequence's length. ``window_size``, ``softcap`` and ``learnable_sink`` go
        to a kernel built with them (tuner/serving/option_calls.py). ``block_table`` (or ``page_table``) makes k
        and v paged caches (num_pages, page_size, kv_heads, head_dim): tuner/serving/paged.py. What neither the
        kernels nor the per-sequence fallback compute is refused (NotImplementedError): dropout, ALiBi, the
        probabilities. float8_e4m3fn q, k, v take FlashAttention-3's ``q_descale``/``k_descale``/``v_descale`` (fp32,
        (sequences, KV heads)) and return bf16 (tuner/serving/fp8_calls.py), packed or over a paged cache; FP8 takes no
        options."""
        has_options = (learnable_sink is not None or bool(softcap)
                       or (window_size is not None and tuple(window_size) != (-1, -1)))
        for given, what in ((dropout_p > 0.0, "dropout"), (alibi_slopes is not None, "alibi_slopes"),
                            (return_attn_probs, "return_attn_probs")):
            if given:
                raise NotImplementedError(f"flash_attn_varlen_func: {what} is not supported by the exported kernels")
        if block_table is not None and page_table is not None and block_table is not page_table:
            raise ValueError("flash_attn_varlen_func: block_table and page_table name the same thing; give one")
        table = block_table if block_table is not None else page_table
        head_dim = q.shape[-1] if isinstance(q, torch.Tensor) and q.dim() >= 1 else 1
        scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(int(head_dim))
        fp8 = None
        if q.dtype == torch.float8_e4m3fn or any(d is not None for d in (q_descale, k_descale, v_descale)):
            if q.dtype != torch.float8_e4m3fn:
                raise ValueError(f"q_descale, k_descale and v_descale apply to {torch.float8_e4m3fn} inputs, not "
                                 f"{q.dtype}")
            if has_options:
                raise NotImplementedError("FP8 calls take no window_size, softcap or learnable_sink")
            fp8 = (q_descale, k_descale, v_descale)
        if table is not None:
            return self.paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                                     table, seqused_k, window_size, softcap, learnable_sink, fp8)
        if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
            hint = " (a paged cache needs block_table= or page_table=)" if k.dim() == 4 else ""
            raise ValueError(f"q, k, v must be 3-D (total_tokens, heads, head_dim); got {tuple(q.shape)}, "
                             f"{tuple(k.shape)}, {tuple(v.shape)}{hint}")
        if k.shape[1] < 1 or q.shape[1] % k.shape[1] or k.shape[:2] != v.shape[:2] or q.shape[2] != k.shape[2]:
            raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: query heads must be a "
                             "multiple of the KV heads, k and v alike in tokens and heads, q and k in head dim")
        if fp8 is not None:
            return self.attend_varlen_fp8(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                          scale, seqused_k, q_descale, k_descale, v_descale)
        if has_options:
            return self.varlen_options(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                                       window_size, softcap, learnable_sink, seqused_k)
        route = self.route_varlen(q, k, v, causal, scale, max_seqlen_k, cu_seqlens_q, max_seqlen_q)
        return op.launch_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                                bool(causal), scale, route)
