"""The decode bucket rule (tuner/serving/buckets/decode.py) at call time: which bucket of a decode config serves a
``flash_attn_with_kvcache`` call, from its shapes alone (no GPU read).

A call's class: ``batch = q.shape[0]`` and the KV capacity (``page_table.shape[1] * page_size`` for a paged cache,
``k_cache.shape[1]`` for a dense one), each in the smallest class edge that holds it, else the last edge
(``BATCH_EDGES`` 1/8/32/128, ``KV_EDGES`` 2k/8k/32k): ``decode_bucket``'s rule, written with integer comparisons
only so that torch.compile folds it into a constant when the shapes are plain ints.

The bucket: the call's own class when the config has it; otherwise the nearest bucket the config has **of the
same page size** (a paged kernel was tuned for its page size, and the runtime refuses a page size it cannot
read), by the distance ``|log2(batch edge / bucket batch)| + |log2(KV edge / bucket KV)|``; a tie goes to the
larger KV capacity, then the larger batch (more splits and more CTAs are the safer side for a kernel). A
paged call whose page size no bucket names has no bucket (None): it falls back (``decode-page-size``). A dense
config's buckets name no page size; a dense call looks them up with page size None.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.serving.buckets.decode import BATCH_EDGES, KV_EDGES, class_edge, parse_decode_bucket


def decode_distance(batch: int, kv: int, other_batch: int, other_kv: int) -> float:
    return abs(math.log2(batch / other_batch)) + abs(math.log2(kv / other_kv))


def nearest_decode_bucket(batch: int, kv: int, page_size: int | None, names) -> str | None:
    """The bucket among ``names`` serving class (batch edge, KV edge, page size) by the module's rule."""
    best, best_key = None, None
    for name in names:
        b, k, p = parse_decode_bucket(name)
        if p != page_size:
            continue
        key = (decode_distance(batch, kv, b, k), -k, -b)
        if best_key is None or key < best_key:
            best, best_key = name, key
    return best


@dataclass(frozen=True)
class DecodeTable:
    """A decode config's buckets settled for dispatch: every class a call can fall into -> its bucket."""

    buckets: dict          # (batch edge, KV edge, page size or None) -> bucket name
    page_sizes: tuple      # the page sizes the buckets name, ascending (empty for a dense cache)

    @classmethod
    def build(cls, names) -> "DecodeTable":
        names = sorted(names)
        pages = sorted({p for p in (parse_decode_bucket(n)[2] for n in names)}, key=lambda p: p or 0)
        table = {}
        for page in pages:
            for b in BATCH_EDGES:
                for kv in KV_EDGES:
                    table[(b, kv, page)] = nearest_decode_bucket(b, kv, page, names)
        return cls(buckets=table, page_sizes=tuple(p for p in pages if p is not None))

    def bucket(self, batch: int, kv_capacity: int, page_size: int | None = None) -> str | None:
        """The bucket of a call, or None when no bucket names its page size. Integer tests and one dict lookup."""
        return self.buckets.get((class_edge(batch, BATCH_EDGES), class_edge(kv_capacity, KV_EDGES), page_size))
