"""A paged KV cache through torch SDPA: the fallback of paged calls and the recompute of their backward.

The cache is ``(num_pages, page_size, kv_heads, head_dim)``; ``page_table`` (batch, pages per sequence)
names sequence b's pages in order, its ``seqused_k[b]`` keys are the first rows of those pages. The pages
are gathered on the device into packed K/V of fixed size, ``pages per sequence x page_size`` rows a
sequence (no host read: table entries past a sequence's pages may hold anything, they are clamped into the
cache and their rows lie past ``seqused_k``), then ``varlen_sdpa`` runs as for packed sequences (it reads the
lengths on the host). Gradients go back the same way: ``varlen_gradients`` of the packed K/V, summed into
the pages they came from (a page two sequences share gets both contributions).
"""
from __future__ import annotations

from tuner.serving.sdpa import varlen_gradients, varlen_sdpa


def _rows(page_table, num_pages: int, page_size: int):
    """The cache row (page * page_size + offset) of every packed row, (batch * pages * page_size,), int64."""
    import torch

    pages = page_table.long().clamp(0, max(0, num_pages - 1))
    offsets = torch.arange(page_size, device=page_table.device)
    return (pages[:, :, None] * page_size + offsets).reshape(-1)


def gather_pages(k_cache, v_cache, page_table):
    """(k, v, cu_seqlens_k): each sequence's pages in table order, packed; ``cu_seqlens_k`` int32 steps of
    ``pages per sequence x page_size``. On the device, no synchronisation."""
    import torch

    num_pages, page_size = int(k_cache.shape[0]), int(k_cache.shape[1])
    rows = _rows(page_table, num_pages, page_size)
    k = k_cache.reshape(-1, *k_cache.shape[2:]).index_select(0, rows)
    v = v_cache.reshape(-1, *v_cache.shape[2:]).index_select(0, rows)
    span = page_table.shape[1] * page_size
    cu = torch.arange(0, (page_table.shape[0] + 1) * span, span, dtype=torch.int32, device=page_table.device)
    return k, v, cu


def check_used(seqused_k, page_table, page_size: int) -> None:
    """Keys past a sequence's pages are not in the cache: ValueError (the lengths are read on the host, as
    varlen_sdpa reads them anyway)."""
    capacity = page_table.shape[1] * page_size
    used = seqused_k.tolist()
    bad = [(b, n) for b, n in enumerate(used) if n < 0 or n > capacity]
    if bad:
        b, n = bad[0]
        raise ValueError(f"seqused_k[{b}] = {n}: a sequence's keys must fit its {page_table.shape[1]} pages of "
                         f"{page_size} rows (0..{capacity})")


def paged_sdpa(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, causal: bool = False,
               softmax_scale: float | None = None):
    """Packed q (total_q, hq, d) over a paged cache -> (total_q, hq, d_v), bottom-right causal within each
    sequence (its queries are the last of its ``seqused_k`` keys). Differentiable."""
    check_used(seqused_k, page_table, int(k_cache.shape[1]))
    k, v, cu_k = gather_pages(k_cache, v_cache, page_table)
    return varlen_sdpa(q, k, v, cu_seqlens_q, cu_k, seqused_k, causal, softmax_scale)


def paged_gradients(grad_out, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, causal: bool,
                    softmax_scale: float):
    """(dq, dk_cache, dv_cache) of ``paged_sdpa``: rows no sequence uses get zero gradients."""
    import torch

    check_used(seqused_k, page_table, int(k_cache.shape[1]))
    k, v, cu_k = gather_pages(k_cache, v_cache, page_table)
    dq, dk, dv = varlen_gradients(grad_out, q, k, v, cu_seqlens_q, cu_k, seqused_k, causal, softmax_scale)
    rows = _rows(page_table, int(k_cache.shape[0]), int(k_cache.shape[1]))
    dk_cache = torch.zeros(k_cache.shape[0] * k_cache.shape[1], *k_cache.shape[2:], dtype=torch.float32,
                           device=k_cache.device).index_add_(0, rows, dk.float())
    dv_cache = torch.zeros(v_cache.shape[0] * v_cache.shape[1], *v_cache.shape[2:], dtype=torch.float32,
                           device=v_cache.device).index_add_(0, rows, dv.float())
    return dq, dk_cache.view(k_cache.shape).to(k_cache.dtype), dv_cache.view(v_cache.shape).to(v_cache.dtype)
