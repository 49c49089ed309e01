"""A GPU profile's default kernel per key-length bucket: measured changes to the per-spec default.

``translate.defaults`` gives one default per spec (FA4's tile for the head dim). The best tile depends on the
key length as well (BENCHMARKS.md, on the H100, causal d64 runs 8-15% faster on 128 x 128 with two
consumer warpgroups at 512-1k keys and slower on it from 2k). So a profile may carry a table of changes per
(variants, head dim, causal, buckets), as data: ``hardware_profiles/bucket_defaults/<gpu>.toml``. Each entry
names its measurement (``measured``): a change goes in only with a paired, re-timed win over the per-spec
default (scripts/param_ab_check.py). A GPU without a table, a serving layout, a decode spec or a schedule other
than the warp-specialised one keeps the per-spec default in every bucket.

``bucket_params(profile, spec, bucket)`` is what `tune build --seqlen`, `tune bench`, the default export and a
campaign's seeds use. A broken table is a ``BucketTableError`` naming the file and the entry, raised when it is
read, never a wrong kernel.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from tuner.serving.buckets.seqlen import BUCKETS, bucket_for, bucket_name, is_bucket_name
from kernel_abi.spec import MLA_D_QK, MLA_D_V, VARIANTS, KernelSpec

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

TABLE_DIR = Path(__file__).resolve().parents[2] / "hardware_profiles" / "bucket_defaults"
ENTRY_ORDER = ("variants", "head_dim", "dtype", "causal", "buckets", "change", "measured")   # as the tables write them
# "dtype" is optional: absent, an entry is for the 16-bit kernels (bf16 and fp16: the same tiles and schedule); "fp8"
# for the e4m3 kernels only (other tiles: translate/params_sm90.py fp8_reasons)
OPTIONAL_KEYS = {"dtype"}
ENTRY_KEYS = set(ENTRY_ORDER)
ENTRY_DTYPES = ("fp8",)
# Where the tables are read from: a folder of <gpu>.toml, or NO_TABLES to use none (`--no-bucket-table`: every bucket
# takes the per-spec default, as on a GPU nobody has tuned). An environment variable, so that the processes a command
# starts (a campaign's Ray workers, trial processes) read the same tables as the command.
TABLES_ENV = "TUNER_BUCKET_TABLES"
NO_TABLES = "none"


def tables_dir() -> Path | None:
    """The folder the tables are read from (None: tables are hidden)."""
    value = os.environ.get(TABLES_ENV, "").strip()
    if value.lower() == NO_TABLES:
        return None
    return Path(value) if value else TABLE_DIR


def hide_tables() -> None:
    """No table from now on, in this process and those it starts (`--no-bucket-table`)."""
    os.environ[TABLES_ENV] = NO_TABLES


def toml_value(value) -> str:
    """A table value as TOML: booleans, numbers, strings, lists and (inline) tables of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in value.items()) + " }"
    return str(value)


def entry_toml(entry: dict) -> str:
    """One entry as the ``[[change]]`` table of a bucket-defaults file (keys in ENTRY_ORDER)."""
    return "[[change]]\n" + "".join(f"{k} = {toml_value(entry[k])}\n" for k in ENTRY_ORDER if k in entry)


class BucketTableError(ValueError):
    """A bucket-defaults table that cannot be used; the message names the file and the entry."""


@dataclass(frozen=True)
class BucketChange:
    """One entry: these KernelParams changes for these specs in these buckets, and the measurement behind them."""

    variants: tuple[str, ...]
    head_dim: int
    causal: bool
    buckets: tuple[str, ...]
    change: tuple[tuple[str, Any], ...]      # sorted (field, value) pairs: hashable, frozen
    measured: str
    dtype: str = ""                          # "fp8": for e4m3 kernels only; "": for bf16 and fp16 kernels

    def applies(self, spec, bucket: str) -> bool:
        return (spec.variant in self.variants and spec.d_qk == self.head_dim == spec.d_v
                and spec.causal == self.causal and bucket in self.buckets and table_dtype(spec) == self.dtype)

    def as_dict(self) -> dict:
        return dict(self.change)


def parse_spec_label(text: str) -> KernelSpec:
    """The dense bf16 spec of a short label, as the A/B records behind a table name their rows (scripts/
    param_ab_check.py, scripts/bucket_table.py): variant, head dim, ``c`` causal or ``n`` not, e.g. ``gqa128c``;
    ``mla...`` is MLA's 192/128. ValueError saying what is wrong."""
    body, causal = text[:-1], text[-1:]
    variant = body.rstrip("0123456789")
    if causal not in ("c", "n") or variant not in VARIANTS or not body[len(variant):].isdigit():
        raise ValueError(f"a spec is variant, head dim and c or n, e.g. gqa128c; got {text!r}")
    if variant == "mla":
        return KernelSpec("mla", MLA_D_QK, MLA_D_V, causal == "c", "bf16")
    head_dim = int(body[len(variant):])
    return KernelSpec(variant, head_dim, head_dim, causal == "c", "bf16")


