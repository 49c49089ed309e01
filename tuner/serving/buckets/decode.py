"""Decode buckets: the best decode kernel is stored per (batch, KV capacity) class, and per page size when paged.

The rule, from shapes alone (a call is routed while torch.compile traces it or a CUDA graph captures it, so
nothing is read back from the GPU): ``batch`` is the number of sequences (q's first dimension); the KV capacity
is the most keys a sequence of the call can hold, ``page_table.shape[1] * page_size`` for a paged cache and
``k_cache.shape[1]`` for a dense one (cache_seqlens lives on the GPU). Each falls into the smallest class edge
that holds it, anything larger into the last class. A name: ``d-b8-kv8k`` (dense), ``d-b8-kv8k-p16`` (paged).

Why these classes: what changes the best decode kernel is whether the (sequence, KV head) units fill the GPU
without splitting the keys (batch 1-8 x 8 KV heads is at most 64 CTAs on a 132-SM H100: splits and the
combine dominate; 32+ fills it once; 128 fills it several times over), and how many key tiles each CTA walks
(the ring depth and tile that hide the gathers' latency differ between 2k and 32k keys).
The split count itself is not bucketed: kernel_abi/splits.py computes it per call.
"""
from __future__ import annotations

import re

BATCH_EDGES = (1, 8, 32, 128)
KV_EDGES = (2048, 8192, 32768)
DECODE_RULE = "decode"

_NAME = re.compile(r"^d-b([1-9][0-9]*)-kv([1-9][0-9]*)k(?:-p([1-9][0-9]*))?$")


def class_edge(value: int, edges: tuple[int, ...]) -> int:
    """The smallest edge holding ``value``, else the last (a plain loop: torch.compile traces it)."""
    for edge in edges:
        if value <= edge:
            return edge
    return edges[-1]


def decode_bucket(batch: int, kv_capacity: int, page_size: int | None = None) -> str:
    """The bucket of a decode call: ``d-b<batch edge>-kv<KV edge / 1024>k[-p<page size>]``."""
    for name, value in (("batch", batch), ("kv_capacity", kv_capacity)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    page = f"-p{page_size}" if page_size else ""
    return f"d-b{class_edge(batch, BATCH_EDGES)}-kv{class_edge(kv_capacity, KV_EDGES) // 1024}k{page}"


def is_decode_bucket(name) -> bool:
    return isinstance(name, str) and _NAME.match(name) is not None


def parse_decode_bucket(name: str) -> tuple[int, int, int | None]:
    """(batch edge, KV edge in keys, page size or None); ValueError on another name."""
    m = _NAME.match(name) if isinstance(name, str) else None
    if m is None:
        raise ValueError(f"not a decode bucket name: {name!r} (expected d-b<batch>-kv<K>k[-p<page>], "
                         "e.g. d-b8-kv8k-p16)")
    return int(m.group(1)), int(m.group(2)) * 1024, int(m.group(3)) if m.group(3) else None


def decode_bucket_errors(name, layout: str) -> list[str]:
    """Every reason ``name`` cannot name a decode record of ``layout`` (paged or dense)."""
    if layout not in ("paged", "dense"):
        return [f"a decode record reads a paged or a dense cache, not {layout!r}"]
    if not is_decode_bucket(name):
        return [f"bucket {name!r} is not a decode bucket such as d-b8-kv8k-p16 (tuner/serving/buckets/decode.py)"]
    batch, kv, page = parse_decode_bucket(name)
    errors = []
    if batch not in BATCH_EDGES or kv not in KV_EDGES:
        errors.append(f"bucket {name!r}: batch {batch} / KV {kv} are not class edges "
                      f"(batch {BATCH_EDGES}, KV {KV_EDGES})")
    if layout == "paged" and page is None:
        errors.append(f"bucket {name!r} names no page size; a paged decode record's bucket ends in -p<page>")
    if layout == "dense" and page is not None:
        errors.append(f"bucket {name!r} names a page size; a dense-cache decode record has none")
    return errors


def decode_bucket_fields(name: str) -> dict:
    """What an export entry writes for a decode bucket: batch and KV class edges, the page size when paged."""
    batch, kv, page = parse_decode_bucket(name)
    out = {"batch": batch, "kv_capacity": kv}
    if page is not None:
        out["page_size"] = page
    return out


def decode_bucket_sort_key(name: str) -> tuple:
    batch, kv, page = parse_decode_bucket(name)
    return (batch, kv, page or 0)


def bucket_points(page_size: int | None = None) -> list[tuple[int, int, str]]:
    """(batch, KV length, bucket) of each bucket's representative decode point: its class edges."""
    return [(b, kv, decode_bucket(b, kv, page_size)) for b in BATCH_EDGES for kv in KV_EDGES]
