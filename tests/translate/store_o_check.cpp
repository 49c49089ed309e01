// Host-only check of attn_sm90::store_o_tile (translate/include/attn_sm90.cuh) against CuTe's tiled copy it
// replaced: make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>, TiledMmaPV) over SmemLayoutO, both from a
// Hopper kernel's own types (tests/translate/test_store_o.py pastes translate.sm90.emit.kernel_types() of each
// config in front of this file, one namespace per config).
//
// A stmatrix.x4 is fixed by what each thread passes: one shared-memory address and four 32-bit registers.
// CuTe's copy, taken apart as cute::copy runs it (per instruction: its eight 16-bit source values, which it
// passes as four 32-bit registers, and the address of its destination's first element), must pass, for every thread of the consumer warpgroups, the same set of
// (address, registers) as store_o_tile: address store_o_offset(thread, k), the fragment's 16-bit values
// 8k .. 8k + 7 in storage order, for k = 0 .. kHeadDimV / 16 - 1.
#include <cstdio>
#include <cstdint>
#include <map>
#include <vector>

namespace check {
using namespace cute;

template <class Cfg>
int store_o(const char* label) {
  using Element = typename Cfg::Element;
  constexpr int kRows = Cfg::kBlockM, kCols = Cfg::kHeadDimV, kThreads = 2 * kRows;   // 128 per 64 rows
  typename Cfg::TiledMmaPV mma;
  auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma);
  // the shared tile at a 1024-byte-aligned address, so the pointer's swizzle is the layout's
  alignas(1024) static Element tile[kRows * kCols];
  Tensor sO = make_tensor(make_smem_ptr(tile), typename Cfg::SmemLayoutO{});
  // the 16-bit output fragment, each value its storage index
  Tensor frag = make_tensor<int>(partition_fragment_C(mma, Shape<Int<kRows>, Int<kCols>>{}).layout());
  for (int i = 0; i < size(frag); ++i) frag.data()[i] = i;
  int bad = 0, stores = 0;
  for (int t = 0; t < kThreads; ++t) {
    auto thr = r2s.get_thread_slice(t);
    // (values, instructions): mode 0 is (an instruction's values, its repeats) and cute::copy peels it
    // instruction by instruction, so the 1-D (colexicographic) order runs through one instruction's values first
    Tensor src = thr.retile_S(frag);
    Tensor dst = thr.partition_D(sO);
    constexpr int kVals = 8;   // 16-bit values of one stmatrix.x4: four 32-bit registers, one 16-byte row piece
    std::map<long, std::vector<int>> cute_stores, ours;
    for (int i = 0; i < size(src) / kVals; ++i) {
      std::vector<int> regs;
      for (int v = 0; v < kVals; ++v) regs.push_back(src(kVals * i + v));
      const long address = long(&dst(kVals * i) - tile);
      for (int v = 1; v < kVals; ++v) {
        if (long(&dst(kVals * i + v) - tile) != address + v) ++bad;   // one contiguous 16-byte row piece
      }
      cute_stores[address] = regs;
    }
    for (int k = 0; k < kCols / 16; ++k) {
      std::vector<int> regs;
      for (int v = 0; v < 8; ++v) regs.push_back(8 * k + v);
      ours[attn_sm90::store_o_offset<kRows, attn_sm90::kChunkCols<kCols>>(t, k)] = regs;
    }
    stores += int(ours.size());
    if (cute_stores != ours) {
      if (bad < 3) std::printf("  %s: thread %d stores differently (%zu vs %zu stmatrix)\n", label, t,
                               cute_stores.size(), ours.size());
      ++bad;
    }
  }
  std::printf("%s %s: %d threads x %d stmatrix.x4\n", bad ? "FAIL" : "OK", label, kThreads, stores / kThreads);
  return bad ? 1 : 0;
}

}  // namespace check
