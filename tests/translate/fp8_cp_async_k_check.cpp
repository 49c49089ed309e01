// Host replay of the FP8 paged kernel's cp.async K copy (attn_sm90_copy.cuh cp_async_load_paged_8bit): the e4m3 rows
// copied as 16-bit rows of half the columns by the producer warpgroup's 128 threads (cp_async_load_paged_64 at 128
// bytes a row, cp_async_load_paged_32 at 64), lane by lane as those functions compute their sources, destinations and
// zero-fill predicates (in 16-bit elements, from the byte offsets and strides halved). Checked against two images of the
// same K tile: CuTe's e4m3 K-major layout (tile_to_shape of GMMA::Layout_K_SW128_Atom / Layout_K_SW64_Atom of
// float_e4m3_t: what the QK^T wgmma reads) and the TMA boxes the TMA-K kernel loads (tma_load_paged: a box of kChunkQK
// bytes x min(rows, page) rows per page, 128- or 64-byte swizzle on the 1024-byte aligned address). Per tile height
// (FP8 block N), page size and sequence end: every 16-byte chunk of every row written exactly once, at the byte the
// two images put it, from its row's page (a shuffled table) and its byte in the row, zero-filled iff its key is past
// the sequence's. Prints one OK/FAIL line per (head dim, block N).
#include <cstdio>
#include <cstdint>
#include <vector>
#include <cute/tensor.hpp>
#include "attn_sm90.cuh"

using namespace cute;

struct Copy {
  int64_t src;     // byte offset from the head's row base
  int dst;         // byte offset in the tile
  bool zfill;      // the ZFILL form with src-size 0 (a key past the sequence's)
};

// The lookups of paged_group_rows and paged_group_offset for lane t of warp w (bytes).
static int64_t group_offset(int warp, int t, int row0, int seqlen_k, const std::vector<int>& pages, int page_size,
                            int64_t page_stride, int64_t row_stride, int warp_groups) {
  if (t >= warp_groups) return 0;
  const int key = row0 + 8 * (warp + 4 * t);
  if (key >= seqlen_k) return 0;
  const int page_idx = key / page_size;
  return int64_t(pages[page_idx]) * page_stride + int64_t(key - page_idx * page_size) * row_stride;
}

// cp_async_load_paged_8bit<kBytes, kTileRows>: the 16-bit view (kCols = kBytes / 2 elements of 2 bytes), lanes replayed
// as cp_async_load_paged_64 / _32 compute them; offsets returned in bytes.
template <int kBytes, int kTileRows>
static std::vector<Copy> replay(int row0, int seqlen_k, const std::vector<int>& pages, int page_size,
                                int64_t page_stride_b, int64_t row_stride_b) {
  constexpr int kCols = kBytes / 2;
  constexpr int kGroups = attn_sm90::PagedRows<kTileRows>::kGroups;
  constexpr int kWarpGroups = attn_sm90::PagedRows<kTileRows>::kWarpGroups;
  const int64_t row_stride = row_stride_b >> 1;
  const bool masked = !(row0 + kTileRows <= seqlen_k);
  std::vector<Copy> out;
  for (int thread = 0; thread < 128; ++thread) {
    const int warp = thread / 32, lane = thread % 32;
    if constexpr (kCols % 64 == 0) {
      constexpr int kChunks = kCols / 8, kLanesPerRow = 8, kBoxes = kChunks / kLanesPerRow;
      const int in_group = lane / kLanesPerRow, a = lane % kLanesPerRow;
      const int keys_left = seqlen_k - row0 - 8 * warp - in_group;
      const int64_t lane_src = in_group * row_stride + a * 8;
      const int64_t half_stride = 4 * row_stride;
      const int dst_lo = (8 * warp + in_group) * 64 + (a ^ in_group) * 8;
      const int dst_hi = (8 * warp + in_group + 4) * 64 + (a ^ in_group ^ 4) * 8;
      for (int t = 0; t < kWarpGroups; ++t) {
        if (!(kGroups % 4 == 0 || warp + 4 * t < kGroups)) continue;
        const int64_t src_lo = lane_src + (group_offset(warp, t, row0, seqlen_k, pages, page_size, page_stride_b,
                                                        row_stride_b, kWarpGroups) >> 1);
        const int64_t src_hi = src_lo + half_stride;
        for (int half = 0; half < 2; ++half)
          for (int k = 0; k < kBoxes; ++k) {
            const int64_t from = (half ? src_hi : src_lo) + 64 * k;
            const int to = (half ? dst_hi : dst_lo) + k * kTileRows * 64 + 32 * t * 64;
            const bool z = masked && !(32 * t + 4 * half < keys_left);
            out.push_back({2 * from, 2 * to, z});
          }
      }
    } else {
      constexpr int kLanesPerRow = 4, kBoxes = kCols / 32;
      const int in_group = lane / kLanesPerRow, a = lane % kLanesPerRow;
      const int keys_left = seqlen_k - row0 - 8 * warp - in_group;
      const int64_t lane_src = in_group * row_stride + a * 8;
      const int dst = attn_sm90::sw64_offset<kTileRows>(8 * warp + in_group, a);
      for (int t = 0; t < kWarpGroups; ++t) {
        if (!(kGroups % 4 == 0 || warp + 4 * t < kGroups)) continue;
        const int64_t src = lane_src + (group_offset(warp, t, row0, seqlen_k, pages, page_size, page_stride_b,
                                                     row_stride_b, kWarpGroups) >> 1);
        for (int k = 0; k < kBoxes; ++k) {
          const bool z = masked && !(32 * t < keys_left);
          out.push_back({2 * (src + 32 * k), 2 * (dst + k * kTileRows * 32 + 32 * t * 32), z});
        }
      }
    }
  }
  return out;
}

