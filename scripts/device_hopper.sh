#!/bin/bash
# Verify and time a set of prebuilt Hopper kernels on the GPU machine (see scripts/hopper_check.py):
#   python scripts/hopper_check.py build --set first --out .hopper     # here, on the CPU
#   bash scripts/device_hopper.sh [--seqlens 1024,4096,16384]          # there, carrying .hopper (and .fa4)
# A kernel that hangs is named and skipped: the run goes on with the next one.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out/hopper}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -f .fa4/install.sh ]; then
  timeout 200 bash .fa4/install.sh && export PYTHONPATH=$PYTHONPATH:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
for pass in 1 2 3 4 5 6; do
  python3 scripts/hopper_check.py run --kernels "${KERNELS:-.hopper}" --out "$OUT" "$@"
  rc=$?
  [ $rc -eq 3 ] || break   # 3: a kernel hung and was skipped; go on with the rest
done
exit $rc
