// The seesaw MLA decode's output store (attn_decode_sm90_seesaw.cuh), its own header so that host programs (the
// CPU tests' layout checks) can include it: the seesaw kernel's header does not parse in a host compilation.
#ifndef ATTN_DECODE_SM90_OUTPUT_CUH
#define ATTN_DECODE_SM90_OUTPUT_CUH

#include "attn_decode_sm90.cuh"
#include "attn_trace.cuh"

namespace attn_decode {
namespace seesaw {
using namespace cute;

// The output, after the loop: both warpgroups hold O in units of the same last max (s_m), each its kDVW columns and
// the row sums of its own tiles, so the one exchange is l = l0 + l1. The normalised rows are staged at the start of
// shared memory (Q and the slots are dead), bf16 O with one split, fp32 partial O otherwise, and leave as one bulk
// copy a row (cp.async.bulk, issued by one warp; the TMA unit streams them) beside the log-sum-exps (a thread a row).
// The staging rows are padded so that the accumulator layout's stores (a warp: 8 rows x 4 neighbouring column pairs)
// fall in distinct banks: bf16 rows kDV + 8 elements apart (a 32-bit store each, rows 4 banks apart), fp32 rows kDV + 8
// floats apart (64-bit stores, a half-warp's 4 rows 8 banks apart). Measured (globaltimer trace and
// paired A/B timings, BENCHMARKS.md 2026-11-26): split_kv_wgmma's store_split_dv, which merges
// warpgroups of different maxima through an unpadded fp32 tile (8-way conflicts) and a loop of scalar stores, took 12
// us of a 150 us call at b64 x 4k; 16-byte stores by every thread from the staged rows cut that to 4 us with one
// split but slowed the fp32 partials (18-22 us for 16 MB at b8 x 16k, 0.71-0.93x); the bulk copies are ahead at
// every point (1.00-1.25x over batch 1-128 x 2k-32k).
template <int kDV>
constexpr int kStageStride = kDV + 8;   // elements of a staging row, bf16 or fp32
template <int kBlockM, int kDV>
constexpr int kStageBytes = kBlockM * kStageStride<kDV> * 4;   // the fp32 staging tile (the bf16 one is half of it)

template <class Cfg, int kRows, class TO, class TC>
__forceinline__ __device__ void store_output(const Args& a, const CtaWork& w, char* smem, const float* s_m,
                                             TO const& acc_o, TC const& tOcO, const float (&l)[kRows],
                                             const int (&r)[kRows], int wg, int tg) {
  using Element = typename Cfg::Element;
  constexpr int kBlockM = Cfg::kBlockM, kDV = Cfg::kHeadDimV, kDVW = kDV / 2;
  constexpr int kStride = kStageStride<kDV>;
  float* s_l = reinterpret_cast<float*>(smem + kStageBytes<kBlockM, kDV>);   // (2, kBlockM): each warpgroup's sums
  Element* stage_e = reinterpret_cast<Element*>(smem);
  float* stage_f = reinterpret_cast<float*>(smem);
  const bool one_split = a.num_splits == 1;
  if (tg % 4 == 0) {
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) { s_l[wg * kBlockM + r[mi]] = l[mi]; }
  }
  __syncthreads();
  auto row_sum = [&](int row) { return s_l[row] + s_l[kBlockM + row]; };
  Tensor o = make_tensor(acc_o.data(), attn_sm90::rowcol_layout(acc_o.layout()));
  Tensor c = make_tensor(tOcO.data(), attn_sm90::rowcol_layout(tOcO.layout()));
  CUTE_UNROLL
  for (int mi = 0; mi < kRows; ++mi) {
    const float sum = row_sum(r[mi]);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(o); ni += 2) {   // (ni, ni + 1): neighbouring columns
      const int at = r[mi] * kStride + wg * kDVW + get<1>(c(mi, ni));
      if (one_split) {
        cutlass::AlignedArray<Element, 2> v;
        v[0] = Element(o(mi, ni) * inv);
        v[1] = Element(o(mi, ni + 1) * inv);
        *reinterpret_cast<cutlass::AlignedArray<Element, 2>*>(stage_e + at) = v;
      } else {
        *reinterpret_cast<float2*>(stage_f + at) = make_float2(o(mi, ni) * inv, o(mi, ni + 1) * inv);
      }
    }
  }
  cutlass::arch::fence_view_async_shared();   // the staged rows, written by this thread, visible to the bulk copies
  __syncthreads();
  ATTN_TRACE(4);
  // one bulk copy (cp.async.bulk, the TMA unit) a row: the rows of a tile need not be neighbours in the output
  const int tid = threadIdx.x;
  const long long rows_all = (long long)a.batch * a.seqlen_q * a.heads_q;
  auto out_row = [&](int t, int h) { return ((long long)w.b * a.seqlen_q + t) * a.heads_q + h; };   // of (splits, rows)
  if (tid < 32) {
    CUTE_UNROLL
    for (int row = tid; row < kBlockM; row += 32) {
      const int gr = w.row0 + row;
      if (gr < w.rows) {
        const int t = gr / w.pack, h = w.head0 + gr % w.pack;
        if (one_split) {
          Element* dst = static_cast<Element*>(a.o) + w.b * a.o_batch_stride + t * a.o_row_stride + h * a.o_head_stride;
          SM90_BULK_COPY_S2G::copy(stage_e + row * kStride, dst, kDV * sizeof(Element));
        } else {
          SM90_BULK_COPY_S2G::copy(stage_f + row * kStride, a.o_partial + (w.split * rows_all + out_row(t, h)) * kDV,
                                   kDV * sizeof(float));
        }
      }
    }
    tma_store_arrive();
  } else if (tid < 32 + kBlockM) {   // the log-sum-exps, a thread a row
    const int row = tid - 32, gr = w.row0 + row;
    if (gr < w.rows) {
      const int t = gr / w.pack, h = w.head0 + gr % w.pack;
      const float sum = row_sum(row), lse2 = sum > 0.f ? s_m[row] + __log2f(sum) : -INFINITY;
      if (!one_split) {
        a.lse_partial[w.split * rows_all + out_row(t, h)] = lse2;
      } else if (a.lse) {
        a.lse[((long long)w.b * a.heads_q + h) * a.seqlen_q + t] = lse2 * 0.6931471805599453f;
      }
    }
  }
  if (tid < 32) { tma_store_wait<0>(); }   // the staging tile is read before the CTA's shared memory goes
}
}  // namespace seesaw
}  // namespace attn_decode

#endif  // ATTN_DECODE_SM90_OUTPUT_CUH
