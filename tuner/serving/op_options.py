"""The custom ops of calls with model options (tuner/serving/options.py: a window, soft-capping, sinks), beside
the plain ops of tuner/serving/op.py and routed the same way:

``attn_tuner::attention_options(q, k, v, attn_mask, causal, scale, window_left, window_right, softcap, sinks,
route)``: (b, s, h, d) as ``attention``; ``attn_mask`` only ever reaches a fallback route.
``attn_tuner::varlen_attention_options(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
max_seqlen_k, causal, scale, window_left, window_right, softcap, sinks, route)``: packed sequences.
``attn_tuner::paged_attention_options(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q,
max_seqlen_k, causal, scale, window_left, window_right, softcap, sinks, route)``: a paged KV cache (q, the caches
and the sinks get gradients).
``attn_tuner::decode_kvcache_options(q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, num_splits,
return_lse, window_left, window_right, softcap, sinks, route) -> (out, lse)``: ``flash_attn_with_kvcache`` with
options, as ``decode_kvcache`` (tuner/serving/op.py) plus the options; its backward differentiates
``decode_reference`` (tuner/serving/decode_sdpa.py) through out and the lse.

Options are op arguments, not part of the route: a model's layers differ in their windows and sinks but share
their kernels. Autograd: the backward recomputes with ``reference_attention`` (fp32 torch) from the saved inputs
and returns its gradients, the sinks' included (they are a trained parameter in the models that have them).
"""
from __future__ import annotations

import torch
from torch import Tensor

from tuner.serving.decode_sdpa import decode_reference
from tuner.serving.op import _ROUTES, NAMESPACE, decode_fake, nothing_observes
from tuner.serving.options import ModelOptions, reference_attention, reference_paged, reference_varlen

_lib = torch.library.Library(NAMESPACE, "FRAGMENT")

_OPTIONS = "int window_left, int window_right, float softcap, Tensor? sinks"
_lib.define(f"attention_options(Tensor q, Tensor k, Tensor v, Tensor? attn_mask, bool causal, float scale, {_OPTIONS}, "
            "int route) -> Tensor")
_lib.define(f"attention_options_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor? attn_mask, "
            f"bool causal, float scale, {_OPTIONS}) -> (Tensor, Tensor, Tensor, Tensor)")
_lib.define(f"varlen_attention_options(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
            f"Tensor? seqused_k, SymInt max_seqlen_q, SymInt max_seqlen_k, bool causal, float scale, {_OPTIONS}, "
            "int route) -> Tensor")
_lib.define(f"varlen_attention_options_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, "
            f"Tensor cu_seqlens_k, Tensor? seqused_k, bool causal, float scale, {_OPTIONS}) "
            "-> (Tensor, Tensor, Tensor, Tensor)")


def _options(window_left, window_right, softcap, sinks) -> ModelOptions:
    return ModelOptions((int(window_left), int(window_right)), float(softcap), sinks)


def _gradients(forward, grad_out, tensors, sinks):
    """(dq, dk, dv, dsinks) of ``forward(q, k, v, sinks)`` by autograd from fresh leaves; dsinks is an empty
    tensor for a call without sinks (the schema's fixed arity). ``forward`` may return several outputs, then
    ``grad_out`` is a tuple of their gradients (None: that output was not used)."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in tensors]
        sink_leaf = None if sinks is None else sinks.detach().requires_grad_()
        out = forward(*leaves, sink_leaf)
        outs, grads_out = (out, grad_out) if isinstance(out, tuple) else ((out,), (grad_out,))
        used = [(o, g) for o, g in zip(outs, grads_out) if g is not None]
        wrt = leaves + ([sink_leaf] if sink_leaf is not None else [])
        grads = torch.autograd.grad([o for o, _ in used], wrt, [g for _, g in used], allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g.contiguous() for g, t in zip(grads, wrt)]
    empty = (grad_out[0] if isinstance(grad_out, tuple) else grad_out).new_empty(0, dtype=torch.float32)
    dsinks = grads[3] if sinks is not None else empty
    return grads[0], grads[1], grads[2], dsinks


def _gradients_fake(q, k, v, sinks):
    """The shapes ``_gradients`` returns, for the backward ops' fake implementations."""
    dsinks = sinks.new_empty(sinks.shape) if sinks is not None else q.new_empty(0, dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks


# ---- dense (b, s, h, d) ----
def _attention_impl(q, k, v, attn_mask, causal, scale, window_left, window_right, softcap, sinks, route):
    r = _ROUTES[route]
    return r.owner.run_options(r, q, k, v, attn_mask, causal, scale,
                               _options(window_left, window_right, softcap, sinks))


def _attention_backward_impl(grad_out, q, k, v, attn_mask, causal, scale, window_left, window_right, softcap, sinks):
    def forward(q, k, v, s):
        return reference_attention(q, k, v, causal, scale, _options(window_left, window_right, softcap, s), attn_mask)

    return _gradients(forward, grad_out, (q, k, v), sinks)


_lib.impl("attention_options", _attention_impl, "CompositeExplicitAutograd")
_lib.impl("attention_options_backward", _attention_backward_impl, "CompositeExplicitAutograd")


@torch.library.register_fake(f"{NAMESPACE}::attention_options", lib=_lib)
def _attention_fake(q, k, v, attn_mask, causal, scale, window_left, window_right, softcap, sinks, route):
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))