// Where a TMA box of kChunk bytes x rows puts byte b of tile row r (tma_load_paged's box of the row's page, landing
// at smem + c * kTileRows * kChunk + r0 * kChunk; the swizzle on the 1024-byte aligned address's bits [4, 7) by bits
// [7, 10), 128-byte swizzle: 3 bits, 64-byte: 2).
template <int kChunk, int kTileRows>
static int tma_offset(int r, int b) {
  const int c = b / kChunk, in_box = b % kChunk;
  const int addr = c * kTileRows * kChunk + r * kChunk + in_box;
  const int mask = kChunk == 128 ? 7 : kChunk == 64 ? 3 : 1;
  return addr ^ (((addr >> 7) & mask) << 4);
}

template <int kBytes, int kTileRows>
static int check() {
  constexpr int kChunk = kBytes % 128 == 0 ? 128 : 64;   // translate/sm90/frame.py fp8_chunk
  using Atom = std::conditional_t<kChunk == 128, GMMA::Layout_K_SW128_Atom<cutlass::float_e4m3_t>,
                                  GMMA::Layout_K_SW64_Atom<cutlass::float_e4m3_t>>;
  using Layout = decltype(tile_to_shape(Atom{}, Shape<Int<kTileRows>, Int<kBytes>>{}));
  alignas(1024) static cutlass::float_e4m3_t buf[kTileRows * kBytes];
  Tensor tile = make_tensor(make_smem_ptr(buf), Layout{});
  constexpr int kChunks = kBytes / 16;
  int bad = 0, cases = 0;
  const int heads = 3;
  const int64_t row_stride = int64_t(heads) * kBytes;   // (pages, page_size, heads, d) bytes
  for (int page_size : {8, 16, 32, 48, 128, 256}) {
    const int64_t page_stride = int64_t(page_size) * row_stride;
    for (int seqlen_k : {1, 7, kTileRows - 1, kTileRows, kTileRows + 9, 3 * kTileRows, 3 * kTileRows - 5}) {
      const int n_pages = (seqlen_k + page_size - 1) / page_size;
      std::vector<int> pages(n_pages);
      for (int i = 0; i < n_pages; ++i) pages[i] = (i * 7 + 3) % (n_pages + 5);   // shuffled, spare pages beside
      for (int row0 = 0; row0 < seqlen_k; row0 += kTileRows) {
        ++cases;
        auto copies = replay<kBytes, kTileRows>(row0, seqlen_k, pages, page_size, page_stride, row_stride);
        std::vector<int> written(kTileRows * kChunks, 0);
        std::vector<int> by_dst(kTileRows * kBytes / 16, -1);
        for (size_t i = 0; i < copies.size(); ++i) {
          const Copy& cp = copies[i];
          if (cp.dst < 0 || cp.dst % 16 || cp.dst >= kTileRows * kBytes) { ++bad; continue; }
          if (by_dst[cp.dst / 16] >= 0) { ++bad; continue; }   // two copies to one place
          by_dst[cp.dst / 16] = int(i);
        }
        for (int r = 0; r < kTileRows; ++r) {
          for (int c = 0; c < kChunks; ++c) {
            const int cute_at = int(&tile(r, 16 * c) - buf);
            const int tma_at = tma_offset<kChunk, kTileRows>(r, 16 * c);
            if (cute_at != tma_at) { ++bad; continue; }
            const int i = by_dst[cute_at / 16];
            if (i < 0) { ++bad; continue; }
            const Copy& cp = copies[i];
            const int key = row0 + r;
            const bool past = key >= seqlen_k;
            if (cp.zfill != past) { ++bad; continue; }
            if (!past) {
              const int page_idx = key / page_size;
              const int64_t want = int64_t(pages[page_idx]) * page_stride + int64_t(key % page_size) * row_stride +
                                   16 * c;
              if (cp.src != want) { ++bad; continue; }   // (offsets from the head's row base)
            }
            ++written[r * kChunks + c];
          }
        }
        for (int w : written) if (w != 1) ++bad;
        if (int(copies.size()) != kTileRows * kChunks) ++bad;
      }
    }
  }
  std::printf("%s d%d block N %d: %d cases, %d mismatches\n", bad ? "FAIL" : "OK", kBytes, kTileRows, cases, bad);
  return bad;
}

int main() {
  int total = 0;
  total += check<128, 64>();
  total += check<128, 128>();
  total += check<128, 160>();
  total += check<128, 192>();
  total += check<128, 224>();
  total += check<128, 256>();
  total += check<64, 64>();
  total += check<64, 128>();
  total += check<64, 160>();
  total += check<64, 192>();
  total += check<64, 224>();
  total += check<64, 256>();
  return total ? 1 : 0;
}
