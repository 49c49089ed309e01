// Device helpers for Hopper (sm_90a) kernels generated from TL programs (translate/sm90/).
// One job each: wgmma GEMM issue, the wgmma accumulator's row/column and operand views, the online
// softmax split in two (statistics now, the output's rescale when the output is next touched),
// mbarrier pipelines between a TMA producer and the consumer warpgroups; the K/V, Q and O copies (TMA tiles and
// pages, the cp.async paged producer) are in attn_sm90_copy.cuh.
// Structure learnt from FlashAttention-3 (hopper/) and CUTLASS's Hopper examples; written anew.
#ifndef ATTN_SM90_CUH
#define ATTN_SM90_CUH

#include <cuda.h>
#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "attn_tl.cuh"
#include "attn_sm90_copy.cuh"

namespace attn_sm90 {
using namespace cute;

// ---- accumulator layouts --------------------------------------------------------------------------
// A wgmma accumulator fragment is ((2, 2, N/8), MMA_M, MMA_N): per 8-column group a thread holds two
// neighbouring columns of two rows (r and r + 8). Rows x cols view, for the row reductions:
// ((2, MMA_M), (2, N/8, MMA_N)). A quad (4 lanes) shares a row, as with mma.sync.
// Host-callable: tests/translate check the layouts on the CPU.
template <typename Layout>
CUTE_HOST_DEVICE auto rowcol_layout(Layout acc) {
  static_assert(decltype(rank(acc))::value == 3);
  static_assert(decltype(rank(get<0>(acc)))::value == 3);
  return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                     make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
}

// TL "Reshape S ... to (MMA_A, ...)": the 16-bit A operand of an RS wgmma (64 x 16 per k-block) holds,
// per thread, the values of two neighbouring 8-column groups of the accumulator:
// ((2, 2, N/8), MMA_M, MMA_N) -> ((2, 2, 2), MMA_M, (N/16, MMA_N)).
template <typename Layout>
CUTE_HOST_DEVICE auto acc_to_a_layout(Layout acc) {
  using X = Underscore;
  auto l = logical_divide(get<0>(acc), Shape<X, X, _2>{});   // ((2, 2, (2, N/16)))
  return make_layout(make_layout(get<0>(l), get<1>(l), get<2, 0>(l)), get<1>(acc),
                     coalesce(make_layout(get<2, 1>(l), get<2>(acc))));
}

// ---- wgmma operands in shared memory ---------------------------------------------------------------
// A shared-memory operand as the tensor of GMMA descriptors that CuTe's ThrMMA::partition_fragment_A/B
// builds (MakeTensor<GMMA::smem_desc> over make_gmma_desc, field by field in its order), from what those
// derive out of the tile's layout: the descriptor tensor's layout (16-byte units), the leading and stride
// byte offsets and the swizzle (layout type). translate/sm90/frame.py gmma_operand() computes them from the
// tile shape; tests/translate/test_gmma_operands.py checks layout type, fields and each thread's start
// against CuTe's partitions. CuTe's partition algebra for the Q, K and V operands cost 2-3 s of cicc per
// distinct tile (BENCHMARKS.md, 2026-11-24).
template <class DescLayout, int kLeading, int kStride, int kLayoutType, typename Element>
__forceinline__ __device__ auto gmma_operand(Element const* smem) {
  GmmaDescriptor desc;
  desc.bitfield.layout_type_ = uint8_t(kLayoutType);
  desc.bitfield.start_address_ = static_cast<uint16_t>(cast_smem_ptr_to_uint(smem) >> 4);
  desc.bitfield.base_offset_ = 0;
  desc.bitfield.stride_byte_offset_ = kStride;
  desc.bitfield.leading_byte_offset_ = kLeading;
  return make_tensor(GMMA::DescriptorIterator{desc}, DescLayout{});
}

// ---- GEMM -----------------------------------------------------------------------------------------
// Issue one wgmma batch: acc (+)= A * B over every k-block, committed as one group. Asynchronous: the
// caller waits (warpgroup_wait<N>) before it touches acc, or overwrites A when A is in registers.
// Everything between arrive and commit is inlined (a call there serialises the wgmma: ptxas C7510).
template <bool kZeroInit, typename TiledMma, typename TA, typename TB, typename TC>
__forceinline__ __device__ void gemm_issue(TiledMma& mma, TA const& tA, TB const& tB, TC& tC) {
  // A is either GMMA descriptors of shared memory (SS) or 16-bit registers (RS)
  constexpr bool kARegs = !cute::is_same_v<typename TA::iterator, GMMA::DescriptorIterator>;
  if constexpr (kARegs) { warpgroup_fence_operand(const_cast<TA&>(tA)); }
  warpgroup_fence_operand(tC);
  warpgroup_arrive();
  if constexpr (kZeroInit) { mma.accumulate_ = GMMA::ScaleOut::Zero; }
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tA); ++k) {
    cute::gemm(mma, tA(_, _, k), tB(_, _, k), tC);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(tC);
  if constexpr (kARegs) { warpgroup_fence_operand(const_cast<TA&>(tA)); }
}

// ptxas schedules within a basic block and moves a wgmma wait above independent arithmetic (seen in
// the SASS: the softmax ended up after the wait for the P·V GEMM it was meant to overlap). A branch that
// is never taken ends the block, so the work emitted before the wait stays before it.
__forceinline__ __device__ void ordering_point(bool never) {
  if (never) { __trap(); }
}