@torch.library.register_fake(f"{NAMESPACE}::attention_options_backward", lib=_lib)
def _attention_backward_fake(grad_out, q, k, v, attn_mask, causal, scale, window_left, window_right, softcap, sinks):
    return _gradients_fake(q, k, v, sinks)


def _attention_setup(ctx, inputs, output):
    q, k, v, attn_mask, causal, scale, window_left, window_right, softcap, sinks, _ = inputs
    ctx.save_for_backward(q, k, v, attn_mask, sinks)
    ctx.args = (causal, scale, window_left, window_right, softcap)


def _attention_backward(ctx, grad_out):
    q, k, v, attn_mask, sinks = ctx.saved_tensors
    causal, scale, left, right, softcap = ctx.args
    dq, dk, dv, dsinks = torch.ops.attn_tuner.attention_options_backward(grad_out, q, k, v, attn_mask, causal, scale,
                                                                         left, right, softcap, sinks)
    return dq, dk, dv, None, None, None, None, None, None, (dsinks if sinks is not None else None), None


torch.library.register_autograd(f"{NAMESPACE}::attention_options", _attention_backward,
                                setup_context=_attention_setup, lib=_lib)
attention_options_op = torch.ops.attn_tuner.attention_options.default


# ---- packed sequences ----
def _varlen_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, causal, scale,
                 window_left, window_right, softcap, sinks, route):
    r = _ROUTES[route]
    return r.owner.run_varlen(r, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                              causal, scale, _options(window_left, window_right, softcap, sinks))


def _varlen_backward_impl(grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, causal, scale, window_left,
                          window_right, softcap, sinks):
    def forward(q, k, v, s):
        return reference_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, causal, scale,
                                _options(window_left, window_right, softcap, s))

    return _gradients(forward, grad_out, (q, k, v), sinks)


_lib.impl("varlen_attention_options", _varlen_impl, "CompositeExplicitAutograd")
_lib.impl("varlen_attention_options_backward", _varlen_backward_impl, "CompositeExplicitAutograd")


@torch.library.register_fake(f"{NAMESPACE}::varlen_attention_options", lib=_lib)
def _varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, causal, scale,
                 window_left, window_right, softcap, sinks, route):
    return q.new_empty((q.shape[0], q.shape[1], v.shape[2]))


@torch.library.register_fake(f"{NAMESPACE}::varlen_attention_options_backward", lib=_lib)
def _varlen_backward_fake(grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, causal, scale, window_left,
                          window_right, softcap, sinks):
    return _gradients_fake(q, k, v, sinks)


def _varlen_setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, used, _, _, causal, scale, window_left, window_right, softcap, sinks, _ = inputs
    ctx.save_for_backward(q, k, v, cu_q, cu_k, used, sinks)
    ctx.args = (causal, scale, window_left, window_right, softcap)


def _varlen_backward(ctx, grad_out):
    q, k, v, cu_q, cu_k, used, sinks = ctx.saved_tensors
    causal, scale, left, right, softcap = ctx.args
    dq, dk, dv, dsinks = torch.ops.attn_tuner.varlen_attention_options_backward(grad_out, q, k, v, cu_q, cu_k, used,
                                                                                causal, scale, left, right, softcap,
                                                                                sinks)
    return (dq, dk, dv) + (None,) * 10 + ((dsinks if sinks is not None else None), None)


torch.library.register_autograd(f"{NAMESPACE}::varlen_attention_options", _varlen_backward,
                                setup_context=_varlen_setup, lib=_lib)
varlen_attention_options_op = torch.ops.attn_tuner.varlen_attention_options.default


# ---- a paged KV cache ----
_lib.define(f"paged_attention_options(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cu_seqlens_q, "
            f"Tensor seqused_k, Tensor page_table, SymInt max_seqlen_q, SymInt max_seqlen_k, bool causal, float scale, "
            f"{_OPTIONS}, int route) -> Tensor")
