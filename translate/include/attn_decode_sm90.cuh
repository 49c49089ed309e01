// Split-d_v decode with Hopper wgmma (sm_90a): the absorbed MLA decode of attn_decode.cuh's split-d_v mode
// (d_qk 576 = 512 latent + 64 rotary, V = the first 512 columns of K's rows, all query heads packed into the
// rows), its GEMMs issued as warpgroup MMAs reading both operands from shared memory instead of ldmatrix +
// mma.sync (which left that kernel issue/latency-bound: tensor pipe 27 %, short-scoreboard stalls).
//
// One CTA = two consumer warpgroups (256 threads), no producer: every thread issues the cp.async gathers of
// the K ring exactly as attn_decode::split_kv does (load_kv, kStages slots, one __syncthreads per tile).
// Tile: 64 packed rows x 64 keys. Per tile, warpgroup wg:
//   1. S_wg (64 x 32) = Q (64 x 576, shared) . K[32 wg : 32 wg + 32, :]^T, wgmma SS (N 32, 36 k-steps);
//   2. mask, row max of its 32 columns, exchanged with the other warpgroup through s_x and a CTA barrier
//      (both then hold the same running max), P_wg = exp2(S scale - m), O_wg rescaled, P_wg (16-bit) into its
//      32 columns of the shared P tile (64 x 64, K-major 128-byte swizzle), fence.proxy.async, CTA barrier;
//   3. O_wg (64 x 256 fp32, 128 registers a thread) += P (64 x 64, shared) . V[:, 256 wg : 256 wg + 256],
//      wgmma SS (N 256, 4 k-steps), V read MN-major from the K slot's first 512 columns.
// Barriers per tile: top of loop (the slot landed for everyone; every warpgroup's wgmmas of the previous tile
// completed, so its slot and the P tile are free), the max exchange, the P tile. The cp.async writes (generic
// proxy) reach the wgmmas (async proxy) through a fence.proxy.async by every thread before the top barrier.
// Overlap (the sketch's prefetch-first order): the next tile's gathers are issued between this tile's score
// wgmmas and their wait, and each thread waits for its cp.async groups of the next tile while P.V runs.
// Shared memory: Q | kStages K slots | P | s_x (2 x 64 fp32), every tile 1024-byte aligned (128-byte swizzle);
// after the loop the epilogue's merge buffer (64 x 512 fp32 O, max and sum per group and row) reuses it from
// the start, as split_kv's split-d_v mode does (translate/decode/params.py: decode_smem_bytes).
// Writes (cp.async, P) use the same swizzled addresses as the GMMA layouts read: Swizzle<3, 3, 3> over 8 x 64
// 16-bit atoms is the 128-byte swizzle of GMMA::Layout_K_SW128_Atom / Layout_MN_SW128_Atom.
#ifndef ATTN_DECODE_SM90_CUH
#define ATTN_DECODE_SM90_CUH

#include "attn_decode.cuh"
#include "attn_sm90.cuh"

