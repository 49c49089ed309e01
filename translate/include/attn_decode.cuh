// Split-KV decode (translate/decode): a few query tokens per sequence against a long, possibly paged, KV cache.
//
// Work of one CTA: one sequence, one unit of heads (a KV head with the query heads of its group packed into the
// tile's rows when kPackGqa, else one query head), one block of packed rows (token t, head g: row t * P + g),
// one split (a contiguous range of key blocks). Every thread issues the cp.async gathers of a ring of K/V
// stages (one page-table lookup per key row); the warps form kWarpsN groups, each an independent online
// softmax over its own columns of every tile, so a 16-row tile keeps four warps busy without a cross-warp
// reduction per tile. At the end the groups merge through shared memory; with one split the CTA writes the
// output, else a normalised partial output and its log2-sum-exp go to the workspace and combine() merges
// the splits (FlashDecoding's scheme). Decode is bound by the bytes of K/V, so the sm80 mma.sync atoms
// suffice and the kernel runs on every sm80+ GPU.
//
// Split-d_v mode (kSplitDV, MLA absorbed decode: d_qk 576, d_v 512): O of even 16 rows x 512 columns is 256 fp32
// registers per thread, so the kWarpsN groups split d_v instead of running independent softmaxes. Group wg scores
// its kBlockN / kWarpsN columns of the tile over the full depth; the tile's row max goes through shared memory
// (every group then holds the same max); each group writes its P columns into a shared P tile; after a barrier
// every group multiplies all kBlockN columns of P by its d_v / kWarpsN slice of V. Row sums stay per group (all
// against the same max) and are added in the epilogue; the O slices are disjoint, so nothing else merges.
// kVFromK: V is the first d_v columns of K's rows (FlashMLA's latent cache): no V ring, V is a view of the K stage.
#ifndef ATTN_DECODE_CUH
#define ATTN_DECODE_CUH

#include <cute/tensor.hpp>
#include "attn_tl.cuh"

