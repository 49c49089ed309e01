"""`tune bench` of each distinct bucket winner of a campaign, in one process per kernel: a serving campaign's
(`--layout varlen|paged`) against FA4 / FlashInfer / padded SDPA (issue 14's "≥ 1.0× FA4 after a campaign"), a
dense one's at the seqlens it won against FA4 and cuDNN (issue 16's).

    python scripts/bench_winners.py STUDY_DIR --layout paged --page-size 16 --model llama3-8b --out DIR
    python scripts/bench_winners.py STUDY_DIR --layout dense --variant mha --head-dim 64 --causal --out DIR

Reads the study's summary.json winners (bucket, the winner's params and schedule), runs one `tune bench` per
distinct kernel (its JSON to DIR/bench-<n>.json) and prints, per mix, the bucket's own winner against the
libraries, last.
"""
from __future__ import annotations

import argparse
import glob
import json
import subprocess
import sys
from pathlib import Path


def winners(study_dir: str) -> list[dict]:
    (path,) = glob.glob(f"{study_dir}/*/summary.json")
    out = []
    for w in json.loads(Path(path).read_text())["winners"]:
        kernel = w[w["winner"]]
        out.append({"bucket": w["bucket"], "params": kernel["params"], "schedule": kernel["schedule"],
                    "kernel_name": kernel["kernel_name"]})
    return out


def _ratios(row: dict, libraries) -> str:
    """Each library's TFLOPS in ``row`` with ours / it, for the libraries that were timed."""
    ours = row.get("ours")
    return "  ".join(f"{x} {row[x]:.1f} ({ours / row[x]:.3f})" for x in libraries
                     if isinstance(row.get(x), (int, float)) and row[x] and isinstance(ours, (int, float)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("study_dir")
    ap.add_argument("--layout", required=True)
    ap.add_argument("--page-size", type=int)
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--variant", help="dense: the study's variant (instead of --model)")
    ap.add_argument("--head-dim", type=int)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    dense = args.layout == "dense"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    kernels: dict[str, dict] = {}
    for w in winners(args.study_dir):
        kernels.setdefault(w["kernel_name"], {**w, "buckets": []})["buckets"].append(w["bucket"])
    rows = []
    for n, (name, k) in enumerate(kernels.items()):
        target = Path(args.out) / f"bench-{n}.json"
        what = (["--variant", args.variant, "--head-dim", str(args.head_dim), "--dtype", args.dtype,
                 "--seqlens", ",".join(b.removeprefix("s") for b in k["buckets"])] if dense
                else ["--model", args.model, "--layout", args.layout])
        cmd = [sys.executable, "-m", "tuner", "bench", "--gpu", args.gpu, *what, "--params", json.dumps(k["params"]),
               "--schedule", k["schedule"], "--causal" if args.causal else "--no-causal", "--json", str(target)]
        if args.page_size:
            cmd += ["--page-size", str(args.page_size)]
        print(f"== {name} (buckets {', '.join(k['buckets'])})", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        print(proc.stdout[-3000:], proc.stderr[-1500:], flush=True)
        if target.exists():
            rows.append((k, json.loads(target.read_text())))
    if dense:
        print("\nper seqlen, the bucket's own winner (TFLOPS; ratio = ours / library):")
        for k, record in rows:
            for r in record.get("rows", []):
                print(f"s{r.get('seqlen')!s:<8}{k['kernel_name'][-60:]:<62}ours {r.get('ours')}  "
                      f"{_ratios(r, ('fa4', 'cudnn'))}")
        return 0
    print("\nper mix, the bucket's own winner (TFLOPS; ratio = ours / library):")
    for k, record in rows:
        for r in record.get("rows", []):
            if r.get("bucket") in k["buckets"]:
                print(f"{r.get('mix', '?'):<22}{r.get('bucket', '?'):<18}ours {r.get('ours')}  "
                      f"{_ratios(r, ('fa4', 'flashinfer', 'sdpa'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
