"""V (batch, keys, heads, d) -> (batch, heads, d, keys rounded up) for the FP8 kernels (tuner/serving/launch/plan.py
transposed_v), packed sequences' V (total keys, heads, d) -> (1, heads, d, keys) with each sequence from an aligned
key and zeros between (transposed_packed_v), and a paged cache's V read through the page table into that packed
layout (tuner/serving/launch/paged_vt.py transposed_paged_v), each as one Triton kernel on CUDA tensors
(tuner/serving/launch/vt_kernels.py).

torch's copy of a permuted 1-byte tensor moves a byte per thread access: on an H200 (BENCHMARKS.md, FP8 dense prefill) it cost
the FP8 d128 kernel 852 -> 796 TFLOPS at 16k keys and 711 -> 367 at 1k. A tile here loads 64 keys x 64 columns as
rows of 64 bytes and stores them transposed as rows of 64 keys, each key at its column of the kernel's order
(plan.vt_column: "accumulator" permutes the keys within each 16; vt_key here is its inverse). Triton ships with
CUDA builds of torch and is imported only here, on first use; without it (or on the CPU) plan.transposed_v copies with torch.
"""
from __future__ import annotations

TILE = 64
# A paged call's V^T is as wide as its shapes allow (batch x the most keys a sequence can have: no host read of the
# lengths); the kernel reads a sequence's columns up to one key tile past its last key, and a key tile is at most a
# wgmma's N, 256. So the paged copy writes the columns up to 256 past the last sequence (+ the alignment gaps) and
# leaves the rest of the width unwritten: a skewed batch (1 x 8k + 32 x 256 keys, 33 x 8k wide) writes 1/16 of it.
READ_PAST_END = 256


def _kernel(name: str):
    """The jitted kernel ``name`` of vt_kernels; ImportError where Triton is not there."""
    from tuner.serving.launch import vt_kernels

    if vt_kernels.triton is None:
        raise ImportError("no Triton")
    return getattr(vt_kernels, name)


def transpose_packed_into(buf, v, cu_seqlens_k, batch: int, align: int, accumulator_order: bool = False) -> bool:
    """Write packed V (total keys, heads, d) into ``buf`` (1, heads, d, keys) transposed, sequence b's keys from
    column align x ceil(cu_seqlens_k[b] / align) + align x b (in accumulator order: plan.vt_column) and zeros
    elsewhere (tuner/serving/launch/plan.py transposed_packed_v), in one launch; False when Triton is not there."""
    try:
        kernel = _kernel("transpose_packed_v")
    except ImportError:
        return False
    import torch

    _, h, d, keys = buf.shape
    src, dst = v.view(torch.uint8), buf.view(torch.uint8)
    grid = (-(-keys // TILE), -(-d // TILE), h)
    kernel[grid](src, dst, cu_seqlens_k, batch, keys, v.stride(0), v.stride(1), buf.stride(1), buf.stride(2), D=d,
                 T=TILE, A=align, STEPS=search_steps(batch), ACC=accumulator_order)
    return True


def transpose_into(buf, v, columns: int | None = None, accumulator_order: bool = False) -> bool:
    """Write V (batch, keys, heads, d) into ``buf`` (batch, heads, d, >= ``columns``) transposed, columns 0 ..
    ``columns`` (default: the keys) each holding its key (in accumulator order: plan.vt_column) or zeros past the
    keys; False when Triton is not there (the caller copies with torch)."""
    try:
        kernel = _kernel("transpose_v")
    except ImportError:
        return False
    import torch

    b, sk, h, d = v.shape
    if sk == 0 or b * h == 0:
        return True
    src, dst = v.view(torch.uint8), buf.view(torch.uint8)
    columns = sk if columns is None else columns
    grid = (-(-columns // TILE), -(-d // TILE), b * h)
    kernel[grid](src, dst, sk, columns, h, v.stride(0), v.stride(1), v.stride(2), buf.stride(0), buf.stride(1),
                 buf.stride(2), D=d, T=TILE, ACC=accumulator_order)
    return True


def search_steps(batch: int) -> int:
    """The binary search's steps that find a column's sequence among ``batch`` (sequence_of_column)."""
    return max(1, (batch - 1).bit_length())


def transpose_paged_into(buf, v_cache, page_table, starts, batch: int, align: int,
                         accumulator_order: bool = False) -> bool:
    """Write the V^T of a paged call into ``buf`` (1, heads, d, keys): sequence b's keys (its pages' rows in table
    order) from column align x ceil(starts[b] / align) + align x b (in accumulator order: plan.vt_column), zeros
    between and for READ_PAST_END columns after the last sequence, the rest unwritten; False when Triton is not
    there."""
    if v_cache.data_ptr() % 16 or any(v_cache.stride(i) % 16 for i in range(3)):
        return False   # (the kernel loads V's rows 16 bytes at a time: torch's gather takes any other layout)
    try:
        kernel = _kernel("transpose_paged_v")
    except ImportError:
        return False
    import torch

    _, h, d, keys = buf.shape
    src, dst = v_cache.view(torch.uint8), buf.view(torch.uint8)
    grid = (-(-keys // TILE), h)
    kernel[grid](src, dst, page_table, starts, batch, keys, v_cache.shape[1], page_table.stride(0), v_cache.stride(0),
                 v_cache.stride(1), v_cache.stride(2), buf.stride(1), buf.stride(2), D=d, T=TILE, A=align,
                 STEPS=search_steps(batch), ACC=accumulator_order, PAST=READ_PAST_END)
    return True
