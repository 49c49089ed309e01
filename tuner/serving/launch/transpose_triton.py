"""V (batch, keys, heads, d) -> (batch, heads, d, keys rounded up) for the FP8 kernels (tuner/serving/launch/plan.py
transposed_v), as one Triton kernel on CUDA tensors.

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
