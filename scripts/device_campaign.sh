#!/bin/bash
# Issue 4's acceptance run on one GPU machine, from the repository root, in under 9.5 minutes:
#   bundle -> `tune --gpu GPU --variant mha` (>= 50 trials, real compile/verify/bench on Ray) -> `tune export`
#   -> the exported loader against torch SDPA -> a summary table (printed last).
#
#   bash scripts/device_campaign.sh                  # on the device: $OUT is set by the runner
#   DRY=1 bash scripts/device_campaign.sh            # here: --dry-run, real nvcc, no GPU (TRIALS default 6)
#   FAKE_GPU=1 bash scripts/device_campaign.sh       # here: GPU backend on a fake H100 (tests/campaign/gpu_fakes.py)
#
# Knobs (environment): OUT, BUDGET (seconds for the whole script, default 555), TRIALS (100 measured
# candidates), MODEL (a preset, e.g. llama3-8b: `--model` instead of MHA d128 causal bf16; the loader check
# then runs the model's head layout), SEQLENS (unset: the campaign's default grid,
# 512..16384), COMPILE_BATCH (4), TRIAL_TIMEOUT (30), SEED (0), GPU_OVERLAP (unset: the campaign's default;
# trial processes per GPU at once, the next ones starting up while one is timed; 1 = one at a time).
# What comes back under $OUT (8 files at most, no folders): campaign.log, check.log, summary.txt,
# summary.json, check.json, retime_check.json (every "search beat the seeds" re-timed apart: scripts/retime_check.py),
# report.md, study.tgz (journal, report, stored kernels, export, GPU samples, Ray worker error logs).
set -u
T0=$(date +%s)
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${OUT:-$REPO/out/device}
mkdir -p "$OUT"
# studies and export live here; only tars go to $OUT. KEEP=DIR keeps them (a later call on the same warm machine
# can then run only the export and the loader check: PHASE=check)
if [ -n "${KEEP:-}" ]; then WORK=$KEEP; mkdir -p "$WORK"; else WORK=$(mktemp -d /tmp/devcamp.XXXXXX); fi
PHASE=${PHASE:-all}
BUDGET=${BUDGET:-555}
DRY=${DRY:-0}
FAKE_GPU=${FAKE_GPU:-0}
if [ "$DRY" = 1 ] || [ "$FAKE_GPU" = 1 ]; then TRIALS=${TRIALS:-6}; else TRIALS=${TRIALS:-100}; fi
if [ "$FAKE_GPU" = 1 ]; then SEQLENS=${SEQLENS:-128,256}; else SEQLENS=${SEQLENS:-}; fi
COMPILE_BATCH=${COMPILE_BATCH:-4}
TRIAL_TIMEOUT=${TRIAL_TIMEOUT:-30}
GPU_OVERLAP=${GPU_OVERLAP:-}
SEED=${SEED:-0}
STEPS=$WORK/steps.json
elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( BUDGET - $(elapsed) )); }
say() { echo "[device_campaign +$(elapsed)s] $*"; }
declare -A STEP
save_steps() {
  local kv="" k
  for k in "${!STEP[@]}"; do
    if [[ ${STEP[$k]} =~ ^-?[0-9]+$ ]]; then kv="$kv\"$k\": ${STEP[$k]}, "; else kv="$kv\"$k\": \"${STEP[$k]}\", "; fi
  done
  echo "{${kv}\"total_s\": $(elapsed)}" > "$STEPS"
}

# 1. The bundle (optuna, ray, openai, typer, CUTLASS headers...) into /tmp/site.
if [ "$DRY" != 1 ] && [ "$FAKE_GPU" != 1 ]; then
  if [ ! -f .gpubundle/install.sh ]; then
    say "no .gpubundle here: pass carry=[\".gpubundle\"]"; exit 3
  fi
  if [ -d /tmp/site/optuna ]; then say "bundle already installed (warm machine)"
  else timeout 150 bash .gpubundle/install.sh || { say "bundle install failed"; exit 3; }; fi
fi
export PYTHONPATH=$REPO:/tmp/site${PYTHONPATH:+:$PYTHONPATH} RAY_AUTH_MODE=disabled
export PYTHONUNBUFFERED=1 COLUMNS=160
STEP[install_done_s]=$(elapsed)
say "bundle ready"

# 2. Which GPU.
GPU=h100
NAME=""
if [ "$DRY" != 1 ] && [ "$FAKE_GPU" != 1 ]; then
  NAME=$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  case "$NAME" in
    *H200*) GPU=h200 ;;
    *H100*) GPU=h100 ;;
    *) say "unexpected GPU '$NAME': using the h100 profile (sm_90a)";;
  esac
  timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | sed 's/^/  /'