// ---- softmax --------------------------------------------------------------------------------------
// 2^x on the FMA pipe, no MUFU (at head dim 64 a tile's MUFU.EX2 time equals its tensor-core time, 16
// exponentials a clock per SM against 4096 FLOP, so the softmax can move part of them to the idle FP32 pipe; FA4
// does this on sm100). x = floor + frac: a round-down add of 1.5 * 2^23 leaves floor(x) in the low mantissa bits,
// 2^frac is a degree-3 polynomial (minimax relative error 8.6e-5: below bf16's and fp16's rounding), and floor
// goes into the exponent field by an integer add. x <= -127 (a masked -inf too) gives exactly 0: floor -127, frac 0,
// p = 1.0, whose exponent field the add empties. 8 FP32/integer instructions in place of one MUFU.
__forceinline__ __device__ float exp2_poly(float x) {
  const float xc = fmaxf(x, -127.f);
  float rounded;
  asm("add.rm.f32 %0, %1, 0f4B400000;" : "=f"(rounded) : "f"(xc));
  const float frac = xc - (rounded - 12582912.f);
  const float p = fmaf(fmaf(fmaf(0.0770672411f, frac, 0.227644980f), frac, 0.695116639f), frac, 1.f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(rounded) << 23));
}

// Which of a row's exponentials take exp2_poly: kPoly of every 8 (0: none), the last of each group of 8 columns
// first, so MUFU and FMA instructions interleave.
template <int kPoly>
__forceinline__ __device__ constexpr bool poly_slot(int ni) {
  return kPoly > 0 && (ni % 8) >= 8 - kPoly;
}

// Online softmax of one score tile, first half: new running row max, P = exp2(S * scale_log2 -
// max * scale_log2) in place (one FFMA + MUFU.EX2 each), row sums rescaled and extended (thread-local:
// the quad reduction waits for the epilogue), and the factor exp2((m_old - m_new) * scale_log2) that the
// output accumulator must be multiplied by before its next GEMM (rescale_rows). A row with no visible
// key keeps max -inf and is treated as max 0, so that P = 0, never NaN.
// kRescaleThreshold > 0 (FA4's conditional rescaling): a row keeps its running max while the tile's max exceeds
// it by at most that many log2 units, so its factor is exactly 1 and rescale_rows<true> can skip the output's
// multiply; P and the sums are then up to 2^threshold (exact in fp32, bf16/fp16 hold it), and the final
// normalisation divides it out: the same softmax, fewer instructions once the running max has settled.
// kExp2Poly > 0: that many of every 8 exponentials of a row by exp2_poly (the FMA pipe) instead of MUFU.EX2.
// kMaxOffset (FP8 kernels): P = 2^(x - (max - kMaxOffset)), so a row's largest P is 2^kMaxOffset: P is rounded to
// e4m3 for the P.V GEMM, whose 3-bit mantissa is relative but whose normal range starts at 2^-6; FA3's offset 8 keeps
// exponentials down to 2^-14 of the max out of the subnormals. The sums carry the same factor, which the final
// normalisation divides out.
template <int kRescaleThreshold = 0, int kExp2Poly = 0, int kMaxOffset = 0, int kMaxChains = 1, typename TS,
          typename TMax, typename TSum, typename TScale>
__forceinline__ __device__ void softmax_tile(TS& acc_s, TMax& row_max, TSum& row_sum, TScale& rescale,
                                             float scale_log2) {
  Tensor s = make_tensor(acc_s.data(), rowcol_layout(acc_s.layout()));
  static_assert(decltype(size<0>(s))::value == decltype(size(row_max))::value);
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(s); ++mi) {
    float factor;
    const float m_scaled = attn_tl::update_row_max<kRescaleThreshold, kMaxChains>(s, mi, row_max, factor,
                                                                              scale_log2) - float(kMaxOffset);
    rescale(mi) = factor;
    float sum = 0.f;
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(s); ++ni) {
      const float x = s(mi, ni) * scale_log2 - m_scaled;
      s(mi, ni) = poly_slot<kExp2Poly>(ni) ? exp2_poly(x) : attn_tl::fast_exp2(x);
      sum += s(mi, ni);
    }
    row_sum(mi) = row_sum(mi) * factor + sum;
  }
}

// softmax_tile in two halves, for a wait between them (pv_wait "mid": the P.V GEMM in flight is waited for once
// the maxima are known, FA4's order, so that the exponentials, P's conversion and the output's rescale share one
// basic block and ptxas interleaves their FP32 and F2FP instructions with the MUFU stream). First half: the new
// running max and the output's factor per row, and S * scale_log2 - max * scale_log2 in place.
template <int kRescaleThreshold = 0, int kMaxOffset = 0, int kMaxChains = 1, typename TS, typename TMax,
          typename TScale>
__forceinline__ __device__ void softmax_scores(TS& acc_s, TMax& row_max, TScale& rescale, float scale_log2) {
  Tensor s = make_tensor(acc_s.data(), rowcol_layout(acc_s.layout()));
  static_assert(decltype(size<0>(s))::value == decltype(size(row_max))::value);
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(s); ++mi) {
    float factor;
    const float m_scaled = attn_tl::update_row_max<kRescaleThreshold, kMaxChains>(s, mi, row_max, factor,
                                                                              scale_log2) - float(kMaxOffset);
    rescale(mi) = factor;
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(s); ++ni) { s(mi, ni) = s(mi, ni) * scale_log2 - m_scaled; }
  }
}

// Second half: P = exp2 of the first half's values in place, and the row sums rescaled and extended. Columns
// [kFrom8, kTo8) eighths of a thread's row only (pv_wait "quarter" / "half": the first part's exponentials before the
// wait for the P.V GEMM, the rest after it, beside P's conversion); the part that starts at column 0 rescales the sums.
template <int kExp2Poly = 0, int kFrom8 = 0, int kTo8 = 8, typename TS, typename TSum, typename TScale>
__forceinline__ __device__ void softmax_exp(TS& acc_s, TSum& row_sum, TScale const& rescale) {
  Tensor s = make_tensor(acc_s.data(), rowcol_layout(acc_s.layout()));
  static_assert(decltype(size<0>(s))::value == decltype(size(row_sum))::value);
  static_assert(0 <= kFrom8 && kFrom8 < kTo8 && kTo8 <= 8);
  constexpr int kCols = decltype(size<1>(s))::value;
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(s); ++mi) {
    float sum = 0.f;
    CUTE_UNROLL
    for (int ni = kCols * kFrom8 / 8; ni < kCols * kTo8 / 8; ++ni) {
      s(mi, ni) = poly_slot<kExp2Poly>(ni) ? exp2_poly(s(mi, ni)) : attn_tl::fast_exp2(s(mi, ni));
      sum += s(mi, ni);
    }
    row_sum(mi) = kFrom8 == 0 ? row_sum(mi) * rescale(mi) + sum : row_sum(mi) + sum;
  }
}

