"""The FP8 decode kernels' register reads (attn_decode_fp8.cuh, attn_decode_fp8_mla.cuh) assume mma.sync's B
fragments as CuTe partitions them: value j of (n-block ni, k-block ki) at n = 8 ni + (lane % 32) / 4, k = 16 ki +
2 (lane % 4) + {0, 1, 8, 9}[j], the four values adjacent registers. ``check_b_fragments`` compiles a host program
(nvcc and CuTe, no GPU) that checks this for every lane of the given tiles and warp counts."""
from __future__ import annotations

import shutil
import subprocess

import pytest

PROGRAM = r"""
#include <cstdio>
#include <cute/tensor.hpp>
using namespace cute;
template <int kWarpsM>
int check() {
  using TiledMma = TiledMMA<MMA_Atom<SM80_16x8x16_F32F16F16F32_TN>, Layout<Shape<Int<kWarpsM>, _1, _1>>,
                            Tile<Int<16 * kWarpsM>, _16, _16>>;
  TiledMma mma;
  cutlass::half_t buf[1];
  int bad = 0;
  for (int t = 0; t < 32 * kWarpsM; ++t) {
    auto thr = mma.get_thread_slice(t);
    auto one = [&](auto tile) {
      Tensor c = thr.partition_B(make_identity_tensor(tile));
      Tensor f = thr.partition_fragment_B(make_tensor(make_gmem_ptr(buf), make_layout(tile)));
      const int offs[4] = {0, 1, 8, 9};
      for (int ki = 0; ki < size<2>(f); ++ki)
        for (int ni = 0; ni < size<1>(f); ++ni)
          for (int j = 0; j < 4; ++j) {
            bad += get<0>(c(j, ni, ki)) != 8 * ni + (t % 32) / 4;
            bad += get<1>(c(j, ni, ki)) != 16 * ki + 2 * (t % 4) + offs[j];
            bad += f.layout()(j, ni, ki) != f.layout()(0, ni, ki) + j || f.layout()(0, ni, ki) % 4;
          }
    };
TILES
  }
  return bad;
}
int main() { printf("%d\n", CHECKS); return 0; }
"""


def program(tiles: list[str], warps: tuple[int, ...]) -> str:
    """The host program for these tiles (C++ shape expressions, e.g. "Shape<_32, _128>") and warp counts."""
    return PROGRAM.replace("TILES", "\n".join(f"    one({t}{{}});" for t in tiles)).replace(
        "CHECKS", " + ".join(f"check<{w}>()" for w in warps))


def check_b_fragments(tmp_path, tiles: list[str], warps: tuple[int, ...]) -> None:
    """Build and run the program (skips without nvcc); it prints the count of lanes' values out of place: 0."""
    from translate.nvcc import cutlass_include_dir, find_nvcc

    try:
        nvcc = find_nvcc()
    except Exception:
        pytest.skip("nvcc not installed")
    if not nvcc or not shutil.which(str(nvcc)):
        pytest.skip("nvcc not installed")
    (tmp_path / "check.cu").write_text(program(tiles, warps))
    build = subprocess.run([str(nvcc), "-std=c++17", f"-I{cutlass_include_dir()}", "-o", str(tmp_path / "check"),
                            str(tmp_path / "check.cu")], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-2000:]
    run = subprocess.run([str(tmp_path / "check")], capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "0", run.stdout + run.stderr