_lib.define(f"paged_attention_options_backward(Tensor grad_out, Tensor q, Tensor k_cache, Tensor v_cache, "
            f"Tensor cu_seqlens_q, Tensor seqused_k, Tensor page_table, bool causal, float scale, {_OPTIONS}) "
            "-> (Tensor, Tensor, Tensor, Tensor)")


def _paged_impl(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q, max_seqlen_k, causal, scale,
                window_left, window_right, softcap, sinks, route):
    r = _ROUTES[route]
    return r.owner.run_paged(r, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q,
                             max_seqlen_k, causal, scale, _options(window_left, window_right, softcap, sinks))


def _paged_backward_impl(grad_out, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, causal, scale,
                         window_left, window_right, softcap, sinks):
    def forward(q, k_cache, v_cache, s):
        return reference_paged(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, causal, scale,
                               _options(window_left, window_right, softcap, s))

    return _gradients(forward, grad_out, (q, k_cache, v_cache), sinks)


_lib.impl("paged_attention_options", _paged_impl, "CompositeExplicitAutograd")
_lib.impl("paged_attention_options_backward", _paged_backward_impl, "CompositeExplicitAutograd")


@torch.library.register_fake(f"{NAMESPACE}::paged_attention_options", lib=_lib)
def _paged_fake(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q, max_seqlen_k, causal, scale,
                window_left, window_right, softcap, sinks, route):
    return q.new_empty((q.shape[0], q.shape[1], v_cache.shape[3]))


@torch.library.register_fake(f"{NAMESPACE}::paged_attention_options_backward", lib=_lib)
def _paged_backward_fake(grad_out, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, causal, scale,
                         window_left, window_right, softcap, sinks):
    return _gradients_fake(q, k_cache, v_cache, sinks)


def _paged_setup(ctx, inputs, output):
    q, k_cache, v_cache, cu_q, used, table, _, _, causal, scale, window_left, window_right, softcap, sinks, _ = inputs
    ctx.save_for_backward(q, k_cache, v_cache, cu_q, used, table, sinks)
    ctx.args = (causal, scale, window_left, window_right, softcap)


def _paged_backward(ctx, grad_out):
    q, k_cache, v_cache, cu_q, used, table, sinks = ctx.saved_tensors
    causal, scale, left, right, softcap = ctx.args
    dq, dk, dv, dsinks = torch.ops.attn_tuner.paged_attention_options_backward(
        grad_out, q, k_cache, v_cache, cu_q, used, table, causal, scale, left, right, softcap, sinks)
    return (dq, dk, dv) + (None,) * 10 + ((dsinks if sinks is not None else None), None)


torch.library.register_autograd(f"{NAMESPACE}::paged_attention_options", _paged_backward, setup_context=_paged_setup,
                                lib=_lib)
paged_attention_options_op = torch.ops.attn_tuner.paged_attention_options.default


# ---- decode over a KV cache (flash_attn_with_kvcache) ----
_lib.define(f"decode_kvcache_options(Tensor q, Tensor k_cache, Tensor v_cache, Tensor? cache_seqlens, "
            f"Tensor? page_table, bool causal, float scale, int num_splits, bool return_lse, {_OPTIONS}, int route, "
            "Tensor? cache_leftpad=None) -> (Tensor, Tensor)")
_lib.define(f"decode_kvcache_options_backward(Tensor grad_out, Tensor? grad_lse, Tensor q, Tensor k_cache, "
            f"Tensor v_cache, Tensor? cache_seqlens, Tensor? page_table, bool causal, float scale, {_OPTIONS}, "
            "Tensor? cache_leftpad=None) -> (Tensor, Tensor, Tensor, Tensor)")


def _decode_impl(q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, num_splits, return_lse, window_left,
                 window_right, softcap, sinks, route, cache_leftpad=None):
    r = _ROUTES[route]
    return r.owner.run_decode(r, q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, num_splits,
                              return_lse, options=_options(window_left, window_right, softcap, sinks),
                              cache_leftpad=cache_leftpad)


def _decode_backward_impl(grad_out, grad_lse, q, k_cache, v_cache, cache_seqlens, page_table, causal, scale,
                          window_left, window_right, softcap, sinks, cache_leftpad=None):
    def forward(q, k_cache, v_cache, s):
        return decode_reference(q, k_cache, v_cache, cache_seqlens, page_table, causal, scale,
                                _options(window_left, window_right, softcap, s), cache_leftpad)

    return _gradients(forward, (grad_out, grad_lse), (q, k_cache, v_cache), sinks)


_lib.impl("decode_kvcache_options", _decode_impl, "CompositeExplicitAutograd")
_lib.impl("decode_kvcache_options_backward", _decode_backward_impl, "CompositeExplicitAutograd")