fi
STEP[gpu]=$GPU
STEP[mode]=$([ "$DRY" = 1 ] && echo dry-run || ([ "$FAKE_GPU" = 1 ] && echo fake-gpu || echo gpu))
say "GPU '$NAME' -> --gpu $GPU; mode ${STEP[mode]}; $TRIALS trials; seqlens ${SEQLENS:-default}; overlap ${GPU_OVERLAP:-default}; $(nproc) CPUs"

# 3. The campaign. Reserve ~70 s after it (export, loader check, tars). --timeout counts from the
#    command's start (Ray start and baselines included) and ends the search; ~40 s are left for the finish
#    (store, report) before the outer timeout would kill it.
EXTRA=()
RAY_PID=""
if [ "$DRY" = 1 ]; then EXTRA+=(--dry-run); fi
[ -n "$SEQLENS" ] && EXTRA+=(--seqlens "$SEQLENS")
[ -n "$GPU_OVERLAP" ] && EXTRA+=(--gpu-overlap "$GPU_OVERLAP")
if [ "$FAKE_GPU" = 1 ]; then
  # A Ray head with one fake H100; every worker of the campaign's job installs the CPU stand-ins.
  PORT=$((20000 + RANDOM % 20000))
  setsid python3 -m ray.scripts.scripts start --head --port=$PORT --num-cpus=2 --num-gpus=1 \
    --labels=ray.io/accelerator-type=H100 --include-dashboard=false --disable-usage-stats --block \
    > "$WORK/ray_head.log" 2>&1 &
  RAY_PID=$!
  sleep 12
  EXTRA+=(--ray-address "127.0.0.1:$PORT")
  # (the trial processes are forked outside Ray: they get the stand-ins through TUNER_TRIAL_SETUP_HOOK)
  export RAY_JOB_CONFIG_JSON_ENV_VAR='{"runtime_env": {"worker_process_setup_hook": "tests.campaign.gpu_fakes.install", "env_vars": {"TUNER_TRIAL_SETUP_HOOK": "tests.campaign.gpu_fakes.install"}}}'
  export FAKE_GPU_REAL_NVCC=1
fi
RESERVE=${RESERVE:-70}       # export, loader check, tars
CMD_LIMIT=$(( $(left) - RESERVE ))
LOOP_LIMIT=${LOOP_TIMEOUT:-$(( CMD_LIMIT - 40 ))}
WHAT=(--variant mha --head-dim 128 --dtype bf16 --causal)
[ -n "${MODEL:-}" ] && WHAT=(--model "$MODEL")
STEP[campaign_limit_s]=$CMD_LIMIT
STEP[loop_timeout_s]=$LOOP_LIMIT
UTIL_PID=""
if [ "$DRY" != 1 ] && [ "$FAKE_GPU" != 1 ] && [ "$PHASE" != check ]; then
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits -l 1 > "$WORK/gpu_util.csv" 2>/dev/null &
  UTIL_PID=$!
fi
CPU_PID=""
if [ "$PHASE" != check ]; then   # CPU busy share and compiler processes: short of CPUs, or of work?
  python3 scripts/cpu_sampler.py "$WORK/cpu.csv" --every 2 &
  CPU_PID=$!
fi
say "campaign: command limit ${CMD_LIMIT}s, search budget --timeout ${LOOP_LIMIT}s"
C0=$(date +%s)
if [ "$PHASE" != check ]; then
timeout -k 15 "$CMD_LIMIT" python3 -m tuner --gpu "$GPU" "${WHAT[@]}" --trials "$TRIALS" --timeout "$LOOP_LIMIT" \
  --compile-batch "$COMPILE_BATCH" \
  --trial-timeout "$TRIAL_TIMEOUT" --seed "$SEED" --study-dir "$WORK/studies" "${EXTRA[@]}" \
  > "$OUT/campaign.log" 2>&1
STEP[campaign_rc]=$?
STEP[campaign_s]=$(( $(date +%s) - C0 ))
[ -n "${KEEP:-}" ] && echo "${STEP[campaign_rc]} ${STEP[campaign_s]} $CMD_LIMIT $LOOP_LIMIT" > "$WORK/campaign_rc"
else   # the campaign phase's outcome and limits (this call's own limits are the check's, not the campaign's)
  read -r STEP[campaign_rc] STEP[campaign_s] STEP[campaign_limit_s] STEP[loop_timeout_s] < "$WORK/campaign_rc"
  cp "$WORK/campaign.log" "$OUT/" 2>/dev/null
