// Device helpers for kernels generated from TL programs (translate/emitters.py).
// One job each: GEMM loops with ldmatrix pipelined one k-block ahead, accumulator layout views,
// the online softmax with exp2 and a folded scale, masking, predicated tile copies.
// Structure follows FlashAttention-2 (csrc/flash_attn/src/{utils,softmax,mask}.h); written anew.
#ifndef ATTN_TL_CUH
#define ATTN_TL_CUH

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_types.h>
#include <cutlass/numeric_conversion.h>

namespace attn_tl {
using namespace cute;

// ---- accumulator layouts --------------------------------------------------------------------------
// mma.m16n8 C fragment: 4 values per atom, (c0,c1) on row r, (c2,c3) on row r+8.
// (4, MMA_M, MMA_N) -> ((2, MMA_M), (2, MMA_N)): rows x cols view for row reductions.
// Layout helpers are host-callable too: tests/translate/fragment_emulation.cpp checks them on the CPU.
template <typename Layout>
CUTE_HOST_DEVICE auto rowcol_layout(Layout acc) {
  static_assert(decltype(size<0>(acc))::value == 4);
  static_assert(decltype(rank(acc))::value == 3);
  auto l = logical_divide(acc, Shape<_2>{});
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<2>(l)));
}

// TL "Reshape S from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N_new)": for k16 atoms two
// neighbouring C fragments are one A fragment, (4, M, N) -> ((4, 2), M, N/2); k8 atoms: unchanged.
template <typename TiledMma, typename Layout>
CUTE_HOST_DEVICE auto acc_to_a_layout(Layout acc) {
  using X = Underscore;
  static_assert(decltype(size<0>(acc))::value == 4);
  constexpr int kMmaK = decltype(get<2>(typename TiledMma::Shape_MNK{}))::value;
  static_assert(kMmaK == 8 || kMmaK == 16);
  if constexpr (kMmaK == 8) {
    return acc;
  } else {
    auto l = logical_divide(acc, Shape<X, X, _2>{});
    return make_layout(make_layout(get<0>(l), get<2, 0>(l)), get<1>(l), get<2, 1>(l));
  }
}

// fp32 accumulator -> 16-bit operand, packed conversions (F2FP).
template <typename To, typename Engine, typename Layout>
__forceinline__ __device__ auto convert_type(Tensor<Engine, Layout> const& src) {
  using From = typename Engine::value_type;
  constexpr int kN = decltype(size(src))::value;
  Tensor dst = make_tensor<To>(src.layout());
  cutlass::NumericArrayConverter<To, From, kN> convert;
  *reinterpret_cast<cutlass::Array<To, kN>*>(dst.data()) =
      convert(*reinterpret_cast<const cutlass::Array<From, kN>*>(src.data()));
  return dst;
}

// ---- GEMMs ----------------------------------------------------------------------------------------
// acc += A * B with both operands from shared memory; the ldmatrix of k-block k+1 is issued before
// the MMAs of k-block k so shared-memory latency hides behind tensor-core work.
template <bool kAInRegs, typename TiledMma, typename TAcc, typename TA, typename TB, typename TsA,
          typename TsB, typename CopyA, typename CopyB, typename ThrCopyA, typename ThrCopyB>
