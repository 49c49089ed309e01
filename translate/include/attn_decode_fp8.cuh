// Split-KV decode over an FP8 (e4m3) KV cache: bf16/fp16 queries, K and V stored as e4m3 with fp32 scales per tensor
// or per KV head (vLLM's kv_cache_dtype "fp8": the real K is k_fp8 * k_scale, the real V v_fp8 * v_scale).
//
// The flow is split_kv's (attn_decode.cuh: one CTA = a sequence, a KV head's packed query rows, one split; warp
// groups run independent online softmaxes over their columns of each tile and merge at the end; the combine kernel
// is the same). What differs is how K and V reach the MMA:
// - the ring holds the e4m3 bytes as they are in the cache (half the bytes of a 16-bit tile): cp.async copies 16-byte
//   chunks of 16 values, XOR-swizzled by 16-byte chunk within 128-byte lines (fp8_off), so that the reads below are
//   free of bank conflicts;
// - K and V are converted in registers into fp16 MMA operands (cvt.rn.f16x2.e4m3x2: one instruction a pair; every
//   e4m3 value is exact in fp16), so no 16-bit copy of a tile is ever written to shared memory. The GEMMs are fp16
//   for bf16 queries too (Cfg::TiledMma is the fp16 atom): there is no packed e4m3 -> bf16 convert before sm_100,
//   and building bf16 from the bits took five instructions a pair (a build that did: 1047 instructions a 64-key
//   tile per warp, near the issue time of the tile's bytes at the copy bandwidth). Q is rounded
//   to fp16 once per CTA: exact for |q| in [2^-14, 65504] (every bf16 value there has 8 significant bits, fp16 11),
//   an absolute error below 2^-25 under it (fp16 subnormals), and |q| > 65504 is outside the kernel's range
//   (docs/decode.md). P is rounded to fp16 (11 bits) instead of bf16 (8), so the P V GEMM is more exact than the
//   16-bit cache kernels'; the output is written in the query's dtype.
// - the scales are folded: k_scale into the softmax scale of the CTA's KV head (with soft-capping, into the cap's
//   prescale), v_scale into the output's 1 / sum. A split's partial output is scaled already, so the combine is
//   unchanged.
//
// The mma.sync B fragment holds, per 16-deep k-block and 8-wide n-block, the values (k, k+1, k+8, k+9) of column
// n = lane / 4 (k = 2 (lane % 4)). Two index permutations make those four values four adjacent bytes, one 32-bit read:
// - scores Q K^T reduce over d: MMA index k of a k-block reads d = 4 (k % 8 / 2) + 2 (k / 8) + k % 2 (qk_col), for Q as
//   for K, so the sum is the same. Q's fragment is gathered from shared memory in that order once per CTA.
// - P V's columns are V's d: MMA column n reads d = 32 (n / 32) + 4 (n % 8) + (n / 8) % 4 (pv_col), so n-blocks
//   4m..4m+3 of a lane are the four bytes of one word of each key row; the words of its four keys (k, k+1, k+8, k+9)
//   are transposed with byte permutes. O's accumulator then holds column n at d = pv_col(n): the epilogue writes it
//   there. The keys (P's columns) keep their order, so masks and the softmax are split_kv's.
#ifndef ATTN_DECODE_FP8_CUH
#define ATTN_DECODE_FP8_CUH

#include "attn_decode.cuh"

