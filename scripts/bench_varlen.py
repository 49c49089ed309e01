"""Varlen and paged prefill, ours against FlashAttention-4, FlashInfer (if installed) and torch SDPA on the
padded batch: issue 14's cases (llama3-8b heads 32q/8kv, d128, causal, bf16; the mixes of tuner/measure/mixes.toml;
paged with pages of 16 and 128, the table shuffled). A thin wrapper over `tune bench --layout varlen` and
`--layout paged` (tuner/commands/bench_serving.py: the protocol, verification first, the table).

    python scripts/bench_varlen.py --gpu h100 --out $OUT/varlen.json [--cache-dir .kcache]

Writes {"varlen": record, "paged": record}, each the record `tune bench --json` writes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL = "llama3-8b"
PAGE_SIZES = (16, 128)


def main(argv=None) -> int:
    from tuner.commands import bench as bench_cmd
    from tuner.commands.bench_serving import run_mix_bench

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--out", default="varlen.json")
    ap.add_argument("--cache-dir", default=".kcache")
    args = ap.parse_args(argv)
    records, codes = {}, []
    for layout in ("varlen", "paged"):
        record: dict = {}
        codes.append(run_mix_bench(gpu=args.gpu, variant=None, model=MODEL, layout=layout, page_size=None,
                                   params=None, sketch=None, head_dim=None, dtype="bf16", causal=True, schedule=None,
                                   out_json=None, cache_dir=Path(args.cache_dir), page_sizes=PAGE_SIZES,
                                   record_out=record))
        if record:
            records[layout] = record
        if codes[-1] == 2:   # bad input or no GPU: the other layout would say the same
            break
    if not records:
        return max(codes)
    problem = bench_cmd.write_record(Path(args.out), records)
    if problem is not None:
        print(f"bench_varlen: error: {problem}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
