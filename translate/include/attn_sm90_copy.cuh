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
// A (rows, D) tile of a (batch, seqlen, heads, D) tensor into a K-major, swizzled shared tile: D/kCols boxes
// of kCols columns x rows, one per chunk, each landing as rows x (kCols elements) (the layout of a GMMA K-major
// atom as wide as the box, tiled over the tile: 64 16-bit or 128 8-bit columns for the 128-byte swizzle, 64 8-bit
// columns for the 64-byte one). Rows past the tensor's end read as zeros.
template <int kChunks, int kRows, int kCols = 64, typename Element>
__forceinline__ __device__ void tma_load_tile(CUtensorMap const* desc, uint64_t* bar, Element* smem, int row0,
                                              int head, int batch) {
  CUTE_UNROLL
  for (int c = 0; c < kChunks; ++c) {
    SM90_TMA_LOAD_4D::copy(desc, bar, uint64_t(TMA::CacheHintSm90::EVICT_NORMAL), smem + c * kRows * kCols,
                           c * kCols, row0, head, batch);
  }
}

// A V tile stored transposed (batch, heads, D, seqlen): the (D, keys) tile K-major for the FP8 P.V GEMM (8-bit
// wgmma operands must be K-major), keys [key0, key0 + kChunks * kCols) in boxes of kCols keys x D rows. Keys past
// the tensor's end read as zeros.
template <int kChunks, int kRows, int kCols, typename Element>
__forceinline__ __device__ void tma_load_vt(CUtensorMap const* desc, uint64_t* bar, Element* smem, int key0,
                                            int head, int batch) {
  CUTE_UNROLL
  for (int c = 0; c < kChunks; ++c) {
    SM90_TMA_LOAD_4D::copy(desc, bar, uint64_t(TMA::CacheHintSm90::EVICT_NORMAL), smem + c * kRows * kCols,
                           key0 + c * kCols, 0, head, batch);
  }
}

// Where a packed sequence's keys start in the transposed V of packed sequences: its first key rounded up to kAlign
// keys, plus kAlign per sequence before it (so that no two sequences overlap). A TMA box's start in the innermost
// dimension (here the keys, one byte each) must be 16-byte aligned: a sequence starting at key 1 faulted
// (illegal instruction, H200). The runtime writes V^T at the same places (tuner/serving/launch/plan.py).
template <int kAlign>
__forceinline__ __device__ int packed_vt_key0(int k_row0, int seq) {
  return (k_row0 + kAlign - 1) / kAlign * kAlign + kAlign * seq;
}

// A K or V tile of kTileRows keys from a paged cache (pages, page_size, heads, D): one box of
// min(kTileRows, page_size) rows per page it spans (the descriptor's box), each from the page the sequence's
// table row names, landing where the tile's rows go. Keys past the sequence's used ones read the last used
// page (any rows of it: they are masked), never a page the table does not give it. (Reading a tile's page
// numbers together into registers and sharing them with the V tile measured slower on the H100: 228.7 vs
// 250.5 TFLOPS with pages of 16, 522 vs 563 with 128; its producer needed 56 registers, the consumers lost 8.)
template <int kChunks, int kTileRows, int kCols = 64, typename Element>
__forceinline__ __device__ void tma_load_paged(CUtensorMap const* desc, uint64_t* bar, Element* smem, int row0,
                                               int seqlen_k, int head, int const* pages, int page_size) {
  const int rows = min(kTileRows, page_size);
  for (int r = 0; r < kTileRows; r += rows) {
    const int key = row0 + r;
    const int page = pages[min(key, max(seqlen_k - 1, 0)) / page_size];
    CUTE_UNROLL
    for (int c = 0; c < kChunks; ++c) {
      SM90_TMA_LOAD_4D::copy(desc, bar, uint64_t(TMA::CacheHintSm90::EVICT_NORMAL),
                             smem + c * kTileRows * kCols + r * kCols, c * kCols, key % page_size, head, page);
    }
  }
}