namespace attn_decode {

// The split kernel's second argument: the cache's scales. A stride of 0 reads one scale for every KV head (a
// 1-element tensor), 1 one per KV head ((heads_kv,) fp32). tuner/serving/launch/decode_kernel.py packs it.
struct KvScales {
  const float* k;
  const float* v;
  int k_stride, v_stride;
};

// Byte offset of byte `col` of row `row` in an e4m3 tile of kRowBytes a row: the 16-byte chunk index XORed with
// fp8_swizzle(row), a function of row % 8, so that rows 8 apart differ by a constant offset (the reads' addresses are
// a few per-thread bases plus immediates). The 8 rows one K read spans (and the 4 keys x 8 words of a V read) fall
// into 32 distinct banks: rows of 128 bytes or more XOR with row % 8; 64-byte rows, two a 128-byte line, with
// (row / 2) % 4 (the rows sharing a bank half then differ in it). At 64-byte rows a V read is two-way: a lane's
// four keys have one parity, so all sit in one half of their lines (tests/decode/test_decode_fp8_kv.py).
template <int kRowBytes>
__forceinline__ __device__ int fp8_swizzle(int row) {
  static_assert(kRowBytes == 64 || kRowBytes % 128 == 0, "rows of 64 bytes or whole 128-byte lines");
  return kRowBytes == 64 ? (row >> 1) & 3 : row & 7;
}
template <int kRowBytes>
__forceinline__ __device__ int fp8_off(int row, int col) {
  return row * kRowBytes + (col ^ (fp8_swizzle<kRowBytes>(row) << 4));
}

// The d of MMA index k of the score GEMM (see the top).
__forceinline__ __device__ int qk_col(int k) {
  return (k & ~15) | (((k & 7) >> 1) << 2) | (((k >> 3) & 1) << 1) | (k & 1);
}
// The d of MMA column n of the P V GEMM (see the top).
__forceinline__ __device__ int pv_col(int n) { return (n & ~31) | ((n & 7) << 2) | ((n >> 3) & 3); }

// Two e4m3 values (the low or high 16 bits of x, kHigh) -> an f16x2, exactly: the packed convert, one instruction a
// pair.
template <int kHigh>
__forceinline__ __device__ uint32_t e4m3x2_to_f16x2(uint32_t x) {
  uint32_t out;
  if constexpr (kHigh) {
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.rn.f16x2.e4m3x2 %0, h; }" : "=r"(out) : "r"(x));
  } else {
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.rn.f16x2.e4m3x2 %0, l; }" : "=r"(out) : "r"(x));
  }
  return out;
}

__forceinline__ __device__ uint32_t lds32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// One K and one V tile of e4m3 rows (kBlockN keys from key0) into a ring slot: thread tid copies 16-byte chunk
// tid % kChunks of rows tid / kChunks + j * (kThreads / kChunks), each row's page looked up once for K and V. Rows
// past seqlen_k are zero-filled (their page and offset are those of the sequence's last row, so no row needs a
// branch). kSameKV: v_cache has k_cache's strides (two tensors of one shape: the usual cache), so V's offset is K's.
// d_qk == d_v (generate.py checks).
template <class Cfg, bool kSameKV>
__forceinline__ __device__ void load_kv_fp8(const Args& a, int b, int kvh, int key0, int seqlen_k, uint8_t* sk,
                                            uint8_t* sv, int tid) {
  constexpr int kChunks = Cfg::kHeadDimQK / 16;
  static_assert(Cfg::kHeadDimQK == Cfg::kHeadDimV, "one chunk pattern for K and V");
  static_assert(Cfg::kThreads % kChunks == 0 && (Cfg::kBlockN * kChunks) % Cfg::kThreads == 0,
                "whole rows per thread step");
  constexpr int kRowStep = Cfg::kThreads / kChunks, kRows = Cfg::kBlockN / kRowStep;
  static_assert(kRowStep % 8 == 0, "a thread's rows share their swizzle: one destination plus immediates");
  const int c = tid % kChunks, r0 = tid / kChunks;
  const int dst0 = fp8_off<Cfg::kHeadDimQK>(r0, c * 16);
  const uint8_t* k = static_cast<const uint8_t*>(a.k) + kvh * a.k_head_stride + c * 16;
  const uint8_t* v = static_cast<const uint8_t*>(a.v) + kvh * a.v_head_stride + c * 16;
  const int* table = Cfg::kPaged ? a.page_table + b * a.page_table_stride : nullptr;
  if constexpr (!Cfg::kPaged) {
    k += b * a.k_batch_stride;
    v += b * a.v_batch_stride;
  }
  CUTE_UNROLL
  for (int j = 0; j < kRows; ++j) {
    const int key = key0 + r0 + j * kRowStep;
    const bool valid = key < seqlen_k;
    const int row = min(key, seqlen_k - 1);   // the caller loads only while the sequence has a key
    // offsets from unsigned 32-bit rows and pages (never negative) times the 64-bit strides: one wide multiply-add
    // each, no sign extension
    using u64 = unsigned long long;
    u64 ko, vo;
    if constexpr (Cfg::kPaged) {
      const unsigned urow = static_cast<unsigned>(row);
      const unsigned page = static_cast<unsigned>(__ldg(table + (urow >> a.page_shift)));
      const unsigned within = urow & ((1u << a.page_shift) - 1);
      ko = page * u64(a.k_batch_stride) + within * u64(a.k_row_stride);
      vo = kSameKV ? ko : page * u64(a.v_batch_stride) + within * u64(a.v_row_stride);
    } else {
      ko = static_cast<unsigned>(row) * u64(a.k_row_stride);
      vo = kSameKV ? ko : static_cast<unsigned>(row) * u64(a.v_row_stride);
    }
    const int dst = dst0 + j * kRowStep * Cfg::kHeadDimQK;
    cp_async_16(sk + dst, k + ko, valid);
    cp_async_16(sv + dst, v + vo, valid);
  }
}

