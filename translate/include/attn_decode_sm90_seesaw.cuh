// The absorbed MLA decode on Hopper with the two warpgroups out of step ("seesaw", DecodeParams.mma =
// "sm90_seesaw"): the same Args, split rule, workspace and combine kernel as split_kv_wgmma (attn_decode_sm90.cuh),
// a different schedule and its own output store (seesaw::store_output, attn_decode_sm90_output.cuh). There, both
// warpgroups score half of every tile, exchange row maxima and P behind three CTA barriers a tile, so the tensor
// cores idle through every softmax and barrier (ncu: 0.54-0.60 of the copy bandwidth at 128 heads, BENCHMARKS.md
// 2026-11-24). Here the tiles go in pairs:
// warpgroup 0 scores the even tile (slot 0), warpgroup 1 the odd one (slot 1), each over all 64 keys, and each
// owns half of O's 512 columns (128 fp32 registers a thread). Per pair (j0, j1), with m the shared running max:
//   wg0: softmax of S(j0) against m -> m0, scale0; P0 (units of m0) to shared memory; [scale0 ready]
//        O_L *= scale0, O_L += P0 . V0_L (RS: P0 from registers)
//   wg1: [scale0 ready] O_R *= scale0, O_R += P0 . V0_R (SS) while it runs the softmax of S(j1) against m0 -> m1,
//        scale1; P1 (units of m1) to shared memory; [scale1 ready] O_R *= scale1, O_R += P1 . V1_R (RS)
//   wg0: [scale1 ready] O_L *= scale1, O_L += P1 . V1_L (SS)
//   each then scores its next tile (j0 + 2, j1 + 2): the tensor cores run one warpgroup's GEMMs through the
//   other's softmax. Two named barriers a pair (the lockstep kernel has three CTA barriers a tile). Each scores
//   the left columns of its next tile (reloaded by warpgroup 0) before it waits for the right ones (reloaded by
//   warpgroup 1): warpgroup 1 reloads its right half right before it scores, so the left half's wgmmas run while
//   those boxes land (1.013-1.047x over waiting for the whole tile at 128 heads, BENCHMARKS.md 2026-11-26;
//   FlashMLA's order, P1.V1_R before P0.V0_R with P0 in units of m1, measured 0.93-0.997x here).
// Conditional rescale (Cfg::kRescaleThreshold > 0, DecodeParams.rescale_threshold): a row keeps the shared running
// max while a tile's max exceeds it by at most that many log2 units, so its factors are exactly 1, and a warp whose
// rows all kept theirs skips O's multiplies (128 a thread, four a pair, two of them on the chain softmax 0 ->
// softmax 1 -> O_L += P1 . V1_L): 1.017-1.051x at 128 heads (BENCHMARKS.md 2026-11-26).
// Learnt from FlashMLA's sm90 decode kernel (deepseek-ai/FlashMLA, its "seesaw" schedule); written anew
// on this project's gathers: there TMA loads whole pages, here cp.async gathers rows through the page table
// (any page size, dense caches) and signals an mbarrier per half slot (cp.async.mbarrier.arrive.noinc).
//
// Loads: each warpgroup reloads the K columns it read last, as soon as its GEMM reading them completed, so two
// slots suffice: warpgroup 0 columns [0, 256) (V_L, read last by its P.V), warpgroup 1 columns [256, 576) (V_R and
// the rotary part, read last by its P.V). full[2 * slot + half] completes once per tile loaded into the slot (128
// cp.async arrivals, no increment); the pages of the rows are looked up a pair ahead. cp.async writes are
// generic-proxy writes and wgmma reads through the async proxy: the reader fences (fence.proxy.async) after its
// mbarrier wait. Measured on the H100 (BENCHMARKS.md, 2026-11-25) and left out: an mbarrier per 64-column chunk, so
// that the score GEMM starts on the first chunks (0.90-0.95x: a wait, a fence and a commit group per chunk), and an
// L2 bulk prefetch of the pair after next (0.91-0.97x at 128 heads, 0.70x at 16), and the rotary chunk in a third
// half-slot reloaded a pair ahead by its scorer (0.97-0.99x). Without any gathers this kernel
// runs 1.45-1.54x faster: the slot reloads, late in each pair, are what is left to hide.
//
// kv_load tma (Cfg::kTmaLoad): a tile of whole keys within one page (or of a dense cache) comes as TMA boxes, 64
// columns x 64 keys each, issued by one thread of the reloading warpgroup (its 4 or 5 chunks, expect_tx on the
// half-slot's mbarrier; the other 127 threads arrive plainly, so the barrier counts 128 arrivals either way). The
// boxes land in the layout the gathers write (128-byte swizzle, chunk c at c x 64 x 64 elements). A sequence's last,
// partial tile and pages smaller than a tile still gather: zero-filled rows, never a page's poisoned tail (P = 0
// times a NaN row of V would be NaN). FlashMLA's sm90 kernel loads its 64-token pages by TMA too. Measured on the
// H100 (BENCHMARKS.md, 2026-11-26): 1.033-1.061x the gathers at 128 heads; TMA tensor prefetches into L2 of the tiles
// one or two pairs after those a pair loads, on top, made it 0.88-0.95x (the prefetches queue in the TMA unit ahead
// of the loads that are needed now, a likely reason not measured).
//
// Shared memory (230,176 B): Q (64 x 576) | slot 0 | slot 1 (64 keys x 576 each) | P0 (64 x 64) | m, scale0,
// scale1 (64 fp32 each) | 4 mbarriers. P1 lives in Q's last 64-column chunk: that chunk of Q is read into
// registers once (the score GEMM's last 4 k-steps are RS wgmmas), which frees its 8 KB (FlashMLA's trick; the
// 227 KB limit holds Q, two slots and one P tile only). After the loop the output's staging tile reuses the
// start of shared memory.
#ifndef ATTN_DECODE_SM90_SEESAW_CUH
#define ATTN_DECODE_SM90_SEESAW_CUH

