// Device helpers for Hopper (sm_90a) kernels generated from TL programs: the copies between global and shared
// memory. TMA boxes of dense tiles and of a paged cache's pages, the producer warpgroup's cp.async rows through a
// page table, and the TMA store of O's rows. Included by attn_sm90.cuh.
#ifndef ATTN_SM90_COPY_CUH
#define ATTN_SM90_COPY_CUH

#include <cuda.h>
#include <cute/tensor.hpp>
#include <cute/arch/copy_sm80.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

namespace attn_sm90 {
using namespace cute;

// ---- TMA ------------------------------------------------------------------------------------------
// A (rows, D) tile of a (batch, seqlen, heads, D) tensor into a K-major, 128-byte-swizzled shared tile:
// D/64 boxes of 64 columns x rows, one per 64-column chunk, each landing as rows x 128 bytes (the
// layout of GMMA::Layout_K_SW128_Atom tiled over the tile). Rows past the tensor's end read as zeros.
template <int kChunks, int kRows, typename Element>
__forceinline__ __device__ void tma_load_tile(CUtensorMap const* desc, uint64_t* bar, Element* smem, int row0,
                                              int head, int batch) {
  CUTE_UNROLL
  for (int c = 0; c < kChunks; ++c) {
    SM90_TMA_LOAD_4D::copy(desc, bar, uint64_t(TMA::CacheHintSm90::EVICT_NORMAL), smem + c * kRows * 64,
                           c * 64, row0, head, batch);
  }
}

// A K or V tile of kTileRows keys from a paged cache (pages, page_size, heads, D): one box of
// min(kTileRows, page_size) rows per page it spans (the descriptor's box), each from the page the sequence's
// table row names, landing where the tile's rows go. Keys past the sequence's used ones read the last used
// page (any rows of it: they are masked), never a page the table does not give it. (Reading a tile's page
// numbers together into registers and sharing them with the V tile measured slower on the H100: 228.7 vs
// 250.5 TFLOPS with pages of 16, 522 vs 563 with 128; its producer needed 56 registers, the consumers lost 8.)
template <int kChunks, int kTileRows, typename Element>
__forceinline__ __device__ void tma_load_paged(CUtensorMap const* desc, uint64_t* bar, Element* smem, int row0,
                                               int seqlen_k, int head, int const* pages, int page_size) {
  const int rows = min(kTileRows, page_size);
  for (int r = 0; r < kTileRows; r += rows) {
    const int key = row0 + r;
    const int page = pages[min(key, max(seqlen_k - 1, 0)) / page_size];
    CUTE_UNROLL
    for (int c = 0; c < kChunks; ++c) {
      SM90_TMA_LOAD_4D::copy(desc, bar, uint64_t(TMA::CacheHintSm90::EVICT_NORMAL), smem + c * kTileRows * 64 + r * 64,
                             c * 64, key % page_size, head, page);
    }
  }
}

// ---- cp.async (indexed) paged loads ----------------------------------------------------------------
// A K or V tile of kTileRows keys from a paged cache (pages, page_size, heads, D) read by the producer
// warpgroup's four warps with cp.async, 16 bytes a lane and instruction: any page size that is a multiple of 8
// (tuner/paging.py), and no page lookup waits for another (a one-thread TMA producer issues one box per page,
// each behind its lookup: 0.44-0.61x FA4 with pages of 16, BENCHMARKS.md).
// The tile's rows go in groups of 8 to the warps in turn (group g to warp g % 4); a group lies within one page,
// so one lookup serves its 8 rows: lane t of the warp looks up the warp's group t (paged_group_offset, before the
// producer waits for the stage: the table read overlaps the wait), and the warp takes the group's cache offset
// from it with one shuffle. A warp-wide cp.async then copies kRowsPerStep whole rows (lane l: chunk
// l % kChunks of the step's row l / kChunks), the source advancing by kRowsPerStep rows a step: about six
// instructions a copy, where one lookup and shuffle per row cost eighteen and made the producer 40% of the
// kernel's instructions (ncu, H100, 2 x 2k queries on 6k cached keys). Within a group a lane's row is
// r % 8 = step * kRowsPerStep + part, so the swizzle is one XOR with a constant. The chunks land where a TMA box
// puts them (K-major, 128-byte swizzle: chunk j of row r at j ^ (r % 8) within its 64 columns), so the
// consumers' GMMA descriptors are the same. Keys at or past seqlen_k are zero-filled, not read: masked scores,
// and zero V rows that a poisoned cache cannot turn into NaN. `row_base` is the cache at the tile's head.
template <int kTileRows>
struct PagedRows {
  static constexpr int kGroups = kTileRows / 8;
  static constexpr int kWarpGroups = (kGroups + 3) / 4;   // groups of 8 rows per warp (the last may be short)
  static_assert(kTileRows % 8 == 0 && kWarpGroups <= 32, "rows in groups of 8, a lane per group");
};

// The page lookup of a tile: lane t of each warp gets the cache offset of its warp's group t (0: no key there).
// Separate from the copy so that the producer reads the table before it waits for the stage to come back.
template <int kTileRows>
__forceinline__ __device__ int64_t paged_group_offset(int row0, int seqlen_k, int const* pages, int page_size,
                                                      int64_t page_stride, int64_t row_stride, int thread) {
  const int warp = thread / 32, lane = thread % 32;
  int64_t offset = 0;
  if (lane < PagedRows<kTileRows>::kWarpGroups) {
    const int key = row0 + 8 * (warp + 4 * lane);
    if (key < seqlen_k) {
      const int page_idx = key / page_size;
      offset = int64_t(pages[page_idx]) * page_stride + int64_t(key - page_idx * page_size) * row_stride;
    }
  }
  return offset;
}

template <int kCols, int kTileRows, typename Element>
__forceinline__ __device__ void cp_async_load_paged(Element* smem, Element const* row_base, int64_t group_offset,
                                                    int64_t row_stride, int row0, int seqlen_k, int thread) {
  constexpr int kChunks = kCols / 8;                   // 16-byte chunks per row
  static_assert(kCols % 64 == 0 && 32 % kChunks == 0, "a warp copies whole rows: head dim 64, 128 or 256");
  constexpr int kRowsPerStep = 32 / kChunks;           // rows one warp-wide cp.async covers (1, 2 or 4)
  constexpr int kStepsPerGroup = 8 / kRowsPerStep;
  constexpr int kGroups = PagedRows<kTileRows>::kGroups;
  constexpr int kWarpGroups = PagedRows<kTileRows>::kWarpGroups;
  const int warp = thread / 32, lane = thread % 32;
  const int j = lane % kChunks, part = lane / kChunks;  // this lane's chunk, and its row within a step
  const int keys_left = seqlen_k - row0 - 8 * warp - part;   // group t's step row 32t + in_group is a key iff below
  Element const* lane_src = row_base + part * row_stride + j * 8;
  const int64_t step_stride = kRowsPerStep * row_stride;
  Element* lane_dst = smem + (j / 8) * kTileRows * 64 + (8 * warp + part) * 64;
  const int swizzled = (j % 8) ^ part;                 // the chunk's place in its row: (j % 8) ^ (r % 8)
  auto copy_rows = [&](auto masked) {
    CUTE_UNROLL
    for (int t = 0; t < kWarpGroups; ++t) {
      if (kGroups % 4 == 0 || warp + 4 * t < kGroups) {  // (the same for the whole warp)
        Element const* src = lane_src + __shfl_sync(0xffffffffu, group_offset, t);
        CUTE_UNROLL
        for (int s = 0; s < kStepsPerGroup; ++s) {
          const int in_group = s * kRowsPerStep;           // (+ part: the row's r % 8)
          auto const& from = *reinterpret_cast<cute::uint128_t const*>(src);
          auto& to = *reinterpret_cast<cute::uint128_t*>(lane_dst + (32 * t + in_group) * 64 +
                                                          ((swizzled ^ in_group) * 8));
          if constexpr (decltype(masked)::value) {
            SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(from, to, 32 * t + in_group < keys_left);
          } else {
            SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>::copy(from, to);
          }
          src += step_stride;
        }
      }
    }
  };
  // Every tile but a sequence's last holds only keys: no predicate per copy there (it cost three instructions
  // of six: the compare, and ptxas packing the predicates into a register)
  if (row0 + kTileRows <= seqlen_k) {
    copy_rows(cute::false_type{});
  } else {
    copy_rows(cute::true_type{});
  }
}

// The stage's full barrier counts one arrival per producer thread: each arrives once its own cp.asyncs so far
// have landed (noinc: the arrival is one of the count the barrier was initialised with).
__forceinline__ __device__ void cp_async_arrive(uint64_t* bar) {
  cutlass::arch::cpasync_barrier_arrive_noinc(bar);
}

// The reverse for a (rows, D) tile of O; rows past the tensor's end are not written.
template <int kChunks, int kTileRows, typename Element>
__forceinline__ __device__ void tma_store_rows(CUtensorMap const* desc, Element const* smem, int row0, int head,
                                               int batch) {
  CUTE_UNROLL
  for (int c = 0; c < kChunks; ++c) {
    SM90_TMA_STORE_4D::copy(desc, smem + c * kTileRows * 64, c * 64, row0, head, batch);
  }
  tma_store_arrive();
}

}  // namespace attn_sm90

#endif  // ATTN_SM90_COPY_CUH