namespace attn_decode {
using namespace cute;

// The single launch argument of both kernels, by value. tuner/serving/launch/decode_kernel.py packs it field by field in
// this order (its ctypes mirror is checked against this header by tests/decode).
struct Args {
  const void* q;            // (b, seqlen_q, heads_q, d_qk)
  const void* k;            // paged: (pages, page_size, heads_kv, d_qk); else (b, seqlen_cache, heads_kv, d_qk)
  const void* v;            // same rows as k, d_v
  void* o;                  // (b, seqlen_q, heads_q, d_v)
  float* o_partial;         // (splits, rows, d_v) fp32, rows = b * seqlen_q * heads_q; only with splits > 1
  float* lse_partial;       // (splits, rows): log2-sum-exp of each split's scores (scaled)
  float* lse;               // (b, heads_q, seqlen_q) natural-log sum-exp, or null
  const int* page_table;    // (b, page_table_stride) page numbers, or null: a dense cache
  const int* seqused_k;     // (b) keys per sequence, or null: seqlen_k each
  long long q_batch_stride, q_row_stride, q_head_stride;
  long long k_batch_stride, k_row_stride, k_head_stride;   // paged: batch stride = page stride
  long long v_batch_stride, v_row_stride, v_head_stride;
  long long o_batch_stride, o_row_stride, o_head_stride;
  long long page_table_stride;
  int batch, seqlen_q, heads_q, group, seqlen_k;
  int page_shift;           // log2(page size); paged only
  int num_splits, blocks_per_split;
  int m_blocks;             // row blocks per unit: ceil(seqlen_q * P / kBlockM)
  float scale_log2;         // softmax scale * log2(e); with soft-capping cap * log2(e)
  // The options (kernel_abi/spec.py), read only by a kernel built with them (Options<Cfg> below):
  const float* sinks;       // (heads_q) fp32 sink logits (natural-log units), or null
  int window_left, window_right;   // keys left / right of each token's diagonal; -1: open
  float softcap_prescale;   // softmax scale / cap: the scores become tanh(scores * prescale), then * scale_log2
  // Last, so that the fields above keep the offsets ABI 4 kernels read (kernel_abi/abi.py):
  const int* leftpad_k;     // (b) a dense cache's row where sequence b's keys start (FA2's cache_leftpad), or null:
                            // its keys are rows [leftpad, seqused_k); read by dense GQA/MHA kernels only
};

// The options a kernel is built with: a Cfg with `struct Opts { kLocal, kSoftcap, kSinks }` has them (generate.py
// emits it only then, so that a kernel without options keeps its source and its compile-cache entry).
template <class Cfg, class = void>
struct Options {
  static constexpr bool kLocal = false, kSoftcap = false, kSinks = false;
};
template <class Cfg>
struct Options<Cfg, std::void_t<typename Cfg::Opts>> : Cfg::Opts {};

__forceinline__ __device__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
__forceinline__ __device__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__forceinline__ __device__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Element offset of key row `key` of sequence b, KV head kvh (paged: through the page table).
template <bool kPaged>
__forceinline__ __device__ long long key_row(const Args& a, int b, int key, long long batch_stride,
                                             long long row_stride, long long head_stride, int kvh, int page) {
  if constexpr (kPaged) {
    return page * batch_stride + (key & ((1 << a.page_shift) - 1)) * row_stride + kvh * head_stride;
  } else {
    return b * batch_stride + key * row_stride + kvh * head_stride;
  }
}

// The fast gather of load_kv, where the tile splits evenly: a warp-wide cp.async copies one 64-column block of
// 4 rows (lane: row lane / 8 of the 4, 16-byte chunk lane % 8 of the block), and each warp takes every kWarps-th
// group of 4 rows. So a thread's rows and chunk are fixed: it finds each of its rows once (page lookup, 64-bit
// offsets) and then issues the row's copies block after block from the same two addresses plus constants (the
// swizzle acts within an 8 x 64 atom, and 64-column blocks lie kBlockN x 64 elements apart in SmemLayoutK/V:
// tests/decode/test_gather_layout.py checks both). The generic gather (load_kv_chunks) did a division, a table read,
// the 64-bit offset and the swizzled address per 16-byte copy: the busiest pipe of the MLA kernel was that arithmetic
// (ncu, BENCHMARKS.md).
template <class Cfg>
constexpr bool kRowGather = Cfg::kHeadDimQK % 64 == 0 && Cfg::kHeadDimV % 64 == 0 &&
                            Cfg::kBlockN % (4 * (Cfg::kThreads / 32)) == 0;

// kBlock0 / kWarps: a subset of the row's 64-column blocks, [kBlock0, kBlocks), by kWarps warps whose first thread is
// tid 0 (attn_decode_sm90_seesaw.cuh: each warpgroup reloads the columns it read last). `pages`: the rows' pages
// looked up ahead of time by gather_pages (the table read's latency off the path to the copies), else null.
template <class Cfg, int kWarps = Cfg::kThreads / 32>
constexpr int kGatherRowsPerThread = Cfg::kBlockN / (4 * kWarps);

template <class Cfg, int kWarps = Cfg::kThreads / 32>
__forceinline__ __device__ void gather_pages(const Args& a, int b, int key0, int seqlen_k, int tid,
                                             int (&pages)[kGatherRowsPerThread<Cfg, kWarps>]) {
  const int warp = tid / 32, lane = tid % 32;
  const int* table = a.page_table + b * a.page_table_stride;
  CUTE_UNROLL
  for (int k = 0; k < kGatherRowsPerThread<Cfg, kWarps>; ++k) {
    const int key = key0 + 4 * (warp + kWarps * k) + lane / 8;
    pages[k] = (Cfg::kPaged && key < seqlen_k) ? __ldg(table + (key >> a.page_shift)) : 0;
  }
}

template <class Cfg, int kBlocks, int kBlock0 = 0, int kWarps = Cfg::kThreads / 32, class SX>
__forceinline__ __device__ void gather_rows(const typename Cfg::Element* x, const Args& a, int b, int kvh, int key0,
                                            int seqlen_k, long long batch_stride, long long row_stride,
                                            long long head_stride, SX& sX, int tid, const int* pages = nullptr) {
  static_assert(Cfg::kBlockN % (4 * kWarps) == 0, "whole 4-row groups per warp");
  constexpr int kRowsPerThread = kGatherRowsPerThread<Cfg, kWarps>;
  const int warp = tid / 32, lane = tid % 32, q = lane % 8;
  const int* table = Cfg::kPaged ? a.page_table + b * a.page_table_stride : nullptr;
  CUTE_UNROLL
  for (int k = 0; k < kRowsPerThread; ++k) {
    const int r = 4 * (warp + kWarps * k) + lane / 8;
    const int key = key0 + r;
    const bool valid = key < seqlen_k;
    const int page = !(Cfg::kPaged && valid) ? 0 : pages ? pages[k] : __ldg(table + (key >> a.page_shift));
    const long long off = valid ? key_row<Cfg::kPaged>(a, b, key, batch_stride, row_stride, head_stride, kvh, page)
                                : 0;
    const typename Cfg::Element* src = x + off + q * 8;
    typename Cfg::Element* dst = &sX(r, q * 8);
    CUTE_UNROLL
    for (int blk = kBlock0; blk < kBlocks; ++blk) {
      cp_async_16(dst + blk * Cfg::kBlockN * 64, src + blk * 64, valid);
    }
  }
}

// The generic gather: chunk by chunk over the tile, each with its own row's lookup.
template <class Cfg, class SK, class SV>
__forceinline__ __device__ void load_kv_chunks(const Args& a, int b, int kvh, int key0, int seqlen_k, SK& sK,
                                               SV& sV, int tid) {
  using Element = typename Cfg::Element;
  constexpr int kChunksK = Cfg::kHeadDimQK / 8, kChunksV = Cfg::kVFromK ? 0 : Cfg::kHeadDimV / 8;
  constexpr int kChunks = kChunksK > kChunksV ? kChunksK : kChunksV;
  const Element* k = static_cast<const Element*>(a.k);
  const Element* v = static_cast<const Element*>(a.v);
  const int* table = Cfg::kPaged ? a.page_table + b * a.page_table_stride : nullptr;
  CUTE_UNROLL
  for (int i = tid; i < Cfg::kBlockN * kChunks; i += Cfg::kThreads) {
    const int row = i / kChunks, c = i % kChunks;
    const int key = key0 + row;
    const bool valid = key < seqlen_k;
    const int page = (Cfg::kPaged && valid) ? __ldg(table + (key >> a.page_shift)) : 0;
    if (c < kChunksK) {
      const long long off = valid ? key_row<Cfg::kPaged>(a, b, key, a.k_batch_stride, a.k_row_stride,
                                                         a.k_head_stride, kvh, page) : 0;
      cp_async_16(&sK(row, c * 8), k + off + c * 8, valid);
    }
    if (!Cfg::kVFromK && c < kChunksV) {   // kVFromK: the K tile holds V's columns, read once
      const long long off = valid ? key_row<Cfg::kPaged>(a, b, key, a.v_batch_stride, a.v_row_stride,
                                                         a.v_head_stride, kvh, page) : 0;
      cp_async_16(&sV(row, c * 8), v + off + c * 8, valid);
    }
  }
}

// One K and one V tile (kBlockN keys from key0) into a ring slot; rows past seqlen_k are zero-filled, so masked
// columns of P multiply zeros, never stale shared memory. key0 and seqlen_k are rows of the sequence's cache (a
// leftpad included: CtaWork::kv_row0).
template <class Cfg, class SK, class SV>
__forceinline__ __device__ void load_kv(const Args& a, int b, int kvh, int key0, int seqlen_k, SK& sK, SV& sV,
                                        int tid) {
  if constexpr (kRowGather<Cfg>) {
    gather_rows<Cfg, Cfg::kHeadDimQK / 64>(static_cast<const typename Cfg::Element*>(a.k), a, b, kvh, key0, seqlen_k,
                                           a.k_batch_stride, a.k_row_stride, a.k_head_stride, sK, tid);
    if constexpr (!Cfg::kVFromK) {   // kVFromK: the K tile holds V's columns, read once
      gather_rows<Cfg, Cfg::kHeadDimV / 64>(static_cast<const typename Cfg::Element*>(a.v), a, b, kvh, key0,
                                            seqlen_k, a.v_batch_stride, a.v_row_stride, a.v_head_stride, sV, tid);
    }
  } else {
    load_kv_chunks<Cfg>(a, b, kvh, key0, seqlen_k, sK, sV, tid);
  }
}


// -inf where the key is past the sequence or, causal, past the bottom-right diagonal of the row's token
// (token t of seqlen_q sees keys <= t + seqlen_k - seqlen_q).
// kLocal: also past the sliding window, keys before t + causal_offset - left or (left/right -1: open) after
// t + causal_offset + right.
template <bool kCausal, bool kLocal = false, class TS, class TC>
__forceinline__ __device__ void mask_tile(TS& acc_s, TC const& coord, int row0, int pack, int col0, int seqlen_k,
                                          int causal_offset, int left = -1, int right = -1) {
  CUTE_UNROLL
  for (int j = 0; j < size(acc_s); ++j) {
    const int c = col0 + get<1>(coord(j));
    const int t = (row0 + get<0>(coord(j))) / pack;
    bool out = c >= seqlen_k || (kCausal && c > t + causal_offset);
    if constexpr (kLocal) {
      out = out || (left >= 0 && c < t + causal_offset - left) || (right >= 0 && c > t + causal_offset + right);
    }
    if (out) { acc_s(j) = -INFINITY; }
  }
}

// The sink of head h joins a row's softmax, given as its max (log2 units) and sum relative to it
// (attn_tl::join_sink): max and sum updated, returns the factor the row's output is multiplied by.
__forceinline__ __device__ float add_sink(const Args& a, int h, float& mx, float& l) {
  const attn_tl::SinkJoin j = attn_tl::join_sink(mx, a.sinks[h] * 1.4426950408889634f);
  l = l * j.keep + j.term;
  mx = j.top;
  return j.keep;
}

// Split-d_v online softmax of one score tile: like attn_tl::online_softmax, but the new row max is the max over
// every warp group's columns, exchanged through s_x (kWarpsN, kBlockM): each group's quad leader writes its
// partial max, a barrier, every group reads all kWarpsN values in the same order, so all hold the same max and
// their P and rescaled O slices agree. The caller's next write of s_x is after a later barrier (top of the loop).
template <class Cfg, class TS, class TO, class TMax, class TSum, class TC>
__forceinline__ __device__ void softmax_shared_max(TS& acc_s, TO& acc_o, TMax& row_max, TSum& row_sum,
                                                   TC const& coord, float* s_x, int wg, int tg, float scale_log2) {
  Tensor s = make_tensor(acc_s.data(), attn_tl::rowcol_layout(acc_s.layout()));
  Tensor o = make_tensor(acc_o.data(), attn_tl::rowcol_layout(acc_o.layout()));
  static_assert(decltype(size<0>(s))::value == decltype(size<0>(o))::value);
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(s); ++mi) {   // row mi of the row/col view: half mi % 2 of m-tile mi / 2
    float m = -INFINITY;
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(s); ++ni) { m = fmaxf(m, s(mi, ni)); }
    m = attn_tl::quad_max(m);
    if (tg % 4 == 0) { s_x[wg * Cfg::kBlockM + get<0>(coord(2 * (mi % 2) + 4 * (mi / 2)))] = m; }
  }
  __syncthreads();
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(s); ++mi) {
    const int r = get<0>(coord(2 * (mi % 2) + 4 * (mi / 2)));
    const float m_old = row_max(mi);
    float m = m_old;
    CUTE_UNROLL
    for (int w = 0; w < Cfg::kWarpsN; ++w) { m = fmaxf(m, s_x[w * Cfg::kBlockM + r]); }
    row_max(mi) = m;
    const float m_scaled = (m == -INFINITY) ? 0.f : m * scale_log2;
    const float rescale = attn_tl::fast_exp2(m_old * scale_log2 - m_scaled);
    row_sum(mi) *= rescale;
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(o); ++ni) { o(mi, ni) *= rescale; }
    float sum = 0.f;
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(s); ++ni) {
      s(mi, ni) = attn_tl::fast_exp2(s(mi, ni) * scale_log2 - m_scaled);
      sum += s(mi, ni);
    }
    row_sum(mi) += sum;
  }
}