// The mask of a tile whose rows are (token, query head) pairs of one KV head, heads fastest (pack_gqa): row r of
// the tile is token (row0 + r) / pack. Per row, not per element: one division for each of a thread's rows.
template <bool kCausal, typename TS, typename TC>
__forceinline__ __device__ void apply_mask_packed(TS& acc_s, TC const& coord, int row0, int col0, int seqlen_k,
                                                  int causal_offset, int pack) {
  Tensor s = make_tensor(acc_s.data(), rowcol_layout(acc_s.layout()));
  Tensor c = make_tensor(coord.data(), rowcol_layout(coord.layout()));
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(s); ++mi) {
    const int last_key = kCausal ? min(seqlen_k - 1, (row0 + get<0>(c(mi, 0))) / pack + causal_offset) : seqlen_k - 1;
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(s); ++ni) {
      if (col0 + get<1>(c(mi, ni)) > last_key) { s(mi, ni) = -INFINITY; }
    }
  }
}

// ---- the options of kernel_abi.spec: sliding windows, soft-capping, sinks -----------------------------------
// The mask of a tile of a local kernel (a sliding window, run-time sizes; -1 leaves a side open): key c of row r is
// visible iff c < seqlen_k and r + offset - left <= c <= r + offset + right (causal kernels pass right 0). A row's
// token is its tile row / pack where query heads are packed into the rows (pack 1: unpacked). Per row, one division.
template <typename TS, typename TC>
__forceinline__ __device__ void apply_mask_window(TS& acc_s, TC const& coord, int row0, int col0, int seqlen_k,
                                                  int causal_offset, int window_left, int window_right, int pack = 1) {
  Tensor s = make_tensor(acc_s.data(), rowcol_layout(acc_s.layout()));
  Tensor c = make_tensor(coord.data(), rowcol_layout(coord.layout()));
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(s); ++mi) {
    const int diag = (row0 + get<0>(c(mi, 0))) / pack + causal_offset;
    const int last_key = window_right >= 0 ? min(seqlen_k - 1, diag + window_right) : seqlen_k - 1;
    const int first_key = window_left >= 0 ? diag - window_left : 0;
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(s); ++ni) {
      const int col = col0 + get<1>(c(mi, ni));
      if (col > last_key || col < first_key) { s(mi, ni) = -INFINITY; }
    }
  }
}

using attn_tl::softcap_tile;   // soft-capping: attn_tl.cuh (the decode kernels' too)

// Attention sinks (FA4's learnable_sink): after the last key tile, each row's sink logit joins its softmax as one
// more key without a value. With m the row's running max (the P values and the sum are relative to m * scale_log2)
// and s the sink in log2 units, M = max(m * scale_log2, s): the sum becomes sum * 2^(m' - M) + 2^(s - M) and the
// output is multiplied by 2^(m' - M), so the final division normalises over the keys and the sink. The sum is
// thread-local (a quad's four threads share a row until normalize_rows adds them): every thread scales its part,
// and the first thread of the quad adds the sink's term once. A row that saw no key (max -inf) gets output 0.
// The query head of tile row r is head0 + (r % pack) (packed heads) or head0.
template <typename TO, typename TMax, typename TSum, typename TC>
__forceinline__ __device__ void add_sink(TO& acc_o, TMax const& row_max, TSum& row_sum, TC const& coord,
                                         float const* sinks, int head0, int pack, float scale_log2, int thread) {
  Tensor o = make_tensor(acc_o.data(), rowcol_layout(acc_o.layout()));
  Tensor c = make_tensor(coord.data(), rowcol_layout(coord.layout()));
  constexpr float kLog2e = 1.4426950408889634f;
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(o); ++mi) {
    const int head = head0 + (pack > 1 ? get<0>(c(mi, 0)) % pack : 0);
    const float sink = __ldg(sinks + head) * kLog2e;
    const float m = row_max(mi) == -INFINITY ? -INFINITY : row_max(mi) * scale_log2;
    const attn_tl::SinkJoin j = attn_tl::join_sink(m, sink);
    row_sum(mi) = row_sum(mi) * j.keep + (thread % 4 == 0 ? j.term : 0.f);
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(o); ++ni) { o(mi, ni) *= j.keep; }
  }
}

// Second half: the output accumulator's rows times their factors. kSkipUnit (with softmax_tile's threshold):
// a warp none of whose rows moved its max skips the multiply (one vote instead of a multiply per element).
template <bool kSkipUnit = false, typename TO, typename TScale>
__forceinline__ __device__ void rescale_rows(TO& acc_o, TScale const& rescale) {
  if constexpr (kSkipUnit) {
    bool moved = false;
    CUTE_UNROLL
    for (int mi = 0; mi < size(rescale); ++mi) { moved |= rescale(mi) != 1.f; }
    if (!__any_sync(0xffffffffu, moved)) { return; }
  }
  Tensor o = make_tensor(acc_o.data(), rowcol_layout(acc_o.layout()));
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(o); ++mi) {
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(o); ++ni) { o(mi, ni) *= rescale(mi); }
  }
}

