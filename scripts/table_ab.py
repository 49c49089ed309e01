"""Bucket-defaults tables timed against each other on one GPU, in one process: each table's kernel per grid point.

    python3 scripts/table_ab.py --gpu h200 --table h100=hardware_profiles/bucket_defaults/h100.toml \
        --table h200=studies/h200.toml [--specs mha64c,mha128n,gqa128c] [--seqlens 512,1024,2048,4096,8192,16384]
        [--rounds 15] [--out table_ab.json]

A table (hardware_profiles/bucket_defaults/<gpu>.toml, or what `tune defaults` writes) changes the per-spec default
per key-length bucket. Here every table given (``NAME=PATH``; the first is the reference) is applied on the ``--gpu``
profile, the distinct kernels they give for each spec (the per-spec default, "default", is always one of them) are
built in one nvcc pool and passed through the verification gate, and at each paper-grid point the kernels the
tables serve there are timed in paired rounds with cuDNN and FA4 (tuner/measure/paired.py: the same protocol as
scripts/param_ab_check.py). Per point: each table's kernel against the reference table's and against the
default (reference ms / table ms, median of the rounds, the confirm rule's 95% interval), and FA4's ms over it.
Last, per table: the geometric mean over all points against the reference and the default, and against FA4 at
>= 2k keys. A table that tunes a GPU should come out ahead of another GPU's table there (issue: a campaign makes a
GPU's defaults). Exit 1 when a kernel does not build or does not pass the gate; 2 on bad input (a table that does
not read, a change the profile refuses, an unknown spec).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

DEFAULT_SPECS = "mha64c,mha128n,gqa128c"
DEFAULT_SEQLENS = "512,1024,2048,4096,8192,16384"

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


def parse_tables(items: list[str]) -> dict[str, tuple]:
    """{name: entries} of ``NAME=PATH`` arguments, in the order given; ValueError saying what is wrong."""
    from tuner.defaults.table import BucketTableError, parse_table

    if len(items) < 2:
        raise ValueError("give at least two --table NAME=PATH (the first is the reference)")
    tables: dict[str, tuple] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--table takes NAME=PATH, got {item!r}")
        if name in tables or name in ("default", "cudnn", "fa4"):
            raise ValueError(f"--table name {name!r} is used twice or names a column (default, cudnn, fa4)")
        try:
            tables[name] = parse_table(tomllib.loads(Path(path).read_text()), path)
        except OSError as exc:
            raise ValueError(f"--table {name}: cannot read {path}: {exc.strerror or exc}") from None
        except (tomllib.TOMLDecodeError, BucketTableError) as exc:
            raise ValueError(f"--table {name}: {exc}") from None
    return tables


def change_name(change: dict) -> str:
    """A kernel's role: "default", or its change as ``block_n=96,pingpong=True`` (fields sorted)."""
    return ",".join(f"{k}={change[k]}" for k in sorted(change)) or "default"


def plan(profile, spec, tables: dict[str, tuple], buckets: list[str]) -> tuple[dict[str, dict], dict[str, dict]]:
    """(kernels, served): {role: change} of the distinct kernels the tables give for ``spec`` over ``buckets``
    ("default" first), and {table: {bucket: role}}. ValueError when the profile refuses a table's change."""
    from tuner.defaults.table import changed_params

    kernels: dict[str, dict] = {"default": {}}
    served: dict[str, dict] = {}
    for name, entries in tables.items():
        served[name] = {}
        for bucket in buckets:
            entry = next((e for e in entries if e.applies(spec, bucket)), None)
            change = entry.as_dict() if entry is not None else {}
            if change:
                _, reasons = changed_params(profile, spec, change)
                if reasons:
                    raise ValueError(f"--table {name}: {spec.label()} {bucket} {change} is not legal on "
                                     f"{profile.name}: {'; '.join(reasons)}")
            role = change_name(change)
            kernels.setdefault(role, change)
            served[name][bucket] = role
    return kernels, served


