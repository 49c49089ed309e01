#!/bin/bash
# The issue-3 benchmark on one GPU machine: `tune bench` for every variant of the grid with the best
# parameters found by the sweeps (notes in BENCHMARKS.md), ours and torch's flash / cuDNN / efficient
# backends in the same process on the same inputs. Kernels are built first in parallel (shared cache),
# then benchmarked one at a time so the timings do not overlap.
#   bash scripts/device_bench.sh          # on the device, $OUT set by the runner
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out/bench}; mkdir -p "$OUT"
if [ -f .gpubundle/install.sh ]; then timeout 150 bash .gpubundle/install.sh || exit 3; fi
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH} RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1 COLUMNS=160
export TUNER_CACHE_DIR=/tmp/tuner-kernel-cache
rm -f /tmp/bench-*.json  # a warm machine keeps the last run's files
GPU=h100; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && GPU=h200
# name | variant | head dim | causal flag | params
CASES=(
  "mha128c|mha|128|--causal|{\"block_m\":128,\"block_n\":128,\"num_warps\":8,\"kv_stages\":1,\"q_in_regs\":true}"
  "mha128n|mha|128|--no-causal|{\"block_m\":128,\"block_n\":64,\"num_warps\":4,\"kv_stages\":2}"
  "mha128c_n64|mha|128|--causal|{\"block_m\":128,\"block_n\":64,\"num_warps\":4,\"kv_stages\":1}"
  "mha128n_s1|mha|128|--no-causal|{\"block_m\":128,\"block_n\":64,\"num_warps\":4,\"kv_stages\":1}"
  "mha64c|mha|64|--causal|{\"block_m\":128,\"block_n\":128,\"num_warps\":4,\"kv_stages\":1}"
  "mha64n|mha|64|--no-causal|{\"block_m\":128,\"block_n\":128,\"num_warps\":4,\"kv_stages\":1}"
  "gqa128c|gqa|128|--causal|{\"block_m\":128,\"block_n\":64,\"num_warps\":4,\"kv_stages\":1}"
  "gqa128n|gqa|128|--no-causal|{\"block_m\":128,\"block_n\":64,\"num_warps\":4,\"kv_stages\":1}"
  "mqa128c|mqa|128|--causal|{\"block_m\":128,\"block_n\":64,\"num_warps\":4,\"kv_stages\":1}"
  "mqa128n|mqa|128|--no-causal|{\"block_m\":128,\"block_n\":64,\"num_warps\":4,\"kv_stages\":1}"
  "mlac|mla|192|--causal|{\"block_m\":128,\"block_n\":96,\"num_warps\":8,\"kv_stages\":2,\"q_in_regs\":true}"
  "mlan|mla|192|--no-causal|{\"block_m\":128,\"block_n\":32,\"num_warps\":4,\"kv_stages\":2}"
)
# ONLY="name1 name2" runs a subset.
if [ -n "${ONLY:-}" ]; then
  keep=(); for c in "${CASES[@]}"; do [[ " $ONLY " == *" ${c%%|*} "* ]] && keep+=("$c"); done; CASES=("${keep[@]}")
fi
echo "== build (parallel, fills the kernel cache)"
for c in "${CASES[@]}"; do
  IFS='|' read -r name variant hd causal params <<<"$c"
  hdarg=(--head-dim "$hd"); [ "$variant" = mla ] && hdarg=()
  timeout 240 python3 -m tuner build --gpu $GPU --variant $variant "${hdarg[@]}" $causal --dtype bf16 \
    --params "$params" -o /tmp/bench-build/$name > /tmp/bench-build-$name.log 2>&1 &
done
wait
echo "== bench (one at a time)"
for c in "${CASES[@]}"; do
  IFS='|' read -r name variant hd causal params <<<"$c"
  hdarg=(--head-dim "$hd"); [ "$variant" = mla ] && hdarg=()
  timeout 120 python3 -m tuner bench --gpu $GPU --variant $variant "${hdarg[@]}" $causal --dtype bf16 \
    --params "$params" --json /tmp/bench-$name.json >> "$OUT/bench.log" 2>&1 || echo "$name: bench exit $?" | tee -a "$OUT/bench.log"
done
python3 - "$OUT" <<'PY'
import glob, json, sys
rows = []
for f in sorted(glob.glob("/tmp/bench-*.json")):
    data = json.load(open(f))
    for r in data.get("rows", []):
        r["file"] = f.split("bench-")[1][:-5]
        rows.append(r)
    meta = {k: v for k, v in data.items() if k != "rows"}
json.dump({"meta": meta, "rows": rows}, open(sys.argv[1] + "/bench_all.json", "w"), indent=1)
print(f"# {meta.get('device_name') or meta.get('device')} torch {meta.get('torch')} cudnn {meta.get('cudnn')}")
def f(x): return "-" if x is None else f"{x:.1f}"
print(f"{'case':9} {'sq':>6} {'ours':>7} {'flash':>7} {'cudnn':>7} {'eff':>7} {'x flash':>8} {'x eff':>6}")
for r in rows:
    o, fl, cu, ef = (r.get(k) for k in ("ours", "flash", "cudnn", "efficient"))
    xf = f"{o/fl:.2f}" if o and fl else "-"
    xe = f"{o/ef:.2f}" if o and ef else "-"
    print(f"{r['file']:9} {r.get('seqlen', r.get('seqlen_q')):>6} {f(o):>7} {f(fl):>7} {f(cu):>7} {f(ef):>7} {xf:>8} {xe:>6}")
PY
