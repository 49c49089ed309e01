// Host-only emulation of the register dataflow of a generated kernel's two GEMMs, built from the
// kernel's own CuTe types (tests/translate/test_codegen_fragments.py pastes translate.emitters'
// kernel_types() of each config in front of this file, one namespace per config).
//
// CuTe gives, on the host, every partition the kernel uses (ldmatrix source rows, register fragments,
// retile views, the accumulator -> operand reshape of attn_tl.cuh). The hardware side is emulated from
// the PTX ISA: ldmatrix(.trans) x4/x2 delivery and the m16n8k8 / m16n8k16 fragment maps. Then
//   S = Q K^T   through s2r_q / s2r_k (LDSM_N) and the score GEMM,
//   O = S V     through the C -> A reshape of S and s2r_v (LDSM_T, V read as (HeadDimV, BN)),
// are compared with a plain reference on small integers (exact in float). A wrong pairing of the
// accumulator and operand fragments, or of ldmatrix blocking and MMA k-blocking, shows as a mismatch.
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <vector>

namespace emu {
using namespace cute;

enum S2RKind { kLdsmX4 = 4, kLdsmX2 = 2, kUniversal = 0 };

// PTX ISA fragment maps (g = lane / 4, q = lane % 4): (row, col) of value v in one warp's atom.
inline void a_coord(int mma_k, int lane, int v, int& row, int& col) {
  const int g = lane / 4, q = lane % 4;
  if (mma_k == 8) { row = g + 8 * (v / 2); col = 2 * q + v % 2; }
  else { row = g + 8 * ((v / 2) % 2); col = 2 * q + v % 2 + 8 * (v / 4); }
}
inline void b_coord(int mma_k, int lane, int v, int& k, int& n) {  // B is K x 8
  const int g = lane / 4, q = lane % 4;
  n = g;
  k = (mma_k == 8) ? 2 * q + v : 2 * q + v % 2 + 8 * (v / 2);
}
inline void c_coord(int lane, int v, int& row, int& col) {
  const int g = lane / 4, q = lane % 4;
  row = g + 8 * (v / 2); col = 2 * q + v % 2;
}

// One shared->register tiled copy of a whole operand: src = thread slice's partition_S of the shared
// tile (element offsets into mem), dst = its retile_D view of the register fragment. Mode 0 of both
// is (values of one copy instruction, instructions); ldmatrix takes one 8-element row address per
// thread (128 bits) and delivers 2 halves per matrix.
template <class TiledCopy, class SLayout, class Frag>
bool emulate_s2r(int nthreads, int kind, bool trans, TiledCopy const& tc, SLayout const& slayout,
                 std::vector<float> const& mem, std::vector<Frag>& frags, const char* what) {
  std::vector<int> base(mem.size());
  for (size_t i = 0; i < base.size(); ++i) base[i] = int(i);
  Tensor counting = make_tensor(base.data(), slayout);
  auto s0 = group_modes<1, 3>(tc.get_thread_slice(0).partition_S(counting));
  const int nval_s = size<0>(s0), nrest = size<1>(s0);
  std::vector<std::vector<int>> src(nthreads);  // [t][rest * nval_s + j] -> element offset
  for (int t = 0; t < nthreads; ++t) {
    auto s = group_modes<1, 3>(tc.get_thread_slice(t).partition_S(counting));
    for (int r = 0; r < nrest; ++r)
      for (int j = 0; j < nval_s; ++j) src[t].push_back(s(j, r));
  }
  for (int t = 0; t < nthreads; ++t) {
    auto d = group_modes<1, 3>(tc.get_thread_slice(t).retile_D(frags[t]));
    const int nval_d = size<0>(d);
    if (int(size<1>(d)) != nrest) {
      std::printf("FAIL %s: %d copy blocks in shared memory, %d in the retiled registers\n", what, nrest,
                  int(size<1>(d)));
      return false;
    }
    const int lane = t % 32, warp0 = t - lane;
    const int dst_per_inst = kind == kUniversal ? 1 : 2 * kind;  // ldmatrix: 2 halves per matrix
    const int src_per_inst = kind == kUniversal ? 1 : 8;
    if (nval_d / dst_per_inst != nval_s / src_per_inst) {
      std::printf("FAIL %s: %d source and %d destination values per thread\n", what, nval_s, nval_d);
      return false;
    }
    for (int r = 0; r < nrest; ++r) {
      for (int j = 0; j < nval_d; ++j) {
        int off;
        if (kind == kUniversal) {
          off = src[t][r * nval_s + j];
        } else {
          const int inst = j / dst_per_inst, a = j % dst_per_inst, i = a / 2, h = a % 2;
          // the row of matrix i comes from thread 8i + row; its 8 elements must be contiguous
          const int row = trans ? 2 * (lane % 4) + h : lane / 4;
          const int col = trans ? lane / 4 : 2 * (lane % 4) + h;
          const int* prow = &src[warp0 + 8 * i + row][r * nval_s + inst * 8];
          for (int e = 1; e < 8; ++e) {
            if (prow[e] != prow[0] + e) {
              std::printf("FAIL %s: ldmatrix row of thread %d is not contiguous in shared memory\n", what,
                          warp0 + 8 * i + row);
              return false;
            }
          }
          off = prow[0] + col;
        }
        d(j, r) = static_cast<typename std::decay_t<decltype(d)>::value_type>(mem[off]);  // small ints: exact
      }
    }
  }
  return true;
}

// attn_tl::gemm_ss / gemm_rs pipeline ldmatrix per k-block when the copy has as many k-blocks as the
// MMA (size<2> equal): then copy k-block k must fill exactly the registers of MMA k-block k.
template <class TiledCopy, class SLayout, class Frag>
bool kblocks_align(TiledCopy const& tc, SLayout const& slayout, Frag frag, const char* what) {
  std::vector<int> base(cosize(slayout));
  auto s = tc.get_thread_slice(0).partition_S(make_tensor(base.data(), slayout));
  if (int(size<2>(s)) != int(size<2>(frag))) return true;   // whole-operand copy: no per-k pairing used
  for (int v = 0; v < size<0>(frag); ++v)
    for (int m = 0; m < size<1>(frag); ++m)
      for (int k = 0; k < size<2>(frag); ++k) frag(v, m, k) = static_cast<typename Frag::value_type>(float(k));
  auto d = tc.get_thread_slice(0).retile_D(frag);
  for (int j = 0; j < size<0>(d); ++j)
    for (int m = 0; m < size<1>(d); ++m)
      for (int k = 0; k < size<2>(d); ++k)
        if (int(float(d(j, m, k))) != k) {
          std::printf("FAIL %s: copy k-block %d writes registers of MMA k-block %d\n", what, k, int(float(d(j, m, k))));
          return false;
        }
  return true;
}

// acc(_, m, n) += A(_, m, k) * B(_, n, k) for every k, per warp, with the hardware's fragment maps.
template <class FA, class FB, class FC>
void emulate_gemm(int nthreads, int mma_k, std::vector<FA> const& a, std::vector<FB> const& b, std::vector<FC>& c) {
  const int nm = size<1>(c[0]), nn = size<2>(c[0]), nk = size<2>(a[0]);
  for (int w = 0; w < nthreads / 32; ++w) {
    for (int m = 0; m < nm; ++m)
      for (int n = 0; n < nn; ++n)
        for (int k = 0; k < nk; ++k) {
          float A[16][16] = {}, B[16][8] = {}, C[16][8] = {};
          for (int lane = 0; lane < 32; ++lane) {
            const int t = 32 * w + lane;
            for (int v = 0; v < int(size<0>(a[t])); ++v) { int r, cc; a_coord(mma_k, lane, v, r, cc); A[r][cc] = float(a[t](v, m, k)); }
            for (int v = 0; v < int(size<0>(b[t])); ++v) { int kk, nn2; b_coord(mma_k, lane, v, kk, nn2); B[kk][nn2] = float(b[t](v, n, k)); }
          }
          for (int r = 0; r < 16; ++r)
            for (int cc = 0; cc < 8; ++cc)
              for (int kk = 0; kk < mma_k; ++kk) C[r][cc] += A[r][kk] * B[kk][cc];
          for (int lane = 0; lane < 32; ++lane) {
            const int t = 32 * w + lane;
            for (int v = 0; v < 4; ++v) { int r, cc; c_coord(lane, v, r, cc); c[t](v, m, n) += C[r][cc]; }
          }
        }
  }
}

template <class Cfg>
int check(const char* name) {
  using TiledMma = typename Cfg::TiledMma;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, DQK = Cfg::kHeadDimQK, DV = Cfg::kHeadDimV;
  constexpr int NT = Cfg::kNThreads;
  constexpr int kMmaK = decltype(get<2>(typename TiledMma::Shape_MNK{}))::value;
  TiledMma tiled_mma;
  auto s2r_q = make_tiled_copy_A(typename Cfg::S2RAtomQK{}, tiled_mma);
  auto s2r_k = make_tiled_copy_B(typename Cfg::S2RAtomQK{}, tiled_mma);
  auto s2r_v = make_tiled_copy_B(typename Cfg::S2RAtomV{}, tiled_mma);

  std::srand(7);
  std::vector<float> Q(BM * DQK), K(BN * DQK), V(BN * DV);
  for (auto& x : Q) x = float(std::rand() % 5 - 2);
  for (auto& x : K) x = float(std::rand() % 5 - 2);
  for (auto& x : V) x = float(std::rand() % 5 - 2);
  typename Cfg::SmemLayoutQ lq; typename Cfg::SmemLayoutK lk; typename Cfg::SmemLayoutV lv;
  std::vector<float> mq(cosize(lq)), mk(cosize(lk)), mv(cosize(lv));
  for (int m = 0; m < BM; ++m) for (int d = 0; d < DQK; ++d) mq[lq(m, d)] = Q[m * DQK + d];
  for (int n = 0; n < BN; ++n) for (int d = 0; d < DQK; ++d) mk[lk(n, d)] = K[n * DQK + d];
  for (int n = 0; n < BN; ++n) for (int d = 0; d < DV; ++d) mv[lv(n, d)] = V[n * DV + d];

  using FragA = decltype(tiled_mma.get_thread_slice(0).partition_fragment_A(make_tensor((float*)nullptr, lq)));
  using FragB = decltype(tiled_mma.get_thread_slice(0).partition_fragment_B(make_tensor((float*)nullptr, lk)));
  using FragVt = decltype(tiled_mma.get_thread_slice(0).partition_fragment_B(
      make_tensor((float*)nullptr, typename Cfg::SmemLayoutVtNoSwizzle{})));
  using FragS = decltype(partition_fragment_C(tiled_mma, Shape<Int<BM>, Int<BN>>{}));
  using FragO = decltype(partition_fragment_C(tiled_mma, Shape<Int<BM>, Int<DV>>{}));
  std::vector<FragA> rq(NT); std::vector<FragB> rk(NT); std::vector<FragVt> rv(NT);
  std::vector<FragS> s(NT); std::vector<FragO> o(NT);
  for (int t = 0; t < NT; ++t) { clear(s[t]); clear(o[t]); }

  int bad = 0;
  bad += !emulate_s2r(NT, Cfg::kS2RKind, false, s2r_q, lq, mq, rq, "Q (A operand, s2r_q)");
  bad += !emulate_s2r(NT, Cfg::kS2RKind, false, s2r_k, lk, mk, rk, "K (B operand, s2r_k)");
  bad += !emulate_s2r(NT, Cfg::kS2RKind, Cfg::kS2RKind != kUniversal, s2r_v, typename Cfg::SmemLayoutVt{}, mv, rv,
                      "V^T (B operand, s2r_v)");
  bad += !kblocks_align(s2r_q, lq, rq[0], "Q (s2r_q)");
  bad += !kblocks_align(s2r_k, lk, rk[0], "K (s2r_k)");
  bad += !kblocks_align(s2r_v, typename Cfg::SmemLayoutVt{}, rv[0], "V^T (s2r_v)");
  if (bad) return 1;
  emulate_gemm(NT, kMmaK, rq, rk, s);

  // S: every accumulator value at the (row, col) tScS (the mask's coordinates) says
  std::vector<float> S(BM * BN, 0.f);
  for (int m = 0; m < BM; ++m) for (int n = 0; n < BN; ++n)
    for (int d = 0; d < DQK; ++d) S[m * BN + n] += Q[m * DQK + d] * K[n * DQK + d];
  int s_bad = 0, rowcol_bad = 0;
  for (int t = 0; t < NT; ++t) {
    Tensor cS = tiled_mma.get_thread_slice(t).partition_C(make_identity_tensor(Shape<Int<BM>, Int<BN>>{}));
    for (int i = 0; i < size(cS); ++i) {
      const int r = get<0>(cS(i)), c = get<1>(cS(i));
      if (s[t](i) != S[r * BN + c]) ++s_bad;
    }
    // the softmax's rows x cols view: one row index per view row, shared by the 4 threads of a quad
    Tensor rc = make_tensor(cS.data(), attn_tl::rowcol_layout(cS.layout()));
    Tensor rc0 = make_tensor(tiled_mma.get_thread_slice(t - t % 4).partition_C(
        make_identity_tensor(Shape<Int<BM>, Int<BN>>{})).data(), attn_tl::rowcol_layout(cS.layout()));
    for (int mi = 0; mi < size<0>(rc); ++mi)
      for (int ni = 0; ni < size<1>(rc); ++ni)
        if (get<0>(rc(mi, ni)) != get<0>(rc(mi, 0)) || get<0>(rc0(mi, ni)) != get<0>(rc(mi, 0))) ++rowcol_bad;
  }

  // P = S reused as the A operand (TL Reshape), O = P V
  std::vector<decltype(make_tensor(s[0].data(), attn_tl::acc_to_a_layout<TiledMma>(s[0].layout())))> p;
  for (int t = 0; t < NT; ++t) p.push_back(make_tensor(s[t].data(), attn_tl::acc_to_a_layout<TiledMma>(s[t].layout())));
  const bool p_shape_ok = size<2>(p[0]) == size<2>(rv[0]) && size<0>(p[0]) == size<0>(rq[0]);
  if (!p_shape_ok) {
    std::printf("FAIL %s: reshaped P has %d k-blocks of %d values, V^T fragment %d k-blocks, A atom %d values\n",
                name, int(size<2>(p[0])), int(size<0>(p[0])), int(size<2>(rv[0])), int(size<0>(rq[0])));
    return 1;
  }
  emulate_gemm(NT, kMmaK, p, rv, o);
  std::vector<float> O(BM * DV, 0.f);
  for (int m = 0; m < BM; ++m) for (int d = 0; d < DV; ++d)
    for (int n = 0; n < BN; ++n) O[m * DV + d] += S[m * BN + n] * V[n * DV + d];
  int o_bad = 0;
  for (int t = 0; t < NT; ++t) {
    Tensor cO = tiled_mma.get_thread_slice(t).partition_C(make_identity_tensor(Shape<Int<BM>, Int<DV>>{}));
    for (int i = 0; i < size(cO); ++i)
      if (o[t](i) != O[get<0>(cO(i)) * DV + get<1>(cO(i))]) ++o_bad;
  }
  std::printf("%s %s: mma k%d, S mismatches %d/%d, rowcol %d, O mismatches %d/%d\n",
              (s_bad || o_bad || rowcol_bad) ? "FAIL" : "OK", name, kMmaK, s_bad, BM * BN, rowcol_bad, o_bad,
              BM * DV);
  return (s_bad || o_bad || rowcol_bad) ? 1 : 0;
}
}  // namespace emu
