#!/bin/bash
# tune bench over the paper grid's dense specs (the bucket table's grid), FA4 and cuDNN in the same process, on a GPU
# machine with the FA4 bundle installed (e.g. `bash .fa4/install.sh` and the device README):
#
#   bash scripts/grid_bench.sh OUT_DIR [--gpu h100] [SPEC ...]
#
# SPEC is variant:head_dim:causal|no-causal (default: the nine specs of the H100 table). One JSON and one log per
# spec under OUT_DIR, then scripts/grid_bench_summary.py's table (ours / FA4 per key length, ours / cuDNN at 512-1k,
# the geometric mean at >= 2k keys).
set -u
usage() {
  echo "usage: bash scripts/grid_bench.sh OUT_DIR [--gpu GPU] [SPEC ...]"
  echo
  echo "tune bench over the paper grid's dense specs on a GPU machine (FA4 and cuDNN in the same process), one"
  echo "JSON and one log per spec under OUT_DIR, then scripts/grid_bench_summary.py's table."
  echo "SPEC is variant:head_dim:causal|no-causal, e.g. gqa:128:causal (default: the nine specs of the H100 table)."
}
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  "") usage >&2; exit 2 ;;
esac
OUT=$1; shift
GPU=h100
if [ "${1:-}" = "--gpu" ]; then GPU=$2; shift 2; fi
SPECS=("$@")
[ ${#SPECS[@]} -eq 0 ] && SPECS=(mha:64:no-causal mha:64:causal mqa:64:causal mha:128:causal mha:128:no-causal
                                 gqa:128:causal gqa:128:no-causal mqa:128:causal mqa:128:no-causal)
mkdir -p "$OUT"
for s in "${SPECS[@]}"; do
  IFS=: read -r v d c <<<"$s"
  A=(--gpu "$GPU" --variant "$v" "--$c" --dtype bf16); [ "$v" != mla ] && A+=(--head-dim "$d")
  timeout 280 python3 -m tuner bench "${A[@]}" --json "$OUT/$v$d-$c.json" > "$OUT/$v$d-$c.log" 2>&1 || echo "$s: exit $?"
done
python3 "$(dirname "$0")/grid_bench_summary.py" "$OUT"
