#!/bin/bash
# Issue 15's decode campaign on one GPU machine, from the repository root (carry [".gpubundle"]):
#   `tune --gpu h100 --model MODEL --phase decode --page-size PAGE --timeout T` -> `tune export` -> the export
#   serving one call per decode bucket through flash_attn_with_kvcache (scripts/decode_serve_check.py) -> a table.
#
#   MODEL=llama3-8b PAGE=16 CAMPAIGN_S=300 bash scripts/device_decode.sh
#   MODEL=deepseek-v3 PAGE=64 CAMPAIGN_S=450 bash scripts/device_decode.sh
#
# FA4 is the campaign's baseline when an earlier call on this warm machine unpacked .fa4 (see device_serving.sh).
# Knobs: OUT (set by the runner), KEEP (.devkeep), TRIALS (1000), COMPILE_BATCH (4), TRIAL_TIMEOUT (120).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out/device}; mkdir -p "$OUT"
KEEP=${KEEP:-$PWD/.devkeep}; mkdir -p "$KEEP"
MODEL=${MODEL:-llama3-8b}; PAGE=${PAGE:-16}
CAMPAIGN_S=${CAMPAIGN_S:-300}; TRIALS=${TRIALS:-1000}
if [ ! -d /tmp/site/optuna ]; then timeout 150 bash .gpubundle/install.sh || { echo "bundle install failed"; exit 3; }; fi
FA4PATH=""; [ -f /tmp/fa4site/.bundle-done ] && FA4PATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages:
export PYTHONPATH=$PWD:$FA4PATH/tmp/site${PYTHONPATH:+:$PYTHONPATH} RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1 COLUMNS=150
echo "FA4 baseline: $([ -n "$FA4PATH" ] && echo "from /tmp/fa4site" || echo "not unpacked on this machine")"
STUDIES=$KEEP/studies-decode-$MODEL
rm -rf "$STUDIES" "$KEEP/exported-decode-$MODEL"
T0=$(date +%s)
timeout -k 15 $((CAMPAIGN_S + 100)) python3 -m tuner --gpu h100 --model "$MODEL" --phase decode --page-size "$PAGE" \
  --trials "$TRIALS" --timeout "$CAMPAIGN_S" --compile-batch "${COMPILE_BATCH:-4}" \
  --trial-timeout "${TRIAL_TIMEOUT:-120}" --seed 0 --study-dir "$STUDIES" > "$OUT/campaign-decode-$MODEL.log" 2>&1
RC=$?
echo "campaign exit $RC after $(( $(date +%s) - T0 )) s"; tail -n 40 "$OUT/campaign-decode-$MODEL.log"
python3 -m tuner export --gpu h100 -o "$KEEP/exported-decode-$MODEL" --study-dir "$STUDIES" 2>&1 | tail -5
cp "$STUDIES"/*/summary.json "$OUT/summary-decode-$MODEL.json" 2>/dev/null
cp "$STUDIES"/*/report.md "$OUT/report-decode-$MODEL.md" 2>/dev/null
cp -r "$KEEP/exported-decode-$MODEL" "$OUT/exported-decode-$MODEL" 2>/dev/null
timeout 150 python3 scripts/decode_serve_check.py "$KEEP/exported-decode-$MODEL" --model "$MODEL" --page-size "$PAGE" \
  --json "$OUT/check-decode-$MODEL.json"
