"""Launch facts of split-KV decode kernels that the host computes per call: the combine kernel's grid and the
absorbed-MLA layout (V read from K's rows)."""
from __future__ import annotations

import math

from kernel_abi.abi import ABI_VERSION
from kernel_abi.spec import MLA_ABSORBED_D_QK, MLA_ABSORBED_D_V, KernelSpec

# MLA decode is the absorbed form (DeepSeek-V3): q and the one latent KV head carry 512 latent + 64 rotary columns,
# and the values are the latent part of the same rows (FlashMLA's convention: v = k_cache[..., :512]).
MLA_DECODE_D_QK, MLA_DECODE_D_V = MLA_ABSORBED_D_QK, MLA_ABSORBED_D_V

COMBINE_WARPS = 4          # warps a combine CTA, each merging one 128-column slice of one row
COMBINE_SLICE_COLS = 128   # attn_decode.cuh kCombineSliceCols: columns of an output row one combine warp merges
COMBINE_WIDE_SPLITS = 16   # attn_decode.cuh kCombineWideSplits: from this many splits, a warp per slice of a row


def v_from_k(spec: KernelSpec) -> bool:
    """V is the first d_v columns of K's rows (absorbed MLA), read once with K: no V ring, no V gather."""
    return spec.variant == "mla" and spec.d_v < spec.d_qk


def combine_grid(rows: int, d_v: int, num_splits: int, abi: int = ABI_VERSION) -> int:
    """CTAs of the combine kernel for ``rows`` output rows of ``d_v`` columns: a warp per 128-column slice of a row
    with many splits (few rows: small batches), else a warp per row (the kernel's rule, attn_decode.cuh combine);
    kernels built before ABI 3 take a warp per row always."""
    slices = math.ceil(d_v / COMBINE_SLICE_COLS) if num_splits >= COMBINE_WIDE_SPLITS and abi >= 3 else 1
    return math.ceil(rows * slices / COMBINE_WARPS)
