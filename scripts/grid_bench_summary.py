"""The paper grid's `tune bench --json` records of one folder as one table.

    python3 scripts/grid_bench_summary.py DIR       # DIR: what scripts/grid_bench.sh wrote

Per spec, ours / FA4 at each key length and ours / cuDNN at 512 and 1k; then over the points at >= 2k keys the
geometric mean against FA4, how many are >= 1.0x FA4 and >= 1.0x max(FA4, cuDNN), and at 512-1k how many are >=
cuDNN. A point a library could not run (or a record lacks) is left out of the counts and printed as "-".
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

LONG = (2048, 4096, 8192, 16384)
SHORT = (512, 1024)


def load(folder: Path) -> dict[str, dict[int, dict]]:
    """{record name: {seqlen: row}} of every tune bench JSON in ``folder``."""
    out = {}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and isinstance(data.get("rows"), list):
            out[path.stem] = {r["seqlen"]: r for r in data["rows"] if "seqlen" in r}
    return out


def summary(records: dict[str, dict[int, dict]]) -> dict:
    long_fa4, ge_fa4, ge_both, short, ge_cudnn = [], 0, 0, 0, 0
    for rows in records.values():
        for seqlen in LONG:
            row = rows.get(seqlen, {})
            fa4, cudnn = row.get("ours/fa4"), row.get("ours/cudnn")
            if fa4:
                long_fa4.append(fa4)
                ge_fa4 += fa4 >= 1.0
                ge_both += fa4 >= 1.0 and (cudnn is None or cudnn >= 1.0)
        for seqlen in SHORT:
            cudnn = rows.get(seqlen, {}).get("ours/cudnn")
            if cudnn:
                short += 1
                ge_cudnn += cudnn >= 1.0
    geomean = math.exp(sum(map(math.log, long_fa4)) / len(long_fa4)) if long_fa4 else None
    return {"geomean_fa4_long": geomean, "points_long": len(long_fa4), "ge_fa4": ge_fa4, "ge_max": ge_both,
            "points_short": short, "ge_cudnn_short": ge_cudnn}


def _cell(value) -> str:
    return f"{value:.3f}" if value else "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", metavar="DIR", type=Path, help="a folder of `tune bench --json` records")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        print(f"grid_bench_summary.py: {args.folder} is not a folder", file=sys.stderr)
        return 2
    records = load(args.folder)
    if not records:
        print(f"no tune bench records in {args.folder}", file=sys.stderr)
        return 1
    print("| spec | 512 | 1k | 2k | 4k | 8k | 16k | / cuDNN 512 | / cuDNN 1k |\n|---|---|---|---|---|---|---|---|---|")
    for name, rows in records.items():
        cells = [_cell(rows.get(s, {}).get("ours/fa4")) for s in SHORT + LONG]
        cells += [_cell(rows.get(s, {}).get("ours/cudnn")) for s in SHORT]
        print(f"| {name} | " + " | ".join(cells) + " |")
    s = summary(records)
    print(f"\n>= 2k keys: geometric mean {_cell(s['geomean_fa4_long'])}x FA4, {s['ge_fa4']} of {s['points_long']} points "
          f">= 1.0x FA4, {s['ge_max']} >= 1.0x max(FA4, cuDNN); 512-1k: {s['ge_cudnn_short']} of {s['points_short']} "
          ">= cuDNN")
    return 0


if __name__ == "__main__":
    sys.exit(main())
