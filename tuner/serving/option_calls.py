"""Calls with model options (a sliding window, soft-capping, attention sinks: tuner/serving/options.py) through an
export, mixed into ExportedAttention: dense (b, s, h, d), packed sequences and a paged KV cache.

Dispatch is the plain calls' rule plus the options: a config whose kernels are built with exactly the options the
call needs (``ExportedConfig.features``) serves it, its bucket chosen as for a plain call; otherwise the fp32
torch reference runs, through the options op (tuner/serving/op_options.py), counted by reason
("no-option-config" when the export has plain kernels of the shape but none built with these options).
"""
from __future__ import annotations

import math

from tuner.serving.op_options import launch_options, launch_varlen_options
from tuner.serving.options import ModelOptions, model_options, option_arguments, reference_attention
from tuner.serving.sdpa import check_shapes


class OptionCalls:
    """Mixed into ExportedAttention: uses its ``route``, ``route_varlen``, ``_launch``, ``_fallback``, ``_messages``
    and ``_count_fallback``."""

    def attend_options(self, q, k, v, causal: bool, scale: float | None, window_size=(-1, -1), softcap: float = 0.0,
                       learnable_sink=None, attn_mask=None, where: str = "attention"):
        """(b, s, h, d) tensors with options (FlashAttention's names) through the options op. ``attn_mask`` (SDPA's
        meaning) sends the call to the reference, which applies the mask on top of the options."""
        check_shapes(q, k, v)
        scale = float(scale) if scale is not None else 1.0 / math.sqrt(int(q.shape[3]))
        options = model_options(window_size, softcap, learnable_sink, causal=bool(causal), heads_q=int(q.shape[2]),
                                device=q.device, where=where)
        if not options.any:
            if attn_mask is not None:
                return self.fallback("mask", q, k, v, False, scale, attn_mask)
            return self(q, k, v, causal=causal, softmax_scale=scale)
        if attn_mask is not None:
            if causal:
                raise ValueError(f"{where}: give an attention mask or causal, not both")
            return launch_options(q, k, v, False, scale, options, self._fallback["mask"], attn_mask)
        return launch_options(q, k, v, bool(causal), scale, options, self.route(q, k, v, causal, scale, options))

    def run_options(self, route, q, k, v, attn_mask, causal: bool, scale: float, options: ModelOptions):
        """What an options route runs (inside the op or directly): the config's kernel with the options, or the
        reference and why."""
        if route.config is not None and attn_mask is None:
            bucket = route.bucket or route.config.bucket_for(k.shape[1])
            extra = option_arguments(options, route.config.causal)
            return self._launch(route.config.kernels[bucket], bucket, route.config.variant, q.device.index or 0,
                                lambda kern: kern(q, k, v, softmax_scale=scale, **extra),
                                lambda code, message: self._reference(code, message, q, k, v, None, causal, scale,
                                                                      options))
        code = route.code if route.config is None else "mask"
        return self._reference(code, self._messages.get(self._fallback.get(code), code), q, k, v, attn_mask, causal,
                               scale, options)

    def _reference(self, code, message, q, k, v, attn_mask, causal, scale, options):
        self._count_fallback(code, message)
        return reference_attention(q, k, v, causal, scale, options, attn_mask)

    # --- packed sequences --------------------------------------------------------------------------------
    def varlen_options(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal: bool,
                       scale: float, window_size, softcap, learnable_sink, seqused_k=None):
        """``flash_attn_varlen_func`` with options (q (total_q, hq, d), k/v (total_k, hkv, d)) through the packed
        options op."""
        options = model_options(window_size, softcap, learnable_sink, causal=bool(causal), heads_q=int(q.shape[1]),
                                device=q.device, where="flash_attn_varlen_func")
        route = self.route_varlen(q, k, v, causal, scale, max_seqlen_k, cu_seqlens_q, max_seqlen_q, options)
        return launch_varlen_options(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                                     bool(causal), scale, options, route)
