"""The split rule of decode kernels: how many CTAs share one sequence's keys.

A decode call has few (sequence, head unit, row block) work items; a long cache split across CTAs fills the GPU.
Decode is bound by HBM bandwidth, which the GPU delivers only while every SM holds its resident CTAs: a last wave
that fills a third of the slots runs at a third of the bandwidth. The rule therefore models the time of ``s``
splits as waves x tiles per CTA,

    ceil(work_items * s / slots) * (ceil(key_tiles / s) + CTA_OVERHEAD_TILES),   slots = SMs x resident CTAs,

and takes the ``s`` of least time, never giving a split fewer than ``min_split_blocks`` key tiles (each split
costs a prologue, a partial output and its share of the combine); among equal times the fewest splits. Then the
tiles are evened out over the splits. Pure, so the host computes it per call shape (tuner/serving/launch/decode_kernel.py, which
asks the driver how many CTAs of the kernel an SM holds) and the CPU tests check it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# What a CTA costs beyond its tiles, in tile times: filling the ring before the first tile lands, the merge of its
# warp groups and its partial output. An assumption (two tiles' worth), not a measurement: with none, the model
# splits b64 x 8k (llama3-8b heads) 64 ways into 2-tile CTAs; with it, 3 ways.
CTA_OVERHEAD_TILES = 2
MAX_SPLITS = 128     # the combine kernel reads one log-sum-exp per split and lane: a bound on its work per row


@dataclass(frozen=True)
class SplitPlan:
    num_splits: int
    blocks_per_split: int


def split_cost(work_items: int, key_tiles: int, slots: int, splits: int) -> int:
    """Waves x (key tiles + overhead) per CTA: the time model of the module doc, in tile times."""
    return math.ceil(work_items * splits / slots) * (math.ceil(key_tiles / splits) + CTA_OVERHEAD_TILES)


def plan_splits(work_items: int, max_seqlen_k: int, block_n: int, sm_count: int, ctas_per_sm: int,
                min_split_blocks: int, num_splits: int | None = None) -> SplitPlan:
    """Splits for ``work_items`` CTAs' worth of (sequence, unit, row block) over keys of up to ``max_seqlen_k``.
    ``num_splits`` forces a count (FlashAttention's argument; clamped to the key tiles there are)."""
    if work_items < 1 or block_n < 1 or sm_count < 1 or ctas_per_sm < 1:
        raise ValueError("work_items, block_n, sm_count and ctas_per_sm must be >= 1")
    tiles = max(1, math.ceil(max_seqlen_k / block_n))
    if num_splits is None or num_splits < 1:
        slots = sm_count * ctas_per_sm
        most = max(1, min(MAX_SPLITS, tiles // max(1, min_split_blocks)))
        num_splits = min(range(1, most + 1), key=lambda s: (split_cost(work_items, tiles, slots, s), s))
    num_splits = max(1, min(num_splits, tiles, MAX_SPLITS))
    per_split = math.ceil(tiles / num_splits)
    return SplitPlan(math.ceil(tiles / per_split), per_split)
