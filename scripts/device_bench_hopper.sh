#!/bin/bash
# The Hopper benchmark on one GPU machine (issue 8's table): `tune bench` for every shape of the paper grid
# with the Hopper defaults (`tune build --gpu h100 ...` picks the same), ours against torch's flash /
# cuDNN / efficient and FlashAttention-4 in the same process on the same inputs. Optionally the GPU
# tests first (GPU_TESTS=1).
#   bash scripts/device_bench_hopper.sh        # on the device; carry .fa4 (FA4 + typer + CUTLASS headers)
#                                              # and .kcache (kernels prebuilt here: PREBUILD=1 on the CPU)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out/bench-hopper}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS=200 TUNER_CACHE_DIR=$PWD/.kcache
GPU=h100
PLAIN='{"mma_atom":"SM90_GMMA","g2s_atom":"SM80_CP_ASYNC_CACHEGLOBAL","block_m":128,"block_n":128,"num_warps":8,"kv_stages":2,"pv_operand":"rs","persistent":false,"producer_regs":24,"pingpong":false}'
# name | variant | head dim | causal flag | params (empty: the Hopper default) | schedule (empty: the default)
CASES=(
  "mha128c|mha|128|--causal|"
  "mha128n|mha|128|--no-causal|"
  "mha64c|mha|64|--causal|"
  "mha64n|mha|64|--no-causal|"
  "gqa128c|gqa|128|--causal|"
  "gqa128n|gqa|128|--no-causal|"
  "mqa128c|mqa|128|--causal|"
  "mqa128n|mqa|128|--no-causal|"
  "mlac|mla|192|--causal|"
  "mlan|mla|192|--no-causal|"
  # alternatives where the default trailed cuDNN in the runs of 2026-11-22 (d64 causal, d128 non-causal at 2k)
  "mha64c_128|mha|64|--causal|{\"block_m\":128,\"num_warps\":8,\"producer_regs\":24}"
  "mha64c_128pp|mha|64|--causal|{\"block_m\":128,\"num_warps\":8,\"producer_regs\":24,\"pingpong\":true}"
  "mha128n_176|mha|128|--no-causal|{\"block_n\":176}"
  "gqa128n_pp|gqa|128|--no-causal|{\"pingpong\":true}"
  # the non-warp-specialised step (issue 8, deliver 1): every warpgroup loads with cp.async and computes with wgmma
  "plain_mha128c|mha|128|--causal|$PLAIN|fa2"
  "plain_mha128n|mha|128|--no-causal|$PLAIN|fa2"
  "plain_mlac|mla|192|--causal|$PLAIN|fa2"
)
if [ -n "${ONLY:-}" ]; then
  keep=(); for c in "${CASES[@]}"; do [[ " $ONLY " == *" ${c%%|*} "* ]] && keep+=("$c"); done; CASES=("${keep[@]}")
fi
args() {  # the tune arguments of a case
  IFS='|' read -r name variant hd causal params schedule <<<"$1"
  A=(--gpu $GPU --variant $variant $causal --dtype bf16); [ "$variant" != mla ] && A+=(--head-dim "$hd")
  [ -n "$params" ] && A+=(--params "$params")
  [ -n "$schedule" ] && A+=(--schedule "$schedule")
}
if [ -n "${PREBUILD:-}" ]; then   # here, on the CPU: fill .kcache so the device compiles nothing
  for c in "${CASES[@]}"; do args "$c"; python3 -m tuner build "${A[@]}" -o /tmp/prebuild || exit 1; done
  exit 0
fi
if [ -f .fa4/install.sh ]; then
  timeout 200 bash .fa4/install.sh || exit 3
  export PYTHONPATH=$PWD:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
fi
GPU=h100; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && GPU=h200
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
if [ -n "${GPU_TESTS:-}" ]; then
  KERNEL_CACHE_DIR=$TUNER_CACHE_DIR timeout 420 python3 -m pytest -q -p no:cacheprovider tests/gpu \
    > "$OUT/gpu_tests.log" 2>&1; echo "gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests.log"))"
fi
for c in "${CASES[@]}"; do
  args "$c"; name=${c%%|*}
  timeout 240 python3 -m tuner bench "${A[@]}" --json "$OUT/bench-$name.json" >> "$OUT/bench.log" 2>&1 \
    || echo "$name: bench exit $?" | tee -a "$OUT/bench.log"
done
python3 - "$OUT" <<'PY'
import glob, json, sys
rows, meta = [], {}
for f in sorted(glob.glob(sys.argv[1] + "/bench-*.json")):
    data = json.load(open(f))
    name = f.split("bench-")[-1][:-5]
    for r in data.get("rows", []):
        r["case"] = name
        rows.append(r)
    meta = {k: v for k, v in data.items() if k not in ("rows", "kernels")}
json.dump({"meta": meta, "rows": rows}, open(sys.argv[1] + "/bench_all.json", "w"), indent=1)
print(f"# {meta.get('device')} torch {meta.get('torch')} cudnn {meta.get('cudnn')}")
f = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
print(f"{'case':8} {'sq':>6} {'ours':>6} {'flash':>6} {'cudnn':>6} {'fa4':>6} {'xcuDNN':>6} {'xFA4':>5} status")
for r in rows:
    o, cu, f4 = r.get("ours"), r.get("cudnn"), r.get("fa4")
    print(f"{r['case']:8} {r['seqlen']:>6} {f(o):>6} {f(r.get('flash')):>6} {f(cu):>6} {f(f4):>6} "
          f"{(o / cu if o and cu else 0):6.2f} {(o / f4 if o and f4 else 0):5.2f} {r.get('status')}")
PY