// acc (rows x the group's d_v slice) += P (shared, all kBlockN columns) * V slice, k-blocks outer and the V
// fragment loaded one ldmatrix n-block at a time, so only a k-block's A fragment and a few B registers are live
// beside the large O slice (gemm_ss would hold a whole k-block of the 256-column slice: 64 more registers).
template <typename TiledMma, typename TAcc, typename TA, typename TB, typename TsA, typename TsB, typename CopyA,
          typename CopyB, typename ThrCopyA, typename ThrCopyB>
__forceinline__ __device__ void gemm_pv_slice(TiledMma const& mma, TAcc& acc, TA& rA, TB& rB, TsA const& sA,
                                              TsB const& sB, CopyA const& copy_a, CopyB const& copy_b,
                                              ThrCopyA const& thr_a, ThrCopyB const& thr_b) {
  Tensor rA_view = thr_a.retile_D(rA);
  Tensor rB_view = thr_b.retile_D(rB);
  static_assert(decltype(size<2>(sB))::value == decltype(size<2>(rA))::value, "k16 atoms");
  CUTE_UNROLL
  for (int k = 0; k < size<2>(rA); ++k) {
    cute::copy(copy_a, sA(_, _, k), rA_view(_, _, k));
    CUTE_UNROLL
    for (int n = 0; n < size<1>(rB_view); ++n) { cute::copy(copy_b, sB(_, n, k), rB_view(_, n, k)); }
    cute::gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

// What one CTA of a split kernel works on (both kernels: split_kv, attn_decode_sm90.cuh's split_kv_wgmma): grid
// x = split, y = (unit, row block), z = sequence; its packed rows (token t, head g: row t * pack + g), its KV head,
// the sequence's keys, and the key tiles of its split (causal: none past the block's last token's diagonal).
// kv_row0: the cache row of key 0 (a dense cache's leftpad, else 0): the key loop counts keys from it, the loads
// add it to the rows they read.
struct CtaWork {
  int split, b, pack, head0, kvh, rows, row0, seqlen_k, causal_offset, blk_begin, n_tiles, kv_row0;
};

template <class Cfg>
__forceinline__ __device__ CtaWork cta_work(const Args& a) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;
  CtaWork w;
  w.split = blockIdx.x;
  const int unit = blockIdx.y / a.m_blocks, m_block = blockIdx.y % a.m_blocks;
  w.b = blockIdx.z;
  w.pack = Cfg::kPackGqa ? a.group : 1;
  w.head0 = Cfg::kPackGqa ? unit * a.group : unit;
  w.kvh = w.head0 / a.group;
  w.rows = a.seqlen_q * w.pack;
  w.row0 = m_block * kBlockM;
  // a leftpad only in the kernels whose loads add it (dense, K and V their own rows): a paged or absorbed-MLA kernel
  // compiles as without it (the launcher refuses one for them). A leftpad past the length leaves no key.
  w.kv_row0 = 0;
  if constexpr (!Cfg::kPaged && !Cfg::kVFromK) { w.kv_row0 = a.leftpad_k ? a.leftpad_k[w.b] : 0; }
  w.seqlen_k = (a.seqused_k ? a.seqused_k[w.b] : a.seqlen_k) - w.kv_row0;
  w.causal_offset = w.seqlen_k - a.seqlen_q;
  int blk_end = (w.seqlen_k + kBlockN - 1) / kBlockN;
  const int t_last = min(a.seqlen_q - 1, (w.row0 + kBlockM - 1) / w.pack);
  if (Cfg::kCausal) {   // the block's last token sees the most keys
    blk_end = min(blk_end, max(0, (t_last + w.causal_offset + kBlockN) / kBlockN));
  }
  int blk_lo = 0;
  if constexpr (Options<Cfg>::kLocal) {   // the window's tiles only: the splits divide them, from the first
    if (a.window_right >= 0) {
      blk_end = min(blk_end, max(0, (t_last + w.causal_offset + a.window_right + kBlockN) / kBlockN));
    }
    if (a.window_left >= 0) {
      blk_lo = max(0, w.row0 / w.pack + w.causal_offset - a.window_left) / kBlockN;
    }
  }
  w.blk_begin = blk_lo + w.split * a.blocks_per_split;
  blk_end = min(blk_end, w.blk_begin + a.blocks_per_split);
  w.n_tiles = max(0, blk_end - w.blk_begin);
  return w;
}

// Q of one CTA (every split kernel): the unit's packed rows (token t, head head0 + g) into sQ (the cp.async view of
// the Q tile), zero past the last row; the caller commits the group.
template <class Cfg, class SQ>
__forceinline__ __device__ void load_q(const Args& a, const CtaWork& w, SQ& sQ, int tid) {
  using Element = typename Cfg::Element;
  const Element* q = static_cast<const Element*>(a.q);
  constexpr int kChunks = Cfg::kHeadDimQK / 8;
  auto row_offset = [&](int gr) {
    return w.b * a.q_batch_stride + (gr / w.pack) * a.q_row_stride + (w.head0 + gr % w.pack) * a.q_head_stride;
  };
  if constexpr (kChunks >= 32) {   // a warp a row at a time: one (warp-uniform) row offset for 2+ copies a lane
    constexpr int kWarps = Cfg::kThreads / 32;
    const int warp = tid / 32, lane = tid % 32;
    for (int r = warp; r < Cfg::kBlockM; r += kWarps) {
      const int gr = w.row0 + r;
      const bool valid = gr < w.rows;
      const long long off = valid ? row_offset(gr) : 0;
      CUTE_UNROLL
      for (int c = lane; c < kChunks; c += 32) { cp_async_16(&sQ(r, c * 8), q + off + c * 8, valid); }
    }
  } else {
    for (int i = tid; i < Cfg::kBlockM * kChunks; i += Cfg::kThreads) {
      const int r = i / kChunks, c = i % kChunks, gr = w.row0 + r;
      const bool valid = gr < w.rows;
      cp_async_16(&sQ(r, c * 8), q + (valid ? row_offset(gr) : 0) + c * 8, valid);
    }
  }
}

// The split kernel. Cfg: Element, kBlockM, kBlockN, kWarpsM, kWarpsN, kThreads, kStages, kHeadDimQK, kHeadDimV,
// kCausal, kPaged, kPackGqa, kPrefetchFirst (the next tile's gathers go out before this tile's GEMMs, as the
// sketch orders them), kSplitDV, kVFromK, TiledMma, SmemLayoutQ/K/V/Vt/VtNoSwizzle, S2RAtomQK, S2RAtomV, and with
// kSplitDV SmemLayoutP (the shared P tile). Shared memory: Q, the K ring, the V ring unless kVFromK, then with
// kSplitDV the P tile and the max exchange (kWarpsN, kBlockM) fp32; after the loop the merge buffer reuses the
// rings (translate/decode/params.py: decode_smem_bytes counts the same).
template <class Cfg>
__forceinline__ __device__ void split_kv(const Args& a, char* smem) {
  using Element = typename Cfg::Element;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr int kGroupThreads = 32 * Cfg::kWarpsM;
  constexpr int kBlockNW = kBlockN / Cfg::kWarpsN;   // columns of one warp group per tile
  constexpr int kDV = Cfg::kHeadDimV;
  constexpr int kDVW = Cfg::kSplitDV ? kDV / Cfg::kWarpsN : kDV;   // O columns one warp group accumulates
  constexpr int kOGroups = Cfg::kSplitDV ? 1 : Cfg::kWarpsN;       // O tiles the epilogue merges
  const int tid = threadIdx.x;
  const int wg = tid / kGroupThreads, tg = tid % kGroupThreads;

  const CtaWork w = cta_work<Cfg>(a);
  const int split = w.split, b = w.b, pack = w.pack, head0 = w.head0, kvh = w.kvh, rows = w.rows, row0 = w.row0;
  const int seqlen_k = w.seqlen_k, causal_offset = w.causal_offset, blk_begin = w.blk_begin, n_tiles = w.n_tiles;
  // the loads address cache rows: key j of the sequence is row kv_row0 + j, valid below kv_row0 + seqlen_k
  const int kv_row0 = w.kv_row0, kv_row_end = w.kv_row0 + w.seqlen_k;

  Element* smem_q = reinterpret_cast<Element*>(smem);
  Element* smem_k = smem_q + cosize(typename Cfg::SmemLayoutQ{});
  constexpr int kTileK = cosize(typename Cfg::SmemLayoutK{});
  // kVFromK: slot s of "V" is slot s of K (its first kDV columns: the K tile's 64-column blocks are stored one
  // after another, so the (kBlockN, kDV) layout of the same atom addresses exactly them)
  constexpr int kTileV = Cfg::kVFromK ? kTileK : cosize(typename Cfg::SmemLayoutV{});
  Element* smem_v = Cfg::kVFromK ? smem_k : smem_k + kStages * kTileK;
  Element* smem_p = smem_v + kStages * kTileV;   // kSplitDV: the P tile, then the max exchange
  float* s_x = reinterpret_cast<float*>(smem_p + (Cfg::kSplitDV ? kBlockM * kBlockN : 0));
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Cfg::SmemLayoutQ{});

  load_q<Cfg>(a, w, sQ, tid);
  auto slot_k = [&](int s) { return make_tensor(make_smem_ptr(smem_k + s * kTileK), typename Cfg::SmemLayoutK{}); };
  auto slot_v = [&](int s) { return make_tensor(make_smem_ptr(smem_v + s * kTileV), typename Cfg::SmemLayoutV{}); };
  // prologue: the first kStages - 1 tiles in flight (Q rides in the first group)
  CUTE_UNROLL
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_tiles) {
      auto sK = slot_k(s);
      auto sV = slot_v(s);
      load_kv<Cfg>(a, b, kvh, kv_row0 + (blk_begin + s) * kBlockN, kv_row_end, sK, sV, tid);
    }
    cp_async_commit();
  }

  typename Cfg::TiledMma mma;
  auto thr = mma.get_thread_slice(tg);
  auto s2r_q = make_tiled_copy_A(typename Cfg::S2RAtomQK{}, mma);
  auto s2r_thr_q = s2r_q.get_thread_slice(tg);
  auto s2r_k = make_tiled_copy_B(typename Cfg::S2RAtomQK{}, mma);
  auto s2r_thr_k = s2r_k.get_thread_slice(tg);
  auto s2r_v = make_tiled_copy_B(typename Cfg::S2RAtomV{}, mma);
  auto s2r_thr_v = s2r_v.get_thread_slice(tg);

  using TileW = Shape<Int<kBlockNW>, Int<Cfg::kHeadDimQK>>;
  // V^T tile of one group: column mode, all d_v rows x its kBlockNW keys; split-d_v, its kDVW rows x all keys
  using TileWt = Shape<Int<kDVW>, Int<Cfg::kSplitDV ? kBlockN : kBlockNW>>;
  Tensor tSrQ = thr.partition_fragment_A(sQ);
  Tensor tSrK = thr.partition_fragment_B(local_tile(slot_k(0), TileW{}, make_coord(0, 0)));
  Tensor sVt0 = make_tensor(make_smem_ptr(smem_v), typename Cfg::SmemLayoutVtNoSwizzle{});
  Tensor tOrVt = thr.partition_fragment_B(local_tile(sVt0, TileWt{}, make_coord(0, 0)));
  Tensor acc_o = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kDVW>>{});
  clear(acc_o);
  Tensor row_max = make_tensor<float>(Shape<Int<2 * size<1>(acc_o)>>{});
  Tensor row_sum = make_fragment_like(row_max);
  fill(row_max, -INFINITY);
  clear(row_sum);
  Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockNW>>{});
  Tensor tScS = thr.partition_C(cS);

  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait<kStages - 2>();
    __syncthreads();   // tile `it` landed for every thread; slot (it - 1) % kStages is free
    auto issue_next = [&]() {
      const int nxt = it + kStages - 1;
      if (nxt < n_tiles) {
        auto sK = slot_k(nxt % kStages);
        auto sV = slot_v(nxt % kStages);
        load_kv<Cfg>(a, b, kvh, kv_row0 + (blk_begin + nxt) * kBlockN, kv_row_end, sK, sV, tid);
      }
      cp_async_commit();
    };
    if constexpr (Cfg::kPrefetchFirst) { issue_next(); }
    if (Cfg::kQInRegs && it == 0) { attn_tl::load_fragment(tSrQ, s2r_thr_q.partition_S(sQ), s2r_q, s2r_thr_q); }
    const int slot = it % kStages;
    Tensor sKw = local_tile(slot_k(slot), TileW{}, make_coord(wg, 0));
    Tensor sVtw = local_tile(make_tensor(make_smem_ptr(smem_v + slot * kTileV), typename Cfg::SmemLayoutVt{}),
                             TileWt{}, Cfg::kSplitDV ? make_coord(wg, 0) : make_coord(0, wg));
    Tensor acc_s = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kBlockNW>>{});
    clear(acc_s);
    attn_tl::gemm_ss<Cfg::kQInRegs>(mma, acc_s, tSrQ, tSrK, s2r_thr_q.partition_S(sQ), s2r_thr_k.partition_S(sKw),
                                    s2r_q, s2r_k, s2r_thr_q, s2r_thr_k);
    const int col0 = (blk_begin + it) * kBlockN + wg * kBlockNW;
    if constexpr (Options<Cfg>::kSoftcap) { attn_tl::softcap_tile(acc_s, a.softcap_prescale); }
    if constexpr (Options<Cfg>::kLocal) {   // the window's edges: every tile checks (one compare a score)
      mask_tile<Cfg::kCausal, true>(acc_s, tScS, row0, pack, col0, seqlen_k, causal_offset, a.window_left,
                                    a.window_right);
    } else if ((blk_begin + it + 1) * kBlockN > (Cfg::kCausal ? causal_offset + 1 : seqlen_k)) {
      mask_tile<Cfg::kCausal>(acc_s, tScS, row0, pack, col0, seqlen_k, causal_offset);
    }
    if constexpr (Cfg::kSplitDV) {
      // barriers per tile: top of loop (ring), the max exchange, the P tile. s_x is rewritten only after the
      // next top-of-loop barrier, sP only after the next max-exchange barrier: every group has read both by then
      softmax_shared_max<Cfg>(acc_s, acc_o, row_max, row_sum, tScS, s_x, wg, tg, a.scale_log2);
      Tensor sP = make_tensor(make_smem_ptr(smem_p), typename Cfg::SmemLayoutP{});
      Tensor rP = attn_tl::convert_type<Element>(acc_s);
      auto r2s_p = make_tiled_copy_C(Copy_Atom<UniversalCopy<uint32_t>, Element>{}, mma);
      auto r2s_thr_p = r2s_p.get_thread_slice(tg);
      cute::copy(r2s_p, r2s_thr_p.retile_S(rP),
                 r2s_thr_p.partition_D(local_tile(sP, Shape<Int<kBlockM>, Int<kBlockNW>>{}, make_coord(0, wg))));
      __syncthreads();   // the whole P tile is written
      auto s2r_p = make_tiled_copy_A(typename Cfg::S2RAtomQK{}, mma);
      auto s2r_thr_p = s2r_p.get_thread_slice(tg);
      Tensor tOrP = thr.partition_fragment_A(sP);
      gemm_pv_slice(mma, acc_o, tOrP, tOrVt, s2r_thr_p.partition_S(sP), s2r_thr_v.partition_S(sVtw), s2r_p, s2r_v,
                    s2r_thr_p, s2r_thr_v);
    } else {
      attn_tl::online_softmax(acc_s, acc_o, row_max, row_sum, a.scale_log2);
      Tensor p = make_tensor(acc_s.data(), attn_tl::acc_to_a_layout<typename Cfg::TiledMma>(acc_s.layout()));
      Tensor tOrP = attn_tl::convert_type<Element>(p);
      attn_tl::gemm_rs(mma, acc_o, tOrP, tOrVt, s2r_thr_v.partition_S(sVtw), s2r_v, s2r_thr_v);
    }
    if constexpr (!Cfg::kPrefetchFirst) { issue_next(); }
  }
  cp_async_wait<0>();
  __syncthreads();   // the ring is free: it becomes the merge buffer

  // merge the warp groups: (max * scale_log2, sum, O) per group and row. Split-d_v: one O tile, each group its
  // own columns; the groups' maxima are equal (exp2 weights 1) and their sums add up
  // split-d_v: from the start of shared memory (Q is dead too), so that 64 rows x 512 fp32 fit beside a small ring
  float* s_o = reinterpret_cast<float*>(Cfg::kSplitDV ? smem : reinterpret_cast<char*>(smem_k));   // (kOGroups, kBlockM, kDV)
  float* s_m = s_o + kOGroups * kBlockM * kDV;                   // (kWarpsN, kBlockM)
  float* s_l = s_m + Cfg::kWarpsN * kBlockM;
  Tensor tOcO = thr.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kDVW>>{}));
  const int o_group = Cfg::kSplitDV ? 0 : wg, o_col0 = Cfg::kSplitDV ? wg * kDVW : 0;
  CUTE_UNROLL
  for (int i = 0; i < size(acc_o); ++i) {
    s_o[(o_group * kBlockM + get<0>(tOcO(i))) * kDV + o_col0 + get<1>(tOcO(i))] = acc_o(i);
  }
  CUTE_UNROLL
  for (int mi = 0; mi < size(row_max); ++mi) {   // row mi of the row/col view: half mi % 2 of m-tile mi / 2
    const float l = attn_tl::quad_sum(row_sum(mi));
    if (tg % 4 == 0) {
      const int r = get<0>(tOcO(2 * (mi % 2) + 4 * (mi / 2)));
      s_m[wg * kBlockM + r] = row_max(mi) == -INFINITY ? -INFINITY : row_max(mi) * a.scale_log2;
      s_l[wg * kBlockM + r] = l;
    }
  }
  __syncthreads();

  Element* o = static_cast<Element*>(a.o);
  const long long rows_all = (long long)a.batch * a.seqlen_q * a.heads_q;
  constexpr int kVec = 4;
  for (int i = tid; i < kBlockM * (kDV / kVec); i += Cfg::kThreads) {
    const int r = i / (kDV / kVec), c = (i % (kDV / kVec)) * kVec, gr = row0 + r;
    if (gr >= rows) { continue; }
    float mx = -INFINITY;
    CUTE_UNROLL
    for (int w = 0; w < Cfg::kWarpsN; ++w) { mx = fmaxf(mx, s_m[w * kBlockM + r]); }
    float l = 0.f, f[Cfg::kWarpsN];
    CUTE_UNROLL
    for (int w = 0; w < Cfg::kWarpsN; ++w) {
      f[w] = mx == -INFINITY ? 0.f : attn_tl::fast_exp2(s_m[w * kBlockM + r] - mx);
      l += f[w] * s_l[w * kBlockM + r];
    }
    const int t = gr / pack, h = head0 + gr % pack;
    if constexpr (Options<Cfg>::kSinks) {   // one split: the sink joins here; several: in the combine
      if (a.num_splits == 1) {
        const float keep = add_sink(a, h, mx, l);
        CUTE_UNROLL
        for (int w = 0; w < Cfg::kWarpsN; ++w) { f[w] *= keep; }
      }
    }
    const float inv = l > 0.f ? 1.f / l : 0.f;
    float acc[kVec] = {0.f, 0.f, 0.f, 0.f};
    CUTE_UNROLL
    for (int w = 0; w < kOGroups; ++w) {
      const float4 x = *reinterpret_cast<const float4*>(s_o + (w * kBlockM + r) * kDV + c);
      acc[0] += f[w] * x.x; acc[1] += f[w] * x.y; acc[2] += f[w] * x.z; acc[3] += f[w] * x.w;
    }
    const float lse2 = l > 0.f ? mx + __log2f(l) : -INFINITY;
    if (a.num_splits == 1) {
      Element* dst = o + b * a.o_batch_stride + t * a.o_row_stride + h * a.o_head_stride + c;
      CUTE_UNROLL
      for (int j = 0; j < kVec; ++j) { dst[j] = Element(acc[j] * inv); }
      if (a.lse && c == 0) { a.lse[((long long)b * a.heads_q + h) * a.seqlen_q + t] = lse2 * 0.6931471805599453f; }
    } else {
      const long long row = ((long long)b * a.seqlen_q + t) * a.heads_q + h;
      float4 y = make_float4(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
      *reinterpret_cast<float4*>(a.o_partial + (split * rows_all + row) * kDV + c) = y;
      if (c == 0) { a.lse_partial[split * rows_all + row] = lse2; }
    }
  }
}