def entry_reasons(entry: Any, fields: set[str]) -> list[str]:
    """Why one table entry is malformed (empty: it is well-formed). ``fields``: the KernelParams field names."""
    if not isinstance(entry, dict):
        return ["an entry must be a table"]
    reasons = []
    missing, unknown = ENTRY_KEYS - OPTIONAL_KEYS - set(entry), set(entry) - ENTRY_KEYS
    if missing:
        reasons.append(f"missing {', '.join(sorted(missing))}")
    if unknown:
        reasons.append(f"unknown keys {', '.join(sorted(unknown))} (an entry has {', '.join(sorted(ENTRY_KEYS))})")
    variants = entry.get("variants", [])
    if not (isinstance(variants, list) and variants and all(v in VARIANTS for v in variants)):
        reasons.append(f"variants must be a non-empty list of {', '.join(VARIANTS)}, got {variants!r}")
    head_dim = entry.get("head_dim")
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
        reasons.append(f"head_dim must be a positive integer, got {head_dim!r}")
    if "dtype" in entry and entry["dtype"] not in ENTRY_DTYPES:
        reasons.append(f"dtype must be one of {', '.join(ENTRY_DTYPES)} (absent: the bf16 and fp16 kernels), got "
                       f"{entry['dtype']!r}")
    if not isinstance(entry.get("causal"), bool):
        reasons.append(f"causal must be true or false, got {entry.get('causal')!r}")
    buckets = entry.get("buckets", [])
    if not (isinstance(buckets, list) and buckets and all(is_bucket_name(b) for b in buckets)):
        reasons.append(f"buckets must be a non-empty list of bucket names (s512 ... s16384), got {buckets!r}")
    elif any(b not in {bucket_name(e) for e in BUCKETS} for b in buckets):
        reasons.append(f"buckets must be among {', '.join(bucket_name(e) for e in BUCKETS)}, got {buckets!r}")
    change = entry.get("change", {})
    if not (isinstance(change, dict) and change):
        reasons.append("change must be a non-empty table of KernelParams fields")
    elif set(change) - fields:
        reasons.append(f"change names fields KernelParams does not have: {', '.join(sorted(set(change) - fields))}")
    if not (isinstance(entry.get("measured"), str) and entry.get("measured", "").strip()):
        reasons.append("measured must say which measurement the change comes from")
    return reasons


def parse_table(data: dict, source: str) -> tuple[BucketChange, ...]:
    """The entries of one table (``[[change]]`` arrays), checked: well-formed, and no two of them for the same
    (variant, head dim, causal, bucket)."""
    from translate.params import KernelParams

    fields = set(KernelParams.__dataclass_fields__)
    extra = set(data) - {"change"}
    if extra:
        raise BucketTableError(f"{source}: unknown top-level keys {', '.join(sorted(extra))} (only [[change]])")
    entries = data.get("change", [])
    if not isinstance(entries, list):
        raise BucketTableError(f"{source}: [[change]] must be an array of tables")
    out: list[BucketChange] = []
    owner: dict[tuple, int] = {}
    for i, entry in enumerate(entries, 1):
        reasons = entry_reasons(entry, fields)
        if reasons:
            raise BucketTableError(f"{source}: change {i}: " + "; ".join(reasons))
        item = BucketChange(tuple(entry["variants"]), entry["head_dim"], entry["causal"], tuple(entry["buckets"]),
                            tuple(sorted(entry["change"].items())), entry["measured"].strip(), entry.get("dtype", ""))
        for key in ((v, item.head_dim, item.causal, b, item.dtype) for v in item.variants for b in item.buckets):
            if key in owner:
                raise BucketTableError(f"{source}: change {i} and change {owner[key]} both set {key[0]} d{key[1]} "
                                       f"{key[4] + ' ' if key[4] else ''}{'causal' if key[2] else 'non-causal'} "
                                       f"{key[3]}")
            owner[key] = i
        out.append(item)
    return tuple(out)