// The split kernel over an e4m3 cache. Cfg: split_kv's (kSplitDV and kVFromK false). Shared memory: Q (16-bit),
// then kStages K tiles and kStages V tiles of e4m3 (kBlockN x d bytes each); the merge buffer reuses the rings
// (translate/decode/params.py: decode_smem_bytes counts the same).
template <class Cfg>
__forceinline__ __device__ void split_kv_fp8(const Args& a, const KvScales& sc, char* smem) {
  using Element = typename Cfg::Element;   // the queries' and the output's dtype
  using MmaElement = cutlass::half_t;      // the GEMMs' operands (see the top)
  static_assert(!Cfg::kSplitDV && !Cfg::kVFromK, "the FP8 cache kernel is the grouped one (column groups)");
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr int kGroupThreads = 32 * Cfg::kWarpsM;
  constexpr int kBlockNW = kBlockN / Cfg::kWarpsN;   // columns of one warp group per tile
  constexpr int kD = Cfg::kHeadDimQK, kDV = Cfg::kHeadDimV;
  constexpr int kOGroups = Cfg::kWarpsN;
  constexpr int kTileK = kBlockN * kD, kTileV = kBlockN * kDV;   // bytes
  static_assert(kDV % 32 == 0, "pv_col permutes columns within 32");
  const int tid = threadIdx.x;
  const int wg = tid / kGroupThreads, tg = tid % kGroupThreads;

  const CtaWork w = cta_work<Cfg>(a);
  const int split = w.split, b = w.b, pack = w.pack, head0 = w.head0, kvh = w.kvh, rows = w.rows, row0 = w.row0;
  const int seqlen_k = w.seqlen_k, causal_offset = w.causal_offset, blk_begin = w.blk_begin, n_tiles = w.n_tiles;
  const int kv_row0 = w.kv_row0, kv_row_end = w.kv_row0 + w.seqlen_k;
  // K = k8 * k_scale: the scores' scale (with soft-capping the cap's prescale, which comes first); V = v8 * v_scale:
  // the output's
  const float k_scale = sc.k[sc.k_stride * kvh], v_scale = sc.v[sc.v_stride * kvh];
  const float scale_log2 = Options<Cfg>::kSoftcap ? a.scale_log2 : a.scale_log2 * k_scale;
  const float softcap_prescale = a.softcap_prescale * k_scale;

  Element* smem_q = reinterpret_cast<Element*>(smem);
  uint8_t* smem_k = reinterpret_cast<uint8_t*>(smem_q + cosize(typename Cfg::SmemLayoutQ{}));
  uint8_t* smem_v = smem_k + kStages * kTileK;
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Cfg::SmemLayoutQ{});

  load_q<Cfg>(a, w, sQ, tid);
  const bool same_kv = a.k_batch_stride == a.v_batch_stride && a.k_row_stride == a.v_row_stride &&
                       a.k_head_stride == a.v_head_stride;
  auto load_kv = [&](int tile, int slot) {   // key tile `tile` of the split into ring slot `slot`
    const int key0 = kv_row0 + (blk_begin + tile) * kBlockN;
    if (same_kv) {
      load_kv_fp8<Cfg, true>(a, b, kvh, key0, kv_row_end, smem_k + slot * kTileK, smem_v + slot * kTileV, tid);
    } else {
      load_kv_fp8<Cfg, false>(a, b, kvh, key0, kv_row_end, smem_k + slot * kTileK, smem_v + slot * kTileV, tid);
    }
  };
  CUTE_UNROLL
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_tiles) { load_kv(s, s); }
    cp_async_commit();
  }

  typename Cfg::TiledMma mma;
  auto thr = mma.get_thread_slice(tg);
  using TileW = Shape<Int<kBlockNW>, Int<kD>>;     // the group's keys x d (scores' B)
  using TileWt = Shape<Int<kDV>, Int<kBlockNW>>;   // d_v x the group's keys (P V's B)
  Tensor tSrQ = thr.partition_fragment_A(sQ);
  Tensor cQ = thr.partition_A(make_identity_tensor(Shape<Int<kBlockM>, Int<kD>>{}));
  Tensor cK = thr.partition_B(make_identity_tensor(TileW{}));
  Tensor cV = thr.partition_B(make_identity_tensor(TileWt{}));
  // the fragments' shapes (shared-memory views of those shapes; nothing is read through them)
  Tensor tSrK = thr.partition_fragment_B(make_tensor(make_smem_ptr(smem_q), make_layout(TileW{})));
  Tensor tOrVt = thr.partition_fragment_B(make_tensor(make_smem_ptr(smem_q), make_layout(TileWt{})));
  static_assert(decltype(size<1>(tOrVt))::value % 4 == 0, "n-blocks by fours");
  uint32_t* rK = reinterpret_cast<uint32_t*>(raw_pointer_cast(tSrK.data()));
  uint32_t* rV = reinterpret_cast<uint32_t*>(raw_pointer_cast(tOrVt.data()));
  Tensor acc_o = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kDV>>{});
  clear(acc_o);
  Tensor row_max = make_tensor<float>(Shape<Int<2 * size<1>(acc_o)>>{});
  Tensor row_sum = make_fragment_like(row_max);
  fill(row_max, -INFINITY);
  clear(row_sum);
  Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockNW>>{});
  Tensor tScS = thr.partition_C(cS);
  // The reads' offsets in a slot: K's of k-block ki at n-block 0 (n-block ni adds 8 ni rows: fp8_swizzle has period
  // 8), V's of word group m for this lane's even and odd keys at k-block 0 (k-block ki adds 16 ki rows, key + 8 eight).
  static_assert(kBlockNW % 16 == 0, "a group's keys start on the swizzle's period");
  int k_off[size<2>(tSrK)], v_off[2][size<1>(tOrVt) / 4];
  CUTE_UNROLL
  for (int ki = 0; ki < size<2>(tSrK); ++ki) {
    const int n = wg * kBlockNW + get<0>(cK(0, 0, ki)), k0 = get<1>(cK(0, 0, ki));
    k_off[ki] = fp8_off<kD>(n, (k0 & ~15) + 2 * (k0 & 15));
  }
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tOrVt) / 4; ++m) {
    const int key = wg * kBlockNW + get<1>(cV(0, 0, 0)), col = pv_col(get<0>(cV(0, 4 * m, 0)));
    v_off[0][m] = fp8_off<kDV>(key, col);
    v_off[1][m] = fp8_off<kDV>(key + 1, col);
  }

  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait<kStages - 2>();
    __syncthreads();   // tile `it` landed for every thread; slot (it - 1) % kStages is free
    auto issue_next = [&]() {
      const int nxt = it + kStages - 1;
      if (nxt < n_tiles) { load_kv(nxt, nxt % kStages); }
      cp_async_commit();
    };
    if constexpr (Cfg::kPrefetchFirst) { issue_next(); }
    if (it == 0) {   // Q in the score GEMM's d order (qk_col), once
      CUTE_UNROLL
      for (int i = 0; i < size(tSrQ); ++i) {
        tSrQ(i) = MmaElement(static_cast<float>(sQ(get<0>(cQ(i)), qk_col(get<1>(cQ(i))))));
      }
    }
    const int slot = it % kStages;
    const uint8_t* sk = smem_k + slot * kTileK;
    const uint8_t* sv = smem_v + slot * kTileV;
    Tensor acc_s = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kBlockNW>>{});
    clear(acc_s);
    CUTE_UNROLL
    for (int ki = 0; ki < size<2>(tSrK); ++ki) {
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(tSrK); ++ni) {   // values (k, k+1, k+8, k+9) of key n: 4 bytes at 4 (lane % 4)
        const uint32_t x = lds32(sk + k_off[ki] + ni * 8 * kD);
        const int r = tSrK.layout()(0, ni, ki) / 2;
        rK[r] = e4m3x2_to_f16x2<0>(x);
        rK[r + 1] = e4m3x2_to_f16x2<1>(x);
      }
      cute::gemm(mma, tSrQ(_, _, ki), tSrK(_, _, ki), acc_s);
    }
    const int col0 = (blk_begin + it) * kBlockN + wg * kBlockNW;
    if constexpr (Options<Cfg>::kSoftcap) { attn_tl::softcap_tile(acc_s, softcap_prescale); }
    if constexpr (Options<Cfg>::kLocal) {
      mask_tile<Cfg::kCausal, true>(acc_s, tScS, row0, pack, col0, seqlen_k, causal_offset, a.window_left,
                                    a.window_right);
    } else if ((blk_begin + it + 1) * kBlockN > (Cfg::kCausal ? causal_offset + 1 : seqlen_k)) {
      mask_tile<Cfg::kCausal>(acc_s, tScS, row0, pack, col0, seqlen_k, causal_offset);
    }
    {   // the online softmax; a warp whose rows all kept their running max skips O's rescale (its factors are
        // exactly 1: exp2 of 0), which is most tiles once the max has settled (64 multiplies a thread a tile)
      Tensor s = make_tensor(acc_s.data(), attn_tl::rowcol_layout(acc_s.layout()));
      Tensor o = make_tensor(acc_o.data(), attn_tl::rowcol_layout(acc_o.layout()));
      float rescale[decltype(size<0>(s))::value];
      bool moved = false;
      CUTE_UNROLL
      for (int mi = 0; mi < size<0>(s); ++mi) {
        const float m_old = row_max(mi);
        const float m_scaled = attn_tl::update_row_max(s, mi, row_max, rescale[mi], scale_log2);
        moved |= row_max(mi) != m_old;
        row_sum(mi) *= rescale[mi];
        float sum = 0.f;
        CUTE_UNROLL
        for (int ni = 0; ni < size<1>(s); ++ni) {
          s(mi, ni) = attn_tl::fast_exp2(s(mi, ni) * scale_log2 - m_scaled);
          sum += s(mi, ni);
        }
        row_sum(mi) += sum;
      }
      if (__any_sync(0xffffffffu, moved)) {
        CUTE_UNROLL
        for (int mi = 0; mi < size<0>(o); ++mi) {
          CUTE_UNROLL
          for (int ni = 0; ni < size<1>(o); ++ni) { o(mi, ni) *= rescale[mi]; }
        }
      }
    }
    Tensor p = make_tensor(acc_s.data(), attn_tl::acc_to_a_layout<typename Cfg::TiledMma>(acc_s.layout()));
    Tensor tOrP = attn_tl::convert_type<MmaElement>(p);
    CUTE_UNROLL
    for (int ki = 0; ki < size<2>(tOrVt); ++ki) {
      const uint8_t* svk = sv + ki * 16 * kDV;   // this lane's keys of k-block ki: 2 (lane % 4) + 0, 1, 8, 9
      CUTE_UNROLL
      for (int m = 0; m < size<1>(tOrVt) / 4; ++m) {   // n-blocks 4m..4m+3: bytes 0..3 of one word per key
        const uint32_t w0 = lds32(svk + v_off[0][m]), w1 = lds32(svk + v_off[1][m]);
        const uint32_t w8 = lds32(svk + v_off[0][m] + 8 * kDV), w9 = lds32(svk + v_off[1][m] + 8 * kDV);
        // x01 = (w0.0, w1.0, w0.1, w1.1), y01 = (w0.2, w1.2, w0.3, w1.3); x89, y89 of keys + 8, + 9
        const uint32_t x01 = __byte_perm(w0, w1, 0x5140), y01 = __byte_perm(w0, w1, 0x7362);
        const uint32_t x89 = __byte_perm(w8, w9, 0x5140), y89 = __byte_perm(w8, w9, 0x7362);
        const uint32_t lo[4] = {x01, x01, y01, y01}, hi[4] = {x89, x89, y89, y89};
        CUTE_UNROLL
        for (int i = 0; i < 4; ++i) {
          const int r = tOrVt.layout()(0, 4 * m + i, ki) / 2;
          rV[r] = i % 2 ? e4m3x2_to_f16x2<1>(lo[i]) : e4m3x2_to_f16x2<0>(lo[i]);
          rV[r + 1] = i % 2 ? e4m3x2_to_f16x2<1>(hi[i]) : e4m3x2_to_f16x2<0>(hi[i]);
        }
      }
      cute::gemm(mma, tOrP(_, _, ki), tOrVt(_, _, ki), acc_o);
    }
    if constexpr (!Cfg::kPrefetchFirst) { issue_next(); }
  }
  cp_async_wait<0>();
  __syncthreads();   // the ring is free: it becomes the merge buffer

  // merge the warp groups as split_kv does; O's column n sits at d = pv_col(n)
  float* s_o = reinterpret_cast<float*>(smem_k);   // (kOGroups, kBlockM, kDV)
  float* s_m = s_o + kOGroups * kBlockM * kDV;     // (kWarpsN, kBlockM)
  float* s_l = s_m + Cfg::kWarpsN * kBlockM;
  Tensor tOcO = thr.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kDV>>{}));
  CUTE_UNROLL
  for (int i = 0; i < size(acc_o); ++i) {
    s_o[(wg * kBlockM + get<0>(tOcO(i))) * kDV + pv_col(get<1>(tOcO(i)))] = acc_o(i);
  }
  CUTE_UNROLL
  for (int mi = 0; mi < size(row_max); ++mi) {   // row mi of the row/col view: half mi % 2 of m-tile mi / 2
    const float l = attn_tl::quad_sum(row_sum(mi));
    if (tg % 4 == 0) {
      const int r = get<0>(tOcO(2 * (mi % 2) + 4 * (mi / 2)));
      s_m[wg * kBlockM + r] = row_max(mi) == -INFINITY ? -INFINITY : row_max(mi) * scale_log2;
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
    for (int g = 0; g < Cfg::kWarpsN; ++g) { mx = fmaxf(mx, s_m[g * kBlockM + r]); }
    float l = 0.f, f[Cfg::kWarpsN];
    CUTE_UNROLL
    for (int g = 0; g < Cfg::kWarpsN; ++g) {
      f[g] = mx == -INFINITY ? 0.f : attn_tl::fast_exp2(s_m[g * kBlockM + r] - mx);
      l += f[g] * s_l[g * kBlockM + r];
    }
    const int t = gr / pack, h = head0 + gr % pack;
    if constexpr (Options<Cfg>::kSinks) {   // one split: the sink joins here; several: in the combine
      if (a.num_splits == 1) {
        const float keep = add_sink(a, h, mx, l);
        CUTE_UNROLL
        for (int g = 0; g < Cfg::kWarpsN; ++g) { f[g] *= keep; }
      }
    }
    const float inv = l > 0.f ? v_scale / l : 0.f;
    float acc[kVec] = {0.f, 0.f, 0.f, 0.f};
    CUTE_UNROLL
    for (int g = 0; g < kOGroups; ++g) {
      const float4 x = *reinterpret_cast<const float4*>(s_o + (g * kBlockM + r) * kDV + c);
      acc[0] += f[g] * x.x; acc[1] += f[g] * x.y; acc[2] += f[g] * x.z; acc[3] += f[g] * x.w;
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

}  // namespace attn_decode

#endif  // ATTN_DECODE_FP8_CUH
