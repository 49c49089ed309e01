// Absorbed-MLA decode (d_qk 576 = 512 latent + 64 rotary, d_v 512 read from the same rows, one latent KV head) over
// an FP8 (e4m3) latent cache: bf16/fp16 queries, the latent rows stored as e4m3 with one fp32 scale (per tensor: the
// latent has one KV head, so per KV head is the same), the real row latent_fp8 * scale. V is the first 512 columns of
// those rows, so it takes the same scale (the launcher passes k_scale; serving refuses a different v_scale).
//
// The flow is split_kv's split-d_v mode (attn_decode.cuh): warp group wg scores its kBlockN / kWarpsN keys of the tile
// over the whole depth, the tile's row max goes through shared memory, P through a shared tile, and every group
// multiplies all of P by its d_v / kWarpsN slice of V. The e4m3 handling is attn_decode_fp8.cuh's (its helpers are
// used here, not copied):
// - the ring holds the cache's bytes as they are (a 576-byte row instead of 1152), by cp.async in 16-byte chunks,
//   swizzled by fp8_off so that the 32-bit reads below are free of bank conflicts. A slot is two regions, since
//   fp8_off takes rows of 64 bytes or whole 128-byte lines and 576 is neither: kBlockN rows of the first 512 bytes
//   (the latent, V's rows too), then kBlockN rows of the last 64 (the rotary part).
// - K and V are converted in registers into fp16 MMA operands (cvt.rn.f16x2.e4m3x2), never written back as a 16-bit
//   tile; the GEMMs are fp16 for bf16 queries too (attn_decode_fp8.cuh says why).
// - the score GEMM reduces over d in qk_col order. The grouped FP8 kernel keeps Q in registers in that order; here Q
//   (64 rows x 576: 144 registers a thread) stays in shared memory as in the 16-bit MLA kernel and is read by ldmatrix
//   every tile, so it is rewritten once per CTA in place: each 16-column group permuted to qk_col order and rounded to
//   fp16 (same bytes, same layout).
// - P V's columns are V's d in pv_col order within 32 (each group's slice starts at a multiple of 32), so O's column n
//   sits at d = pv_col(n) and the epilogue writes it there.
// - the scale is folded: into the softmax scale (scores) and the output's 1 / sum (V), so a split's partial output
//   is scaled already and the combine kernel is the 16-bit one.
#ifndef ATTN_DECODE_FP8_MLA_CUH
#define ATTN_DECODE_FP8_MLA_CUH

#include "attn_decode_fp8.cuh"