def geomean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarise(rows: list[dict], tables: list[str]) -> dict[str, dict]:
    """Per table: geometric means over the rows of the ratios against the reference and the default, and of
    FA4's ms over the table's kernel at >= 2k keys; counts of points confirmed faster and slower than the reference."""
    out = {}
    for name in tables:
        ref = [r["tables"][name]["vs_reference"] for r in rows]
        out[name] = {"vs_reference": geomean([v["ratio"] for v in ref]),
                     "vs_default": geomean([r["tables"][name]["vs_default"]["ratio"] for r in rows]),
                     "over_fa4_2k": geomean([r["tables"][name]["over_fa4"] for r in rows
                                             if r["seqlen"] >= 2048 and r["tables"][name]["over_fa4"] is not None]),
                     "faster": sum(v["confirmed"] for v in ref),
                     "slower": sum(v["high"] < 1.0 for v in ref), "points": len(rows)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--table", action="append", default=[], metavar="NAME=PATH",
                    help="a bucket-defaults table; give two or more, the first is the reference")
    ap.add_argument("--specs", default=DEFAULT_SPECS, help="comma list of variant, head dim, c or n (default %(default)s)")
    ap.add_argument("--seqlens", default=DEFAULT_SEQLENS)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default="table_ab.json")
    ap.add_argument("--cache-dir", default=".kcache")
    args = ap.parse_args(argv)

    from hardware_profiles import ProfileError, load_profile
    from tuner.defaults.table import parse_spec_label
    from tuner.serving.buckets.seqlen import bucket_for

    try:
        profile = load_profile(args.gpu)
        tables = parse_tables(args.table)
        specs = [(text, parse_spec_label(text)) for text in args.specs.split(",")]
        seqlens = tuple(int(s) for s in args.seqlens.split(","))
        if args.rounds < 3 or args.rounds % 2 == 0:
            raise ValueError(f"--rounds must be odd and at least 3 (the rule's median), got {args.rounds}")
        buckets = sorted({bucket_for(s) for s in seqlens}, key=lambda b: int(b[1:]))
        plans = {label: plan(profile, spec, tables, buckets) for label, spec in specs}
    except (ValueError, ProfileError) as exc:
        print(f"bad input: {exc}", file=sys.stderr)
        return 2

    import torch

    from kernel_abi.spec import grid_problems
    from tuner.campaign.confirm import ConfirmRule, verdict
    from tuner.defaults.export import compile_changes, load_verified
    from tuner.measure import timer
    from tuner.measure.paired import paired_point

    rule = ConfirmRule(rounds=args.rounds)
    timing = timer.Timing(**rule.timing())
    names = list(tables)
    record = {"device": torch.cuda.get_device_name(), "gpu": profile.name, "tables": dict(zip(names, args.table)),
              "rule": rule.to_dict(), "served": {label: plans[label][1] for label, _ in specs}, "rows": []}
    built = compile_changes(args.gpu, [(spec, plans[label][0]) for label, spec in specs], Path(args.cache_dir))
    kernels = {label: load_verified(b, spec, label) for (label, spec), b in zip(specs, built)}
    missing = [f"{label}/{role}" for label, _ in specs for role in plans[label][0] if role not in kernels[label]]
    if missing:
        record["missing"] = missing
        Path(args.out).write_text(json.dumps(record, indent=1))
        print(f"not built or not verified: {', '.join(missing)}", file=sys.stderr)
        return 1

    for label, spec in specs:
        served = plans[label][1]
        for problem in grid_problems(spec.variant, spec.d_qk, "bf16", spec.causal, seqlens=seqlens):
            bucket = bucket_for(problem.seqlen_k)
            roles = list(dict.fromkeys(["default", *(served[n][bucket] for n in names)]))
            ms = paired_point(problem, {role: kernels[label][role] for role in roles}, rule.rounds, timing)
            ref = served[names[0]][bucket]

            def over_fa4(role):
                return statistics.median(f / k for k, f in zip(ms[role], ms["fa4"])) if ms["fa4"] else None

            row = {"spec": label, "seqlen": problem.seqlen_k, "bucket": bucket, "ms": ms, "tables": {
                n: {"kernel": served[n][bucket],
                    "vs_reference": verdict(ms[served[n][bucket]], ms[ref], rule).to_dict(),
                    "vs_default": verdict(ms[served[n][bucket]], ms["default"], rule).to_dict(),
                    "over_fa4": over_fa4(served[n][bucket])} for n in names}}
            record["rows"].append(row)
            Path(args.out).write_text(json.dumps(record, indent=1))     # what was timed survives a cut-off run
            print(f"{label} s{problem.seqlen_k}: " + "  ".join(
                f"{n} x{row['tables'][n]['vs_reference']['ratio']:.3f}" for n in names[1:]), flush=True)
    record["summary"] = summarise(record["rows"], names)
    Path(args.out).write_text(json.dumps(record, indent=1))

    def fmt(x):
        return f"{x:.3f}" if x is not None else "-"

    print(f"\n{record['device']} ({profile.name}): each table's kernel against {names[0]}'s ({names[0]} ms / table "
          f"ms, median of {rule.rounds} paired rounds [95%], * confirmed faster, - slower) and FA4's ms over it")
    print(f"{'spec':<9}{'seqlen':>7}  " + "".join(f"{n + ' kernel':<34}{'x ' + names[0]:<24}{'/FA4':>7}  "
                                                  for n in names))
    for row in record["rows"]:
        cells = []
        for n in names:
            t = row["tables"][n]
            v = t["vs_reference"]
            cells.append(f"{t['kernel'][:33]:<34}x{v['ratio']:.3f} [{v['low']:.3f}, {v['high']:.3f}]"
                         f"{'*' if v['confirmed'] else '-' if v['high'] < 1.0 else ' ':<3}{fmt(t['over_fa4']):>7}  ")
        print(f"{row['spec']:<9}{row['seqlen']:>7}  " + "".join(cells))
    for n, s in record["summary"].items():
        print(f"{n}: geomean x{fmt(s['vs_reference'])} against {names[0]}, x{fmt(s['vs_default'])} against the "
              f"per-spec defaults, {fmt(s['over_fa4_2k'])}x FA4 at >= 2k keys; {s['faster']} of {s['points']} points "
              f"confirmed faster than {names[0]}, {s['slower']} slower")
    return 0


if __name__ == "__main__":
    sys.exit(main())