// ---- cp.async (indexed) paged loads ----------------------------------------------------------------
// A K or V tile of kTileRows keys from a paged cache (pages, page_size, heads, D) read by the producer
// warpgroup's four warps with cp.async, 16 bytes a lane and instruction: any page size that is a multiple of 8
// (tuner/serving/launch/paging.py), and no page lookup waits for another (a one-thread TMA producer issues one box per page,
// each behind its lookup: 0.44-0.61x FA4 with pages of 16, BENCHMARKS.md).
// The tile's rows go in groups of 8 to the warps in turn (group g to warp g % 4); a group lies within one page,
// so one lookup serves its 8 rows: lane t of the warp looks up the warp's group t (paged_group_rows, before the
// producer waits for the stage, once for K and V), and the warp takes the group's cache offset from it with one
// shuffle. A warp-wide cp.async then copies 4 rows x 128 bytes, 8 lanes a row (one 64-column block of the smem
// tile, whole 128-byte lines: FA4's layout); lane l takes rows l / 8 and l / 8 + 4 of the group and chunks l % 8 +
// 8k, so its destinations are two addresses plus constants and its sources two pointers plus constants: about two
// instructions a copy besides the cp.async, where the layout of 2 rows x 256 bytes a step took four (SASS). With the
// lookup once a tile, llama3-8b's paged kernel went from 0.97-0.99x to 1.04-1.08x FA4 on 2 x 2k queries on 6k
// cached keys in pages of 16 (H100, BENCHMARKS.md 2026-11-27).
// The chunks land where a TMA box puts them (K-major, 128-byte swizzle: chunk j of row r at j ^ (r % 8) within its
// 64 columns), so the consumers' GMMA descriptors are the same. Keys at or past seqlen_k are zero-filled, not
// read: masked scores, and zero V rows that a poisoned cache cannot turn into NaN. `row_base` is the cache at the
// tile's head.
template <int kTileRows>
struct PagedRows {
  static constexpr int kGroups = kTileRows / 8;
  static constexpr int kWarpGroups = (kGroups + 3) / 4;   // groups of 8 rows per warp (the last may be short)
  static_assert(kTileRows % 8 == 0 && kWarpGroups <= 32, "rows in groups of 8, a lane per group");
};