namespace attn_decode {

// One tile of e4m3 latent rows (kBlockN keys from key0) into a ring slot: as gather_rows (attn_decode.cuh), a warp
// copies 4 rows at a time (lane: row lane / 8 of the 4, 16-byte chunk lane % 8 of each 128-byte block), each row's
// page looked up once; the thread copies its chunk of the latent's four 128-byte blocks, and lanes with chunk < 4 the
// rotary part's chunk too. Rows past seqlen_k are zero-filled (their source is the sequence's last row, no branch).
template <class Cfg>
__forceinline__ __device__ void load_latent_fp8(const Args& a, int b, int kvh, int key0, int seqlen_k, uint8_t* slot,
                                                int tid) {
  constexpr int kDV = Cfg::kHeadDimV, kRope = Cfg::kHeadDimQK - Cfg::kHeadDimV;
  constexpr int kWarps = Cfg::kThreads / 32;
  static_assert(kDV % 128 == 0 && kRope == 64, "latent rows of whole 128-byte lines, a 64-byte rotary part");
  static_assert(Cfg::kBlockN % (4 * kWarps) == 0, "whole 4-row groups per warp");
  constexpr int kRows = Cfg::kBlockN / (4 * kWarps);
  const int warp = tid / 32, lane = tid % 32, c = lane % 8;
  const uint8_t* src0 = static_cast<const uint8_t*>(a.k) + kvh * a.k_head_stride + c * 16;
  uint8_t* rope = slot + Cfg::kBlockN * kDV;
  const int* table = Cfg::kPaged ? a.page_table + b * a.page_table_stride : nullptr;
  if constexpr (!Cfg::kPaged) { src0 += b * a.k_batch_stride; }
  using u64 = unsigned long long;
  CUTE_UNROLL
  for (int k = 0; k < kRows; ++k) {
    const int r = 4 * (warp + kWarps * k) + lane / 8;
    const int key = key0 + r;
    const bool valid = key < seqlen_k;
    const unsigned row = static_cast<unsigned>(min(key, seqlen_k - 1));   // loaded only while a key is left
    u64 off;
    if constexpr (Cfg::kPaged) {
      const unsigned page = static_cast<unsigned>(__ldg(table + (row >> a.page_shift)));
      off = page * u64(a.k_batch_stride) + (row & ((1u << a.page_shift) - 1)) * u64(a.k_row_stride);
    } else {
      off = row * u64(a.k_row_stride);
    }
    const uint8_t* src = src0 + off;
    uint8_t* dst = slot + fp8_off<kDV>(r, c * 16);
    CUTE_UNROLL
    for (int blk = 0; blk < kDV / 128; ++blk) { cp_async_16(dst + blk * 128, src + blk * 128, valid); }
    if (c < kRope / 16) { cp_async_16(rope + fp8_off<kRope>(r, c * 16), src + kDV, valid); }
  }
}

// Q (kBlockM x kHeadDimQK of the queries' dtype, landed in sQ) rewritten in place: every 16-column group in qk_col
// order as fp16, the score GEMM's A operand over the e4m3 keys' order. A thread owns whole groups (two 16-byte chunks
// of one row: the 16-bit swizzle moves 8-column chunks), so no thread reads what another writes.
template <class Cfg, class SQ>
__forceinline__ __device__ void q_to_fp16_qk_order(SQ& sQ, int tid) {
  using Element = typename Cfg::Element;
  constexpr int kGroups = Cfg::kHeadDimQK / 16;
  for (int i = tid; i < Cfg::kBlockM * kGroups; i += Cfg::kThreads) {
    const int r = i / kGroups, g = i % kGroups;
    uint4* p0 = reinterpret_cast<uint4*>(&sQ(r, 16 * g));
    uint4* p1 = reinterpret_cast<uint4*>(&sQ(r, 16 * g + 8));
    alignas(16) Element in[16];
    alignas(16) cutlass::half_t out[16];
    reinterpret_cast<uint4*>(in)[0] = *p0;
    reinterpret_cast<uint4*>(in)[1] = *p1;
    CUTE_UNROLL
    for (int k = 0; k < 16; ++k) { out[k] = cutlass::half_t(static_cast<float>(in[qk_col(k)])); }
    *p0 = reinterpret_cast<const uint4*>(out)[0];
    *p1 = reinterpret_cast<const uint4*>(out)[1];
  }
}

// The split kernel over an e4m3 latent cache. Cfg: split_kv's in split-d_v mode (kSplitDV, kVFromK, SmemLayoutP; no
// options). Shared memory: Q (16 bits a value), kStages slots of kBlockN x 576 e4m3 bytes, the P tile (fp16) and the
// max exchange (kWarpsN, kBlockM) fp32; after the loop the merge buffer from the start (translate/decode/params.py:
// decode_smem_bytes counts the same).
template <class Cfg>
__forceinline__ __device__ void split_kv_fp8_mla(const Args& a, const KvScales& sc, char* smem) {
  using Element = typename Cfg::Element;   // the queries' and the output's dtype
  using MmaElement = cutlass::half_t;      // the GEMMs' operands
  static_assert(Cfg::kSplitDV && Cfg::kVFromK, "the FP8 latent kernel is the split-d_v one, V read from K's rows");
  static_assert(!Options<Cfg>::kLocal && !Options<Cfg>::kSoftcap && !Options<Cfg>::kSinks, "no options");
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr int kGroupThreads = 32 * Cfg::kWarpsM;
  constexpr int kBlockNW = kBlockN / Cfg::kWarpsN;   // keys one warp group scores per tile
  constexpr int kD = Cfg::kHeadDimQK, kDV = Cfg::kHeadDimV, kRope = kD - kDV;
  constexpr int kDVW = kDV / Cfg::kWarpsN;           // O columns one warp group accumulates
  constexpr int kSlot = kBlockN * kD;                // bytes: the latent region, then the rotary one
  static_assert(kDVW % 32 == 0, "pv_col permutes columns within 32");
  static_assert(kBlockNW % 16 == 0, "a group's keys start on the swizzle's period");
  const int tid = threadIdx.x;
  const int wg = tid / kGroupThreads, tg = tid % kGroupThreads;

  const CtaWork w = cta_work<Cfg>(a);
  const int split = w.split, b = w.b, pack = w.pack, head0 = w.head0, kvh = w.kvh, rows = w.rows, row0 = w.row0;
  const int seqlen_k = w.seqlen_k, causal_offset = w.causal_offset, blk_begin = w.blk_begin, n_tiles = w.n_tiles;
  const int kv_row0 = w.kv_row0, kv_row_end = w.kv_row0 + w.seqlen_k;
  // the latent's one scale: K = k8 * scale folds into the scores' scale, V (the same rows) into the output's 1 / sum
  const float kv_scale = sc.k[sc.k_stride * kvh];
  const float scale_log2 = a.scale_log2 * kv_scale;

  Element* smem_q = reinterpret_cast<Element*>(smem);
  uint8_t* smem_kv = reinterpret_cast<uint8_t*>(smem_q + cosize(typename Cfg::SmemLayoutQ{}));
  MmaElement* smem_p = reinterpret_cast<MmaElement*>(smem_kv + kStages * kSlot);
  float* s_x = reinterpret_cast<float*>(smem_p + kBlockM * kBlockN);
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Cfg::SmemLayoutQ{});
  // the same bytes once q_to_fp16_qk_order has rewritten them
  Tensor sQh = make_tensor(make_smem_ptr(reinterpret_cast<MmaElement*>(smem_q)), typename Cfg::SmemLayoutQ{});
  Tensor sP = make_tensor(make_smem_ptr(smem_p), typename Cfg::SmemLayoutP{});