// TL "Compute Divide O, Ssum": quad-reduce the thread-local sums, divide; a row that saw no key (sum 0)
// is 0, as FlashAttention defines it.
// ``out_scale``: a factor on every output (an FP8 kernel's v descale), folded into the division.
template <typename TO, typename TSum>
__forceinline__ __device__ void normalize_rows(TO& acc_o, TSum& row_sum, float out_scale = 1.f) {
  Tensor o = make_tensor(acc_o.data(), rowcol_layout(acc_o.layout()));
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(o); ++mi) {
    const float sum = attn_tl::quad_sum(row_sum(mi));
    row_sum(mi) = sum;
    const float inv = (sum == 0.f || sum != sum) ? 0.f : out_scale / sum;
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(o); ++ni) { o(mi, ni) *= inv; }
  }
}

// fp32 accumulator -> 16-bit A operand in registers (RS P·V GEMM), into a fragment of A layout.
template <typename TP, typename TS>
__forceinline__ __device__ void convert_into(TP& p, TS const& acc_s) {
  using To = typename TP::value_type;
  constexpr int kN = decltype(size(acc_s))::value;
  static_assert(kN == decltype(size(p))::value);
  cutlass::NumericArrayConverter<To, float, kN> convert;
  *reinterpret_cast<cutlass::Array<To, kN>*>(p.data()) =
      convert(*reinterpret_cast<const cutlass::Array<float, kN>*>(acc_s.data()));
}

// ---- FP8: P into the A operand of an e4m3 wgmma ----------------------------------------------------------
// The accumulator gives a thread, per row and 32-column k-block, columns {2t, 2t + 1} of each of its four 8-column
// groups (t = lane % 4); the 8-bit A operand of m64nNk32 wants columns 4t..4t + 3 and 16 + 4t..19 + 4t (registers
// (row r, low k) (row r + 8, low k) (row r, high k) (row r + 8, high k), four e4m3 each). The keys are V's rows in
// shared memory as the TMA box wrote them, so the values move, not V: per row and k-block the thread packs its 8
// values into X = groups 0|1 and Y = groups 2|3 (two bytes each), takes from each source thread of its quad the
// pair of halves it needs in two shuffles, and byte-permutes them into place. Which half a source gives and in which
// order the receiver joins them follow from t alone (Fp8PLanes); tests/translate/test_fp8_p_shuffle.py replays the
// exchange lane by lane.
struct Fp8PLanes {
  int src_a, src_b;         // the quad lanes this thread reads in the two shuffles
  uint32_t give_a, give_b;  // byte selectors (prmt) of the word this thread offers in each shuffle
  uint32_t lo, hi;          // byte selectors that join the two received words into the low- and high-k registers
};

__forceinline__ __device__ Fp8PLanes fp8_p_lanes(int lane) {
  const int t = lane % 4;
  const bool swap = ((t ^ (t >> 1)) & 1) != 0;   // t = 1 or 2
  const int quad = lane & ~3;
  return {quad | ((0x2130 >> (4 * t)) & 3), quad | ((0x3021 >> (4 * t)) & 3), swap ? 0x7632u : 0x5410u,
          swap ? 0x5410u : 0x7632u, swap ? 0x1054u : 0x5410u, swap ? 0x3276u : 0x7632u};
}

__forceinline__ __device__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

__forceinline__ __device__ uint32_t e4m3x4(float a, float b, float c, float d) {   // bytes a, b, c, d (low first)
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(b), "f"(a));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(d), "f"(c));
  return uint32_t(lo) | (uint32_t(hi) << 16);
}

// The fp32 score tile (64 x N per warpgroup: ((2, 2, N/8), 1, 1)) -> the e4m3 A operand (16 values per k-block).
template <typename TP, typename TS>
__forceinline__ __device__ void convert_p_fp8(TP& p, TS const& acc_s, Fp8PLanes const& lanes) {
  constexpr int kN = decltype(size(acc_s))::value;
  static_assert(kN % 16 == 0 && decltype(size(p))::value == kN, "P: 16 values a thread per 32-column k-block");
  float const* s = acc_s.data();
  uint32_t* out = reinterpret_cast<uint32_t*>(p.data());
  CUTE_UNROLL
  for (int kb = 0; kb < kN / 16; ++kb) {
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      float const* g = s + 16 * kb + 2 * r;   // group j of this k-block: g[4 j], g[4 j + 1]
      const uint32_t x = e4m3x4(g[0], g[1], g[4], g[5]);
      const uint32_t y = e4m3x4(g[8], g[9], g[12], g[13]);
      const uint32_t a = __shfl_sync(0xffffffffu, prmt(x, y, lanes.give_a), lanes.src_a);
      const uint32_t b = __shfl_sync(0xffffffffu, prmt(x, y, lanes.give_b), lanes.src_b);
      out[4 * kb + r] = prmt(a, b, lanes.lo);
      out[4 * kb + 2 + r] = prmt(a, b, lanes.hi);
    }
  }
}

// The same conversion where V^T's keys come in the accumulator's order (KernelParams.vt_key_order "accumulator"):
// within each 16 keys, key 8h + 2q + b sits at column 4q + 2h + b of V^T (tuner/serving/launch/transpose_triton.py
// vt_key). A thread of quad lane q holds, per row and 16-key half of a k-block, keys 2q, 2q + 1, 8 + 2q, 9 + 2q: the A
// operand's four bytes at k = 4q .. 4q + 3 are then these, in this order, so P converts in place (two cvt and a prmt
// a word) and the P.V sum runs over the same pairs of (P, V) as with natural order.
template <typename TP, typename TS>
__forceinline__ __device__ void convert_p_fp8_in_place(TP& p, TS const& acc_s) {
  constexpr int kN = decltype(size(acc_s))::value;
  static_assert(kN % 16 == 0 && decltype(size(p))::value == kN, "P: 16 values a thread per 32-column k-block");
  float const* s = acc_s.data();
  uint32_t* out = reinterpret_cast<uint32_t*>(p.data());
  CUTE_UNROLL
  for (int kb = 0; kb < kN / 16; ++kb) {
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      float const* g = s + 16 * kb + 2 * r;   // group j of this k-block: g[4 j], g[4 j + 1]
      out[4 * kb + r] = e4m3x4(g[0], g[1], g[4], g[5]);
      out[4 * kb + 2 + r] = e4m3x4(g[8], g[9], g[12], g[13]);
    }
  }
}