#include "attn_decode_sm90.cuh"
#include "attn_decode_sm90_output.cuh"
#include "attn_trace.cuh"

namespace attn_decode {
using namespace cute;

namespace seesaw {
// named barriers between the two warpgroups (cutlass::arch::NamedBarrier ids, past CUTLASS's reserved ones)
enum Barrier : uint32_t { kScale0Ready = 0, kScale1Ready = 1 };
// the loop's wait sites for -DATTN_DECODE_WAITS (attn_trace.cuh); scripts/decode_trace.py reads the labels from here
enum WaitSite : int {
  kWaitW0NextLeft = 0,    // wg0: left chunks of tile j0 + 2
  kWaitW0NextRight = 1,   // wg0: right chunks of tile j0 + 2
  kWaitW0Scale1 = 2,      // wg0: warpgroup 1's scale1 and P1
  kWaitW0PvOwn = 3,       // wg0: O_L += P0 . V0_L done
  kWaitW0PvOther = 4,     // wg0: O_L += P1 . V1_L done
  kWaitW0Score = 5,       // wg0: S(j0 + 2) done
  kWaitW1Scale0 = 8,      // wg1: warpgroup 0's scale0 and P0
  kWaitW1PvOther = 9,     // wg1: O_R += P0 . V0_R done
  kWaitW1PvOwn = 10,      // wg1: O_R += P1 . V1_R done
  kWaitW1NextLeft = 11,   // wg1: left chunks of tile j0 + 3
  kWaitW1NextRight = 12,  // wg1: right chunks of tile j0 + 3
  kWaitW1Score = 13,      // wg1: S(j0 + 3) done
  kWaitW0Loop = 16,       // wg0: the whole loop
  kWaitW1Loop = 17,       // wg1: the whole loop
};
constexpr uint32_t kBoth = 256;
__forceinline__ __device__ void arrive(Barrier b) { cutlass::arch::NamedBarrier::arrive(kBoth, b); }
__forceinline__ __device__ void sync(Barrier b) { cutlass::arch::NamedBarrier::sync(kBoth, b); }

// The score GEMM S (+)= Q . K^T over the 64-column chunks [kC0, kC1) of d_qk: SS wgmmas for every chunk but the
// last, whose Q is in registers (rQ_last) and whose k-steps are RS wgmmas. One commit group.
template <int kC0, int kC1, int kChunks, class MmaSS, class MmaRS, class TQ, class TK, class TQL, class TKL, class TC>
__forceinline__ __device__ void score_issue(MmaSS& ss, MmaRS& rs, TQ const& tQ, TK const& tK, TQL const& rQ_last,
                                            TKL const& tK_last, TC& acc) {
  constexpr bool kWithLast = kC1 == kChunks;
  if constexpr (kWithLast) { warpgroup_fence_operand(const_cast<TQL&>(rQ_last)); }
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  ss.accumulate_ = kC0 == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int c = kC0; c < (kWithLast ? kC1 - 1 : kC1); ++c) {
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tQ); ++k) {
      cute::gemm(ss, tQ(_, _, k, c), tK(_, _, k, c), acc);
      ss.accumulate_ = GMMA::ScaleOut::One;
    }
  }
  if constexpr (kWithLast) {
    rs.accumulate_ = (kC0 == kChunks - 1) ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(rQ_last); ++k) {
      cute::gemm(rs, rQ_last(_, _, k), tK_last(_, _, k), acc);
      rs.accumulate_ = GMMA::ScaleOut::One;
    }
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(acc);
  if constexpr (kWithLast) { warpgroup_fence_operand(const_cast<TQL&>(rQ_last)); }
}
}  // namespace seesaw

