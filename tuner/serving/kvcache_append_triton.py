"""The cache write of ``flash_attn_with_kvcache``'s append as one Triton kernel, for eager calls on CUDA.

In eager mode every small torch op costs 20-37 µs of host time on the H100 machine (BENCHMARKS.md
2026-11-27), and the write in torch ops takes eight (positions, page lookup, flat rows, two ``index_copy_``, the
new lengths): one launch here does all of it. kvcache_append.py uses it only for eager CUDA calls (not while
compiling, where Inductor fuses the torch ops itself); Triton ships with CUDA builds of torch and is imported only
here, on first use. ``ATTN_TUNER_APPEND_TRITON=0`` keeps eager calls on the torch ops too.

Each program copies one new row (all KV heads) of k and of v into the cache: dense at (batch, row), paged at (the
table's page for the row, row % page size); the first row of a sequence also writes its new length.
"""
from __future__ import annotations

import functools
import os

import torch


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def append_rows(k_cache, v_cache, k_new, v_new, lens, table, lens_out,
                    kc_b, kc_r, kc_h, vc_b, vc_r, vc_h, kn_b, kn_s, kn_h, vn_b, vn_s, vn_h, table_b, table_c,
                    seqlen_new, page_size, heads,
                    D_K: tl.constexpr, D_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
                    PAGED: tl.constexpr, WITH_V: tl.constexpr):
        pid = tl.program_id(0)
        b = pid // seqlen_new
        i = pid % seqlen_new
        length = tl.load(lens + b).to(tl.int64)
        pos = length + i
        if PAGED:
            first = tl.load(table + b * table_b + (pos // page_size) * table_c).to(tl.int64)
            second = pos % page_size
        else:
            first = b.to(tl.int64)
            second = pos
        ok = tl.arange(0, BLOCK_K)
        ov = tl.arange(0, BLOCK_V)
        for h in range(heads):
            row = tl.load(k_new + b * kn_b + i * kn_s + h * kn_h + ok, mask=ok < D_K)
            tl.store(k_cache + first * kc_b + second * kc_r + h * kc_h + ok, row, mask=ok < D_K)
            if WITH_V:
                row_v = tl.load(v_new + b * vn_b + i * vn_s + h * vn_h + ov, mask=ov < D_V)
                tl.store(v_cache + first * vc_b + second * vc_r + h * vc_h + ov, row_v, mask=ov < D_V)
        if i == 0:
            tl.store(lens_out + b, (length + seqlen_new).to(tl.int32))

    return append_rows, triton.next_power_of_2


def usable(k_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None) -> bool:
    """An eager CUDA call whose cache and new rows have contiguous head dims, nothing to differentiate (the
    kernel's write is not recorded by autograd), with Triton installed."""
    if not (k_cache.is_cuda and k_cache.stride(-1) == 1 and k.stride(-1) == 1) or torch.compiler.is_compiling():
        return False
    if os.environ.get("ATTN_TUNER_APPEND_TRITON", "1") == "0":   # the torch ops instead (a way around Triton)
        return False
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (k_cache, k, v)):
        return False
    try:
        _kernel()
    except ImportError:
        return False
    return True


def write_rows(k_cache, v_cache, k, v, cache_seqlens, page_table) -> torch.Tensor:
    """Write k (and v, unless None) at rows cache_seqlens[b] + i of the caches; returns cache_seqlens + seqlen_new
    (int32). The rows must lie inside the cache (kvcache_append.room_errors checks that, where it may read)."""
    kernel, next_pow2 = _kernel()
    b, seqlen_new, heads = k.shape[0], k.shape[1], k.shape[2]
    with_v = v is not None
    if with_v and v.stride(-1) != 1:
        v = v.contiguous()
    vc, vn = (v_cache, v) if with_v else (k_cache, k)     # placeholders the kernel never touches without v
    lens = cache_seqlens.to(torch.int32).contiguous()    # the caller's are int32 and contiguous: no copy
    lens_out = torch.empty_like(lens)
    table = page_table if page_table is not None else lens
    kernel[(b * seqlen_new,)](
        k_cache, vc, k, vn, lens, table, lens_out,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), vc.stride(0), vc.stride(1), vc.stride(2),
        k.stride(0), k.stride(1), k.stride(2), vn.stride(0), vn.stride(1), vn.stride(2),
        table.stride(0) if page_table is not None else 0, table.stride(1) if page_table is not None else 0,
        seqlen_new, k_cache.shape[1], heads,
        D_K=k.shape[3], D_V=vn.shape[3], BLOCK_K=next_pow2(k.shape[3]), BLOCK_V=next_pow2(vn.shape[3]),
        PAGED=page_table is not None, WITH_V=with_v)
    return lens_out