// ---- FP8: V transposed in the kernel (KernelParams.v_transpose "producer") -----------------------------
// The byte offset of (row, byte col) in a K-major tile of 8-bit elements laid out as TMA boxes of kChunk bytes x
// kRows rows side by side (box c at c x kRows x kChunk), each in the kChunk-byte swizzle: 16-byte unit u of row r at
// u ^ (r % 8) (128 bytes), u ^ ((r / 2) % 4) (64) or u ^ ((r / 4) % 2) (32), as SWIZZLE_128B/64B/32B and the GMMA
// descriptors' layout types put them (address bits 4.. xor bits 7..). ``col`` is a multiple of 16.
template <int kRows, int kChunk>
CUTE_HOST_DEVICE int swizzled_byte(int row, int col) {
  static_assert(kChunk == 128 || kChunk == 64 || kChunk == 32, "128-, 64- or 32-byte swizzle atoms");
  constexpr unsigned kShift = kChunk == 128 ? 0 : (kChunk == 64 ? 1 : 2);
  constexpr unsigned kMask = kChunk / 16 - 1;
  const unsigned r = unsigned(row), c = unsigned(col);   // (unsigned: shifts and masks, no signed division)
  const unsigned unit = (c % kChunk) / 16;
  return int((c / kChunk) * (kRows * kChunk) + r * kChunk + ((unit ^ ((r >> kShift) & kMask)) << 4));
}

// Where one lane's ldmatrix / stmatrix rows lie in a step of the transpose (transpose_v_tile): the key (within the 16
// of a step) and the d column (within its 32) of the staged V row it reads, and the d row (within 32) of V^T it writes.
struct VtLanes {
  int key, dcol, drow;
  uint32_t sel_a, sel_b;   // byte selectors (prmt) of the two V^T words made from each pair of ldmatrix words
};

// ldmatrix.x4.trans over 16-bit elements reads four 8 x 16-byte matrices: lane l addresses row l % 8 of matrix l / 8 and
// receives, of each matrix, the 16-bit elements (rows 2q and 2q + 1, column r) for r = l / 4, q = l % 4: for V's rows
// (keys) of bytes (d), keys k(2q), k(2q + 1) of columns d = 2r and 2r + 1. Matrices 0 and 2 read the keys A(i), 1 and 3
// the keys B(i) of the step's 16, at d unit 2p (0, 1) and 2p + 1 (2, 3). Two words of A and B keys permute (prmt) into
// one word of 4 keys A(2q), A(2q + 1), B(2q), B(2q + 1) of a single d row: columns 4q .. 4q + 3 of that V^T row's
// 16-key unit, which is where stmatrix (lane 4r + q's word -> row r, bytes 4q .. 4q + 3) puts it. So the keys land at
// column 4q + 2h + b = key of (h ? B : A)(2q + b): natural order (column c = key c) takes A(i) = 4(i / 2) + i % 2,
// B(i) = A(i) + 2; accumulator order (key 8h + 2q + b at column 4q + 2h + b, convert_p_fp8_in_place) A(i) = i,
// B(i) = 8 + i, whose eight consecutive rows read without bank conflicts (natural order's two-way). Of each stmatrix
// matrix, row r holds d = 2r + (r >= 4) (matrices 0, 2) or 2r + (r < 4) (1, 3): eight d rows that fall in eight
// different bank groups for every swizzle, so the stores run without bank conflicts.
template <bool kAccumulatorOrder>
CUTE_HOST_DEVICE VtLanes vt_lanes(int lane) {
  const int m = lane / 8, i = lane % 8;
  VtLanes v;
  v.key = kAccumulatorOrder ? 8 * (m % 2) + i : 4 * (i / 2) + i % 2 + 2 * (m % 2);
  v.dcol = 16 * (m / 2);
  v.drow = 16 * (m / 2) + 2 * i + ((m % 2) ^ (i >= 4 ? 1 : 0));
  const bool odd_first = lane >= 16;   // the data rows r = lane / 4 >= 4 take the odd d row in matrices 0 and 2
  v.sel_a = odd_first ? 0x7531u : 0x6420u;
  v.sel_b = odd_first ? 0x6420u : 0x7531u;
  return v;
}

// The byte offsets of one lane's ldmatrix row in the staged V tile and of its stmatrix row in the V^T tile, for the
// step of keys [16 g, 16 g + 16) and d columns [32 p, 32 p + 32). Host-callable: the host replay of the transpose
// (tests/translate/vt_transpose_check.cpp) takes the same offsets.
template <int kBlockN, int kHeadDimV, int kChunkStage, int kChunkVt>
CUTE_HOST_DEVICE int vt_stage_offset(VtLanes const& ln, int g, int p) {
  return swizzled_byte<kBlockN, kChunkStage>(16 * g + ln.key, 32 * p + ln.dcol);
}

template <int kBlockN, int kHeadDimV, int kChunkStage, int kChunkVt>
CUTE_HOST_DEVICE int vt_tile_offset(VtLanes const& ln, int g, int p) {
  return swizzled_byte<kHeadDimV, kChunkVt>(32 * p + ln.drow, 16 * g);
}

// The warp that takes step (g, p) of a tile: steps p x groups + g dealt round-robin to kWarps warps.
template <int kKeyGroups, int kWarps>
CUTE_HOST_DEVICE constexpr int vt_first_group(int warp, int p) {
  return ((warp - p * kKeyGroups) % kWarps + kWarps) % kWarps;
}

