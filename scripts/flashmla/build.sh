#!/bin/bash
# Build FlashMLA's Hopper dense decode (bf16) from a checkout into one shared library with a C entry point
# (shim.cu), for scripts/flashmla_check.py: no torch extension, so it builds on a CPU machine with nvcc and
# CUTLASS headers and loads anywhere with ctypes.
#   bash scripts/flashmla/build.sh FLASHMLA_DIR CUTLASS_INCLUDE OUT.so
# CUTLASS_INCLUDE: a CUTLASS include/ folder (FlashMLA's csrc/cutlass submodule, or the nvidia-cutlass wheel's).
set -eu
src=$1/csrc; cutlass=$2; out=$3
here=$(cd "$(dirname "$0")" && pwd)
flags=(-O3 -std=c++20 -DNDEBUG -D_USE_MATH_DEFINES -DFLASH_MLA_DISABLE_FP16 --expt-relaxed-constexpr
       --expt-extended-lambda --use_fast_math -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__
       -U__CUDA_NO_BFLOAT16_CONVERSIONS__ -Xcompiler -fPIC -gencode arch=compute_90a,code=sm_90a
       -I"$src" -I"$src/kerutils/include" -I"$cutlass" -I"$cutlass/../tools/util/include")
tmp=$(mktemp -d)
units=("$here/shim.cu" "$src/sm90/decode/dense/instantiations/bf16.cu" "$src/smxx/decode/combine/combine.cu"
       "$src/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu")
pids=()
for u in "${units[@]}"; do
  nvcc "${flags[@]}" -c "$u" -o "$tmp/$(basename "$u").o" & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
# the driver API (cuTensorMapEncodeTiled) resolves at load time against libcuda.so.1 (flashmla_check.py loads it
# first, RTLD_GLOBAL): CPU build machines have no libcuda to link against
nvcc -shared -o "$out" "$tmp"/*.o
rm -rf "$tmp"
echo "built $out"