fi
[ -n "$UTIL_PID" ] && kill "$UTIL_PID" 2>/dev/null
[ -n "$CPU_PID" ] && kill "$CPU_PID" 2>/dev/null
if [ -n "$RAY_PID" ]; then kill -TERM -- "-$RAY_PID" 2>/dev/null; wait "$RAY_PID" 2>/dev/null; fi
say "campaign exit ${STEP[campaign_rc]} after ${STEP[campaign_s]}s; last lines:"
tail -n 25 "$OUT/campaign.log" | sed 's/^/  | /'

[ -n "${KEEP:-}" ] && cp "$OUT/campaign.log" "$WORK/campaign.log" 2>/dev/null
if [ "$PHASE" = campaign ]; then say "PHASE=campaign: export and check left to PHASE=check (KEEP=$WORK)"; exit 0; fi
# 4. Export, then the exported loader against SDPA (not for a dry run: nothing is stored).
STUDY=$(ls -d "$WORK"/studies/*/ 2>/dev/null | grep -v -e '/kernels/$' -e '/nvcc-cache/$' | head -1)
: > "$OUT/check.log"
if [ "$DRY" != 1 ]; then
  timeout 40 python3 -m tuner export --gpu "$GPU" -o "$WORK/exported" --study-dir "$WORK/studies" \
    >> "$OUT/check.log" 2>&1
  STEP[export_rc]=$?
  if [ "${STEP[export_rc]}" = 0 ]; then
    CHECK_ARGS=()
    [ "$FAKE_GPU" = 1 ] && CHECK_ARGS+=(--fake-gpu)
    [ -n "${MODEL:-}" ] && CHECK_ARGS+=(--model "$MODEL")
    CHECK_LIMIT=$(( $(left) - 20 )); [ "$CHECK_LIMIT" -lt 20 ] && CHECK_LIMIT=20
    timeout "$CHECK_LIMIT" python3 scripts/device_report.py check "$WORK/exported" "$OUT/check.json" "${CHECK_ARGS[@]}" \
      >> "$OUT/check.log" 2>&1
    STEP[check_rc]=$?
  fi
  # Every "search beat the seeds" of the run, re-timed apart from the campaign in a fresh process (15 rounds)
  HOOK=()
  [ "$FAKE_GPU" = 1 ] && HOOK=(env TUNER_TRIAL_SETUP_HOOK=tests.campaign.gpu_fakes.install)
  RETIME_LIMIT=$(( $(left) - 15 )); [ "$RETIME_LIMIT" -lt 20 ] && RETIME_LIMIT=20
  timeout "$RETIME_LIMIT" "${HOOK[@]}" python3 scripts/retime_check.py "$WORK/studies" "$OUT/retime_check.json" \
    >> "$OUT/check.log" 2>&1
  STEP[retime_check_rc]=$?
  cat "$OUT/check.log" | sed 's/^/  | /'
fi

# 5. What comes back: the study (journal, report, store, export, samples, Ray errors) as one tar.
if [ -n "$STUDY" ]; then
  cp "$STUDY/report.md" "$OUT/report.md" 2>/dev/null
  cp "$STUDY/summary.json" "$OUT/summary.json" 2>/dev/null
fi
mkdir -p "$WORK/ray_errors"
for f in /tmp/ray/session_latest/logs/worker-*.err /tmp/ray/session_latest/logs/raylet.err; do
  [ -s "$f" ] && tail -c 20000 "$f" > "$WORK/ray_errors/$(basename "$f")"
done
save_steps
tar -C "$WORK" --exclude='compiled' --exclude='nvcc-cache' -czf "$OUT/study.tgz" \
  $(cd "$WORK" && ls -d studies exported gpu_util.csv cpu.csv ray_errors steps.json ray_head.log 2>/dev/null)
[ -f "$OUT/study.tgz" ] && STEP[tgz_kb]=$(( $(stat -c %s "$OUT/study.tgz") / 1024 ))
save_steps
timeout 15 python3 scripts/device_report.py summary "$STUDY/summary.json" "$OUT/check.json" "$STEPS" \
  "$WORK/gpu_util.csv" "$WORK/cpu.csv" > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
[ -z "${KEEP:-}" ] && rm -rf "$WORK"
[ "${STEP[campaign_rc]}" = 0 ] && { [ "$DRY" = 1 ] || [ "${STEP[check_rc]:-1}" = 0 ]; }