namespace attn_decode {
using namespace cute;

// The epilogue of the split-d_v wgmma kernels (split_kv's split-d_v mode, as a function): each warpgroup's O slice
// (fp32, its kDV / 2 columns; coordinates tOcO) with, per row the thread holds, the row r, its max in scaled log2
// units m2 and its quad-reduced sum l, goes through one fp32 O tile from the start of shared memory (the caller's
// K ring and Q are dead), then out as the normalised output (one split) or the partial O and log2-sum-exp.
// Each warpgroup's (max, sum) pair is kept; the store merges them, so the warpgroups may hold different maxima.
template <class Cfg, int kRows, class TO, class TC>
__forceinline__ __device__ void store_split_dv(const Args& a, const CtaWork& w, char* smem, TO const& acc_o,
                                               TC const& tOcO, const float (&m2)[kRows], const float (&l)[kRows],
                                               const int (&r)[kRows], int wg, int tg) {
  using Element = typename Cfg::Element;
  constexpr int kBlockM = Cfg::kBlockM, kDV = Cfg::kHeadDimV, kWarpsN = 2, kDVW = kDV / kWarpsN;
  const int tid = threadIdx.x, rows = w.rows, row0 = w.row0, b = w.b, split = w.split, pack = w.pack;
  const int head0 = w.head0;
  float* s_o = reinterpret_cast<float*>(smem);   // (kBlockM, kDV)
  float* s_m = s_o + kBlockM * kDV;              // (kWarpsN, kBlockM)
  float* s_l = s_m + kWarpsN * kBlockM;
  CUTE_UNROLL
  for (int i = 0; i < size(acc_o); i += 2) {   // two neighbouring columns a register pair
    *reinterpret_cast<float2*>(s_o + get<0>(tOcO(i)) * kDV + wg * kDVW + get<1>(tOcO(i))) =
        make_float2(acc_o(i), acc_o(i + 1));
  }
  CUTE_UNROLL
  for (int mi = 0; mi < kRows; ++mi) {
    if (tg % 4 == 0) {
      s_m[wg * kBlockM + r[mi]] = m2[mi];
      s_l[wg * kBlockM + r[mi]] = l[mi];
    }
  }
  __syncthreads();

  Element* o = static_cast<Element*>(a.o);
  const long long rows_all = (long long)a.batch * a.seqlen_q * a.heads_q;
  constexpr int kVec = 4;
  for (int i = tid; i < kBlockM * (kDV / kVec); i += Cfg::kThreads) {
    const int row = i / (kDV / kVec), c = (i % (kDV / kVec)) * kVec, gr = row0 + row;
    if (gr >= rows) { continue; }
    float mx = -INFINITY;
    CUTE_UNROLL
    for (int g = 0; g < kWarpsN; ++g) { mx = fmaxf(mx, s_m[g * kBlockM + row]); }
    float sum = 0.f;
    CUTE_UNROLL
    for (int g = 0; g < kWarpsN; ++g) {
      sum += (mx == -INFINITY ? 0.f : attn_tl::fast_exp2(s_m[g * kBlockM + row] - mx)) * s_l[g * kBlockM + row];
    }
    // each warpgroup's columns in units of the common max (its own slice only: the other's weight is its own)
    const int wc = c / kDVW;
    const float f = mx == -INFINITY ? 0.f : attn_tl::fast_exp2(s_m[wc * kBlockM + row] - mx);
    const float inv = sum > 0.f ? f / sum : 0.f;
    const float4 x = *reinterpret_cast<const float4*>(s_o + row * kDV + c);
    const float acc[kVec] = {x.x * inv, x.y * inv, x.z * inv, x.w * inv};
    const int t = gr / pack, h = head0 + gr % pack;
    const float lse2 = sum > 0.f ? mx + __log2f(sum) : -INFINITY;
    if (a.num_splits == 1) {
      Element* dst = o + b * a.o_batch_stride + t * a.o_row_stride + h * a.o_head_stride + c;
      CUTE_UNROLL
      for (int j = 0; j < kVec; ++j) { dst[j] = Element(acc[j]); }
      if (a.lse && c == 0) { a.lse[((long long)b * a.heads_q + h) * a.seqlen_q + t] = lse2 * 0.6931471805599453f; }
    } else {
      const long long out_row = ((long long)b * a.seqlen_q + t) * a.heads_q + h;   // of the partial O (splits, rows)
      *reinterpret_cast<float4*>(a.o_partial + (split * rows_all + out_row) * kDV + c) =
          make_float4(acc[0], acc[1], acc[2], acc[3]);
      if (c == 0) { a.lse_partial[split * rows_all + out_row] = lse2; }
    }
  }
}

// Cfg: as split_kv's (Element, kBlockM 64, kBlockN 64, kWarpsN 2, kThreads 256, kStages, kHeadDimQK, kHeadDimV,
// kCausal, kPaged, kPackGqa, kPrefetchFirst, kVFromK = true, SmemLayoutQ/K: the cp.async writes' layouts) plus
// TiledMmaQK (64 x kBlockN / 2 x d_qk, SS), TiledMmaPV (64 x d_v / 2 x kBlockN, SS, B MN-major) and the GMMA
// views GmmaLayoutQ (kBlockM, d_qk), GmmaLayoutK (kBlockN, d_qk), GmmaLayoutVt (d_v, kBlockN), GmmaLayoutP.
template <class Cfg>
__forceinline__ __device__ void split_kv_wgmma(const Args& a, char* smem) {
  using Element = typename Cfg::Element;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr int kWarpsN = 2;
  constexpr int kBlockNW = kBlockN / kWarpsN;   // score columns of one warpgroup
  constexpr int kDV = Cfg::kHeadDimV, kDVW = kDV / kWarpsN;
  static_assert(kBlockM == 64 && Cfg::kThreads == 256 && Cfg::kWarpsN == kWarpsN && Cfg::kVFromK);
  static_assert(kDVW <= 256 && kDVW % 64 == 0 && kBlockN % 64 == 0);
  const int tid = threadIdx.x;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0), tg = tid % 128;  // warp-uniform: see split_kv_seesaw

