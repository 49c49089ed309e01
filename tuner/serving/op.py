"""The torch custom ops every entry point launches through, and the routes they dispatch on.

``torch.ops.attn_tuner.attention(q, k, v, attn_mask, causal, scale, route) -> out``: q (b, sq, hq, d_qk),
k (b, sk, hkv, d_qk), v (b, sk, hkv, d_v) -> out (b, sq, hq, d_v), contiguous. ``attn_mask`` (SDPA's
meaning) is only ever given to an SDPA route: the entry points send what the kernels cannot compute
(a padding mask, a sliding window) through the op too, so that the fallback is counted per call, also
inside a compiled graph, and differentiates the same way. ``route`` names what runs, decided while
tracing from shapes, dtypes and device facts (``ExportedAttention.route``): an exported kernel (a config and
its bucket, or the config alone when seqlen_k is not known while tracing: the bucket is then chosen per
call from the concrete length), or torch SDPA and the countable reason why. Routes are registered when
an export is loaded, never while tracing, so a traced graph holds a plain int.

The fake (meta) implementation gives torch.compile the output's shape, so a model traces with no graph
break. Autograd: the forward is our kernel; the backward is ``attn_tuner::attention_backward``, which
recomputes the attention with torch SDPA from the saved inputs and returns SDPA's own gradients
(tuner/serving/sdpa.py: same scale, GQA grouping and bottom-right causal alignment). That costs one SDPA
forward more than a fused backward would; it is exact to SDPA's precision.

The packed ops follow the same pattern: ``varlen_attention`` (cu_seqlens) recomputes per sequence;
``paged_attention`` (a page table into a paged KV cache) gathers the pages into packed K/V, recomputes per
sequence and sums the K/V gradients back into the pages (tuner/serving/paged_sdpa.py): q, k_cache and
v_cache all get gradients.

``decode_kvcache`` (``flash_attn_with_kvcache``: q (b, seqlen_q, hq, d), a paged or dense KV cache,
cache_seqlens) returns (out, lse): lse (b, hq, seqlen_q) fp32 when asked for, else an empty tensor. Its route
is an exported decode kernel (tuner/serving/launch/decode_kernel.py) or the masked torch reference
(tuner/serving/decode_sdpa.py). Its backward, like the paged op's, recomputes with that reference from the
saved inputs (``decode_kvcache_backward``, the gradients written out, also those of the lse): decode is
inference, but a call under autograd is differentiable, never silently not.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tuner.serving.decode_sdpa import decode_gradients
from tuner.serving.paged_sdpa import paged_gradients
from tuner.serving.sdpa import attention_gradients, varlen_gradients

NAMESPACE = "attn_tuner"


@dataclass(frozen=True)
class Route:
    """What one route runs: ``owner.run(route, ...)``; ``config`` None means SDPA for reason ``code``."""

    owner: Any
    config: Any = None
    bucket: str | None = None      # None with a config: chosen per call
    code: str = "kernel"


_ROUTES: list[Route] = []


def register_route(route: Route) -> int:
    _ROUTES.append(route)
    return len(_ROUTES) - 1


def route_config(route: int):
    """The exported config a route runs, or None for a fallback route."""
    return _ROUTES[route].config


def run_route(route: int, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, causal: bool,
              scale: float) -> Tensor:
    r = _ROUTES[route]
    return r.owner.run(r, q, k, v, attn_mask, causal, scale)


_lib = torch.library.Library(NAMESPACE, "DEF")
_lib.define("attention(Tensor q, Tensor k, Tensor v, Tensor? attn_mask, bool causal, float scale, int route) "
            "-> Tensor")
_lib.define("attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor? attn_mask, bool causal, "
            "float scale) -> (Tensor, Tensor, Tensor)")


def _attention(q, k, v, attn_mask, causal, scale, route):
    return run_route(route, q, k, v, attn_mask, causal, scale)


def _attention_backward(grad_out, q, k, v, attn_mask, causal, scale):
    grads = attention_gradients(grad_out, q, k, v, causal, scale, attn_mask)
    return tuple(g.contiguous() for g in grads)


_lib.impl("attention", _attention, "CompositeExplicitAutograd")
_lib.impl("attention_backward", _attention_backward, "CompositeExplicitAutograd")


@torch.library.register_fake(f"{NAMESPACE}::attention", lib=_lib)
def _attention_fake(q, k, v, attn_mask, causal, scale, route):
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))


@torch.library.register_fake(f"{NAMESPACE}::attention_backward", lib=_lib)
def _attention_backward_fake(grad_out, q, k, v, attn_mask, causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, attn_mask, causal, scale, _ = inputs
    ctx.save_for_backward(q, k, v, attn_mask)
    ctx.causal, ctx.scale = causal, scale


def _backward(ctx, grad_out):
    q, k, v, attn_mask = ctx.saved_tensors
    dq, dk, dv = torch.ops.attn_tuner.attention_backward(grad_out, q, k, v, attn_mask, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None, None, None


torch.library.register_autograd(f"{NAMESPACE}::attention", _backward, setup_context=_setup_context, lib=_lib)

attention_op = torch.ops.attn_tuner.attention.default


# ---- packed sequences (flash_attn_varlen_func): q (total_q, hq, d_qk), k/v (total_k, hkv, d), cu_seqlens ----
_lib.define("varlen_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
            "Tensor? seqused_k, SymInt max_seqlen_q, SymInt max_seqlen_k, bool causal, float scale, int route) "
            "-> Tensor")
_lib.define("varlen_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, "
            "Tensor cu_seqlens_k, Tensor? seqused_k, bool causal, float scale) -> (Tensor, Tensor, Tensor)")


def run_varlen_route(route: int, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                     causal: bool, scale: float) -> Tensor:
    r = _ROUTES[route]
    return r.owner.run_varlen(r, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                              causal, scale)


def _varlen_backward_impl(grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, causal, scale):
    grads = varlen_gradients(grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, causal, scale)
    return tuple(g.contiguous() for g in grads)


def _varlen_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, causal, scale, route):
    return run_varlen_route(route, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                            causal, scale)


_lib.impl("varlen_attention", _varlen_impl, "CompositeExplicitAutograd")
_lib.impl("varlen_attention_backward", _varlen_backward_impl, "CompositeExplicitAutograd")


@torch.library.register_fake(f"{NAMESPACE}::varlen_attention", lib=_lib)
def _varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, causal, scale, route):
    return q.new_empty((q.shape[0], q.shape[1], v.shape[2]))


@torch.library.register_fake(f"{NAMESPACE}::varlen_attention_backward", lib=_lib)
def _varlen_backward_fake(grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _varlen_setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, used, _, _, causal, scale, _ = inputs
    ctx.save_for_backward(q, k, v, cu_q, cu_k, used)
    ctx.causal, ctx.scale = causal, scale


def _varlen_backward(ctx, grad_out):
    q, k, v, cu_q, cu_k, used = ctx.saved_tensors
    dq, dk, dv = torch.ops.attn_tuner.varlen_attention_backward(grad_out, q, k, v, cu_q, cu_k, used, ctx.causal,
                                                               ctx.scale)
    return dq, dk, dv, None, None, None, None, None, None, None, None


torch.library.register_autograd(f"{NAMESPACE}::varlen_attention", _varlen_backward, setup_context=_varlen_setup,
                                lib=_lib)
varlen_attention_op = torch.ops.attn_tuner.varlen_attention.default


# ---- a paged KV cache: q (total_q, hq, d_qk), k/v_cache (pages, page_size, hkv, d), page_table (batch, pages) ----
# seqused_k is always a tensor here (the entry point derives it from cu_seqlens_k on the device when absent);
# max_seqlen_k is the routing length (the caller's, or the table's capacity): the kernel reads none.
_lib.define("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cu_seqlens_q, Tensor seqused_k, "
            "Tensor page_table, SymInt max_seqlen_q, SymInt max_seqlen_k, bool causal, float scale, int route) "
            "-> Tensor")
_lib.define("paged_attention_backward(Tensor grad_out, Tensor q, Tensor k_cache, Tensor v_cache, "
            "Tensor cu_seqlens_q, Tensor seqused_k, Tensor page_table, bool causal, float scale) "
            "-> (Tensor, Tensor, Tensor)")


def run_paged_route(route: int, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q,
                    max_seqlen_k, causal: bool, scale: float) -> Tensor:
    r = _ROUTES[route]
    return r.owner.run_paged(r, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q,
                             max_seqlen_k, causal, scale)


def _paged_impl(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q, max_seqlen_k, causal, scale,
                route):
    return run_paged_route(route, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q,
                           max_seqlen_k, causal, scale)


def _paged_backward_impl(grad_out, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, causal, scale):
    grads = paged_gradients(grad_out, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, causal, scale)
    return tuple(g.contiguous() for g in grads)


_lib.impl("paged_attention", _paged_impl, "CompositeExplicitAutograd")
_lib.impl("paged_attention_backward", _paged_backward_impl, "CompositeExplicitAutograd")


@torch.library.register_fake(f"{NAMESPACE}::paged_attention", lib=_lib)
def _paged_fake(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q, max_seqlen_k, causal, scale,
                route):
    return q.new_empty((q.shape[0], q.shape[1], v_cache.shape[3]))


@torch.library.register_fake(f"{NAMESPACE}::paged_attention_backward", lib=_lib)
def _paged_backward_fake(grad_out, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, causal, scale):
    return q.new_empty(q.shape), k_cache.new_empty(k_cache.shape), v_cache.new_empty(v_cache.shape)


def _paged_setup(ctx, inputs, output):
    q, k_cache, v_cache, cu_q, used, table, _, _, causal, scale, _ = inputs
    ctx.save_for_backward(q, k_cache, v_cache, cu_q, used, table)
    ctx.causal, ctx.scale = causal, scale


def _paged_backward(ctx, grad_out):
    q, k_cache, v_cache, cu_q, used, table = ctx.saved_tensors
    dq, dk, dv = torch.ops.attn_tuner.paged_attention_backward(grad_out, q, k_cache, v_cache, cu_q, used, table,
                                                               ctx.causal, ctx.scale)
    return dq, dk, dv, None, None, None, None, None, None, None, None


torch.library.register_autograd(f"{NAMESPACE}::paged_attention", _paged_backward, setup_context=_paged_setup,
                                lib=_lib)
paged_attention_op = torch.ops.attn_tuner.paged_attention.default


# ---- decode over a KV cache (flash_attn_with_kvcache): q (b, sq, hq, d), k/v_cache paged or dense ----
# page_table None: a dense cache; cache_seqlens None: every row of the cache (dense only: the entry point gives
# a paged call the table's capacity). num_splits 0: the kernel's split rule. cache_leftpad (b,) int32 (a dense
# cache, FA2's): sequence b's keys start at that row (tuner/serving/decode_sdpa.py); last, with a default, so that
# a call without it keeps its arguments.
_lib.define("decode_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, Tensor? cache_seqlens, Tensor? page_table, "
            "bool causal, float scale, int num_splits, bool return_lse, int route, Tensor? cache_leftpad=None) "
            "-> (Tensor, Tensor)")
_lib.define("decode_kvcache_backward(Tensor grad_out, Tensor? grad_lse, Tensor q, Tensor k_cache, Tensor v_cache, "
            "Tensor? cache_seqlens, Tensor? page_table, bool causal, float scale, Tensor? cache_leftpad=None) "
            "-> (Tensor, Tensor, Tensor)")


def run_decode_route(route: int, q, k_cache, v_cache, cache_seqlens, page_table, causal: bool, scale: float,
                     num_splits: int, return_lse: bool, out=None, cache_leftpad=None):
    r = _ROUTES[route]
    return r.owner.run_decode(r, q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, num_splits,
                              return_lse, out, cache_leftpad=cache_leftpad)


def _decode_impl(q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, num_splits, return_lse, route,
                 cache_leftpad=None):
    return run_decode_route(route, q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, num_splits,
                            return_lse, cache_leftpad=cache_leftpad)


def _decode_backward_impl(grad_out, grad_lse, q, k_cache, v_cache, cache_seqlens, page_table, causal, scale,
                          cache_leftpad=None):
    grads = decode_gradients(grad_out, grad_lse, q, k_cache, v_cache, cache_seqlens, page_table, causal, scale,
                             cache_leftpad)
    return tuple(g.contiguous() for g in grads)


_lib.impl("decode_kvcache", _decode_impl, "CompositeExplicitAutograd")
_lib.impl("decode_kvcache_backward", _decode_backward_impl, "CompositeExplicitAutograd")


def decode_fake(q, v_cache, return_lse: bool):
    """The (out, lse) shapes of a decode op (this one and tuner/serving/op_options.py's)."""
    out = q.new_empty((q.shape[0], q.shape[1], q.shape[2], v_cache.shape[3]))
    lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if return_lse else (0,)
    return out, q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.register_fake(f"{NAMESPACE}::decode_kvcache", lib=_lib)
def _decode_fake(q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, num_splits, return_lse, route,
                 cache_leftpad=None):
    return decode_fake(q, v_cache, return_lse)


@torch.library.register_fake(f"{NAMESPACE}::decode_kvcache_backward", lib=_lib)
def _decode_backward_fake(grad_out, grad_lse, q, k_cache, v_cache, cache_seqlens, page_table, causal, scale,
                          cache_leftpad=None):
    return q.new_empty(q.shape), k_cache.new_empty(k_cache.shape), v_cache.new_empty(v_cache.shape)


def _decode_setup(ctx, inputs, output):
    q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, _, return_lse, _ = inputs[:10]
    cache_leftpad = inputs[10] if len(inputs) > 10 else None
    ctx.save_for_backward(q, k_cache, v_cache, cache_seqlens, page_table, cache_leftpad)
    ctx.causal, ctx.scale, ctx.return_lse = causal, scale, return_lse


def _decode_backward(ctx, grad_out, grad_lse):
    q, k_cache, v_cache, cache_seqlens, page_table, cache_leftpad = ctx.saved_tensors
    dq, dk, dv = torch.ops.attn_tuner.decode_kvcache_backward(grad_out, grad_lse if ctx.return_lse else None, q,
                                                              k_cache, v_cache, cache_seqlens, page_table,
                                                              ctx.causal, ctx.scale, cache_leftpad)
    return dq, dk, dv, None, None, None, None, None, None, None, None


torch.library.register_autograd(f"{NAMESPACE}::decode_kvcache", _decode_backward, setup_context=_decode_setup,
                                lib=_lib)
decode_kvcache_op = torch.ops.attn_tuner.decode_kvcache.default


def nothing_observes(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """True when no tracer, mode, transform or autograd could see the op: then calling the route directly
    is the op's own behaviour minus the dispatcher. Measured on the CI CPU: a Python custom op costs
    ~10 µs per call before its kernel runs (the dispatcher ~3 µs, the registered autograd kernel ~5 µs even
    without grad), about half of torch SDPA's whole host time on a GPU."""
    return not torch.compiler.is_compiling() and no_observers(q, k, v)


def no_observers(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """``nothing_observes`` for a caller that knows it is not being traced by torch.compile."""
    return (type(q) is Tensor and type(k) is Tensor and type(v) is Tensor
            and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
            and not torch._C._is_torch_function_mode_enabled()
            and torch._C._len_torch_dispatch_stack() == 0
            and torch._C._functorch.maybe_current_level() is None)


def launch_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, causal: bool,
                  scale: float, route: int) -> Tensor:
    """The varlen op, or its route directly when nothing observes the call."""
    if nothing_observes(q, k, v):
        return run_varlen_route(route, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                                causal, scale)
    return varlen_attention_op(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, causal,
                               scale, route)


def launch_paged(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q, max_seqlen_k, causal: bool,
                 scale: float, route: int) -> Tensor:
    """The paged op, or its route directly when nothing observes the call."""
    if nothing_observes(q, k_cache, v_cache):
        return run_paged_route(route, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q,
                               max_seqlen_k, causal, scale)
    return paged_attention_op(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q, max_seqlen_k,
                              causal, scale, route)


def launch_decode(q, k_cache, v_cache, cache_seqlens, page_table, causal: bool, scale: float, num_splits: int,
                  return_lse: bool, route: int, out=None, cache_leftpad=None):
    """(out, lse) of the decode op, or of its route directly when nothing observes the call (then ``out``, when
    given, is written by the kernel itself; through the op it is filled from the op's fresh output)."""
    if nothing_observes(q, k_cache, v_cache):
        return run_decode_route(route, q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, num_splits,
                                return_lse, out, cache_leftpad)
    res, lse = decode_kvcache_op(q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, num_splits,
                                 return_lse, route, cache_leftpad)
    if out is not None:
        out.copy_(res)
        res = out
    return res, lse


def launch(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, route: int,
           attn_mask: Tensor | None = None) -> Tensor:
    """The op, or the route itself when nothing observes the call (``nothing_observes``)."""
    if nothing_observes(q, k, v):
        return run_route(route, q, k, v, attn_mask, causal, scale)
    return attention_op(q, k, v, attn_mask, causal, scale, route)