// The combine kernel merges the splits' partial outputs of a row by their log2-sum-exps (an empty split has -inf
// and weight 0: its partial row, whatever it holds, is not summed). Each warp computes the weights once, a lane per
// split, and loads the partial rows 8 float4s a lane at a time, all ahead of their sums (predicated on the split
// count, not on the shuffled weight), so that the loads' latencies overlap. With many splits (>= kCombineWideSplits,
// few rows: small batches) a warp merges one kCombineSliceCols-column slice of a row, a float4 a lane, so a row has
// kDV / 128 warps; with fewer, one warp the whole row (the weights then cost a warp a row, not one a slice).
// combine_grid (translate/decode/generate.py) launches a warp per slice or per row by the same rule. Measured
// (BENCHMARKS.md 2026-11-26): the first version (a warp a row, one split after another behind a branch on
// its weight) took about half a microsecond a split, the largest fixed cost of a batch-1 MLA call; this one is
// 1.3-1.9x at batch 1 and 1.0-1.07x elsewhere. Slices for every split count made batch 32 x 2k (2 splits) 0.92x;
// the loops unrolled (2.5k instructions: every SM fetches the code of a kernel that runs a few microseconds) made
// batch 8-32 0.96-0.98x, hence the `unroll 1` loops below.
constexpr int kCombineSliceCols = 128;
constexpr int kCombineMaxSplits = 128;   // kernel_abi/splits.py MAX_SPLITS
constexpr int kCombineWideSplits = 16;   // translate/decode/generate.py COMBINE_WIDE_SPLITS