// log2 of a page size that is a power of two, else -1 (a division then): computed once per kernel, so that a
// lookup's page index is a shift, not the ~25 instructions of an integer division by a run-time value.
__forceinline__ __device__ int page_shift_of(int page_size) {
  return (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;
}

// The page lookup of a tile: lane t of each warp gets the page and the row within it of its warp's group t's first
// key (page -1: no key there). Separate from the copy so that the producer reads the table before it waits for the
// stage to come back, and once for K and V: the two tiles of an iteration are the same keys (the two lookups and
// their divisions were about 40% of the producer's instructions a tile, SASS).
struct PagedGroup {
  int page, in_page;
};

template <int kTileRows>
__forceinline__ __device__ PagedGroup paged_group_rows(int row0, int seqlen_k, int const* pages, int page_size,
                                                       int page_shift, int thread) {
  const int warp = thread / 32, lane = thread % 32;
  PagedGroup g{-1, 0};
  if (lane < PagedRows<kTileRows>::kWarpGroups) {
    const int key = row0 + 8 * (warp + 4 * lane);
    if (key < seqlen_k) {
      const int page_idx = page_shift >= 0 ? key >> page_shift : key / page_size;
      g.page = pages[page_idx];
      g.in_page = key - page_idx * page_size;
    }
  }
  return g;
}

// The cache offset of a looked-up group in one tensor (K or V: their own strides); 0 where there is no key.
__forceinline__ __device__ int64_t paged_group_offset(PagedGroup g, int64_t page_stride, int64_t row_stride) {
  return g.page >= 0 ? int64_t(g.page) * page_stride + int64_t(g.in_page) * row_stride : 0;
}

//
// Where 64 columns do not divide the row (head dim 96), the tile is 32-column blocks of the 64-byte swizzle (chunk j
// of row r at j ^ ((r / 2) % 4) within its 32 columns, as a SWIZZLE_64B box puts it: sw64_offset): a warp-wide
// cp.async copies one such block of a whole group, 8 rows x 64 bytes, 4 lanes a row (cp_async_load_paged_32).
//
// The element offset of 16-byte chunk j of row r in a 16-bit tile of kTileRows rows laid out in 32-column blocks of
// the 64-byte swizzle (GMMA::Layout_K_SW64_Atom tiled rows first; tests/translate checks it against CuTe's layout).
template <int kTileRows>
CUTE_HOST_DEVICE constexpr int sw64_offset(int r, int j) {
  return (j / 4) * (kTileRows * 32) + r * 32 + ((j % 4) ^ ((r / 2) % 4)) * 8;
}

template <int kCols, int kTileRows, typename Element>
__forceinline__ __device__ void cp_async_load_paged_32(Element* smem, Element const* row_base, int64_t group_offset,
                                                       int64_t row_stride, int row0, int seqlen_k, int thread) {
  static_assert(kCols % 32 == 0, "32-column blocks");
  constexpr int kLanesPerRow = 4;                      // a warp-wide cp.async: 8 rows x 64 bytes (one 32-column block)
  constexpr int kBoxes = kCols / 32;                   // a row's 32-column parts (the smem tile's blocks)
  constexpr int kGroups = PagedRows<kTileRows>::kGroups;
  constexpr int kWarpGroups = PagedRows<kTileRows>::kWarpGroups;
  const int warp = thread / 32, lane = thread % 32;
  const int in_group = lane / kLanesPerRow, a = lane % kLanesPerRow;   // row in_group of the group; chunk a
  const int keys_left = seqlen_k - row0 - 8 * warp - in_group;   // group t's row is a key iff 32t is below this
  Element const* lane_src = row_base + in_group * row_stride + a * 8;
  // a group's rows start at a multiple of 8: the swizzle of row in_group is the same in every group and block, so
  // chunk 4k + a of row 32t + r lies k blocks and 32t rows from chunk a of row r
  Element* dst = smem + sw64_offset<kTileRows>(8 * warp + in_group, a);
  auto copy_rows = [&](auto masked) {
    CUTE_UNROLL
    for (int t = 0; t < kWarpGroups; ++t) {
      if (kGroups % 4 == 0 || warp + 4 * t < kGroups) {  // (the same for the whole warp)
        Element const* src = lane_src + __shfl_sync(0xffffffffu, group_offset, t);
        CUTE_UNROLL
        for (int k = 0; k < kBoxes; ++k) {
          auto const& from = *reinterpret_cast<cute::uint128_t const*>(src + 32 * k);
          auto& to = *reinterpret_cast<cute::uint128_t*>(dst + k * kTileRows * 32 + 32 * t * 32);
          if constexpr (decltype(masked)::value) {
            SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(from, to, 32 * t < keys_left);
          } else {
            SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>::copy(from, to);
          }
        }
      }
    }
  };
  if (row0 + kTileRows <= seqlen_k) {
    copy_rows(cute::false_type{});
  } else {
    copy_rows(cute::true_type{});
  }
}

template <int kCols, int kTileRows, typename Element>
__forceinline__ __device__ void cp_async_load_paged_64(Element* smem, Element const* row_base, int64_t group_offset,
                                                       int64_t row_stride, int row0, int seqlen_k, int thread) {
  constexpr int kChunks = kCols / 8;                   // 16-byte chunks per row
  static_assert(kCols % 64 == 0 && kChunks <= 32, "64-column tiles: head dim 64, 128 or 256");
  constexpr int kLanesPerRow = 8;                      // a warp-wide cp.async: 4 rows x 128 bytes (one 64-column box)
  constexpr int kBoxes = kChunks / kLanesPerRow;       // a row's 64-column parts (the smem tile's blocks)
  constexpr int kGroups = PagedRows<kTileRows>::kGroups;
  constexpr int kWarpGroups = PagedRows<kTileRows>::kWarpGroups;
  const int warp = thread / 32, lane = thread % 32;
  const int in_group = lane / kLanesPerRow, a = lane % kLanesPerRow;   // rows in_group and in_group + 4; chunks a + 8k
  const int keys_left = seqlen_k - row0 - 8 * warp - in_group;   // group t's row 32t + 4 half is a key iff below this
  Element const* lane_src = row_base + in_group * row_stride + a * 8;
  const int64_t half_stride = 4 * row_stride;          // the group's second four rows
  // chunk c of row r lands at (c % 8) ^ (r % 8) of its 64 columns: a ^ in_group for the first four rows, that ^ 4
  // for the next, so each copy's place is one of two addresses plus a constant (its 64 columns, its group)
  Element* dst_lo = smem + (8 * warp + in_group) * 64 + (a ^ in_group) * 8;
  Element* dst_hi = smem + (8 * warp + in_group + 4) * 64 + (a ^ in_group ^ 4) * 8;
  auto copy_rows = [&](auto masked) {
    CUTE_UNROLL
    for (int t = 0; t < kWarpGroups; ++t) {
      if (kGroups % 4 == 0 || warp + 4 * t < kGroups) {  // (the same for the whole warp)
        Element const* src_lo = lane_src + __shfl_sync(0xffffffffu, group_offset, t);
        Element const* src_hi = src_lo + half_stride;
        CUTE_UNROLL
        for (int half = 0; half < 2; ++half) {
          CUTE_UNROLL
          for (int k = 0; k < kBoxes; ++k) {
            auto const& from = *reinterpret_cast<cute::uint128_t const*>((half ? src_hi : src_lo) + 64 * k);
            auto& to = *reinterpret_cast<cute::uint128_t*>((half ? dst_hi : dst_lo) + k * kTileRows * 64 +
                                                            32 * t * 64);
            if constexpr (decltype(masked)::value) {
              SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(from, to, 32 * t + 4 * half < keys_left);
            } else {
              SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>::copy(from, to);
            }
          }
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

template <int kCols, int kTileRows, typename Element>
__forceinline__ __device__ void cp_async_load_paged(Element* smem, Element const* row_base, int64_t group_offset,
                                                    int64_t row_stride, int row0, int seqlen_k, int thread) {
  if constexpr (kCols % 64 == 0) {
    cp_async_load_paged_64<kCols, kTileRows>(smem, row_base, group_offset, row_stride, row0, seqlen_k, thread);
  } else {
    cp_async_load_paged_32<kCols, kTileRows>(smem, row_base, group_offset, row_stride, row0, seqlen_k, thread);
  }
}

// An FP8 (e4m3) kernel's K tile by the same producer. Its K-major tile of kCols bytes a row, in kChunkQK-byte swizzle
// atoms (the 128-byte swizzle at 128 bytes a row, the 64-byte one at 64: translate/sm90/frame.py fp8_chunk), is byte for
// byte the 16-bit tile of kCols / 2 columns (128-byte swizzle where 64 columns divide the row, else 32-column blocks
// of the 64-byte swizzle: frame._fp8_k_major), and a TMA box of kChunkQK bytes x rows puts a row's 16-byte chunks where
// the 16-bit box of half the columns does. So the e4m3 rows are copied as 16-bit rows of half the columns: the same
// chunks to the same places, rows at or past seqlen_k zero-filled (e4m3 zeros). Offsets and strides come in e4m3
// elements (bytes) and are halved for the 16-bit view (all even: rows of 64 or 128 bytes, pages of whole rows).
template <int kCols, int kTileRows, typename Element>
__forceinline__ __device__ void cp_async_load_paged_8bit(Element* smem, Element const* row_base, int64_t group_offset,
                                                         int64_t row_stride, int row0, int seqlen_k, int thread) {
  static_assert(sizeof(Element) == 1 && kCols % 64 == 0, "e4m3 rows of a multiple of 64 bytes");
  using Half = uint16_t;
  cp_async_load_paged<kCols / 2, kTileRows>(reinterpret_cast<Half*>(smem), reinterpret_cast<Half const*>(row_base),
                                            group_offset >> 1, row_stride >> 1, row0, seqlen_k, thread);
}

// The stage's full barrier counts one arrival per producer thread: each arrives once its own cp.asyncs so far
// have landed (noinc: the arrival is one of the count the barrier was initialised with).
__forceinline__ __device__ void cp_async_arrive(uint64_t* bar) {
  cutlass::arch::cpasync_barrier_arrive_noinc(bar);
}

// The reverse for a (rows, D) tile of O; rows past the tensor's end are not written.
template <int kChunks, int kTileRows, int kCols = 64, typename Element>
__forceinline__ __device__ void tma_store_rows(CUtensorMap const* desc, Element const* smem, int row0, int head,
                                               int batch) {
  CUTE_UNROLL
  for (int c = 0; c < kChunks; ++c) {
    SM90_TMA_STORE_4D::copy(desc, smem + c * kTileRows * kCols, c * kCols, row0, head, batch);
  }
  tma_store_arrive();
}

}  // namespace attn_sm90

#endif  // ATTN_SM90_COPY_CUH
