"""Shape buckets: the best kernel is stored per key-sequence-length bucket, since the best tiles differ
between a 512-token prefill and a 16k one.

A bucket is named ``s<N>`` by its upper edge N. A seqlen falls into the smallest bucket that holds it;
anything longer than the last edge lands in the last bucket.
"""
from __future__ import annotations

import math
import re

BUCKETS = (512, 1024, 2048, 4096, 8192, 16384)

_NAME = re.compile(r"^s([1-9][0-9]*)$")


def bucket_name(edge: int) -> str:
    return f"s{edge}"


def bucket_seqlen(name: str) -> int:
    """The seqlen a bucket name stands for: ``"s4096"`` -> 4096. ValueError on anything else."""
    m = _NAME.match(name) if isinstance(name, str) else None
    if m is None:
        raise ValueError(f"not a shape bucket name: {name!r} (expected s<seqlen>, e.g. s4096)")
    return int(m.group(1))


def is_bucket_name(name: str) -> bool:
    return isinstance(name, str) and _NAME.match(name) is not None


def bucket_for(seqlen_k: int) -> str:
    """The bucket a key sequence length belongs to: the smallest edge >= seqlen_k, else the last."""
    if isinstance(seqlen_k, bool) or not isinstance(seqlen_k, int) or seqlen_k < 1:
        raise ValueError(f"seqlen_k must be a positive integer, got {seqlen_k!r}")
    for edge in BUCKETS:
        if seqlen_k <= edge:
            return bucket_name(edge)
    return bucket_name(BUCKETS[-1])


def nearest_bucket(seqlen: int, available) -> str:
    """The available bucket nearest to ``seqlen`` in log2 distance (kernel cost scales with the seqlen's
    ratio, not its difference). A tie goes to the larger bucket: its tiles suit the longer sequences
    where time is spent."""
    if isinstance(seqlen, bool) or not isinstance(seqlen, int) or seqlen < 1:
        raise ValueError(f"seqlen must be a positive integer, got {seqlen!r}")
    names = list(available)
    if not names:
        raise ValueError("no buckets to choose from")
    target = math.log2(seqlen)
    return min(names, key=lambda n: (abs(math.log2(bucket_seqlen(n)) - target), -bucket_seqlen(n)))