// One V tile (kBlockN keys x kHeadDimV bytes, staged as TMA wrote it: boxes of kChunkStage bytes of d, 8-bit K-major)
// into the transposed tile the FP8 P.V GEMM reads (kHeadDimV rows x kBlockN keys, boxes of kChunkVt keys: the image
// tma_load_vt writes), in the key order kAccumulatorOrder says. kWarps warps share the steps of 16 keys x 32 d
// (one ldmatrix.x4.trans, four prmt and one stmatrix.x4 each); ``thread`` is this one's index among them. Loops, not
// unrolled: at the producer's 32 registers ptxas spilled every unrolled form (all steps: 60 bytes at d128; the key
// groups by two, or the next step's ldmatrix issued ahead: 8-20 bytes), while this one needs none (28 instructions a
// step at d128). The caller orders the generic-proxy stores before the wgmma reads (fence.proxy.async) and hands the
// tile over.
// Zeros into the rows [keys, kBlockN) of a staged V tile (kHeadDimV / 16 chunks of 16 bytes a row, swizzled as TMA
// wrote them), ``thread`` of kThreads. Host-callable: the host replay zeroes its staged tile with it.
template <int kBlockN, int kHeadDimV, int kChunkStage, int kThreads>
CUTE_HOST_DEVICE void zero_staged_rows(uint8_t* stage, int keys, int thread) {
  constexpr int kChunks = kHeadDimV / 16;
  for (int i = keys * kChunks + thread; i < kBlockN * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i - r * kChunks;
    *reinterpret_cast<uint4*>(stage + swizzled_byte<kBlockN, kChunkStage>(r, 16 * c)) = make_uint4(0, 0, 0, 0);
  }
}

// ``keys``: the tile's keys that exist (its sequence's keys from the tile's first). The transposed tile holds zeros
// past them, as the runtime's V^T does: the staged rows past a sequence's keys are zeros past a dense tensor's end
// (TMA), but another sequence's V (packed) or whatever a paged cache's last page holds past the used keys, where e4m3
// NaN times P = 0 would be NaN in the P.V GEMM. A tile short of kBlockN keys (a sequence's last) has those rows zeroed
// first (the kWarps warps, then their named barrier kBarrier); its transpose is the whole tile's, so the loop's
// registers stay as they are (a mask in the loop spilled at the producer's 32).
template <int kBlockN, int kHeadDimV, int kChunkStage, int kChunkVt, bool kAccumulatorOrder, int kWarps, int kBarrier>
__forceinline__ __device__ void transpose_v_tile(uint8_t* stage, uint8_t* vt, int keys, int thread) {
  static_assert(kBlockN % 16 == 0 && kHeadDimV % 32 == 0, "steps of 16 keys x 32 d");
  constexpr int kKeyGroups = kBlockN / 16;
  // (the lanes' rows per tile, a few instructions: held across the tiles they cost the producer's few registers)
  const int warp = thread / 32;
  const VtLanes ln = vt_lanes<kAccumulatorOrder>(thread % 32);
  if (keys < kBlockN) {
    zero_staged_rows<kBlockN, kHeadDimV, kChunkStage, 32 * kWarps>(stage, keys, thread);
    cutlass::arch::NamedBarrier::sync(32 * kWarps, kBarrier);
  }
#pragma unroll 1
  for (int p = 0; p < kHeadDimV / 32; ++p) {
#pragma unroll 1
    for (int g = vt_first_group<kKeyGroups, kWarps>(warp, p); g < kKeyGroups; g += kWarps) {
      uint32_t w0, w1, w2, w3;
      SM75_U16x8_LDSM_T::copy(*reinterpret_cast<uint128_t const*>(
                                  stage + vt_stage_offset<kBlockN, kHeadDimV, kChunkStage, kChunkVt>(ln, g, p)),
                              w0, w1, w2, w3);
      SM90_U32x4_STSM_N::copy(prmt(w0, w1, ln.sel_a), prmt(w0, w1, ln.sel_b), prmt(w2, w3, ln.sel_a),
                              prmt(w2, w3, ln.sel_b),
                              *reinterpret_cast<uint128_t*>(
                                  vt + vt_tile_offset<kBlockN, kHeadDimV, kChunkStage, kChunkVt>(ln, g, p)));
    }
  }
}

// ---- epilogue: registers -> shared memory -----------------------------------------------------------
// The 16-bit output fragment of the consumer warpgroups (a wgmma accumulator: per 8-column group j, a
// thread holds two neighbouring columns of rows r and r + 8, as registers 2j and 2j + 1 of 32 bits) into
// the (kTileRows, kCols) output tile of K-major, 128-byte-swizzled 64-column chunks (SmemLayoutO:
// tile_to_shape(GMMA::Layout_K_SW128_Atom, ...) at a 1024-byte-aligned address), one stmatrix.x4 per 16
// columns: its 8x8 matrices (rows 0-7 | 8-15) x (columns 0-7 | 8-15) take the thread's 32-bit registers
// 4k .. 4k + 3, and lane l gives the address of row l % 8 of matrix l / 8. Where 64 columns do not divide kCols
// (head dim 96), the chunks are 32 columns of the 64-byte swizzle (Layout_K_SW64_Atom): 16-byte chunk j of row r at
// j ^ ((r / 2) % 4), as SWIZZLE_64B puts them (address bits 4-5 xor bits 7-8).
// These are the stores (address and registers, per thread and instruction) of CuTe's
// make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>, tiled_mma) over SmemLayoutO, checked on the host
// for every tile shape (tests/translate/test_store_o.py), without that copy's partition algebra: ~2 s of
// cicc per distinct tile, a fifth of a lone kernel's build (BENCHMARKS.md, 2026-11-24).
// The columns of a 16-bit tile's swizzle atoms and TMA boxes: 64 (128-byte swizzle) where they divide the row, else
// 32 (64-byte swizzle; translate/sm90/frame.py chunk).
template <int kCols>
constexpr int kChunkCols = kCols % 64 == 0 ? 64 : 32;