@torch.library.register_fake(f"{NAMESPACE}::decode_kvcache_options", lib=_lib)
def _decode_fake(q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, num_splits, return_lse, window_left,
                 window_right, softcap, sinks, route, cache_leftpad=None):
    return decode_fake(q, v_cache, return_lse)


@torch.library.register_fake(f"{NAMESPACE}::decode_kvcache_options_backward", lib=_lib)
def _decode_backward_fake(grad_out, grad_lse, q, k_cache, v_cache, cache_seqlens, page_table, causal, scale,
                          window_left, window_right, softcap, sinks, cache_leftpad=None):
    return _gradients_fake(q, k_cache, v_cache, sinks)


def _decode_setup(ctx, inputs, output):
    q, k_cache, v_cache, lens, table, causal, scale, _, return_lse, window_left, window_right, softcap, sinks, _ = \
        inputs[:14]
    leftpad = inputs[14] if len(inputs) > 14 else None
    ctx.save_for_backward(q, k_cache, v_cache, lens, table, sinks, leftpad)
    ctx.args = (causal, scale, window_left, window_right, softcap)
    ctx.return_lse = return_lse


def _decode_backward(ctx, grad_out, grad_lse):
    q, k_cache, v_cache, lens, table, sinks, leftpad = ctx.saved_tensors
    causal, scale, left, right, softcap = ctx.args
    dq, dk, dv, dsinks = torch.ops.attn_tuner.decode_kvcache_options_backward(
        grad_out, grad_lse if ctx.return_lse else None, q, k_cache, v_cache, lens, table, causal, scale, left, right,
        softcap, sinks, leftpad)
    return (dq, dk, dv) + (None,) * 9 + ((dsinks if sinks is not None else None), None, None)


torch.library.register_autograd(f"{NAMESPACE}::decode_kvcache_options", _decode_backward,
                                setup_context=_decode_setup, lib=_lib)
decode_kvcache_options_op = torch.ops.attn_tuner.decode_kvcache_options.default


def _direct(q, k, v, sinks) -> bool:
    """Whether nothing observes the call, its sinks included (a trained sink parameter needs the op's autograd)."""
    return nothing_observes(q, k, v) and not (sinks is not None and torch.is_grad_enabled() and sinks.requires_grad)


def launch_options(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, options: ModelOptions, route: int,
                   attn_mask: Tensor | None = None) -> Tensor:
    """The options op, or its route directly when nothing observes the call."""
    if _direct(q, k, v, options.sinks):
        r = _ROUTES[route]
        return r.owner.run_options(r, q, k, v, attn_mask, causal, scale, options)
    return attention_options_op(q, k, v, attn_mask, causal, scale, options.window[0], options.window[1],
                                options.softcap, options.sinks, route)


def launch_varlen_options(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, causal: bool,
                          scale: float, options: ModelOptions, route: int) -> Tensor:
    """The packed options op, or its route directly when nothing observes the call."""
    if _direct(q, k, v, options.sinks):
        r = _ROUTES[route]
        return r.owner.run_varlen(r, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                                  max_seqlen_k, causal, scale, options)
    return varlen_attention_options_op(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                                       causal, scale, options.window[0], options.window[1], options.softcap,
                                       options.sinks, route)


def launch_paged_options(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q, max_seqlen_k,
                         causal: bool, scale: float, options: ModelOptions, route: int) -> Tensor:
    """The paged options op, or its route directly when nothing observes the call."""
    if _direct(q, k_cache, v_cache, options.sinks):
        r = _ROUTES[route]
        return r.owner.run_paged(r, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q,
                                 max_seqlen_k, causal, scale, options)
    return paged_attention_options_op(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q,
                                      max_seqlen_k, causal, scale, options.window[0], options.window[1],
                                      options.softcap, options.sinks, route)


def launch_decode_options(q, k_cache, v_cache, cache_seqlens, page_table, causal: bool, scale: float,
                          num_splits: int, return_lse: bool, options: ModelOptions, route: int, out=None,
                          cache_leftpad=None):
    """(out, lse) of the decode options op, or of its route directly when nothing observes the call (then ``out``,
    when given, is written by the kernel itself; through the op it is filled from the op's fresh output)."""
    if _direct(q, k_cache, v_cache, options.sinks):
        r = _ROUTES[route]
        return r.owner.run_decode(r, q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, num_splits,
                                  return_lse, out, options, cache_leftpad)
    res, lse = decode_kvcache_options_op(q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, num_splits,
                                         return_lse, options.window[0], options.window[1], options.softcap,
                                         options.sinks, route, cache_leftpad)
    if out is not None:
        out.copy_(res)
        res = out
    return res, lse