// lane's float4s of one row: kChunks of them, 32 float4s apart, from chunk `first`; kUnroll splits a step
template <class Element, int kDV, int kChunks, int kUnroll, bool kSinks = false>
__forceinline__ __device__ void combine_row(const Args& a, long long row, int first, bool write_lse) {
  constexpr int kRowChunks = kDV / 4;   // float4s a row
  constexpr int kWeightRegs = kCombineMaxSplits / 32;
  static_assert(kDV % 4 == 0 && 32 % kUnroll == 0, "the splits of one step share a weight register");
  const int lane = threadIdx.x % 32, n = a.num_splits;
  const long long rows_all = (long long)a.batch * a.seqlen_q * a.heads_q;
  float x[kWeightRegs];
  float mx = -INFINITY;
  CUTE_UNROLL
  for (int k = 0; k < kWeightRegs; ++k) {
    const int s = lane + 32 * k;
    x[k] = s < n ? a.lse_partial[s * rows_all + row] : -INFINITY;
    mx = fmaxf(mx, x[k]);
  }
  CUTE_UNROLL
  for (int d = 16; d > 0; d /= 2) { mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, d)); }
  float l = 0.f;
  CUTE_UNROLL
  for (int k = 0; k < kWeightRegs; ++k) { l += x[k] == -INFINITY ? 0.f : attn_tl::fast_exp2(x[k] - mx); }
  CUTE_UNROLL
  for (int d = 16; d > 0; d /= 2) { l += __shfl_xor_sync(0xffffffff, l, d); }
  if constexpr (kSinks) { add_sink(a, int(row % a.heads_q), mx, l); }   // the sink: one more term of the sum
  const float lse2 = l > 0.f ? mx + __log2f(l) : -INFINITY;
  float w[kWeightRegs];   // split lane + 32 k's weight
  CUTE_UNROLL
  for (int k = 0; k < kWeightRegs; ++k) {
    w[k] = (lse2 == -INFINITY || x[k] == -INFINITY) ? 0.f : attn_tl::fast_exp2(x[k] - lse2);
  }
  const float4* src = reinterpret_cast<const float4*>(a.o_partial) + row * kRowChunks;
  const long long split_stride = rows_all * kRowChunks;   // float4s from one split's partial row to the next's
  float4 acc[kChunks];
  CUTE_UNROLL
  for (int c = 0; c < kChunks; ++c) { acc[c] = make_float4(0.f, 0.f, 0.f, 0.f); }
  auto chunk = [&](int c) { return first + 32 * c; };
  // splits [32 k, 32 k + 32) take their weights from w[0], shifted down after each 32: constant register indices
  // with one copy of the loop (kept small: the combine runs a few microseconds, its code is fetched by every SM)
