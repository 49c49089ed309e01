#!/bin/bash
# Issue 14's campaign run on one GPU machine, from the repository root (carry [".gpubundle"]):
#   `tune --gpu h100 --model MODEL --layout LAYOUT --page-size PAGE --timeout T` -> `tune export` -> the export
#   serving every mix of the layout through flash_attn_varlen_func (scripts/serving_check.py) -> a table, last.
#
#   LAYOUT=paged PAGE=16 MODEL=llama3-8b CAMPAIGN_S=360 bash scripts/device_serving.sh
#
# Knobs: OUT (set by the runner), KEEP (a folder kept between calls on a warm machine: the study and the export
# stay there for a later `tune bench` call with .fa4), TRIALS (1000), COMPILE_BATCH (4), TRIAL_TIMEOUT (60).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out/device}; mkdir -p "$OUT"
KEEP=${KEEP:-$PWD/.devkeep}; mkdir -p "$KEEP"
LAYOUT=${LAYOUT:-paged}; PAGE=${PAGE:-16}; MODEL=${MODEL:-llama3-8b}
CAMPAIGN_S=${CAMPAIGN_S:-360}; TRIALS=${TRIALS:-1000}
if [ ! -d /tmp/site/optuna ]; then timeout 150 bash .gpubundle/install.sh || { echo "bundle install failed"; exit 3; }; fi
# FA4 as the campaign's baseline when an earlier call on this warm machine unpacked .fa4 (its DSL's `cutlass`
# module first; the nvcc headers are found as cutlass_library either way)
FA4PATH=""; [ -f /tmp/fa4site/.bundle-done ] && FA4PATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages:
export PYTHONPATH=$PWD:$FA4PATH/tmp/site${PYTHONPATH:+:$PYTHONPATH} RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1 COLUMNS=150
echo "FA4 baseline: $([ -n "$FA4PATH" ] && echo "from /tmp/fa4site" || echo "not unpacked on this machine")"
PAGE_ARGS=(); [ "$LAYOUT" = paged ] && PAGE_ARGS=(--page-size "$PAGE")
STUDIES=$KEEP/studies-$LAYOUT$([ "$LAYOUT" = paged ] && echo "$PAGE")
rm -rf "$STUDIES" "$KEEP/exported-$LAYOUT"
T0=$(date +%s)
timeout -k 15 $((CAMPAIGN_S + 90)) python3 -m tuner --gpu h100 --model "$MODEL" --layout "$LAYOUT" "${PAGE_ARGS[@]}" \
  --trials "$TRIALS" --timeout "$CAMPAIGN_S" --compile-batch "${COMPILE_BATCH:-4}" \
  --trial-timeout "${TRIAL_TIMEOUT:-60}" --seed 0 --study-dir "$STUDIES" > "$OUT/campaign-$LAYOUT.log" 2>&1
RC=$?
echo "campaign exit $RC after $(( $(date +%s) - T0 )) s"; tail -n 30 "$OUT/campaign-$LAYOUT.log"
python3 -m tuner export --gpu h100 -o "$KEEP/exported-$LAYOUT" --study-dir "$STUDIES" 2>&1 | tail -5
cp "$STUDIES"/*/summary.json "$OUT/summary-$LAYOUT.json" 2>/dev/null
cp "$STUDIES"/*/report.md "$OUT/report-$LAYOUT.md" 2>/dev/null
timeout 200 python3 scripts/serving_check.py "$KEEP/exported-$LAYOUT" --layout "$LAYOUT" "${PAGE_ARGS[@]}" \
  --model "$MODEL" --json "$OUT/check-$LAYOUT.json"
