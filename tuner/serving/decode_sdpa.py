"""Decode over a KV cache in plain torch: the fallback of ``flash_attn_with_kvcache`` and the recompute of its
backward.

``flash_attn_with_kvcache``'s conventions: q (b, seqlen_q, hq, d_qk); the cache paged (num_pages, page_size,
hkv, d) with ``page_table`` (b, max_pages) int32, or dense (b, seqlen_cache, hkv, d); sequence b's keys are the
first ``cache_seqlens[b]`` rows of its pages in table order (of its cache row, dense), all of them when
``cache_seqlens`` is None; causal aligns bottom-right (the queries are the last ``seqlen_q`` of those keys:
query i sees keys j <= i + cache_seqlens[b] - seqlen_q). Query head h reads KV head h // (hq / hkv).
``cache_leftpad`` (b,) (FA2's, a dense cache): sequence b's keys are rows [cache_leftpad[b], cache_seqlens[b]); the
causal diagonal and a window, aligned to the last key, stay where they are in cache rows, so the leftpad only hides
the rows before it (a leftpad at or past the length leaves no key: 0 and -inf).

Everything stays on the device and nothing is read back (no synchronisation: a CUDA graph captures the
fallback as well as the kernel). The pages are gathered into a dense (b, capacity, hkv, d) copy (table
entries past a sequence's pages may hold anything: they are clamped into the cache, and their rows lie past
``cache_seqlens``), rows past a sequence's length are zeroed (a NaN in an unused row or page never reaches the
output), then softmax(Q Kᵀ · scale) V in fp32 with the mask. Memory: b · hq · seqlen_q · capacity fp32 scores;
this is a fallback, not a fast path. A row that sees no key gives 0 and a log-sum-exp of -inf, as the kernel.
Model options (a sliding window aligned to each sequence's length, soft-capping, sinks that join each row's max,
denominator and log-sum-exp) go through the masking and softmax of tuner/serving/options.py, the prefill
reference's own.

``decode_gradients`` is the backward written out (P = softmax(S); dV = Pᵀ dO; dS = P ∘ (dO Vᵀ − rowsum(P ∘ dO Vᵀ)
+ dLSE); dQ = dS K · scale; dK = dSᵀ Q · scale), with the paged K/V gradients summed back into the pages they came
from: it needs no autograd (the op's backward runs where autograd does not record). It covers calls without
options; the options op (tuner/serving/op_options.py) differentiates ``decode_reference`` by autograd instead.
"""
from __future__ import annotations

import math

import torch

from tuner.serving.kvcache_fp8 import E4M3, dequantise
from tuner.serving.options import NO_WINDOW, PLAIN, ModelOptions, capped, softmax_rows, visible
from tuner.serving.paged_sdpa import _rows


def _gather(k_cache, v_cache, page_table):
    """(k, v) dense (b, capacity, hkv, d) and the cache rows they came from (None for a dense cache). An e4m3 cache
    is gathered as its bytes."""
    if page_table is None:
        return k_cache, v_cache, None
    if k_cache.dtype == E4M3:
        k, v, rows = _gather(k_cache.view(torch.uint8), v_cache.view(torch.uint8), page_table)
        return k.view(E4M3), v.view(E4M3), rows
    num_pages, page_size = int(k_cache.shape[0]), int(k_cache.shape[1])
    rows = _rows(page_table, num_pages, page_size)
    b, capacity = page_table.shape[0], page_table.shape[1] * page_size
    k = k_cache.reshape(-1, *k_cache.shape[2:]).index_select(0, rows).view(b, capacity, *k_cache.shape[2:])
    v = v_cache.reshape(-1, *v_cache.shape[2:]).index_select(0, rows).view(b, capacity, *v_cache.shape[2:])
    return k, v, rows


def _masks(q, capacity: int, cache_seqlens, causal: bool, window=NO_WINDOW, cache_leftpad=None):
    """(used (b, capacity): the keys each sequence has, visible (b, seqlen_q, capacity): those each row sees)."""
    b, sq = q.shape[0], q.shape[1]
    if cache_seqlens is None:
        lens = torch.full((b,), capacity, dtype=torch.long, device=q.device)
    else:
        lens = cache_seqlens.long().clamp(0, capacity)
    cols = torch.arange(capacity, device=q.device)[None, :]
    used = cols < lens[:, None]
    seen = visible(sq, capacity, causal, window, q.device, seqlens=lens)
    if cache_leftpad is not None:
        used = used & (cols >= cache_leftpad.long()[:, None])
        seen = seen & used[:, None, :]
    return used, seen


