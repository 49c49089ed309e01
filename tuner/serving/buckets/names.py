"""Which bucket names a layout's records may carry, and what a name stands for (store, export, reader).

Two bucket rules name the stored kernels of a spec:

  * ``s<N>`` (tuner/serving/buckets/seqlen.py): the key length. Dense records use it; varlen records stored before the
    serving buckets used it too and keep being read, stored and routed by ``max_seqlen_k`` as before.
  * serving buckets (tuner/measure/mixes.py: ``t16k-even``, ``t4k-even-p16``): the packed tokens, the length mix
    and, when paged, the page size, all from what the host knows of a packed call. Varlen and paged records.

A paged record must name its page size (``-p16``): the page size is part of what it was tuned on, and a
paged call routes by it; no paged record predates the serving buckets, so ``s<N>`` is refused for them. A
varlen record's serving bucket names no page size. One config holds buckets of one rule only
(``mixed_rules``): a call is routed by one rule.
"""
from __future__ import annotations

from tuner.serving.buckets.seqlen import bucket_seqlen, is_bucket_name
from tuner.serving.buckets.serving import MIX_CLASSES, PAGE_SIZES, SERVING_LAYOUTS, is_serving_bucket, parse_serving_bucket

LAYOUTS = ("dense", *SERVING_LAYOUTS)
SEQLEN_RULE, SERVING_RULE = "seqlen", "serving"


def bucket_rule(name) -> str | None:
    """``"seqlen"`` for ``s<N>``, ``"serving"`` for a serving bucket, None for anything else."""
    if is_bucket_name(name):
        return SEQLEN_RULE
    return SERVING_RULE if is_serving_bucket(name) else None


def bucket_errors(bucket, layout) -> list[str]:
    """Every reason ``bucket`` cannot name a record of ``layout`` (empty: it can)."""
    if layout not in LAYOUTS:
        return [f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}"]
    rule = bucket_rule(bucket)
    if layout == "dense":
        if rule != SEQLEN_RULE:
            return [f"bucket {bucket!r} is not a bucket name such as s4096 (a dense record is bucketed by its key "
                    "length; serving buckets such as t16k-even are for varlen and paged records)"]
        return []
    if rule is None:
        example = "t16k-even-p16" if layout == "paged" else "t16k-even (or s4096)"
        return [f"bucket {bucket!r} is neither a serving bucket such as {example} nor a key-length bucket"]
    if layout == "paged":
        if rule == SEQLEN_RULE:
            return [f"bucket {bucket!r}: a paged record needs a serving bucket naming its page size, "
                    "e.g. t4k-even-p16 (tuner/measure/mixes.py serving_bucket)"]
        page = parse_serving_bucket(bucket)[2]
        if page is None:
            return [f"bucket {bucket!r} names no page size; a paged record's bucket ends in -p<page>, e.g. "
                    f"{bucket}-p16"]
        if page not in PAGE_SIZES:
            return [f"bucket {bucket!r}: page size {page} is not one of {', '.join(map(str, PAGE_SIZES))}"]
        return []
    if rule == SERVING_RULE and parse_serving_bucket(bucket)[2] is not None:
        return [f"bucket {bucket!r} names a page size; a varlen record's serving bucket has none "
                f"(e.g. {bucket.rsplit('-p', 1)[0]})"]
    return []


def bucket_sort_key(name: str) -> tuple:
    """Key-length buckets by length, then serving buckets by tokens, mix class, page size; anything else last
    (a store directory that is not a bucket still sorts)."""
    rule = bucket_rule(name)
    if rule == SEQLEN_RULE:
        return (0, bucket_seqlen(name), 0, 0)
    if rule == SERVING_RULE:
        tokens, mix, page = parse_serving_bucket(name)
        return (1, tokens, MIX_CLASSES.index(mix), page or 0)
    return (2, 0, 0, 0)


def bucket_fields(name: str) -> dict:
    """What a bucket name stands for, as an export entry writes it: ``{"seqlen_k": N}`` for ``s<N>``, else
    ``{"tokens": edge, "mix": class}`` plus ``"page_size"`` for a paged bucket. ValueError on other names."""
    rule = bucket_rule(name)
    if rule == SEQLEN_RULE:
        return {"seqlen_k": bucket_seqlen(name)}
    if rule is None:
        raise ValueError(f"not a bucket name: {name!r}")
    tokens, mix, page = parse_serving_bucket(name)
    return {"tokens": tokens, "mix": mix} if page is None else {"tokens": tokens, "mix": mix, "page_size": page}


def mixed_rules(names) -> str | None:
    """Why these buckets cannot share one config (both rules among them), or None."""
    seqlen = sorted(n for n in names if bucket_rule(n) == SEQLEN_RULE)
    serving = sorted(n for n in names if bucket_rule(n) == SERVING_RULE)
    if seqlen and serving:
        return (f"key-length buckets ({', '.join(seqlen)}) and serving buckets ({', '.join(serving)}) in one "
                "config: a call is routed by one rule; re-store the key-length records under serving buckets "
                "or remove them")
    return None