template <int kTileRows, int kChunk = 64>
CUTE_HOST_DEVICE int store_o_offset(int mma_tidx, int k) {   // element offset of this lane's row of matrix k
  const int lane = mma_tidx % 32;
  const int row = (mma_tidx / 32) * 16 + lane % 8 + 8 * ((lane / 8) % 2);   // 16 rows a warp
  const int chunk = 2 * k + lane / 16;   // the row's 16-byte chunk (8 columns) this lane addresses
  if constexpr (kChunk == 64) {
    return (chunk / 8) * (kTileRows * 64) + row * 64 + ((chunk % 8) ^ (row % 8)) * 8;
  } else {
    static_assert(kChunk == 32, "64- or 32-column chunks (128- or 64-byte swizzle)");
    return sw64_offset<kTileRows>(row, chunk);
  }
}

template <int kTileRows, int kCols, typename TO, typename Element>
__forceinline__ __device__ void store_o_tile(TO const& r_o, Element* smem, int mma_tidx) {
  static_assert(sizeof(Element) == 2 && kCols % 32 == 0 && kTileRows % 64 == 0);
  static_assert(decltype(size(r_o))::value == kCols / 2, "a warpgroup's 64 x kCols tile: kCols / 2 values a thread");
  const uint32_t* regs = reinterpret_cast<const uint32_t*>(r_o.data());
  CUTE_UNROLL
  for (int k = 0; k < kCols / 16; ++k) {
    SM90_U32x4_STSM_N::copy(regs[4 * k], regs[4 * k + 1], regs[4 * k + 2], regs[4 * k + 3],
                            *reinterpret_cast<uint128_t*>(smem + store_o_offset<kTileRows, kChunkCols<kCols>>(
                                mma_tidx, k)));
  }
}

// ---- pipelines: mbarriers -------------------------------------------------------------------------
// full[s]: the producer's TMA for stage s landed (one arrive with the byte count, then the bytes);
// empty[s]: every consumer thread is done reading stage s. A fresh mbarrier counts as having completed
// the phase before phase 0, so the producer's first pass through the ring waits with parity 1.
using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
using EmptyBarrier = cutlass::arch::ClusterBarrier;

__forceinline__ __device__ void wait_barrier(uint64_t* bar, int phase) {
  EmptyBarrier::wait(bar, uint32_t(phase));
}

// A consumer warpgroup hands a stage back once its wgmma reading it completed (after warpgroup_wait):
// one thread per warpgroup arrives (FA3 measured all-thread arrivals as slower).
__forceinline__ __device__ void release_stage(uint64_t* bar, int consumer_tidx) {
  if (consumer_tidx % 128 == 0) { EmptyBarrier::arrive(bar); }
}

// ---- tile order -----------------------------------------------------------------------------------
// A tile is (query block, head, batch). Non-causal: the query blocks of one head follow each other, so
// the CTAs running at once read the same K and V (ncu: half the L2 traffic of heads-first). Causal:
// the longest query blocks (most keys) first, so that the grid ends with short tiles, heads in sections
// whose K and V fit about 32 MB of L2 (FA3's scheduler).
struct TileCoord {
  int m_block, bidh, bidb;
};

__forceinline__ __device__ int l2_section_heads(int seqlen_k, int head_dims, int group, int heads_total) {
  const long long kv_bytes = static_cast<long long>(seqlen_k) * head_dims * 2;
  const long long budget = 32LL << 20;
  int heads = kv_bytes >= budget ? 1 : 1 << (31 - __clz(static_cast<int>(budget / kv_bytes)));
  heads *= group;   // the query heads of one KV head share its K and V
  return max(1, min(heads, heads_total));
}

__forceinline__ __device__ TileCoord decode_tile(int tile, int m_blocks, int heads, int section_heads,
                                                 int heads_total, bool longest_first) {
  TileCoord c;
  if (!longest_first) {
    const int hb = tile / m_blocks;
    c.m_block = tile - hb * m_blocks;
    c.bidb = hb / heads;
    c.bidh = hb - c.bidb * heads;
    return c;
  }
  const int per_section = section_heads * m_blocks;
  const int section = tile / per_section;
  const int r = tile - section * per_section;
  const int full_sections = heads_total / section_heads;
  const int width = section < full_sections ? section_heads : heads_total - full_sections * section_heads;
  const int block = r / width;
  const int hb = section * section_heads + (r - block * width);
  c.m_block = longest_first ? m_blocks - 1 - block : block;
  c.bidb = hb / heads;
  c.bidh = hb - c.bidb * heads;
  return c;
}

// ---- varlen tile order ----------------------------------------------------------------------------
// Packed sequences (tl/layout.py): tiles are numbered sequence by sequence, each sequence's query blocks
// (the heaviest first when causal: they see the most keys) times the heads, heads fastest (the query heads
// of one KV head run back to back). A CTA is handed increasing tile numbers, so it finds a tile's
// sequence by walking forward from its previous tile's: every sequence's lengths are read once per CTA.
struct VarlenTile {
  int m_block, bidh, seqlen_q, seqlen_k, q_row0, k_row0, seq;
};
struct VarlenCursor {
  int seq = 0, first_tile = 0;   // the sequence reached and the number of its first tile
};
constexpr int kNoTile = 0x7fffffff;   // what the producer hands out when no tile is left

__forceinline__ __device__ int sequence_keys(int seq, int const* cu_seqlens_k, int const* seqused_k) {
  return seqused_k != nullptr ? seqused_k[seq] : cu_seqlens_k[seq + 1] - cu_seqlens_k[seq];
}

