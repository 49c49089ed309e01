"""The per-bucket defaults that recorded A/B runs support, by the table's rule (hardware_profiles/bucket_defaults/).

    python3 scripts/bucket_table.py RECORD.json [RECORD.json ...] [--min-processes 2] [--check GPU]
    python3 scripts/bucket_table.py hardware_profiles/bucket_defaults/records/h100/*.json --check h100

Each RECORD is one fresh process of `scripts/param_ab_check.py --changes` (its --out JSON). A change enters the
table for (spec, bucket) only when, at that bucket's edge, the confirm rule held (the lower bound of the median's
95% interval above 1 + min_gain, tuner/campaign/confirm.py) in at least ``--min-processes`` records and no record
timed it slower than the default (a median ratio below 1). With two records that is the campaign's rule, "in each
of two fresh processes"; more records can only add evidence, never take a confirmed win away for one process that
was merely inconclusive. A change timed against the current default (the record's kernel_revision) counts only those
timings at that point. Among several such changes, the one with the best median of its records' ratios. The
records are kept beside the table (``hardware_profiles/bucket_defaults/records/<gpu>/``), so the table can be
re-derived.

Prints the derived entries as TOML (``[[change]]`` tables, ``measured`` filled from the ratios), and the changes
that won in fewer processes as comments. With ``--gpu GPU`` (and with ``--check GPU``) a change is reduced to what
that GPU's per-spec default does not already hold: a win the default has since taken makes no entry. ``--check GPU``
instead compares the derivation with that GPU's table (variants, head dim, causal, bucket -> change) and exits 1 on
any difference, naming it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from kernel_abi.spec import VARIANTS
from translate.sm90.emit import PINGPONG_REVISION

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

# tuner.defaults.table and the bucket rules (tuner.serving.buckets) import torch: imported where used, so that
# --help answers at once.


def superseded(change: dict, record: dict) -> bool:
    """Whether ``record`` timed ``change`` with a ping-pong kernel the translator no longer builds (its
    pingpong_revision, 1 where the record predates the field, below translate.sm90.emit.PINGPONG_REVISION)."""
    return bool(change.get("pingpong")) and record.get("pingpong_revision", 1) < PINGPONG_REVISION


def kernel_revision(record: dict) -> int:
    """The translator revision whose kernels ``record`` timed (translate.sm90.emit.KERNEL_REVISION; 1 where the record
    predates the field)."""
    return record.get("kernel_revision", 1)


def collect(records: list[dict]) -> dict[tuple[str, int], dict[str, list[dict]]]:
    """{(spec label, seqlen): {change as canonical JSON: [one verdict per record that timed it]}}, leaving out the
    timings of superseded ping-pong kernels, and for each change at each (spec, seqlen) the records of an older kernel
    revision than the newest that timed that change there: a ratio measured against an earlier, slower default says
    nothing about the current one once the change has been timed against the current one (a change not re-timed keeps
    its older records)."""
    timed: list[tuple[tuple[str, int], str, int, dict]] = []
    for i, record in enumerate(records):
        changes = record.get("changes")
        if not isinstance(changes, dict):
            raise ValueError(f"record {i + 1} has no 'changes' (not a param_ab_check --changes record)")
        for row in record.get("rows", []):
            for name, verdict in row["verdicts"].items():
                if name not in changes or superseded(changes[name], record):
                    # "before" (--before): an earlier translator's kernel, not a change; or an old ping-pong
                    continue
                key = json.dumps(changes[name], sort_keys=True)
                timed.append(((row["spec"], row["seqlen"]), key, kernel_revision(record), verdict))
    newest: dict[tuple, int] = {}
    for point, key, revision, _ in timed:
        newest[(point, key)] = max(newest.get((point, key), 0), revision)
    out: dict[tuple[str, int], dict[str, list[dict]]] = {}
    for point, key, revision, verdict in timed:
        if revision == newest[(point, key)]:
            out.setdefault(point, {}).setdefault(key, []).append(verdict)
    return out


def choose(collected, min_processes: int = 2) -> tuple[dict, list[str]]:
    """({(spec, bucket): (change dict, verdicts)} for the changes the rule takes; notes on those it does not)."""
    from tuner.serving.buckets.seqlen import BUCKETS, bucket_for, bucket_name

    chosen, notes = {}, []
    edges = {bucket_name(e) for e in BUCKETS}
    for (spec, seqlen), by_change in sorted(collected.items()):
        bucket = bucket_for(seqlen)
        if bucket_name(seqlen) != bucket or bucket not in edges:
            notes.append(f"{spec} {seqlen}: not a bucket edge, not used")
            continue
        taken = []
        for key, verdicts in by_change.items():
            won = [v for v in verdicts if v["confirmed"]]
            if len(won) >= min_processes and all(v["ratio"] >= 1.0 for v in verdicts):
                taken.append((statistics.median(v["ratio"] for v in verdicts), key, verdicts))
            elif won:
                ratios = ", ".join(f"x{v['ratio']:.3f}" for v in verdicts)
                notes.append(f"{spec} {bucket} {key}: won in {len(won)} of {len(verdicts)} process(es) ({ratios})")
        if taken:
            _, key, verdicts = max(taken)
            chosen[(spec, bucket)] = (json.loads(key), verdicts)
    return chosen, notes


def beyond_default(change: dict, spec, profile) -> dict:
    """The part of ``change`` that the spec's per-spec default on ``profile`` does not already hold (a record timed
    its change against the default of its day; a later default may have taken some of it, e.g. pack_gqa at d64)."""
    from translate.defaults import default_params

    default = default_params(profile, spec, "ws_overlap").to_dict()
    return {k: v for k, v in change.items() if default.get(k) != v}


def entries(chosen, profile=None) -> list[dict]:
    """Table entries: per (head dim, causal, change, buckets) with the variants that share them; with ``profile``,
    each change less what the per-spec default already holds (beyond_default), and none where nothing is left."""
    from tuner.defaults.table import parse_spec_label
    from tuner.serving.buckets.seqlen import BUCKETS, bucket_name

    per_spec: dict[tuple, dict] = {}
    for (spec, bucket), (change, verdicts) in chosen.items():
        parsed = parse_spec_label(spec)
        if profile is not None:
            change = beyond_default(change, parsed, profile)
            if not change:
                continue
        key = (parsed.variant, parsed.d_qk, parsed.causal, json.dumps(change, sort_keys=True))
        per_spec.setdefault(key, {"buckets": [], "measured": []})
        per_spec[key]["buckets"].append(bucket)
        per_spec[key]["measured"].append(f"{bucket} " + " ".join(f"x{v['ratio']:.3f}" for v in verdicts))
    order = {bucket_name(e): i for i, e in enumerate(BUCKETS)}
    merged: dict[tuple, dict] = {}
    for (variant, head_dim, causal, change), item in per_spec.items():
        buckets = tuple(sorted(item["buckets"], key=order.get))
        entry = merged.setdefault((head_dim, causal, change, buckets), {
            "variants": [], "head_dim": head_dim, "causal": causal, "buckets": list(buckets),
            "change": json.loads(change), "measured": []})
        entry["variants"].append(variant)
        entry["measured"].append(f"{variant.upper()} " + ", ".join(sorted(item["measured"], key=lambda m: order[
            m.split()[0]])))
    out = []
    for entry in merged.values():
        entry["variants"] = [v for v in VARIANTS if v in entry["variants"]]
        entry["measured"] = "; ".join(entry["measured"])
        out.append(entry)
    return sorted(out, key=lambda e: (e["head_dim"], e["causal"], order[e["buckets"][0]], e["variants"]))


def to_toml(items: list[dict]) -> str:
    from tuner.defaults.table import entry_toml

    return "\n".join(entry_toml(e) for e in items)


def as_table(items: list[dict]):
    """The derived entries as the table parser reads them (tuner.defaults.table.parse_table): checked alike."""
    from tuner.defaults.table import parse_table

    return parse_table(tomllib.loads(to_toml(items)), "derived")


def assignments(table) -> dict[tuple, dict]:
    """{(variant, head dim, causal, bucket): change} of a parsed table (tuner.defaults.table.BucketChange)."""
    return {(variant, e.head_dim, e.causal, bucket): e.as_dict()
            for e in table for variant in e.variants for bucket in e.buckets}


def differences(derived: dict, table: dict) -> list[str]:
    """What the table says that the records do not, and the other way round."""
    out = []
    for key in sorted(set(derived) | set(table), key=str):
        if derived.get(key) != table.get(key):
            out.append(f"{key}: records give {derived.get(key)}, the table has {table.get(key)}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", metavar="RECORD.json", nargs="+", type=Path, help="a param_ab_check.py --changes record")
    ap.add_argument("--min-processes", type=int, default=2, help="records in which a change must win (default 2)")
    ap.add_argument("--check", metavar="GPU", help="compare with hardware_profiles/bucket_defaults/GPU.toml")
    ap.add_argument("--gpu", help="print the changes beyond this GPU's per-spec defaults (--check GPU implies it)")
    args = ap.parse_args(argv)
    try:
        records = [json.loads(p.read_text()) for p in args.records]
        chosen, notes = choose(collect(records), args.min_processes)
    except (OSError, ValueError, KeyError) as exc:
        print(f"bad input: {exc}", file=sys.stderr)
        return 2
    from hardware_profiles import load_profile

    items = entries(chosen, load_profile(args.check or args.gpu) if (args.check or args.gpu) else None)
    if args.check:
        from tuner.defaults.table import load_table

        diff = differences(assignments(as_table(items)), assignments(load_table(args.check)))
        for line in diff:
            print(line)
        print(f"{args.check}: {'differs from' if diff else 'matches'} the {len(args.records)} records")
        return 1 if diff else 0
    print(to_toml(items))
    for note in notes:
        print(f"# {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