def _probabilities(q, k, visible, scale: float, softcap: float = 0.0, sinks=None):
    """(P (b, hkv, g, sq, cap) fp32, lse (b, hkv, g, sq) fp32) of the scores (soft-capped, the sinks (hq,) joined:
    tuner/serving/options.py); rows seeing no key and no sink: 0, -inf."""
    b, sq, hq, d = q.shape
    hkv = k.shape[2]
    qf = q.float().reshape(b, sq, hkv, hq // hkv, d)
    s = capped(torch.einsum("bihgd,bjhd->bhgij", qf, k.float()) * scale, softcap)
    s = s.masked_fill(~visible[:, None, None], float("-inf"))
    sink = None if sinks is None else sinks.float().view(1, hkv, hq // hkv, 1, 1)
    return softmax_rows(s, sink)


def _zero_unused(t, used):
    return torch.where(used[:, :, None, None], t, torch.zeros((), dtype=t.dtype, device=t.device))


def decode_reference(q, k_cache, v_cache, cache_seqlens=None, page_table=None, causal: bool = False,
                     softmax_scale: float | None = None, options: ModelOptions = PLAIN, cache_leftpad=None,
                     kv_scales=None):
    """(out (b, seqlen_q, hq, d_v) in q's dtype, lse (b, hq, seqlen_q) fp32 natural log, the sinks included).
    ``options``: a window (aligned to each sequence's length), a cap, sinks (tuner/serving/options.py);
    ``cache_leftpad``: the module doc; ``kv_scales`` (k_scale, v_scale): an e4m3 cache's, its gathered rows
    dequantised in fp32 (tuner/serving/kvcache_fp8.py). Differentiable, also in the sinks."""
    b, sq, hq, d = q.shape
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    k, v, _ = _gather(k_cache, v_cache, page_table)
    if kv_scales is not None:
        k, v = dequantise(k, kv_scales[0]), dequantise(v, kv_scales[1])
    used, visible = _masks(q, k.shape[1], cache_seqlens, causal, options.window, cache_leftpad)
    k, v = _zero_unused(k, used), _zero_unused(v, used)
    p, lse = _probabilities(q, k, visible, scale, options.softcap, options.sinks)
    out = torch.einsum("bhgij,bjhd->bihgd", p, v.float()).reshape(b, sq, hq, v.shape[3])
    return out.to(q.dtype), lse.reshape(b, hq, sq)


def decode_gradients(grad_out, grad_lse, q, k_cache, v_cache, cache_seqlens, page_table, causal: bool,
                     softmax_scale: float, cache_leftpad=None):
    """(dq, dk_cache, dv_cache) of ``decode_reference`` (``grad_lse`` None: the lse was not used); rows no
    sequence sees (a leftpad's among them) get zero gradients."""
    b, sq, hq, d = q.shape
    k, v, rows = _gather(k_cache, v_cache, page_table)
    hkv, dv_dim = k.shape[2], v.shape[3]
    g = hq // hkv
    used, visible = _masks(q, k.shape[1], cache_seqlens, causal, NO_WINDOW, cache_leftpad)
    kf, vf = _zero_unused(k, used).float(), _zero_unused(v, used).float()
    p, _ = _probabilities(q, kf, visible, softmax_scale)
    do = grad_out.float().reshape(b, sq, hkv, g, dv_dim)
    dv = torch.einsum("bhgij,bihgd->bjhd", p, do)
    dp = torch.einsum("bihgd,bjhd->bhgij", do, vf)
    ds = p * (dp - (p * dp).sum(dim=-1, keepdim=True))
    if grad_lse is not None:
        ds = ds + p * grad_lse.float().reshape(b, hkv, g, sq)[..., None]
    qf = q.float().reshape(b, sq, hkv, g, d)
    dq = (torch.einsum("bhgij,bjhd->bihgd", ds, kf) * softmax_scale).reshape(q.shape)
    dk = torch.einsum("bhgij,bihgd->bjhd", ds, qf) * softmax_scale
    if rows is not None:
        dk = torch.zeros(k_cache.shape[0] * k_cache.shape[1], *k_cache.shape[2:], dtype=torch.float32,
                         device=k_cache.device).index_add_(0, rows, dk.reshape(-1, *dk.shape[2:])).view(k_cache.shape)
        dv = torch.zeros(v_cache.shape[0] * v_cache.shape[1], *v_cache.shape[2:], dtype=torch.float32,
                         device=v_cache.device).index_add_(0, rows, dv.reshape(-1, *dv.shape[2:])).view(v_cache.shape)
    return dq.to(q.dtype), dk.to(k_cache.dtype), dv.to(v_cache.dtype)
