"""The split rule of decode kernels: how many CTAs share one sequence's keys.

A decode call has few (sequence, head unit, row block) work items; a long cache split across CTAs fills the GPU.
The rule aims at ``splits_per_sm`` CTAs per SM, never gives a split fewer than ``min_split_blocks`` key tiles
(each split costs a partial output and a combine), and then evens the tiles out over the splits. Pure, so the
host computes it per call shape (tuner/decode_runtime.py) and the CPU tests check it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

MAX_SPLITS = 128     # the combine kernel reads one log-sum-exp per split and lane: a bound on its work per row


@dataclass(frozen=True)
class SplitPlan:
    num_splits: int
    blocks_per_split: int


def plan_splits(work_items: int, max_seqlen_k: int, block_n: int, sm_count: int, splits_per_sm: int,
                min_split_blocks: int, num_splits: int | None = None) -> SplitPlan:
    """Splits for ``work_items`` CTAs' worth of (sequence, unit, row block) over keys of up to ``max_seqlen_k``.
    ``num_splits`` forces a count (FlashAttention's argument; clamped to the key tiles there are)."""
    if work_items < 1 or block_n < 1 or sm_count < 1:
        raise ValueError("work_items, block_n and sm_count must be >= 1")
    blocks = max(1, math.ceil(max_seqlen_k / block_n))
    if num_splits is None or num_splits < 1:
        want = math.ceil(sm_count * splits_per_sm / work_items)
        num_splits = min(want, max(1, blocks // max(1, min_split_blocks)))
    num_splits = max(1, min(num_splits, blocks, MAX_SPLITS))
    per_split = math.ceil(blocks / num_splits)
    return SplitPlan(math.ceil(blocks / per_split), per_split)