// Cfg::kTmaLoad where the Cfg states it (kv_load tma), else false: the gather kernels' sources stay as they were
template <class Cfg, class = void>
struct TmaLoadOf : cute::false_type {};
template <class Cfg>
struct TmaLoadOf<Cfg, cute::void_t<decltype(Cfg::kTmaLoad)>> : cute::bool_constant<Cfg::kTmaLoad> {};

// Cfg::kRescaleThreshold where the Cfg states it (rescale_threshold > 0), else 0: the running max follows every tile
template <class Cfg, class = void>
struct RescaleThresholdOf : cute::Int<0> {};
template <class Cfg>
struct RescaleThresholdOf<Cfg, cute::void_t<decltype(Cfg::kRescaleThreshold)>> : cute::Int<Cfg::kRescaleThreshold> {};

// Cfg: as split_kv_wgmma's (Element, kBlockM 64, kBlockN 64, kThreads 256, kHeadDimQK, kHeadDimV, kCausal, kPaged,
// kPackGqa, kVFromK = true, SmemLayoutQ/K: the cp.async writes' layouts, GmmaLayoutQ/K/Vt/P) with TiledMmaQK /
// TiledMmaQKrs (64 x kBlockN x 64 per chunk, SS and RS), TiledMmaPV / TiledMmaPVrs (64 x d_v / 2 x kBlockN, B
// MN-major, SS and RS).
template <class Cfg>
__forceinline__ __device__ void split_kv_seesaw(const Args& a, char* smem, const CUtensorMap* k_map = nullptr) {
  using Element = typename Cfg::Element;
  using seesaw::arrive;
  using seesaw::sync;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kDQK = Cfg::kHeadDimQK, kDV = Cfg::kHeadDimV;
  constexpr int kDVW = kDV / 2;           // O columns per warpgroup
  constexpr int kChunks = kDQK / 64;      // 64-column chunks of Q and K
  constexpr int kLeftChunks = kDVW / 64;  // K chunks [0, kLeftChunks): warpgroup 0 reloads them, the rest warpgroup 1
  constexpr bool kTma = TmaLoadOf<Cfg>::value;
  constexpr int kRescaleThreshold = RescaleThresholdOf<Cfg>::value;
  static_assert(kBlockM == 64 && kBlockN == 64 && Cfg::kThreads == 256 && Cfg::kVFromK);
  static_assert(kDQK % 64 == 0 && kDV % 128 == 0 && kDVW <= 256 && kDV < kDQK,
                "V is the first d_v columns of K, Q's last chunk (P1's bytes) is past them");
  ATTN_TRACE(0);   // -DATTN_DECODE_TRACE only (attn_trace.cuh): start, Q loaded, first score, loop end, staged, end
  const int tid = threadIdx.x;
  // warp-uniform (lane 0's, shuffled): ptxas keeps what depends on wg (the GMMA descriptors of the warpgroup's
  // tiles) in uniform registers; from tid / 128 it moved them into uniform ones before each wgmma (725 R2UR
  // in the kernel, now 97; 1.01-1.03x at 128 heads, BENCHMARKS.md 2026-11-26)
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0), tg = tid % 128;

  const CtaWork w = cta_work<Cfg>(a);
  const int b = w.b, pack = w.pack, kvh = w.kvh, row0 = w.row0;
  const int seqlen_k = w.seqlen_k, causal_offset = w.causal_offset, blk_begin = w.blk_begin, n_tiles = w.n_tiles;

  constexpr int kTileQ = kBlockM * kDQK, kTileK = kBlockN * kDQK, kChunkQ = kBlockM * 64;
  Element* smem_q = reinterpret_cast<Element*>(smem);
  Element* smem_k0 = smem_q + kTileQ;
  Element* smem_k1 = smem_k0 + kTileK;
  Element* smem_p0 = smem_k1 + kTileK;
  Element* smem_p1 = smem_q + (kChunks - 1) * kChunkQ;   // Q's last chunk, once it is in registers
  float* s_m = reinterpret_cast<float*>(smem_p0 + kBlockM * kBlockN);   // running row max, scaled log2 units
  float* s_scale0 = s_m + kBlockM;
  float* s_scale1 = s_scale0 + kBlockM;
  uint64_t* full = reinterpret_cast<uint64_t*>(s_scale1 + kBlockM);   // full[2 * slot + half]

  if (tid == 0) {
    CUTE_UNROLL
    for (int i = 0; i < 4; ++i) { cutlass::arch::ClusterBarrier::init(&full[i], 128); }
  }
  if (tid < kBlockM) { s_m[tid] = -INFINITY; }
  cutlass::arch::fence_barrier_init();

  {   // Q: one commit group
    Tensor sQw = make_tensor(make_smem_ptr(smem_q), typename Cfg::SmemLayoutQ{});
    load_q<Cfg>(a, w, sQw, tid);
    cp_async_commit();
  }
  __syncthreads();   // the mbarriers are initialised before anyone arrives on them

  const Element* kbase = static_cast<const Element*>(a.k);
  // the pages of this thread's rows of a tile, looked up a pair ahead: a table read in front of every gather put
  // its latency on the critical path (ncu: long-scoreboard stalls on the address arithmetic, BENCHMARKS.md)
  using Pages = int[kGatherRowsPerThread<Cfg, 4>];
  // local tile j comes by TMA: whole keys (no zero fill needed) within one page (a page is a multiple of the tile)
  auto by_tma = [&](int j) {
    if constexpr (!kTma) {
      return false;
    } else {
      return (blk_begin + j + 1) * kBlockN <= seqlen_k && (!Cfg::kPaged || (1 << a.page_shift) >= kBlockN);
    }
  };
  auto lookup = [&](int j, Pages& pages) {
    if constexpr (Cfg::kPaged) {
      const int key0 = (blk_begin + j) * kBlockN;
      if (by_tma(j)) {   // one page for the tile, read by the thread that issues its boxes
        if (tg == 0) { pages[0] = __ldg(a.page_table + b * a.page_table_stride + (key0 >> a.page_shift)); }
      } else {
        gather_pages<Cfg, 4>(a, b, key0, seqlen_k, tg, pages);
      }
    }
  };
  // this warpgroup's columns of local tile j (key tiles blk_begin + j) into slot j % 2, then its arrival
  auto load_half = [&](int j, const Pages& pages) {
    Element* slot = (j & 1) ? smem_k1 : smem_k0;
    Tensor sK = make_tensor(make_smem_ptr(slot), typename Cfg::SmemLayoutK{});
    const int key0 = (blk_begin + j) * kBlockN;
    if constexpr (kTma) {
      if (by_tma(j)) {
        uint64_t* bar = &full[2 * (j & 1) + wg];
        if (tg == 0) {
          const int c0 = wg ? kLeftChunks : 0, c1 = wg ? kChunks : kLeftChunks;
          cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(
              bar, uint32_t((c1 - c0) * kBlockN * 64 * sizeof(Element)));
          // (columns, row in the page or sequence, KV head, page or sequence): the map of tuner/serving/launch/decode_kernel.py
          const int row = Cfg::kPaged ? (key0 & ((1 << a.page_shift) - 1)) : key0;
          const int outer = Cfg::kPaged ? pages[0] : b;
          for (int c = c0; c < c1; ++c) {
            SM90_TMA_LOAD_4D::copy(k_map, bar, uint64_t(TMA::CacheHintSm90::EVICT_FIRST), slot + c * kBlockN * 64,
                                   c * 64, row, kvh, outer);
          }
        } else {
          cutlass::arch::ClusterBarrier::arrive(bar);
        }
        return;
      }
    }
    if (wg == 0) {
      gather_rows<Cfg, kLeftChunks, 0, 4>(kbase, a, b, kvh, key0, seqlen_k, a.k_batch_stride, a.k_row_stride,
                                          a.k_head_stride, sK, tg, pages);
    } else {
      gather_rows<Cfg, kChunks, kLeftChunks, 4>(kbase, a, b, kvh, key0, seqlen_k, a.k_batch_stride,
                                                a.k_row_stride, a.k_head_stride, sK, tg, pages);
    }
    cutlass::arch::cpasync_barrier_arrive_noinc(&full[2 * (j & 1) + wg]);
  };
  // half h of local tile j landed (its slot's (j / 2)-th fill), visible to this thread's wgmmas
  auto wait_half = [&](int j, int h) {
    cutlass::arch::ClusterBarrier::wait(&full[2 * (j & 1) + h], (j >> 1) & 1);
  };
  // the same without waiting, the same answer in every lane of the warp
  auto half_landed = [&](int j, int h) {
    const bool landed = cutlass::arch::ClusterBarrier::test_wait(&full[2 * (j & 1) + h], (j >> 1) & 1, 1);
    return __shfl_sync(0xffffffffu, int(landed), 0) != 0;
  };
  Pages pages_even = {}, pages_odd = {};   // of tiles j0 + 2 and j0 + 3 while pair j0 runs
  if (n_tiles > 0) { lookup(0, pages_even); load_half(0, pages_even); }
  if (n_tiles > 1) { lookup(1, pages_odd); load_half(1, pages_odd); }
  cp_async_commit();
  if (n_tiles > 2) { lookup(2, pages_even); }
  if (n_tiles > 3) { lookup(3, pages_odd); }

  typename Cfg::TiledMmaQK mma_qk;
  typename Cfg::TiledMmaQKrs mma_qk_rs;
  typename Cfg::TiledMmaPV mma_pv;
  typename Cfg::TiledMmaPVrs mma_pv_rs;
  auto thr_qk = mma_qk.get_thread_slice(tg);
  auto thr_qk_rs = mma_qk_rs.get_thread_slice(tg);
  auto thr_pv = mma_pv.get_thread_slice(tg);
  auto thr_pv_rs = mma_pv_rs.get_thread_slice(tg);

  auto chunks = [](Element* base, auto layout) {   // (64, 64, kChunks): the 64-column chunks of a tile
    return flat_divide(make_tensor(make_smem_ptr(base), layout), Shape<_64, _64>{})(_, _, _0{}, _);
  };
  Tensor sQc = chunks(smem_q, typename Cfg::GmmaLayoutQ{});
  Tensor tSsQ = thr_qk.partition_fragment_A(sQc);                        // (MMA, 1, 4, kChunks) descriptors
  Tensor tSrQl = thr_qk_rs.partition_fragment_A(sQc(_, _, kChunks - 1));  // (MMA, 1, 4) registers
  // this warpgroup scores the tiles of its own slot
  Element* own_slot = wg ? smem_k1 : smem_k0;
  Tensor sKc = chunks(own_slot, typename Cfg::GmmaLayoutK{});
  Tensor tSsK = thr_qk.partition_fragment_B(sKc);
  Tensor tSsKl = thr_qk_rs.partition_fragment_B(sKc(_, _, kChunks - 1));
  // P . V: its own P from registers times V of its own slot; the other's P from shared memory times V of the
  // other slot; always its own kDVW columns of V (MN-major views of the slots' first d_v columns)
  auto v_half = [&](Element* slot) {
    return local_tile(make_tensor(make_smem_ptr(slot), typename Cfg::GmmaLayoutVt{}),
                      Shape<Int<kDVW>, Int<kBlockN>>{}, make_coord(wg, 0));
  };
  Tensor tOsVown = thr_pv_rs.partition_fragment_B(v_half(own_slot));
  Tensor tOsVother = thr_pv.partition_fragment_B(v_half(wg ? smem_k0 : smem_k1));
  Tensor tOsPother = thr_pv.partition_fragment_A(
      make_tensor(make_smem_ptr(wg ? smem_p0 : smem_p1), typename Cfg::GmmaLayoutP{}));
  Element* own_p = wg ? smem_p1 : smem_p0;

  cp_async_wait<1>();                         // this thread's Q copies landed
  cutlass::arch::fence_view_async_shared();   // visible to the wgmmas
  __syncthreads();                            // everyone's
  {
    Tensor tSsQl = thr_qk_rs.partition_A(sQc(_, _, kChunks - 1));
    CUTE_UNROLL
    for (int i = 0; i < size(tSrQl); ++i) { tSrQl(i) = tSsQl(i); }
  }
  __syncthreads();   // Q's last chunk is in everyone's registers: its bytes may become P1
  ATTN_TRACE(1);

  Tensor acc_s = partition_fragment_C(mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor acc_o = partition_fragment_C(mma_pv, Shape<Int<kBlockM>, Int<kDVW>>{});
  clear(acc_o);
  Tensor cS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor cS_rc = make_tensor(cS.data(), attn_sm90::rowcol_layout(cS.layout()));
  constexpr int kRows = decltype(size<0>(cS_rc))::value;   // rows a thread holds (2: r and r + 8)
  Tensor s = make_tensor(acc_s.data(), attn_sm90::rowcol_layout(acc_s.layout()));
  float row_sum[kRows];
  int row[kRows];
  CUTE_UNROLL
  for (int mi = 0; mi < kRows; ++mi) {
    row_sum[mi] = 0.f;
    row[mi] = get<0>(cS_rc(mi, 0));
  }

  auto score = [&](int j) {   // S = Q . K(j)^T of this warpgroup's slot, all chunks, waited
    wait_half(j, 0);
    wait_half(j, 1);
    cutlass::arch::fence_view_async_shared();
    seesaw::score_issue<0, kChunks, kChunks>(mma_qk, mma_qk_rs, tSsQ, tSsK, tSrQl, tSsKl, acc_s);
    warpgroup_wait<0>();
  };
  auto mask = [&](int j) {   // -inf past the sequence (and the diagonal) on a tile that reaches them
    const int blk = blk_begin + j;
    if ((blk + 1) * kBlockN > (Cfg::kCausal ? causal_offset + 1 : seqlen_k)) {
      mask_tile<Cfg::kCausal>(acc_s, cS, row0, pack, blk * kBlockN, seqlen_k, causal_offset);
    }
  };
  auto row_max = [&](int mi) {
    float m = -INFINITY;
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(s); ++ni) { m = fmaxf(m, s(mi, ni)); }
    return attn_tl::quad_max(m);
  };
  // P = exp2(S scale - m) in place (m -inf: a row that saw no key, P = 0), its row sums
  auto exponentiate = [&](int mi, float m_use) {
    float sum = 0.f;
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(s); ++ni) {
      s(mi, ni) = attn_tl::fast_exp2(s(mi, ni) * a.scale_log2 - m_use);
      sum += s(mi, ni);
    }
    return sum;
  };
  // the running max after a tile whose scaled row max is m_tile: FA4's conditional rescale (kRescaleThreshold > 0)
  // keeps the old max while the tile exceeds it by at most that many log2 units (P then reaches 2^threshold, and
  // the factor is exactly 1, so the output's multiply is skipped)
  auto next_max = [&](float m_old, float m_tile) {
    const float m = fmaxf(m_old, m_tile);
    return (kRescaleThreshold > 0 && m_old != -INFINITY && m - m_old <= float(kRescaleThreshold)) ? m_old : m;
  };
  auto factor = [&](float m_old, float m_new, float m_use) {
    return (kRescaleThreshold > 0 && m_new == m_old) ? 1.f : attn_tl::fast_exp2(m_old - m_use);
  };
  // O's rows times their factors (a thread's kRows); with the threshold, a warp none of whose rows moved its max
  // skips the multiplies: the prefill kernels' rescale_rows
  auto scale_rows = [&](auto const& f) { attn_sm90::rescale_rows<(kRescaleThreshold > 0)>(acc_o, f); };
  auto row_factors = [] { return make_tensor<float>(Int<kRows>{}); };

  if (wg == 0 && n_tiles > 0) { score(0); }
  ATTN_TRACE(2);
  if (wg == 1 && n_tiles > 1) { score(1); }

  ATTN_SPAN_BEGIN(attn_loop_t0);
  for (int j0 = 0; j0 < n_tiles; j0 += 2) {
    const int j1 = j0 + 1;
    const bool has1 = j1 < n_tiles, has2 = j0 + 2 < n_tiles, has3 = j0 + 3 < n_tiles;
    if (wg == 0) {
      // softmax of S(j0) against the running max m -> m0; P0 (units of m0) to shared memory for warpgroup 1
      mask(j0);
      float m_use[kRows], m_new[kRows];
      Tensor scale0 = row_factors();
      CUTE_UNROLL
      for (int mi = 0; mi < kRows; ++mi) {
        const float m_old = s_m[row[mi]];
        m_new[mi] = next_max(m_old, row_max(mi) * a.scale_log2);
        m_use[mi] = m_new[mi] == -INFINITY ? 0.f : m_new[mi];
        scale0(mi) = factor(m_old, m_new[mi], m_use[mi]);
      }
      __syncwarp();   // the quad's reads of m before its leader's write
      CUTE_UNROLL
      for (int mi = 0; mi < kRows; ++mi) {
        if (tg % 4 == 0) {
          s_m[row[mi]] = m_new[mi];
          s_scale0[row[mi]] = scale0(mi);
        }
        row_sum[mi] = row_sum[mi] * scale0(mi) + exponentiate(mi, m_use[mi]);
      }
      {
        Tensor rP = attn_tl::convert_type<Element>(acc_s);
        attn_sm90::store_o_tile<kBlockM, kBlockN>(rP, own_p, tg);
      }
      cutlass::arch::fence_view_async_shared();
      arrive(seesaw::kScale0Ready);   // m0, scale0 and P0 are out
      scale_rows(scale0);
      {   // O_L += P0 . V0_L, P0 from registers
        Tensor rP = make_tensor<Element>(attn_sm90::acc_to_a_layout(acc_s.layout()));
        attn_sm90::convert_into(rP, acc_s);
        attn_sm90::gemm_issue<false>(mma_pv_rs, rP, tOsVown, acc_o);
        ATTN_WAIT(seesaw::kWaitW0PvOwn, warpgroup_wait<0>());
      }
      if (has2) { load_half(j0 + 2, pages_even); }   // slot 0's columns [0, 256): last read by that GEMM
      if (j0 + 4 < n_tiles) { lookup(j0 + 4, pages_even); }
      if (has1) {   // O_L to m1, O_L += P1 . V1_L (P1 in units of m1, from shared memory)
        ATTN_WAIT(seesaw::kWaitW0Scale1, sync(seesaw::kScale1Ready));
        Tensor f = row_factors();
        CUTE_UNROLL
        for (int mi = 0; mi < kRows; ++mi) {
          f(mi) = s_scale1[row[mi]];
          row_sum[mi] *= f(mi);
        }
        scale_rows(f);
        cutlass::arch::fence_view_async_shared();   // V1_L: gathered by this warpgroup, waited for by the other
        attn_sm90::gemm_issue<false>(mma_pv, tOsPother, tOsVother, acc_o);
      }
      if (has2) {   // S(j0 + 2): its left columns first (this warpgroup loaded them a while ago)
        // Slot 1's left columns go to tile j0 + 3 as soon as O_L += P1 . V1_L completes, which warpgroup 1 scores
        // next: its wait for them was 12-18% of its loop (decode_trace.py --waits) when they went out only after
        // this warpgroup's wait for tile j0 + 2's left chunks. Where those have landed already, S(j0 + 2)'s wgmmas
        // go first (they queue behind that P . V); else the reload does (1.006-1.030x at 128 heads, 1.01x at 16;
        // 0.99x at 2-4 tokens; BENCHMARKS.md 2026-11-26).
        const bool left_landed = half_landed(j0 + 2, 0);
        if (!left_landed) {
          ATTN_WAIT(seesaw::kWaitW0PvOther, warpgroup_wait<0>());
          if (has3) { load_half(j0 + 3, pages_odd); }
        }
        ATTN_WAIT(seesaw::kWaitW0NextLeft, wait_half(j0 + 2, 0));
        cutlass::arch::fence_view_async_shared();
        seesaw::score_issue<0, kLeftChunks, kChunks>(mma_qk, mma_qk_rs, tSsQ, tSsK, tSrQl, tSsKl, acc_s);
        if (left_landed) {
          ATTN_WAIT(seesaw::kWaitW0PvOther, warpgroup_wait<1>());
          if (has3) { load_half(j0 + 3, pages_odd); }
        }
        if (j0 + 5 < n_tiles) { lookup(j0 + 5, pages_odd); }
        ATTN_WAIT(seesaw::kWaitW0NextRight, wait_half(j0 + 2, 1));
        cutlass::arch::fence_view_async_shared();
        seesaw::score_issue<kLeftChunks, kChunks, kChunks>(mma_qk, mma_qk_rs, tSsQ, tSsK, tSrQl, tSsKl, acc_s);
      }
      ATTN_WAIT(seesaw::kWaitW0Score, warpgroup_wait<0>());
    } else {
      ATTN_WAIT(seesaw::kWaitW1Scale0, sync(seesaw::kScale0Ready));
      // O_R to m0, O_R += P0 . V0_R (P0 from shared memory), while the softmax of S(j1) runs
      Tensor scale0 = row_factors();
      CUTE_UNROLL
      for (int mi = 0; mi < kRows; ++mi) {
        scale0(mi) = s_scale0[row[mi]];
        row_sum[mi] *= scale0(mi);
      }
      scale_rows(scale0);
      cutlass::arch::fence_view_async_shared();   // V0_R: gathered by this warpgroup, waited for by the other
      attn_sm90::gemm_issue<false>(mma_pv, tOsPother, tOsVother, acc_o);
      if (has1) {   // softmax of S(j1) against m0 -> m1; P1 (units of m1) to shared memory for warpgroup 0
        mask(j1);
        float m_use[kRows], m_new[kRows];
        Tensor scale1 = row_factors();
        CUTE_UNROLL
        for (int mi = 0; mi < kRows; ++mi) {
          const float m0 = s_m[row[mi]];
          m_new[mi] = next_max(m0, row_max(mi) * a.scale_log2);
          m_use[mi] = m_new[mi] == -INFINITY ? 0.f : m_new[mi];
          scale1(mi) = factor(m0, m_new[mi], m_use[mi]);
        }
        __syncwarp();
        CUTE_UNROLL
        for (int mi = 0; mi < kRows; ++mi) {
          if (tg % 4 == 0) {
            s_m[row[mi]] = m_new[mi];
            s_scale1[row[mi]] = scale1(mi);
          }
          row_sum[mi] = row_sum[mi] * scale1(mi) + exponentiate(mi, m_use[mi]);
        }
        {
          Tensor rP = attn_tl::convert_type<Element>(acc_s);
          attn_sm90::store_o_tile<kBlockM, kBlockN>(rP, own_p, tg);
        }
        cutlass::arch::fence_view_async_shared();
        arrive(seesaw::kScale1Ready);   // m1, scale1 and P1 are out
        ATTN_WAIT(seesaw::kWaitW1PvOther, warpgroup_wait<0>());   // O_R += P0 . V0_R completed
        if (has2) { load_half(j0 + 2, pages_even); }   // slot 0's columns [256, 576): last read by that GEMM
        if (j0 + 4 < n_tiles) { lookup(j0 + 4, pages_even); }
        scale_rows(scale1);
        Tensor rP = make_tensor<Element>(attn_sm90::acc_to_a_layout(acc_s.layout()));
        attn_sm90::convert_into(rP, acc_s);
        attn_sm90::gemm_issue<false>(mma_pv_rs, rP, tOsVown, acc_o);   // O_R += P1 . V1_R
        ATTN_WAIT(seesaw::kWaitW1PvOwn, warpgroup_wait<0>());
        if (has3) {   // slot 1's columns [256, 576) are free: tile j0 + 3, then its scores
          load_half(j0 + 3, pages_odd);
          if (j0 + 5 < n_tiles) { lookup(j0 + 5, pages_odd); }
          // its left columns first (warpgroup 0 reloaded them a GEMM earlier): their wgmmas run while the right
          // half, just issued, lands
          ATTN_WAIT(seesaw::kWaitW1NextLeft, wait_half(j0 + 3, 0));
          cutlass::arch::fence_view_async_shared();
          seesaw::score_issue<0, kLeftChunks, kChunks>(mma_qk, mma_qk_rs, tSsQ, tSsK, tSrQl, tSsKl, acc_s);
          ATTN_WAIT(seesaw::kWaitW1NextRight, wait_half(j0 + 3, 1));
          cutlass::arch::fence_view_async_shared();
          seesaw::score_issue<kLeftChunks, kChunks, kChunks>(mma_qk, mma_qk_rs, tSsQ, tSsK, tSrQl, tSsKl, acc_s);
          ATTN_WAIT(seesaw::kWaitW1Score, warpgroup_wait<0>());
        }
      } else {
        warpgroup_wait<0>();
      }
    }
  }
  ATTN_SPAN_END(wg ? seesaw::kWaitW1Loop : seesaw::kWaitW0Loop, attn_loop_t0);
  __syncthreads();   // every GEMM and load is done: the slots and Q become the staging tile
  ATTN_TRACE(3);

  Tensor tOcO = thr_pv.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kDVW>>{}));
  float l[kRows];
  CUTE_UNROLL
  for (int mi = 0; mi < kRows; ++mi) { l[mi] = attn_tl::quad_sum(row_sum[mi]); }
  static_assert(seesaw::kStageBytes<kBlockM, kDV> + 2 * kBlockM * sizeof(float) <=
                    (kTileQ + 2 * kTileK + kBlockM * kBlockN) * sizeof(Element),
                "the staging tile and the row sums end before s_m, which the store reads");
  seesaw::store_output<Cfg, kRows>(a, w, smem, s_m, acc_o, tOcO, l, row, wg, tg);
  ATTN_TRACE_SYNC(5);
}

}  // namespace attn_decode

#endif  // ATTN_DECODE_SM90_SEESAW_CUH
