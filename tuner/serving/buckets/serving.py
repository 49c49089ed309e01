"""The serving buckets: the best varlen or paged kernel is stored per bucket, and a call is routed to a bucket from
what the host knows without reading the GPU: the packed query count (``q.shape[0]``), the batch
(``len(cu_seqlens) - 1``) and ``max_seqlen_q`` / ``max_seqlen_k`` (flash_attn_varlen_func's arguments). The rule:

  * tokens: the smallest edge of TOKEN_EDGES (4k, 16k, 64k) holding the packed queries, else the last;
  * mix: ``short`` when no sequence has more than SHORT_MAX_KEYS (512) keys; else ``skewed`` when the
    longest query is at least SKEW_RATIO (4) x the mean query length (one long prompt among short ones:
    its tiles are the tail of the schedule); else ``even``;
  * paged: the page size.

Named ``t16k-even`` (varlen) or ``t16k-even-p16`` (paged). The benchmark mixes (tuner/measure/mixes.toml) fall
into: 8 x 2k -> t16k-even, 1 x 8k + 32 x 256 -> t16k-skewed, 64 random 1-512 -> t16k-short, 2 x (2k on 6k) paged
-> t4k-even-p<page>.
"""
from __future__ import annotations

import math
import re

SERVING_LAYOUTS = ("varlen", "paged")
TOKEN_EDGES = (4096, 16384, 65536)
SHORT_MAX_KEYS = 512
SKEW_RATIO = 4
MIX_CLASSES = ("short", "even", "skewed")
PAGE_SIZES = (16, 32, 64, 128, 256)      # pages of 16..256 tokens (powers of two: whole TMA boxes)

_BUCKET = re.compile(r"^t([1-9][0-9]*)k-(short|even|skewed)(?:-p([1-9][0-9]*))?$")


def _kilo(edge: int) -> str:
    return f"t{edge // 1024}k"


def serving_bucket(total_q: int, batch: int, max_seqlen_q: int, max_seqlen_k: int,
                   page_size: int | None = None) -> str:
    """The serving bucket of a packed call (module doc: the rule)."""
    for name, value in (("total_q", total_q), ("batch", batch), ("max_seqlen_q", max_seqlen_q),
                        ("max_seqlen_k", max_seqlen_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    tokens = next((e for e in TOKEN_EDGES if total_q <= e), TOKEN_EDGES[-1])
    if max_seqlen_k <= SHORT_MAX_KEYS:
        mix = "short"
    elif batch > 0 and max_seqlen_q * batch >= SKEW_RATIO * max(1, total_q):
        mix = "skewed"
    else:
        mix = "even"
    name = f"{_kilo(tokens)}-{mix}"
    return name if page_size is None else f"{name}-p{page_size}"


def is_serving_bucket(name) -> bool:
    return isinstance(name, str) and _BUCKET.match(name) is not None


def parse_serving_bucket(name: str) -> tuple[int, str, int | None]:
    """(token edge, mix class, page size or None) of a serving bucket name; ValueError on anything else."""
    m = _BUCKET.match(name) if isinstance(name, str) else None
    if m is None:
        raise ValueError(f"not a serving bucket name: {name!r} (expected t<K>k-<short|even|skewed>[-p<page>], "
                         "e.g. t16k-even or t16k-short-p16)")
    return int(m.group(1)) * 1024, m.group(2), int(m.group(3)) if m.group(3) else None


def nearest_serving_bucket(name: str, available) -> str:
    """The available bucket closest to ``name``: the same mix class and page size first, then the nearest
    token edge (log2); a tie goes to the larger edge. ValueError when ``available`` is empty."""
    names = list(available)
    if not names:
        raise ValueError("no buckets to choose from")
    tokens, mix, page = parse_serving_bucket(name)

    def distance(other: str):
        t, m, p = parse_serving_bucket(other)
        return (m != mix, p != page, abs(math.log2(t) - math.log2(tokens)), -t, other)   # (a name breaks a tie)

    return min(names, key=distance)


def page_size_problem(page_size) -> str | None:
    """Why ``page_size`` is not a supported page size; None when it is."""
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size not in PAGE_SIZES:
        return f"page size {page_size!r} is not supported; choose one of: {', '.join(map(str, PAGE_SIZES))}"
    return None