__forceinline__ __device__ void gemm_ss(TiledMma const& mma, TAcc& acc, TA& rA, TB& rB, TsA const& sA,
                                        TsB const& sB, CopyA const& copy_a, CopyB const& copy_b,
                                        ThrCopyA const& thr_a, ThrCopyB const& thr_b) {
  Tensor rA_view = thr_a.retile_D(rA);
  Tensor rB_view = thr_b.retile_D(rB);
  if constexpr (decltype(size<2>(sB))::value != decltype(size<2>(rA))::value) {
    // k8 atoms (SM75): one ldmatrix k-block feeds two MMA k-blocks; load whole operands, then multiply.
    if constexpr (!kAInRegs) { cute::copy(copy_a, sA, rA_view); }
    cute::copy(copy_b, sB, rB_view);
    CUTE_UNROLL
    for (int k = 0; k < size<2>(rA); ++k) { cute::gemm(mma, rA(_, _, k), rB(_, _, k), acc); }
    return;
  }
  if constexpr (!kAInRegs) { cute::copy(copy_a, sA(_, _, _0{}), rA_view(_, _, _0{})); }
  cute::copy(copy_b, sB(_, _, _0{}), rB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(rA); ++k) {
    if (k < size<2>(rA) - 1) {
      if constexpr (!kAInRegs) { cute::copy(copy_a, sA(_, _, k + 1), rA_view(_, _, k + 1)); }
      cute::copy(copy_b, sB(_, _, k + 1), rB_view(_, _, k + 1));
    }
    cute::gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

// acc += A * B with A already in registers (P after the C->A reshape), B from shared memory.
template <typename TiledMma, typename TAcc, typename TA, typename TB, typename TsB, typename CopyB,
          typename ThrCopyB>
__forceinline__ __device__ void gemm_rs(TiledMma const& mma, TAcc& acc, TA const& rA, TB& rB, TsB const& sB,
                                        CopyB const& copy_b, ThrCopyB const& thr_b) {
  Tensor rB_view = thr_b.retile_D(rB);
  if constexpr (decltype(size<2>(sB))::value != decltype(size<2>(rA))::value) {  // k8 atoms: see gemm_ss
    cute::copy(copy_b, sB, rB_view);
    CUTE_UNROLL
    for (int k = 0; k < size<2>(rA); ++k) { cute::gemm(mma, rA(_, _, k), rB(_, _, k), acc); }
    return;
  }
  cute::copy(copy_b, sB(_, _, _0{}), rB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(rA); ++k) {
    if (k < size<2>(rA) - 1) { cute::copy(copy_b, sB(_, _, k + 1), rB_view(_, _, k + 1)); }
    cute::gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

// Load a whole operand fragment from shared memory (Q kept in registers).
template <typename TR, typename TS, typename Copy, typename ThrCopy>
__forceinline__ __device__ void load_fragment(TR& r, TS const& s, Copy const& copy, ThrCopy const& thr) {
  Tensor r_view = thr.retile_D(r);
  cute::copy(copy, s, r_view);
}

// ---- softmax --------------------------------------------------------------------------------------
__forceinline__ __device__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Soft-capping, FlashAttention's softcap * tanh(score / softcap), before the mask and the softmax: S becomes
// tanh(S * prescale) with prescale = softmax scale / softcap, and the softmax's exponent scale (scale_log2) carries
// softcap * log2(e). One MUFU.TANH an element, beside the exponential's MUFU.EX2. (Prefill and decode kernels.)
template <typename TS>
__forceinline__ __device__ void softcap_tile(TS& acc_s, float prescale) {
  CUTE_UNROLL
  for (int i = 0; i < size(acc_s); ++i) {
    float t;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(acc_s(i) * prescale));
    acc_s(i) = t;
  }
}

// An attention sink joins a row's softmax as one more key without a value: with m the row's max and s the sink's
// logit, both in log2 units (m -inf: the row saw no key), top = max(m, s) becomes the row's max, the row's sum and
// output are multiplied by `keep` = 2^(m - top) (0 for a row with no key) and the sum gains `term` = 2^(s - top).
struct SinkJoin {
  float top, keep, term;
};
__forceinline__ __device__ SinkJoin join_sink(float m, float sink_log2) {
  const float top = fmaxf(m, sink_log2);
  return {top, m == -INFINITY ? 0.f : fast_exp2(m - top), fast_exp2(sink_log2 - top)};
}

template <typename T>
__forceinline__ __device__ T quad_max(T x) {  // the 4 threads of a quad share a row
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
}

template <typename T>
__forceinline__ __device__ T quad_sum(T x) {
  x += __shfl_xor_sync(0xffffffff, x, 2);
  return x + __shfl_xor_sync(0xffffffff, x, 1);
}

// Row mi of a (rows, cols) score view: its new running max, from the old one and the row's scores reduced over the
// quad, stored in row_max; the factor exp2((m_old - m_new) * scale_log2) that the row's earlier output and sum must be
// multiplied by; and the new max * scale_log2 (0 for a row with no visible key, which keeps max -inf, so that its
// P = 0, never NaN). kRescaleThreshold > 0 (FA4's conditional rescaling, the Hopper softmax): the row keeps its
// running max while the tile's max exceeds it by at most that many log2 units, and its factor is then exactly 1.
// kChains > 1: the thread's part of the row reduced in that many independent FMNMX chains, joined at the end (ptxas
// keeps one chain as written: its latency, cols deep, sat on the FP8 kernels' critical path in ncu's samples).
template <int kRescaleThreshold = 0, int kChains = 1, typename TS, typename TMax>
__forceinline__ __device__ float update_row_max(TS const& s, int mi, TMax& row_max, float& factor, float scale_log2) {
  const float m_old = row_max(mi);
  float m = m_old;
  if constexpr (kChains > 1) {
    float chain[kChains];
    CUTE_UNROLL
    for (int c = 0; c < kChains; ++c) { chain[c] = m_old; }
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(s); ++ni) { chain[ni % kChains] = fmaxf(chain[ni % kChains], s(mi, ni)); }
    CUTE_UNROLL
    for (int c = 1; c < kChains; ++c) { chain[0] = fmaxf(chain[0], chain[c]); }
    m = chain[0];
  } else {
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(s); ++ni) { m = fmaxf(m, s(mi, ni)); }
  }
  m = quad_max(m);
  if constexpr (kRescaleThreshold > 0) {   // (all four threads of a row see the same maxima: one decision)
    if (m_old != -INFINITY && (m - m_old) * scale_log2 <= float(kRescaleThreshold)) { m = m_old; }
  }
  row_max(mi) = m;
  const float m_scaled = (m == -INFINITY) ? 0.f : m * scale_log2;
  factor = (kRescaleThreshold > 0 && m == m_old) ? 1.f : fast_exp2(m_old * scale_log2 - m_scaled);
  return m_scaled;
}

// Online softmax of one score tile: new running max, rescale of the running sum and of the output
// accumulator by exp2((m_old - m_new) * scale_log2), P = exp2(S * scale_log2 - m_new * scale_log2)
// (one FFMA + MUFU.EX2 per element). Row sums stay thread-local; normalize_rows reduces them.
// A row with no visible key keeps max -inf; it is treated as max 0 so that P = 0, never NaN.
template <typename TS, typename TO, typename TMax, typename TSum>
__forceinline__ __device__ void online_softmax(TS& acc_s, TO& acc_o, TMax& row_max, TSum& row_sum,
                                               float scale_log2) {
  Tensor s = make_tensor(acc_s.data(), rowcol_layout(acc_s.layout()));
  Tensor o = make_tensor(acc_o.data(), rowcol_layout(acc_o.layout()));
  static_assert(decltype(size<0>(s))::value == decltype(size<0>(o))::value);
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(s); ++mi) {
    float rescale;
    const float m_scaled = update_row_max(s, mi, row_max, rescale, scale_log2);
    row_sum(mi) *= rescale;
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(o); ++ni) { o(mi, ni) *= rescale; }
    float sum = 0.f;
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(s); ++ni) {
      s(mi, ni) = fast_exp2(s(mi, ni) * scale_log2 - m_scaled);
      sum += s(mi, ni);
    }
    row_sum(mi) += sum;
  }
}