  const CtaWork w = cta_work<Cfg>(a);
  const int b = w.b, pack = w.pack, kvh = w.kvh, row0 = w.row0;
  const int seqlen_k = w.seqlen_k, causal_offset = w.causal_offset, blk_begin = w.blk_begin, n_tiles = w.n_tiles;

  constexpr int kTileQ = kBlockM * Cfg::kHeadDimQK, kTileK = kBlockN * Cfg::kHeadDimQK;
  static_assert((kTileQ * 2) % 1024 == 0 && (kTileK * 2) % 1024 == 0, "128-byte swizzle: 1024-byte aligned tiles");
  Element* smem_q = reinterpret_cast<Element*>(smem);
  Element* smem_k = smem_q + kTileQ;
  Element* smem_p = smem_k + kStages * kTileK;
  float* s_x = reinterpret_cast<float*>(smem_p + kBlockM * kBlockN);   // (kWarpsN, kBlockM) row maxima
  Tensor sQw = make_tensor(make_smem_ptr(smem_q), typename Cfg::SmemLayoutQ{});   // cp.async's view

  load_q<Cfg>(a, w, sQw, tid);
  auto slot_k = [&](int s) { return make_tensor(make_smem_ptr(smem_k + s * kTileK), typename Cfg::SmemLayoutK{}); };
  CUTE_UNROLL
  for (int s = 0; s < kStages - 1; ++s) {   // the first kStages - 1 tiles in flight (Q rides in the first group)
    if (s < n_tiles) {
      auto sK = slot_k(s);
      load_kv<Cfg>(a, b, kvh, (blk_begin + s) * kBlockN, seqlen_k, sK, sK, tid);
    }
    cp_async_commit();
  }

