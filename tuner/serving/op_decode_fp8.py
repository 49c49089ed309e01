"""The custom op of decode calls over an FP8 (e4m3) KV cache, beside tuner/serving/op.py's decode op and routed the
same way:

``attn_tuner::decode_kvcache_fp8(q, k_cache, v_cache, k_scale, v_scale, cache_seqlens, page_table, causal, scale,
num_splits, return_lse, window_left, window_right, softcap, sinks, route, cache_leftpad=None) -> (out, lse)``: q
(b, seqlen_q, hq, d) fp16/bf16, k/v_cache paged or dense float8_e4m3fn, k_scale/v_scale fp32 of one element or one
per KV head (the real K is k_cache * k_scale) -> out in q's dtype, lse fp32 (b, hq, seqlen_q) or empty. The model
options are arguments (plain values when the call has none), as in the options op. The route runs an exported FP8
cache kernel, or the masked reference on the dequantised cache (tuner/serving/decode_sdpa.py), counted by reason.

An FP8 cache is served for inference: e4m3 caches take no gradient in torch, and the op's backward says so.
"""
from __future__ import annotations

import torch
from torch import Tensor

from tuner.serving.op import NAMESPACE, _ROUTES, decode_fake, nothing_observes
from tuner.serving.options import ModelOptions

_lib = torch.library.Library(NAMESPACE, "FRAGMENT")
_lib.define("decode_kvcache_fp8(Tensor q, Tensor k_cache, Tensor v_cache, Tensor k_scale, Tensor v_scale, "
            "Tensor? cache_seqlens, Tensor? page_table, bool causal, float scale, int num_splits, bool return_lse, "
            "int window_left, int window_right, float softcap, Tensor? sinks, int route, Tensor? cache_leftpad=None) "
            "-> (Tensor, Tensor)")


def _run(route: int, q, k_cache, v_cache, k_scale, v_scale, cache_seqlens, page_table, causal: bool, scale: float,
         num_splits: int, return_lse: bool, options: ModelOptions, out=None, cache_leftpad=None):
    r = _ROUTES[route]
    return r.owner.run_decode(r, q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, num_splits,
                              return_lse, out, options, cache_leftpad, kv_scales=(k_scale, v_scale))


def _impl(q, k_cache, v_cache, k_scale, v_scale, cache_seqlens, page_table, causal, scale, num_splits, return_lse,
          window_left, window_right, softcap, sinks, route, cache_leftpad=None):
    options = ModelOptions((int(window_left), int(window_right)), float(softcap), sinks)
    return _run(route, q, k_cache, v_cache, k_scale, v_scale, cache_seqlens, page_table, causal, scale, num_splits,
                return_lse, options, cache_leftpad=cache_leftpad)


_lib.impl("decode_kvcache_fp8", _impl, "CompositeExplicitAutograd")


@torch.library.register_fake(f"{NAMESPACE}::decode_kvcache_fp8", lib=_lib)
def _fake(q, k_cache, v_cache, k_scale, v_scale, cache_seqlens, page_table, causal, scale, num_splits, return_lse,
          window_left, window_right, softcap, sinks, route, cache_leftpad=None):
    return decode_fake(q, v_cache, return_lse)


def _setup_context(ctx, inputs, output):
    pass


def _backward(ctx, grad_out, grad_lse):
    raise NotImplementedError("attn_tuner::decode_kvcache_fp8 has no backward: an FP8 (e4m3) KV cache is served for "
                              "inference; train with a bf16/fp16 cache")


torch.library.register_autograd(f"{NAMESPACE}::decode_kvcache_fp8", _backward, setup_context=_setup_context, lib=_lib)
decode_kvcache_fp8_op = torch.ops.attn_tuner.decode_kvcache_fp8.default


def launch_decode_fp8(q, k_cache, v_cache, k_scale, v_scale, cache_seqlens, page_table, causal: bool, scale: float,
                      num_splits: int, return_lse: bool, options: ModelOptions, route: int, out=None,
                      cache_leftpad=None):
    """(out, lse) of the op, or of its route directly when nothing observes the call (then ``out``, when given, is
    written by the kernel itself; through the op it is filled from the op's fresh output)."""
    if nothing_observes(q, k_cache, v_cache) and not (options.sinks is not None and torch.is_grad_enabled()
                                                      and options.sinks.requires_grad):
        return _run(route, q, k_cache, v_cache, k_scale, v_scale, cache_seqlens, page_table, causal, scale,
                    num_splits, return_lse, options, out, cache_leftpad)
    res, lse = decode_kvcache_fp8_op(q, k_cache, v_cache, k_scale, v_scale, cache_seqlens, page_table, causal, scale,
                                     num_splits, return_lse, options.window[0], options.window[1], options.softcap,
                                     options.sinks, route, cache_leftpad)
    if out is not None:
        out.copy_(res)
        res = out
    return res, lse
