"""Which page sizes a paged kernel can read, and `--page-size` on the command line.

A paged kernel takes its page size at run time (the cache's shape), so one cubin serves every page size its
K/V copy can read. A TMA producer (g2s_atom SM90_TMA) reads a K/V tile as boxes of min(block N, page size) rows,
each box within one page, so a page must divide the tile (several boxes a tile) or be a multiple of it (several
tiles a page). The indexed producer (cp.async, attn_sm90_copy.cuh cp_async_load_paged) looks pages up itself, once
per 8 rows: any multiple of 8.
`--page-size` on `tune build` checks one size against the kernel before compiling; on `tune bench` it picks
the cache's page size.
"""
from __future__ import annotations

from typing import Optional

from kernel_abi.abi import TMA_KV
from tuner.serving.buckets.serving import PAGE_SIZES, page_size_problem

RULE = ("the page size must divide block N or be a multiple of it (a K/V tile is read as whole TMA boxes of "
        "min(block N, page size) rows, each within one page)")


def kv_copy_of(meta: dict) -> str:
    """The g2s_atom of a loaded kernel (its meta sidecar); TMA for sidecars from before the choice existed."""
    return meta.get("params", {}).get("g2s_atom", TMA_KV)


def page_misfit(page_size: int, block_n: int, g2s_atom: str = TMA_KV) -> Optional[str]:
    """Why a kernel of ``block_n`` whose producer copies with ``g2s_atom`` cannot read pages of ``page_size``
    keys; None when it can."""
    if g2s_atom != TMA_KV:
        if page_size >= 8 and page_size % 8 == 0:
            return None
        return (f"page size {page_size} is not a multiple of 8: the cp.async producer copies a K/V tile in groups "
                "of 8 rows, each within one page")
    if page_size >= 1 and block_n >= 1 and (page_size % block_n == 0 or block_n % page_size == 0):
        return None
    return f"page size {page_size} does not fit block N {block_n}: {RULE}"


# An FP8 paged kernel's K boxes are rows of 64 or 128 bytes (e4m3): a box of 8 rows spans whole 512- or 1024-byte
# swizzle periods, so each page's box lands where the tile's layout puts its rows.
FP8_PAGE_ROWS = 8


def fp8_page_misfit(page_size: int) -> Optional[str]:
    """Why an FP8 paged kernel (TMA boxes of e4m3 K rows) cannot read pages of ``page_size`` keys; None when it can
    (besides page_misfit's rule)."""
    if page_size >= FP8_PAGE_ROWS and page_size % FP8_PAGE_ROWS == 0:
        return None
    return (f"page size {page_size} is not a multiple of {FP8_PAGE_ROWS}: an FP8 paged kernel reads K in TMA boxes "
            f"of whole swizzle periods ({FP8_PAGE_ROWS} rows of 64 or 128 bytes) a page")


def compatible_page_sizes(block_n: int, g2s_atom: str = TMA_KV) -> tuple[int, ...]:
    """The supported page sizes (tuner.serving.buckets.serving.PAGE_SIZES) a kernel of ``block_n`` reads."""
    return tuple(p for p in PAGE_SIZES if page_misfit(p, block_n, g2s_atom) is None)


def page_size_error(layout: str, page_size: Optional[int]) -> Optional[str]:
    """Why ``--page-size`` is wrong with ``--layout``; None when it is fine (or not given)."""
    if page_size is None:
        return None
    if layout != "paged":
        return f"--page-size applies to --layout paged only (got --layout {layout})"
    problem = page_size_problem(page_size)
    return f"--page-size: {problem}" if problem else None