  typename Cfg::TiledMmaQK mma_qk;
  typename Cfg::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(tg);
  auto thr_pv = mma_pv.get_thread_slice(tg);
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Cfg::GmmaLayoutQ{});
  Tensor sP = make_tensor(make_smem_ptr(smem_p), typename Cfg::GmmaLayoutP{});
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);     // descriptors (MMA, 1, d_qk / 16)
  Tensor tOsP = thr_pv.partition_fragment_A(sP);     // descriptors (MMA, 1, kBlockN / 16)
  auto r2s_p = make_tiled_copy_C(Copy_Atom<UniversalCopy<uint32_t>, Element>{}, mma_qk);
  auto r2s_thr_p = r2s_p.get_thread_slice(tg);
  Tensor tPsP = r2s_thr_p.partition_D(local_tile(sP, Shape<Int<kBlockM>, Int<kBlockNW>>{}, make_coord(0, wg)));

  Tensor acc_o = partition_fragment_C(mma_pv, Shape<Int<kBlockM>, Int<kDVW>>{});
  clear(acc_o);
  Tensor cS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockNW>>{}));
  Tensor cS_rc = make_tensor(cS.data(), attn_sm90::rowcol_layout(cS.layout()));   // (row, col) coordinates
  constexpr int kRows = decltype(size<0>(cS_rc))::value;   // rows a thread holds (2: r and r + 8)
  Tensor row_max = make_tensor<float>(Shape<Int<kRows>>{});
  Tensor row_sum = make_fragment_like(row_max);
  fill(row_max, -INFINITY);
  clear(row_sum);

  for (int it = 0; it < n_tiles; ++it) {
    if (!Cfg::kPrefetchFirst || it == 0) {   // prefetch-first: done at the end of iteration it - 1, beside P.V
      cp_async_wait<kStages - 2>();
      cutlass::arch::fence_view_async_shared();   // this thread's cp.async writes, visible to the wgmmas
    }
    __syncthreads();   // tile `it` landed for every thread; every wgmma of tile it - 1 completed
    auto issue_next = [&]() {
      const int nxt = it + kStages - 1;
      if (nxt < n_tiles) {
        auto sK = slot_k(nxt % kStages);
        load_kv<Cfg>(a, b, kvh, (blk_begin + nxt) * kBlockN, seqlen_k, sK, sK, tid);
      }
      cp_async_commit();
    };
    Element* slot = smem_k + (it % kStages) * kTileK;
    Tensor sK = make_tensor(make_smem_ptr(slot), typename Cfg::GmmaLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(slot), typename Cfg::GmmaLayoutVt{});
    Tensor tSrK = thr_qk.partition_fragment_B(local_tile(sK, Shape<Int<kBlockNW>, Int<Cfg::kHeadDimQK>>{},
                                                         make_coord(wg, 0)));
    Tensor tOrV = thr_pv.partition_fragment_B(local_tile(sVt, Shape<Int<kDVW>, Int<kBlockN>>{}, make_coord(wg, 0)));

    // 1. scores of this warpgroup's kBlockNW keys
    Tensor acc_s = partition_fragment_C(mma_qk, Shape<Int<kBlockM>, Int<kBlockNW>>{});
    attn_sm90::gemm_issue<true>(mma_qk, tSrQ, tSrK, acc_s);
    // the next tile's gathers go out while the tensor cores run this tile's scores: its slot's readers (the
    // wgmmas of tile it - 1) completed before the top barrier
    if constexpr (Cfg::kPrefetchFirst) { issue_next(); }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_s);
    const int col0 = (blk_begin + it) * kBlockN + wg * kBlockNW;
    if ((blk_begin + it + 1) * kBlockN > (Cfg::kCausal ? causal_offset + 1 : seqlen_k)) {
      mask_tile<Cfg::kCausal>(acc_s, cS, row0, pack, col0, seqlen_k, causal_offset);
    }

    // 2. the row max over both warpgroups' columns, P, the rescale of O
    Tensor s = make_tensor(acc_s.data(), attn_sm90::rowcol_layout(acc_s.layout()));
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      float m = -INFINITY;
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(s); ++ni) { m = fmaxf(m, s(mi, ni)); }
      m = attn_tl::quad_max(m);
      if (tg % 4 == 0) { s_x[wg * kBlockM + get<0>(cS_rc(mi, 0))] = m; }
    }
    __syncthreads();   // both warpgroups' maxima are in s_x (rewritten only after the next top barrier)
    Tensor o = make_tensor(acc_o.data(), attn_sm90::rowcol_layout(acc_o.layout()));
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      const int r = get<0>(cS_rc(mi, 0));
      const float m_old = row_max(mi);
      float m = m_old;
      CUTE_UNROLL
      for (int w = 0; w < kWarpsN; ++w) { m = fmaxf(m, s_x[w * kBlockM + r]); }
      row_max(mi) = m;
      const float m_scaled = (m == -INFINITY) ? 0.f : m * a.scale_log2;
      const float rescale = attn_tl::fast_exp2(m_old * a.scale_log2 - m_scaled);
      row_sum(mi) *= rescale;
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(o); ++ni) { o(mi, ni) *= rescale; }
      float sum = 0.f;
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(s); ++ni) {
        s(mi, ni) = attn_tl::fast_exp2(s(mi, ni) * a.scale_log2 - m_scaled);
        sum += s(mi, ni);
      }
      row_sum(mi) += sum;
    }
    {
      Tensor rP = attn_tl::convert_type<Element>(acc_s);
      cute::copy(r2s_p, r2s_thr_p.retile_S(rP), tPsP);
    }
    cutlass::arch::fence_view_async_shared();   // the P writes (generic proxy), visible to the wgmmas
    __syncthreads();   // the whole P tile is written

    // 3. O slice += P . V slice (completes before the next top barrier: the slot and P are rewritten after it)
    attn_sm90::gemm_issue<false>(mma_pv, tOsP, tOrV, acc_o);
    if constexpr (!Cfg::kPrefetchFirst) {   // the sketch's order: the gathers once this tile's GEMMs are done
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_o);
      issue_next();   // into the slot of tile it - 1, whose wgmmas completed before the top barrier
    } else {   // while P.V runs: the next tile's own cp.async groups landed (the top of the loop waits for nothing)
      if (it + 1 < n_tiles) {
        cp_async_wait<kStages - 2>();
        cutlass::arch::fence_view_async_shared();
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_o);
    }
  }
  cp_async_wait<0>();
  __syncthreads();   // the ring is free: it becomes the merge buffer

  Tensor tOcO = thr_pv.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kDVW>>{}));
  float m2[kRows], l[kRows];
  int r[kRows];
  CUTE_UNROLL
  for (int mi = 0; mi < kRows; ++mi) {
    r[mi] = get<0>(cS_rc(mi, 0));
    m2[mi] = row_max(mi) == -INFINITY ? -INFINITY : row_max(mi) * a.scale_log2;
    l[mi] = attn_tl::quad_sum(row_sum(mi));
  }
  store_split_dv<Cfg, kRows>(a, w, smem, acc_o, tOcO, m2, l, r, wg, tg);
}

}  // namespace attn_decode

#endif  // ATTN_DECODE_SM90_CUH