def load_table(gpu: str, directory: Path | None = None) -> tuple[BucketChange, ...]:
    """The GPU's table (empty when it has none, or tables are hidden); ``directory`` default: ``tables_dir()``."""
    directory = directory if directory is not None else tables_dir()
    if directory is None:
        return ()
    path = Path(directory) / f"{gpu}.toml"
    try:
        stamp = path.stat().st_mtime_ns      # a table rewritten (`tune defaults`) is read again
    except OSError:
        return ()
    return _load_table(path, stamp)


@lru_cache(maxsize=None)
def _load_table(path: Path, stamp: int) -> tuple[BucketChange, ...]:
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise BucketTableError(f"{path}: not valid TOML: {exc}") from None
    return parse_table(data, str(path))


def applies_to(spec, schedule: str) -> bool:
    """Whether bucket defaults exist for this kind of kernel: dense prefill, warp-specialised, without the options of
    kernel_abi.spec (the table's changes were measured on plain kernels). FP8 kernels take the entries that say
    dtype "fp8" only (table_dtype)."""
    return (spec.layout == "dense" and spec.phase == "prefill" and schedule.startswith("ws_")
            and not getattr(spec, "features", ()))


def table_dtype(spec) -> str:
    """The dtype an entry must name to apply to ``spec``: "fp8" for e4m3 kernels, "" for the 16-bit ones."""
    return "fp8" if spec.dtype == "fp8" else ""


def bucket_change(profile, spec, bucket: str, schedule: str = "ws_overlap") -> BucketChange | None:
    """The table entry that sets this spec's default in ``bucket``, or None (the per-spec default holds)."""
    if not is_bucket_name(bucket):
        raise ValueError(f"not a shape bucket name: {bucket!r} (expected s<seqlen>, e.g. s4096)")
    if not applies_to(spec, schedule):
        return None
    return next((c for c in load_table(profile.name) if c.applies(spec, bucket)), None)


def bucket_params(profile, spec, bucket: str, schedule: str = "ws_overlap"):
    """The default KernelParams of ``spec`` in ``bucket``: the per-spec default with the table's change for the
    bucket, if any. A change the profile's validation refuses is a BucketTableError with the reasons."""
    from translate.defaults import default_params

    base = default_params(profile, spec, schedule)
    entry = bucket_change(profile, spec, bucket, schedule)
    if entry is None:
        return base
    params, reasons = changed_params(profile, spec, entry.as_dict(), schedule)
    if reasons:
        raise BucketTableError(f"{profile.name} bucket default for {spec.label()} {bucket} ({entry.as_dict()}) is "
                               "not legal: " + "; ".join(reasons))
    return params


def changed_params(profile, spec, change: dict, schedule: str = "ws_overlap"):
    """(KernelParams, reasons): the per-spec default with ``change``, and why the profile refuses it (empty: legal)."""
    from translate.defaults import default_params, probe_problem
    from translate.params import KernelParams, validate

    try:
        params = KernelParams.from_dict({**default_params(profile, spec, schedule).to_dict(), **change})
    except (TypeError, ValueError) as exc:
        return None, [str(exc)]
    return params, validate(params, profile, probe_problem(spec), warp_specialized=True)


def params_for_seqlen(profile, spec, seqlen_k: int, schedule: str = "ws_overlap"):
    """``bucket_params`` of the bucket ``seqlen_k`` falls into."""
    return bucket_params(profile, spec, bucket_for(seqlen_k), schedule)


def bucket_defaults(profile, spec, buckets=None, schedule: str = "ws_overlap") -> dict[str, Any]:
    """{bucket: KernelParams} over ``buckets`` (default: every bucket)."""
    names = buckets if buckets is not None else [bucket_name(e) for e in BUCKETS]
    return {b: bucket_params(profile, spec, b, schedule) for b in names}


def _group(items, params_of) -> list[tuple[Any, list]]:
    groups: dict[str, tuple[Any, list]] = {}
    for item in items:
        params = params_of(item)
        groups.setdefault(params.key(), (params, []))[1].append(item)
    return list(groups.values())


def group_by_params(profile, spec, seqlens, schedule: str = "ws_overlap") -> list[tuple[Any, list[int]]]:
    """The seqlens grouped by the bucket default that serves them: [(KernelParams, [seqlen, ...])], in order of
    first appearance; one group when the table changes nothing for this spec."""
    return _group(seqlens, lambda s: params_for_seqlen(profile, spec, s, schedule))


def group_buckets(profile, spec, buckets, schedule: str = "ws_overlap") -> list[tuple[Any, list[str]]]:
    """``buckets`` grouped by their default: [(KernelParams, [bucket, ...])], in order of first appearance."""
    return _group(buckets, lambda b: bucket_params(profile, spec, b, schedule))