#pragma unroll 1
  for (int k = 0; k < kWeightRegs && 32 * k < n; ++k) {
#pragma unroll 1
    for (int s1 = 0; s1 < 32 && 32 * k + s1 < n; s1 += kUnroll) {
      float ws[kUnroll];
      float4 y[kUnroll][kChunks];
      // every load first, predicated on the split count alone (not on the shuffled weight, which put a shuffle's
      // latency in front of each load and let ptxas interleave them with the sums: 3-5 loads in flight, not all)
      CUTE_UNROLL
      for (int u = 0; u < kUnroll; ++u) {
        const int s = 32 * k + s1 + u;
        CUTE_UNROLL
        for (int c = 0; c < kChunks; ++c) {
          y[u][c] = make_float4(0.f, 0.f, 0.f, 0.f);
          if (chunk(c) < kRowChunks && s < n) { y[u][c] = src[s * split_stride + chunk(c)]; }
        }
      }
      CUTE_UNROLL
      for (int u = 0; u < kUnroll; ++u) {
        ws[u] = __shfl_sync(0xffffffff, w[0], s1 + u);
        CUTE_UNROLL
        for (int c = 0; c < kChunks; ++c) {   // weight 0 (an empty split, whose row may be anything): nothing
          if (ws[u] != 0.f) {
            acc[c].x += ws[u] * y[u][c].x; acc[c].y += ws[u] * y[u][c].y;
            acc[c].z += ws[u] * y[u][c].z; acc[c].w += ws[u] * y[u][c].w;
          }
        }
      }
    }
    CUTE_UNROLL
    for (int i = 0; i + 1 < kWeightRegs; ++i) { w[i] = w[i + 1]; }
  }
  const int h = row % a.heads_q, t = (row / a.heads_q) % a.seqlen_q, b = row / ((long long)a.heads_q * a.seqlen_q);
  Element* dst = static_cast<Element*>(a.o) + b * a.o_batch_stride + t * a.o_row_stride + h * a.o_head_stride;
  CUTE_UNROLL
  for (int c = 0; c < kChunks; ++c) {
    if (chunk(c) < kRowChunks) {
      cutlass::AlignedArray<Element, 4> v;
      v[0] = Element(acc[c].x); v[1] = Element(acc[c].y); v[2] = Element(acc[c].z); v[3] = Element(acc[c].w);
      *reinterpret_cast<cutlass::AlignedArray<Element, 4>*>(dst + chunk(c) * 4) = v;
    }
  }
  if (a.lse && write_lse && lane == 0) {
    a.lse[((long long)b * a.heads_q + h) * a.seqlen_q + t] = lse2 * 0.6931471805599453f;
  }
}

template <class Element, int kDV, bool kSinks = false>
__forceinline__ __device__ void combine(const Args& a) {
  constexpr int kSlices = (kDV + kCombineSliceCols - 1) / kCombineSliceCols;
  const int lane = threadIdx.x % 32;
  const long long rows_all = (long long)a.batch * a.seqlen_q * a.heads_q;
  const long long warp = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (kSlices > 1 && a.num_splits >= kCombineWideSplits) {   // a warp a slice: float4 `slice * 32 + lane`
    const long long row = warp / kSlices;
    const int slice = int(warp % kSlices);
    if (row < rows_all) { combine_row<Element, kDV, 1, 8, kSinks>(a, row, slice * 32 + lane, slice == 0); }
  } else if (warp < rows_all) {   // a warp a row: float4s lane, lane + 32, ...
    combine_row<Element, kDV, kSlices, 8 / kSlices, kSinks>(a, warp, lane, true);
  }
}

}  // namespace attn_decode

#endif  // ATTN_DECODE_CUH
