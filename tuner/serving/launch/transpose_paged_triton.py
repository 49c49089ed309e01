"""A paged cache's V (pages, page_size, heads, d) -> the packed V^T (1, heads, d, keys) of an FP8 paged call
(tuner/serving/launch/paged_vt.py transposed_paged_v), read through the page table, in one Triton launch
(tuner/serving/launch/vt_kernels.py transpose_paged_v: a column's sequence as the packed kernel finds it, its key in the
kernel's order by the same vt_key), so that it equals plan.transposed_packed_v of the same keys (tests/
test_runtime_fp8_paged.py on the CPU, tests/gpu/test_fp8_paged_gpu.py for the two Triton kernels). Without Triton (or
on the CPU) paged_vt gathers with torch.
"""
from __future__ import annotations

TILE = 64


def _kernel():
    from tuner.serving.launch import vt_kernels

    if vt_kernels.triton is None:
        raise ImportError("no Triton")
    return vt_kernels.transpose_paged_v


def transpose_paged_into(buf, v_cache, page_table, starts, batch: int, align: int,
                         accumulator_order: bool = False) -> bool:
    """Write the V^T of a paged call into ``buf`` (1, heads, d, keys): sequence b's keys (its pages' rows in table
    order) from column align x ceil(starts[b] / align) + align x b (in accumulator order: plan.vt_column), zeros
    elsewhere; False when Triton is not there."""
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
                 STEPS=max(1, (batch - 1).bit_length()), ACC=accumulator_order)
    return True