// `order` (null: the sequences as given) lists the sequences in the order their tiles are handed out.
__forceinline__ __device__ bool varlen_tile(int tile, VarlenCursor& cur, int const* cu_seqlens_q,
                                            int const* cu_seqlens_k, int const* seqused_k, int batch, int heads,
                                            int block_m, bool longest_first, VarlenTile& t,
                                            int const* order = nullptr) {
  while (cur.seq < batch) {
    const int seq = order != nullptr ? order[cur.seq] : cur.seq;
    const int q_row0 = cu_seqlens_q[seq];
    const int seqlen_q = cu_seqlens_q[seq + 1] - q_row0;
    const int blocks = (seqlen_q + block_m - 1) / block_m;   // a sequence of length 0 has no tile
    if (tile < cur.first_tile + blocks * heads) {
      const int local = tile - cur.first_tile;
      const int block = local / heads;
      t.m_block = longest_first ? blocks - 1 - block : block;
      t.bidh = local - block * heads;
      t.seqlen_q = seqlen_q;
      t.q_row0 = q_row0;
      t.k_row0 = cu_seqlens_k != nullptr ? cu_seqlens_k[seq] : 0;   // paged: rows are found by page
      t.seqlen_k = sequence_keys(seq, cu_seqlens_k, seqused_k);
      t.seq = seq;
      return true;
    }
    cur.first_tile += blocks * heads;
    ++cur.seq;
  }
  return false;
}

// The persistent scheduler's sequence order (long sequences first). A sequence's heaviest tile sees all
// its keys (its last query block, causal or not), so the sequences go by keys, most first (ties: as given): the
// grid ends with the light tiles of short sequences instead of a long one's heavy tiles started last. The producer
// warpgroup ranks them once per CTA into shared memory (order[rank] = sequence; `keys` is scratch), up to
// kMaxOrderedSeqs sequences: a rank is a count over all of them, and past that many the tiles are fine-grained
// enough that the order given is kept.
constexpr int kMaxOrderedSeqs = 128;

template <int kThreads>
__forceinline__ __device__ void order_sequences(int* order, int* keys, int const* cu_seqlens_k, int const* seqused_k,
                                                int batch, int thread, int barrier_id) {
  for (int i = thread; i < batch; i += kThreads) { keys[i] = sequence_keys(i, cu_seqlens_k, seqused_k); }
  cutlass::arch::NamedBarrier::sync(kThreads, barrier_id);
  for (int i = thread; i < batch; i += kThreads) {
    const int mine = keys[i];
    int rank = 0;
    for (int j = 0; j < batch; ++j) {
      const int other = keys[j];
      rank += (other > mine || (other == mine && j < i)) ? 1 : 0;
    }
    order[rank] = i;
  }
  cutlass::arch::NamedBarrier::sync(kThreads, barrier_id);
}

// Varlen epilogue: a warpgroup's 64 rows of the O tile, shared -> global in 16-byte stores, rows at or past
// the sequence's end skipped (a TMA store would write them over the next sequence's rows). The tile is the
// image a TMA store reads: per 64 columns a (kTileRows x 128 bytes) block, 16-byte chunk j of row r at
// chunk j ^ (r % 8) (SWIZZLE_128B; the blocks are 1024-byte aligned); per 32 columns a (kTileRows x 64 bytes) block,
// chunk j of row r at j ^ ((r / 2) % 4) where 64 do not divide the head dim (SWIZZLE_64B, store_o_tile). Plain address
// arithmetic: CuTe's indexing of the swizzled layout with run-time coordinates spilled to local memory (ptxas).
template <int kHeadDim, int kTileRows, typename Element>
__forceinline__ __device__ void store_rows_predicated_128(Element const* smem_o, Element* o_seq, int64_t row_stride,
                                                          int tile_row, int seq_row, int seqlen_q, int thread) {
  constexpr int kChunks = kHeadDim / 8;   // 16-byte chunks per row
  char const* tile = reinterpret_cast<char const*>(smem_o);
  for (int idx = thread; idx < 64 * kChunks; idx += 128) {
    const int r = idx / kChunks;
    const int j = idx - r * kChunks;
    if (seq_row + r < seqlen_q) {
      const int row = tile_row + r;
      const int block = j / 8, chunk = j % 8;
      const cute::uint128_t v = *reinterpret_cast<cute::uint128_t const*>(
          tile + block * kTileRows * 128 + row * 128 + ((chunk ^ (row % 8)) * 16));
      *reinterpret_cast<cute::uint128_t*>(o_seq + int64_t(seq_row + r) * row_stride + j * 8) = v;
    }
  }
}

template <int kHeadDim, int kTileRows, typename Element>
__forceinline__ __device__ void store_rows_predicated_64(Element const* smem_o, Element* o_seq, int64_t row_stride,
                                                         int tile_row, int seq_row, int seqlen_q, int thread) {
  constexpr int kChunks = kHeadDim / 8;   // 16-byte chunks per row
  for (int idx = thread; idx < 64 * kChunks; idx += 128) {
    const int r = idx / kChunks;
    const int j = idx - r * kChunks;
    if (seq_row + r < seqlen_q) {
      const cute::uint128_t v = *reinterpret_cast<cute::uint128_t const*>(
          smem_o + sw64_offset<kTileRows>(tile_row + r, j));
      *reinterpret_cast<cute::uint128_t*>(o_seq + int64_t(seq_row + r) * row_stride + j * 8) = v;
    }
  }
}

template <int kHeadDim, int kTileRows, typename Element>
__forceinline__ __device__ void store_rows_predicated(Element const* smem_o, Element* o_seq, int64_t row_stride,
                                                      int tile_row, int seq_row, int seqlen_q, int thread) {
  if constexpr (kChunkCols<kHeadDim> == 64) {
    store_rows_predicated_128<kHeadDim, kTileRows>(smem_o, o_seq, row_stride, tile_row, seq_row, seqlen_q, thread);
  } else {
    store_rows_predicated_64<kHeadDim, kTileRows>(smem_o, o_seq, row_stride, tile_row, seq_row, seqlen_q, thread);
  }
}

}  // namespace attn_sm90

#endif  // ATTN_SM90_CUH
