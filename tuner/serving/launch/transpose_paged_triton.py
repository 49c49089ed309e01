"""A paged cache's V (pages, page_size, heads, d) -> the packed V^T (1, heads, d, keys) of an FP8 paged call
(tuner/serving/launch/paged_vt.py transposed_paged_v), read through the page table, in one Triton launch.

``vt_column_key`` is the only place here that maps a V^T column to its sequence and key (the layout of
attn_sm90::packed_vt_key0): a change of the key order within a sequence's columns is made there, and alike in the
packed kernel of transpose_triton.py and plan.transposed_packed_v, whose V^T this one must equal for the same keys
(tests/test_runtime_fp8_paged.py on the CPU, tests/gpu/test_fp8_paged_gpu.py for the two Triton kernels). Triton ships with CUDA
builds of torch and is imported only here, on first use; without it (or on the CPU) paged_vt gathers with torch.
"""
from __future__ import annotations

import functools

TILE = 64


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def vt_column_key(c, cu, batch, A: tl.constexpr, STEPS: tl.constexpr):
        # sequence b's columns start at A x ceil(cu[b] / A) + A x b (strictly increasing in b): a binary search finds
        # a column's sequence, then its key within it, valid where that is one of the sequence's keys
        lo = tl.zeros_like(c)
        hi = tl.zeros_like(c) + batch
        for _ in tl.static_range(STEPS):
            mid = (lo + hi) // 2
            go = hi - lo > 1
            at = (tl.load(cu + mid, mask=go, other=0) + A - 1) // A * A + A * mid
            lo = tl.where(go & (at <= c), mid, lo)
            hi = tl.where(go & (at > c), mid, hi)
        first = tl.load(cu + lo)
        key = c - ((first + A - 1) // A * A + A * lo)
        valid = (key >= 0) & (key < tl.load(cu + lo + 1) - first)
        return lo, key, valid

    @triton.jit
    def transpose_paged_v(src, dst, table, cu, batch, keys_t, page_size, t_b, s_p, s_r, s_h, d_h, d_d,
                          D: tl.constexpr, T: tl.constexpr, A: tl.constexpr, STEPS: tl.constexpr):
        pid_c, pid_d, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        c = pid_c * T + tl.arange(0, T)
        d = pid_d * T + tl.arange(0, T)
        seq, key, valid = vt_column_key(c, cu, batch, A, STEPS)
        key = tl.where(valid, key, 0)
        page = tl.load(table + seq.to(tl.int64) * t_b + key // page_size, mask=valid, other=0)
        row = page.to(tl.int64) * s_p + (key % page_size).to(tl.int64) * s_r + h * s_h
        tile = tl.load(src + row[:, None] + d[None, :], mask=valid[:, None] & (d[None, :] < D), other=0)
        out = dst + h.to(tl.int64) * d_h + d[None, :].to(tl.int64) * d_d + c[:, None]
        tl.store(out, tile, mask=(c[:, None] < keys_t) & (d[None, :] < D))

    return transpose_paged_v


def transpose_paged_into(buf, v_cache, page_table, starts, batch: int, align: int) -> bool:
    """Write the V^T of a paged call into ``buf`` (1, heads, d, keys): sequence b's keys (its pages' rows in table
    order) from column align x ceil(starts[b] / align) + align x b, zeros elsewhere; False when Triton is not there."""
    try:
        kernel = _kernel()
    except ImportError:
        return False
    import torch

    _, h, d, keys = buf.shape
    src, dst = v_cache.view(torch.uint8), buf.view(torch.uint8)
    grid = (-(-keys // TILE), -(-d // TILE), h)
    kernel[grid](src, dst, page_table, starts, batch, keys, v_cache.shape[1], page_table.stride(0), v_cache.stride(0),
                 v_cache.stride(1), v_cache.stride(2), buf.stride(1), buf.stride(2), D=d, T=TILE, A=align,
                 STEPS=max(1, (batch - 1).bit_length()))
    return True