// TL "Compute Divide O, Ssum": reduce the thread-local row sums over the quad, divide; a row that saw
// no key (sum 0) gets output 0, as FlashAttention defines it.
template <typename TO, typename TSum>
__forceinline__ __device__ void normalize_rows(TO& acc_o, TSum& row_sum) {
  Tensor o = make_tensor(acc_o.data(), rowcol_layout(acc_o.layout()));
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(o); ++mi) {
    const float sum = quad_sum(row_sum(mi));
    row_sum(mi) = sum;
    const float inv = (sum == 0.f || sum != sum) ? 0.f : 1.f / sum;
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(o); ++ni) { o(mi, ni) *= inv; }
  }
}

// Elementwise ops of TL "Compute Multiply/Add/Subtract/Divide X, y".
template <typename TR, typename TA, typename F>
__forceinline__ __device__ void elementwise(TR& r, TA const& a, F f) {
  CUTE_UNROLL
  for (int j = 0; j < size(r); ++j) { r(j) = f(a(j)); }
}

// ---- masking --------------------------------------------------------------------------------------
// -inf where the key column is past seqlen_k or, causal, past the bottom-right aligned diagonal:
// query row r sees key c iff c <= r + seqlen_k - seqlen_q.
template <bool kCausal, typename TS, typename TC>
__forceinline__ __device__ void apply_mask(TS& acc_s, TC const& coord, int row0, int col0, int seqlen_k,
                                           int causal_offset) {
  CUTE_UNROLL
  for (int j = 0; j < size(acc_s); ++j) {
    const int r = row0 + get<0>(coord(j));
    const int c = col0 + get<1>(coord(j));
    if (c >= seqlen_k || (kCausal && c > r + causal_offset)) { acc_s(j) = -INFINITY; }
  }
}

// ---- tile copies ----------------------------------------------------------------------------------
// Rows past max_rows are zero-filled in the destination (ragged last tiles: finite zeros, so that
// masked columns of P multiply zeros of V, never stale shared memory).
template <typename TiledCopy, typename TSrc, typename TDst, typename TCoord>
__forceinline__ __device__ void copy_rows_zfill(TiledCopy const& tc, TSrc const& src, TDst&& dst,
                                                TCoord const& coord, int max_rows) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    if (get<0>(coord(0, m, 0)) < max_rows) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(src); ++k) { cute::copy(tc, src(_, m, k), dst(_, m, k)); }
    } else {
      cute::clear(dst(_, m, _));
    }
  }
}

// Rows past max_rows are not written (ragged last query tile).
template <typename TiledCopy, typename TSrc, typename TDst, typename TCoord>
__forceinline__ __device__ void store_rows(TiledCopy const& tc, TSrc const& src, TDst&& dst,
                                           TCoord const& coord, int max_rows) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    if (get<0>(coord(0, m, 0)) < max_rows) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(src); ++k) { cute::copy(tc, src(_, m, k), dst(_, m, k)); }
    }
  }
}

}  // namespace attn_tl

#endif  // ATTN_TL_CUH
