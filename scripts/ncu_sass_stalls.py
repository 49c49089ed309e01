"""Where two kernels' warps wait, instruction by instruction: the SASS page of an ncu report (dense_profile.py's
``POINT.source.csv``, i.e. ``ncu --import R --page source --csv --print-source sass``) summed per opcode.

    python3 scripts/ncu_sass_stalls.py POINT.source.csv                 # every kernel: executed and sampled, per opcode
    python3 scripts/ncu_sass_stalls.py POINT.source.csv --diff 1 4      # kernel 1 minus kernel 4, per stall reason
    python3 scripts/ncu_sass_stalls.py POINT.source.csv --hot 0 --top 30   # kernel 0's 30 most sampled instructions

Kernels are numbered in the file's order (0 first). The per-opcode table is how BENCHMARKS.md's "d64 limiter" section
found our softmax's F2FP and FADD waiting after the last MUFU.EX2 where FA4's interleave with it.
"""
from __future__ import annotations

import argparse
import collections
import csv
import sys
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return 0.0


def load(path: Path) -> list[dict]:
    """[{"name", "rows": [{column: value}], "stalls": [stall columns]}] per kernel of a source-page export."""
    kernels, header = [], None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                kernels.append({"name": row[1] if len(row) > 1 else "?", "rows": []})
                header = None
            elif header is None:
                header = row
                if kernels:
                    kernels[-1]["stalls"] = [c for c in header if c.startswith("stall_") and "Not Issued" not in c]
            elif kernels:
                kernels[-1]["rows"].append(dict(zip(header, row)))
    if not kernels or any("stalls" not in k or SAMPLES not in (k["rows"][0] if k["rows"] else {SAMPLES: 0})
                          for k in kernels):
        raise ValueError(f"{path}: not an ncu source page with SASS and stall samples (dense_profile.py's "
                         "POINT.source.csv)")
    return kernels


def opcode(source: str) -> str:
    """``@!P0 BRA 0x...`` -> BRA, ``MUFU.EX2 R1, R2`` -> MUFU."""
    tokens = source.split()
    if not tokens:
        return ""
    op = tokens[1] if tokens[0].startswith("@") and len(tokens) > 1 else tokens[0]
    return op.split(".")[0]


def per_opcode(kernel: dict) -> dict[str, collections.Counter]:
    """{opcode: Counter(executed=..., samples=..., stall_x=...)}."""
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for row in kernel["rows"]:
        op = opcode(row.get("Source", ""))
        if not op:
            continue
        out[op]["executed"] += _number(row.get(EXECUTED, "0"))
        out[op]["samples"] += _number(row.get(SAMPLES, "0"))
        for stall in kernel["stalls"]:
            out[op][stall] += _number(row.get(stall, "0"))
    return out


def stall_diff(a: dict, b: dict) -> list[tuple[str, float, float, list[tuple[str, float]]]]:
    """Per stall reason: (reason, a's samples, b's samples, the five opcodes whose difference is largest)."""
    ops_a, ops_b = per_opcode(a), per_opcode(b)
    out = []
    for stall in a["stalls"]:
        total_a = sum(c[stall] for c in ops_a.values())
        total_b = sum(c[stall] for c in ops_b.values())
        diffs = {op: ops_a.get(op, collections.Counter())[stall] - ops_b.get(op, collections.Counter())[stall]
                 for op in set(ops_a) | set(ops_b)}
        top = sorted(diffs.items(), key=lambda kv: -abs(kv[1]))[:5]
        out.append((stall, total_a, total_b, top))
    return sorted(out, key=lambda t: -abs(t[1] - t[2]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source_csv", type=Path)
    ap.add_argument("--diff", nargs=2, type=int, metavar=("A", "B"), help="kernel A minus kernel B per stall reason")
    ap.add_argument("--hot", type=int, metavar="K", help="kernel K's most sampled instructions")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    try:
        kernels = load(args.source_csv)
    except (OSError, ValueError) as exc:
        print(f"bad input: {exc}", file=sys.stderr)
        return 2
    for i in [*(args.diff or ()), *([args.hot] if args.hot is not None else [])]:
        if not 0 <= i < len(kernels):
            print(f"bad input: no kernel {i} (the file holds {len(kernels)}: 0-{len(kernels) - 1})", file=sys.stderr)
            return 2
    if args.diff:
        a, b = (kernels[i] for i in args.diff)
        print(f"A = {a['name'][:80]}\nB = {b['name'][:80]}\nreason | A samples | B samples | A - B | largest A - B by opcode")
        for stall, ta, tb, top in stall_diff(a, b):
            print(f"{stall[6:]} | {ta:.0f} | {tb:.0f} | {ta - tb:+.0f} | " + ", ".join(f"{op} {d:+.0f}" for op, d in top))
        return 0
    if args.hot is not None:
        k = kernels[args.hot]
        total = sum(_number(r.get(SAMPLES, "0")) for r in k["rows"]) or 1.0
        for row in sorted(k["rows"], key=lambda r: -_number(r.get(SAMPLES, "0")))[:args.top]:
            worst = max(k["stalls"], key=lambda s: _number(row.get(s, "0")))
            print(f"{row.get('Address', '?')} {100 * _number(row.get(SAMPLES, '0')) / total:5.2f}% {worst[6:]:14s} "
                  f"{row.get('Source', '')[:90]}")
        return 0
    for i, k in enumerate(kernels):
        ops = per_opcode(k)
        inst = sum(c["executed"] for c in ops.values()) or 1.0
        samples = sum(c["samples"] for c in ops.values()) or 1.0
        print(f"[{i}] {k['name'][:90]}: {inst / 1e6:.1f} M instructions, {samples:.0f} samples")
        for op, c in sorted(ops.items(), key=lambda kv: -kv[1]["executed"])[:args.top]:
            print(f"    {op:12s} {c['executed'] / 1e6:8.1f} M {100 * c['executed'] / inst:5.1f}%   samples "
                  f"{100 * c['samples'] / samples:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