  load_q<Cfg>(a, w, sQ, tid);
  auto load_tile = [&](int tile, int slot) {
    load_latent_fp8<Cfg>(a, b, kvh, kv_row0 + (blk_begin + tile) * kBlockN, kv_row_end, smem_kv + slot * kSlot,
                         tid);
  };
  CUTE_UNROLL
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_tiles) { load_tile(s, s); }
    cp_async_commit();
  }

  typename Cfg::TiledMma mma;
  auto thr = mma.get_thread_slice(tg);
  using S2RAtom = Copy_Atom<SM75_U32x4_LDSM_N, MmaElement>;
  auto s2r_q = make_tiled_copy_A(S2RAtom{}, mma);
  auto s2r_thr_q = s2r_q.get_thread_slice(tg);
  auto s2r_p = make_tiled_copy_A(S2RAtom{}, mma);
  auto s2r_thr_p = s2r_p.get_thread_slice(tg);
  using TileW = Shape<Int<kBlockNW>, Int<kD>>;     // the group's keys x d (scores' B)
  using TileWt = Shape<Int<kDVW>, Int<kBlockN>>;   // the group's d_v slice x all keys (P V's B)
  Tensor tSrQ = thr.partition_fragment_A(sQh);
  Tensor tSsQ = s2r_thr_q.partition_S(sQh);
  Tensor tSrQv = s2r_thr_q.retile_D(tSrQ);
  Tensor tOrP = thr.partition_fragment_A(sP);
  Tensor tOsP = s2r_thr_p.partition_S(sP);
  Tensor tOrPv = s2r_thr_p.retile_D(tOrP);
  Tensor cK = thr.partition_B(make_identity_tensor(TileW{}));
  Tensor cV = thr.partition_B(make_identity_tensor(TileWt{}));
  // the fragments' shapes (shared-memory views of those shapes; nothing is read through them)
  Tensor tSrK = thr.partition_fragment_B(make_tensor(make_smem_ptr(smem_p), make_layout(TileW{})));
  Tensor tOrVt = thr.partition_fragment_B(make_tensor(make_smem_ptr(smem_p), make_layout(TileWt{})));
  static_assert(decltype(size<1>(tOrVt))::value % 4 == 0, "n-blocks by fours");
  static_assert(decltype(size<2>(tSrK))::value == kD / 16 && decltype(size<2>(tOrP))::value == kBlockN / 16, "k16");
  uint32_t* rK = reinterpret_cast<uint32_t*>(raw_pointer_cast(tSrK.data()));
  uint32_t* rV = reinterpret_cast<uint32_t*>(raw_pointer_cast(tOrVt.data()));
  Tensor acc_o = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kDVW>>{});
  clear(acc_o);
  Tensor row_max = make_tensor<float>(Shape<Int<2 * size<1>(acc_o)>>{});
  Tensor row_sum = make_fragment_like(row_max);
  fill(row_max, -INFINITY);
  clear(row_sum);
  Tensor tScS = thr.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockNW>>{}));
  // The reads' offsets in a slot. K: k-block ki of the latent reads 16 ki + 4 (lane % 4) of its key, whose 16-byte
  // chunk fp8_off XORs with key % 8 inside a 128-byte line, so k-blocks ki and ki + 8 lie a line apart: eight bases
  // for the latent, four for the rotary region (n-block ni adds 8 ni rows: fp8_swizzle has period 8). V: the lane's
  // even and odd key of k-block 0 at word group m of the group's slice; groups m and m + 4 lie a line apart (k-block
  // ki adds 16 ki rows, key + 8 eight).
  constexpr int kQkBlocks = kD / 16, kLatentBlocks = kDV / 16, kVGroups = decltype(size<1>(tOrVt))::value / 4;
  int k_off[8], r_off[kRope / 16], v_off[2][kVGroups < 4 ? kVGroups : 4];
  CUTE_UNROLL
  for (int ki = 0; ki < 8; ++ki) {
    const int n = wg * kBlockNW + get<0>(cK(0, 0, ki)), k0 = get<1>(cK(0, 0, ki));
    k_off[ki] = fp8_off<kDV>(n, (k0 & ~15) + 2 * (k0 & 15));
  }
  CUTE_UNROLL
  for (int j = 0; j < kRope / 16; ++j) {
    const int ki = kLatentBlocks + j;
    const int n = wg * kBlockNW + get<0>(cK(0, 0, ki)), k0 = get<1>(cK(0, 0, ki)) - kDV;
    r_off[j] = kBlockN * kDV + fp8_off<kRope>(n, (k0 & ~15) + 2 * (k0 & 15));
  }
  CUTE_UNROLL
  for (int m = 0; m < (kVGroups < 4 ? kVGroups : 4); ++m) {
    const int key = get<1>(cV(0, 0, 0)), col = wg * kDVW + pv_col(get<0>(cV(0, 4 * m, 0)));
    v_off[0][m] = fp8_off<kDV>(key, col);
    v_off[1][m] = fp8_off<kDV>(key + 1, col);
  }

  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait<kStages - 2>();
    __syncthreads();   // tile `it` landed for every thread (Q with tile 0); slot (it - 1) % kStages is free
    auto issue_next = [&]() {
      const int nxt = it + kStages - 1;
      if (nxt < n_tiles) { load_tile(nxt, nxt % kStages); }
      cp_async_commit();
    };
    if constexpr (Cfg::kPrefetchFirst) { issue_next(); }
    if (it == 0) {   // CTA-uniform: the barrier is reached by every thread
      q_to_fp16_qk_order<Cfg>(sQ, tid);
      __syncthreads();
    }
    const uint8_t* sk = smem_kv + (it % kStages) * kSlot;
    Tensor acc_s = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kBlockNW>>{});
    clear(acc_s);
    CUTE_UNROLL
    for (int ki = 0; ki < kQkBlocks; ++ki) {
      cute::copy(s2r_q, tSsQ(_, _, ki), tSrQv(_, _, ki));
      const bool latent = ki < kLatentBlocks;
      const int off = latent ? k_off[ki % 8] + 128 * (ki / 8) : r_off[ki - kLatentBlocks];
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(tSrK); ++ni) {   // values (k, k+1, k+8, k+9) of key n: 4 bytes at 4 (lane % 4)
        const uint32_t x = lds32(sk + off + ni * 8 * (latent ? kDV : kRope));
        const int r = tSrK.layout()(0, ni, ki) / 2;
        rK[r] = e4m3x2_to_f16x2<0>(x);
        rK[r + 1] = e4m3x2_to_f16x2<1>(x);
      }
      cute::gemm(mma, tSrQ(_, _, ki), tSrK(_, _, ki), acc_s);
    }
    const int col0 = (blk_begin + it) * kBlockN + wg * kBlockNW;
    if ((blk_begin + it + 1) * kBlockN > (Cfg::kCausal ? causal_offset + 1 : seqlen_k)) {
      mask_tile<Cfg::kCausal>(acc_s, tScS, row0, pack, col0, seqlen_k, causal_offset);
    }
    // barriers per tile as split_kv's: top of loop (ring), the max exchange, the P tile
    softmax_shared_max<Cfg>(acc_s, acc_o, row_max, row_sum, tScS, s_x, wg, tg, scale_log2);
    {
      Tensor rP = attn_tl::convert_type<MmaElement>(acc_s);
      auto r2s_p = make_tiled_copy_C(Copy_Atom<UniversalCopy<uint32_t>, MmaElement>{}, mma);
      auto r2s_thr_p = r2s_p.get_thread_slice(tg);
      cute::copy(r2s_p, r2s_thr_p.retile_S(rP),
                 r2s_thr_p.partition_D(local_tile(sP, Shape<Int<kBlockM>, Int<kBlockNW>>{}, make_coord(0, wg))));
    }
    __syncthreads();   // the whole P tile is written
    CUTE_UNROLL
    for (int ki = 0; ki < kBlockN / 16; ++ki) {
      cute::copy(s2r_p, tOsP(_, _, ki), tOrPv(_, _, ki));
      const uint8_t* svk = sk + ki * 16 * kDV;   // this lane's keys of k-block ki: 2 (lane % 4) + 0, 1, 8, 9
      CUTE_UNROLL
      for (int m = 0; m < kVGroups; ++m) {   // n-blocks 4m..4m+3: bytes 0..3 of one word per key
        const int o0 = v_off[0][m % 4] + 128 * (m / 4), o1 = v_off[1][m % 4] + 128 * (m / 4);
        const uint32_t w0 = lds32(svk + o0), w1 = lds32(svk + o1);
        const uint32_t w8 = lds32(svk + o0 + 8 * kDV), w9 = lds32(svk + o1 + 8 * kDV);
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
  __syncthreads();   // the ring is free: the merge buffer starts at Q (dead too)

  // one O tile, each group its own columns (column n of its slice at d = wg * kDVW + pv_col(n)); the groups' maxima
  // are equal (softmax_shared_max), their sums add up
  float* s_o = reinterpret_cast<float*>(smem);    // (kBlockM, kDV)
  float* s_m = s_o + kBlockM * kDV;               // (kWarpsN, kBlockM)
  float* s_l = s_m + Cfg::kWarpsN * kBlockM;
  Tensor tOcO = thr.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kDVW>>{}));
  CUTE_UNROLL
  for (int i = 0; i < size(acc_o); ++i) {
    s_o[get<0>(tOcO(i)) * kDV + wg * kDVW + pv_col(get<1>(tOcO(i)))] = acc_o(i);
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
    float l = 0.f;
    CUTE_UNROLL
    for (int g = 0; g < Cfg::kWarpsN; ++g) {
      l += (mx == -INFINITY ? 0.f : attn_tl::fast_exp2(s_m[g * kBlockM + r] - mx)) * s_l[g * kBlockM + r];
    }
    const int t = gr / pack, h = head0 + gr % pack;
    const float inv = l > 0.f ? kv_scale / l : 0.f;
    const float4 x = *reinterpret_cast<const float4*>(s_o + r * kDV + c);
    const float acc[kVec] = {x.x * inv, x.y * inv, x.z * inv, x.w * inv};
    const float lse2 = l > 0.f ? mx + __log2f(l) : -INFINITY;
    if (a.num_splits == 1) {
      Element* dst = o + b * a.o_batch_stride + t * a.o_row_stride + h * a.o_head_stride + c;
      CUTE_UNROLL
      for (int j = 0; j < kVec; ++j) { dst[j] = Element(acc[j]); }
      if (a.lse && c == 0) { a.lse[((long long)b * a.heads_q + h) * a.seqlen_q + t] = lse2 * 0.6931471805599453f; }
    } else {
      const long long row = ((long long)b * a.seqlen_q + t) * a.heads_q + h;
      *reinterpret_cast<float4*>(a.o_partial + (split * rows_all + row) * kDV + c) =
          make_float4(acc[0], acc[1], acc[2], acc[3]);
      if (c == 0) { a.lse_partial[split * rows_all + row] = lse2; }
    }
  }
}

}  // namespace attn_decode

#endif  // ATTN_DECODE_FP8_MLA_CUH
