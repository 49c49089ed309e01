"""V (batch, keys, heads, d) -> (batch, heads, d, keys rounded up) for the FP8 kernels (tuner/serving/launch/plan.py
transposed_v), and packed sequences' V (total keys, heads, d) -> (1, heads, d, keys) with each sequence from an
aligned key and zeros between (transposed_packed_v), each as one Triton kernel on CUDA tensors.

torch's copy of a permuted 1-byte tensor moves a byte per thread access: on an H200 (BENCHMARKS.md, FP8 dense prefill) it cost
the FP8 d128 kernel 852 -> 796 TFLOPS at 16k keys and 711 -> 367 at 1k. A tile here loads 64 keys x 64 columns as
rows of 64 bytes and stores them transposed as rows of 64 keys. Triton ships with CUDA builds of torch and is imported
only here, on first use; without it (or on the CPU) plan.transposed_v copies with torch.
"""
from __future__ import annotations

import functools

TILE = 64


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def transpose_v(src, dst, keys, heads, s_b, s_s, s_h, d_b, d_h, d_d, D: tl.constexpr, T: tl.constexpr):
        pid_s, pid_d, pid_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        b = pid_bh // heads
        h = pid_bh % heads
        s = pid_s * T + tl.arange(0, T)
        d = pid_d * T + tl.arange(0, T)
        keep = (s[:, None] < keys) & (d[None, :] < D)
        tile = tl.load(src + b.to(tl.int64) * s_b + s[:, None].to(tl.int64) * s_s + h * s_h + d[None, :],
                       mask=keep)
        out = dst + b.to(tl.int64) * d_b + h.to(tl.int64) * d_h + d[None, :].to(tl.int64) * d_d + s[:, None]
        tl.store(out, tile, mask=keep)

    return transpose_v


@functools.cache
def _packed_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def transpose_packed_v(src, dst, cu, batch, keys_t, s_s, s_h, d_h, d_d, D: tl.constexpr, T: tl.constexpr,
                           A: tl.constexpr, STEPS: tl.constexpr):
        # a tile of V^T columns: each column's sequence by a binary search over the aligned starts
        # (align x ceil(cu[b] / align) + align x b, strictly increasing in b), its key, or a zero in a gap
        pid_c, pid_d, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        c = pid_c * T + tl.arange(0, T)
        d = pid_d * T + tl.arange(0, T)
        lo = tl.zeros([T], dtype=tl.int32)
        hi = tl.zeros([T], dtype=tl.int32) + batch
        for _ in tl.static_range(STEPS):
            mid = (lo + hi) // 2
            go = hi - lo > 1
            at = (tl.load(cu + mid, mask=go, other=0) + A - 1) // A * A + A * mid
            lo = tl.where(go & (at <= c), mid, lo)
            hi = tl.where(go & (at > c), mid, hi)
        first = tl.load(cu + lo)
        key = first + c - ((first + A - 1) // A * A + A * lo)
        valid = (key >= first) & (key < tl.load(cu + lo + 1))
        tile = tl.load(src + key[:, None].to(tl.int64) * s_s + h * s_h + d[None, :],
                       mask=valid[:, None] & (d[None, :] < D), other=0)
        out = dst + h.to(tl.int64) * d_h + d[None, :].to(tl.int64) * d_d + c[:, None]
        tl.store(out, tile, mask=(c[:, None] < keys_t) & (d[None, :] < D))

    return transpose_packed_v


def transpose_packed_into(buf, v, cu_seqlens_k, batch: int, align: int) -> bool:
    """Write packed V (total keys, heads, d) into ``buf`` (1, heads, d, keys) transposed, sequence b's keys from
    column align x ceil(cu_seqlens_k[b] / align) + align x b and zeros elsewhere (tuner/serving/launch/plan.py
    transposed_packed_v), in one launch; False when Triton is not there."""
    try:
        kernel = _packed_kernel()
    except ImportError:
        return False
    import torch

    _, h, d, keys = buf.shape
    src, dst = v.view(torch.uint8), buf.view(torch.uint8)
    grid = (-(-keys // TILE), -(-d // TILE), h)
    kernel[grid](src, dst, cu_seqlens_k, batch, keys, v.stride(0), v.stride(1), buf.stride(1), buf.stride(2), D=d,
                 T=TILE, A=align, STEPS=max(1, (batch - 1).bit_length()))
    return True


def transpose_into(buf, v) -> bool:
    """Write V (batch, keys, heads, d) into ``buf`` (batch, heads, d, >= keys) transposed; False when Triton is not
    there (the caller copies with torch)."""
    try:
        kernel = _kernel()
    except ImportError:
        return False
    import torch

    b, sk, h, d = v.shape
    if sk == 0 or b * h == 0:
        return True
    src, dst = v.view(torch.uint8), buf.view(torch.uint8)
    grid = (-(-sk // TILE), -(-d // TILE), b * h)
    kernel[grid](src, dst, sk, h, v.stride(0), v.stride(1), v.stride(2), buf.stride(0), buf.stride(1), buf.stride(2),
                 D=d, T=TILE)
    return True
