"""The decode kernels' fast gather (attn_decode.cuh gather_rows) addresses a row's 64-column blocks as the row's
first block plus blk x kBlockN x 64 elements: true of the shared-memory layouts translate/decode/generate.py
declares (tile_to_shape of a Swizzle<s, 3, 3> 8 x 64 atom, every swizzle 0..3), checked on the host against CuTe
for every element of the K/V tiles the decode search space can build."""
import pytest

from tests.translate.host_checks import run_host_checks

pytestmark = pytest.mark.slow

CHECK = r"""
#include <cstdio>
#include <cute/tensor.hpp>
using namespace cute;

template <int kSwizzle, int kRows, int kCols>
int check(const char* label) {
  using Atom = decltype(composition(Swizzle<kSwizzle, 3, 3>{}, Layout<Shape<_8, _64>, Stride<_64, _1>>{}));
  auto layout = tile_to_shape(Atom{}, Shape<Int<kRows>, Int<kCols>>{});
  int bad = 0;
  for (int r = 0; r < kRows; ++r)
    for (int blk = 0; blk < kCols / 64; ++blk)
      for (int c = 0; c < 64; ++c)
        bad += layout(r, blk * 64 + c) != layout(r, c) + blk * kRows * 64;
  std::printf("%s swizzle %d, %d x %d: %d mismatches\n", bad ? "FAIL" : "OK", kSwizzle, kRows, kCols, bad);
  return bad;
}

template <int kSwizzle>
int all() {
  return check<kSwizzle, 32, 128>("") + check<kSwizzle, 64, 128>("") + check<kSwizzle, 64, 576>("") +
         check<kSwizzle, 32, 576>("") + check<kSwizzle, 64, 512>("") + check<kSwizzle, 16, 64>("");
}

int main() { return (all<0>() + all<1>() + all<2>() + all<3>()) ? 1 : 0; }
"""


def test_a_rows_64_column_blocks_lie_kblockn_x_64_elements_apart(tmp_path):
    run_host_checks(CHECK, "gather_layout", tmp_path, count=24)
