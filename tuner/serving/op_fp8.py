"""The custom op of FP8 calls (e4m3 q, k, v with FlashAttention-3's descales), beside the plain ops of
tuner/serving/op.py and routed the same way:

``attn_tuner::attention_fp8(q, k, v, q_descale, k_descale, v_descale, causal, scale, route) -> out``: q (b, sq, hq, d),
k/v (b, sk, hkv, d) float8_e4m3fn, each descale fp32 (b, hkv) (a value stands for value x its (batch, KV head)
descale) -> out (b, sq, hq, d) bf16. The route runs an exported FP8 kernel, or the fallback: torch SDPA on the
dequantised inputs in bf16 (counted by reason like every fallback).

``attn_tuner::varlen_attention_fp8(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
q_descale, k_descale, v_descale, causal, scale, route) -> out``: the same for packed sequences (flash_attn_varlen_func's
tensors), a descale per (sequence, KV head); the fallback is SDPA per sequence on the dequantised inputs.

``attn_tuner::paged_attention_fp8(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q,
max_seqlen_k, q_descale, k_descale, v_descale, causal, scale, route) -> out``: packed e4m3 q over an e4m3 paged cache
(flash_attn_varlen_func with a block table), a descale per (sequence, KV head); the fallback gathers each sequence's
pages, dequantises them with its descales and runs SDPA per sequence.

FP8 attention here is inference: e4m3 tensors take no gradient in torch, and the op's backward says so instead of
returning nothing.
"""
from __future__ import annotations

import torch
from torch import Tensor

from tuner.serving.op import _ROUTES, NAMESPACE, nothing_observes

_lib = torch.library.Library(NAMESPACE, "FRAGMENT")
_lib.define("attention_fp8(Tensor q, Tensor k, Tensor v, Tensor q_descale, Tensor k_descale, Tensor v_descale, "
            "bool causal, float scale, int route) -> Tensor")


def run_fp8_route(route: int, q, k, v, q_descale, k_descale, v_descale, causal: bool, scale: float) -> Tensor:
    r = _ROUTES[route]
    return r.owner.run_fp8(r, q, k, v, q_descale, k_descale, v_descale, causal, scale)


def _attention_fp8(q, k, v, q_descale, k_descale, v_descale, causal, scale, route):
    return run_fp8_route(route, q, k, v, q_descale, k_descale, v_descale, causal, scale)


_lib.impl("attention_fp8", _attention_fp8, "CompositeExplicitAutograd")


@torch.library.register_fake(f"{NAMESPACE}::attention_fp8", lib=_lib)
def _attention_fp8_fake(q, k, v, q_descale, k_descale, v_descale, causal, scale, route):
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]), dtype=torch.bfloat16)


def _setup_context(ctx, inputs, output):
    pass


def _backward(ctx, grad_out):
    raise NotImplementedError("attn_tuner's FP8 op has no backward: FP8 (e4m3) attention is served for "
                              "inference; train in bf16/fp16")


torch.library.register_autograd(f"{NAMESPACE}::attention_fp8", _backward, setup_context=_setup_context, lib=_lib)

attention_fp8_op = torch.ops.attn_tuner.attention_fp8.default


def launch_fp8(q, k, v, q_descale, k_descale, v_descale, causal: bool, scale: float, route: int) -> Tensor:
    """The op, or the route itself when nothing observes the call (tuner/serving/op.py nothing_observes)."""
    if nothing_observes(q, k, v):
        return run_fp8_route(route, q, k, v, q_descale, k_descale, v_descale, causal, scale)
    return attention_fp8_op(q, k, v, q_descale, k_descale, v_descale, causal, scale, route)



_lib.define("varlen_attention_fp8(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
            "Tensor? seqused_k, SymInt max_seqlen_q, SymInt max_seqlen_k, Tensor q_descale, Tensor k_descale, "
            "Tensor v_descale, bool causal, float scale, int route) -> Tensor")


def run_varlen_fp8_route(route: int, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                         q_descale, k_descale, v_descale, causal: bool, scale: float) -> Tensor:
    r = _ROUTES[route]
    return r.owner.run_varlen_fp8(r, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                                  q_descale, k_descale, v_descale, causal, scale)


def _varlen_fp8(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, q_descale, k_descale,
                v_descale, causal, scale, route):
    return run_varlen_fp8_route(route, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                                q_descale, k_descale, v_descale, causal, scale)


_lib.impl("varlen_attention_fp8", _varlen_fp8, "CompositeExplicitAutograd")


@torch.library.register_fake(f"{NAMESPACE}::varlen_attention_fp8", lib=_lib)
def _varlen_fp8_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, q_descale,
                     k_descale, v_descale, causal, scale, route):
    return q.new_empty((q.shape[0], q.shape[1], v.shape[2]), dtype=torch.bfloat16)


torch.library.register_autograd(f"{NAMESPACE}::varlen_attention_fp8", _backward, setup_context=_setup_context,
                                lib=_lib)

varlen_attention_fp8_op = torch.ops.attn_tuner.varlen_attention_fp8.default


def launch_varlen_fp8(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, q_descale,
                      k_descale, v_descale, causal: bool, scale: float, route: int) -> Tensor:
    """The packed op, or the route itself when nothing observes the call."""
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, q_descale, k_descale,
            v_descale, causal, scale)
    if nothing_observes(q, k, v):
        return run_varlen_fp8_route(route, *args)
    return varlen_attention_fp8_op(*args, route)


_lib.define("paged_attention_fp8(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cu_seqlens_q, Tensor seqused_k, "
            "Tensor page_table, SymInt max_seqlen_q, SymInt max_seqlen_k, Tensor q_descale, Tensor k_descale, "
            "Tensor v_descale, bool causal, float scale, int route) -> Tensor")


def run_paged_fp8_route(route: int, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q,
                        max_seqlen_k, q_descale, k_descale, v_descale, causal: bool, scale: float) -> Tensor:
    r = _ROUTES[route]
    return r.owner.run_paged_fp8(r, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q,
                                 max_seqlen_k, q_descale, k_descale, v_descale, causal, scale)


def _paged_fp8(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q, max_seqlen_k, q_descale,
               k_descale, v_descale, causal, scale, route):
    return run_paged_fp8_route(route, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q,
                               max_seqlen_k, q_descale, k_descale, v_descale, causal, scale)


_lib.impl("paged_attention_fp8", _paged_fp8, "CompositeExplicitAutograd")


@torch.library.register_fake(f"{NAMESPACE}::paged_attention_fp8", lib=_lib)
def _paged_fp8_fake(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q, max_seqlen_k, q_descale,
                    k_descale, v_descale, causal, scale, route):
    return q.new_empty((q.shape[0], q.shape[1], v_cache.shape[3]), dtype=torch.bfloat16)


torch.library.register_autograd(f"{NAMESPACE}::paged_attention_fp8", _backward, setup_context=_setup_context,
                                lib=_lib)

paged_attention_fp8_op = torch.ops.attn_tuner.paged_attention_fp8.default


def launch_paged_fp8(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q, max_seqlen_k, q_descale,
                     k_descale, v_descale, causal: bool, scale: float, route: int) -> Tensor:
    """The paged FP8 op, or the route itself when nothing observes the call."""
    args = (q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q, max_seqlen_k, q_descale,
            k_descale, v_descale, causal, scale)
    if nothing_observes(q, k_cache, v_cache):
        return run_paged_fp8_route(route, *args)
    return paged_attention_fp8_op(*args, route)
