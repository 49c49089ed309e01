"""Two builds of the same decode kernels side by side, in one process: each folder holds what `tune build
--phase decode --out DIR` wrote (a .cubin and its .json per kernel); kernels of the same name in both folders are
timed against each other, interleaved over `--rounds` rounds (tuner.measure.timer.time_ms: triton's do_bench median, L2
flushed), GQA ones with FA4's paged decode beside them, MLA ones against the copy bandwidth.

Both builds of a kernel must agree on every point (max |a - b| <= 2e-2 on bf16 outputs of unit-normal inputs; the
gate itself is tuner/verify_decode, run by tests/gpu) before anything is timed.

    python3 scripts/decode_ab_check.py BEFORE_DIR AFTER_DIR --out $OUT/decode_ab.json [--rounds 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

AGREE = 2e-2


def _spec_key(record: Path) -> tuple:
    spec = json.loads(record.read_text())["meta"]["spec"]
    return tuple(sorted((k, str(v)) for k, v in spec.items()))


def pair_records(before: Path, after: Path, by_spec: bool = False) -> list[tuple[Path, Path]]:
    """(before record, after record) of the kernels to compare: the same file name in both folders, or with
    ``by_spec`` the same spec (two parameter choices of one problem, e.g. DecodeParams.mma). A spec held by two
    kernels of one folder is ambiguous and refused."""
    if not by_spec:
        return [(before / r.name, r) for r in sorted(after.glob("*.json")) if (before / r.name).exists()]
    by_key = []
    for folder in (before, after):   # each record read once: {spec key: record}
        keyed = {}
        for r in sorted(folder.glob("*.json")):
            if keyed.setdefault(_spec_key(r), r) is not r:
                raise SystemExit(f"{folder} holds two kernels of one spec: --by-spec cannot tell which to pair")
        by_key.append(keyed)
    twins, records = by_key
    return [(twins[key], r) for key, r in records.items() if key in twins]


def load_pairs(before: Path, after: Path, by_spec: bool = False) -> dict:
    from tuner.serving.launch import load_kernel

    pairs = {}
    for twin, record in pair_records(before, after, by_spec):
        meta_a, meta_b = json.loads(twin.read_text())["meta"], json.loads(record.read_text())["meta"]
        pairs[meta_b["name"]] = (load_kernel(twin.with_suffix(".cubin").read_bytes(), meta_a),
                                 load_kernel(record.with_suffix(".cubin").read_bytes(), meta_b), meta_b)
    return pairs


def points(meta: dict, grid: bool = False) -> list:
    from tuner.measure.decode import DecodePoint, MLAPoint

    if meta["spec"]["variant"] == "mla" and grid:   # the decode buckets' corners at 128 heads, 1 token
        return [MLAPoint(b, kv) for b in (1, 8, 32, 128) for kv in (2048, 8192, 32768)]
    if meta["spec"]["variant"] == "mla":
        return [MLAPoint(b, kv, heads_q=h) for h in (128, 16) for b, kv in ((64, 4096), (128, 8192), (64, 16384))] + [
            MLAPoint(64, 8192, heads_q=128, seqlen_q=sq) for sq in (2, 4)]   # compute-bound: TFLOPS vs FlashMLA
    return [DecodePoint(b, kv) for b, kv in ((1, 8192), (8, 32768), (64, 8192), (128, 2048))]


def main(argv=None) -> int:
    import torch

    from tuner.measure.timer import alternating_rounds
    from tuner.measure.decode import (MLAPoint, copy_bandwidth_gbs, fa4_decode_call, make_decode_inputs,
                                    make_mla_inputs)

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--out", default="decode_ab.json")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--time-only", action="store_true",
                    help="time builds that are not meant to agree (a measurement variant): report, do not stop")
    ap.add_argument("--grid", action="store_true", help="MLA: batch 1-128 x 2k-32k keys at 128 heads instead")
    ap.add_argument("--by-spec", action="store_true",
                    help="pair the kernels of the same spec (their names differ: two parameter choices)")
    args = ap.parse_args(argv)

    copy = copy_bandwidth_gbs()
    record = {"device": torch.cuda.get_device_name(), "copy_gbs": copy, "rounds": args.rounds, "rows": []}
    print(f"copy bandwidth {copy:.0f} GB/s", flush=True)
    for name, (before, after, meta) in load_pairs(args.before, args.after, args.by_spec).items():
        print(name, flush=True)
        for p in points(meta, args.grid):
            mla = isinstance(p, MLAPoint)
            x = make_mla_inputs(p) if mla else make_decode_inputs(p)
            v = None if mla else x["v"]
            calls = {label: (lambda k: lambda: k(x["q"], x["k"], v, cache_seqlens=x["seqused_k"],
                                                 page_table=x["page_table"]))(kern)
                     for label, kern in (("before", before), ("after", after))}
            a, b = calls["before"](), calls["after"]()
            diff = float((a.float() - b.float()).abs().max())
            if not diff <= AGREE:
                print(f"  {p.label()}: the builds disagree (max |a - b| {diff:.3g})", flush=True)
                if not args.time_only:
                    return 1
            if not mla:
                try:
                    fa = fa4_decode_call(p, x)
                    fa()
                    calls["fa4"] = fa
                except Exception as exc:  # noqa: BLE001 - FA4 missing: the two builds are still compared
                    print(f"  fa4 not timed: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            gbs = {label: [p.kv_bytes / t / 1e6 for t in ms]
                   for label, ms in alternating_rounds(calls, args.rounds).items()}
            row = {"kernel": name, "point": p.label(), "max_diff": diff, **gbs,
                   "after/before": statistics.median(y / z for y, z in zip(gbs["after"], gbs["before"]))}
            if "fa4" in gbs:
                row["after/fa4"] = statistics.median(y / z for y, z in zip(gbs["after"], gbs["fa4"]))
            record["rows"].append(row)
            cells = "  ".join(f"{k} {statistics.median(g):.0f} [{min(g):.0f}, {max(g):.0f}]" for k, g in gbs.items())
            extra = f"  after/fa4 {row['after/fa4']:.3f}" if "after/fa4" in row else ""
            if mla:   # FLOP per cache byte is fixed by the point: TFLOPS = GB/s x that
                extra += f"  after TFLOPS {statistics.median(gbs['after']) * p.flops / p.kv_bytes / 1e3:.0f}"
            print(f"  {p.label():<28} GB/s {cells}  after/before {row['after/before']:.3f}  "
                  f"after/copy {statistics.median(gbs['after']) / copy:.2f}{extra}", flush=True)
            x = calls = a = b = None
            torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(record, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
