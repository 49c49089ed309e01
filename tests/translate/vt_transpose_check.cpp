// Host replay of the FP8 in-kernel transpose of V (attn_sm90::transpose_v_tile, KernelParams.v_transpose "producer"):
// a warp's ldmatrix.x4.trans / prmt / stmatrix.x4, lane by lane, from the lanes' addresses and byte selectors the
// kernel computes (attn_sm90::vt_lanes, attn_sm90::swizzled_byte) over a staged V tile laid out as the TMA box writes
// it, against the V^T image the runtime's copy makes TMA write (tma_load_vt: boxes of kChunkVt keys x d rows, keys in
// the order of vt_key_order). One OK/FAIL line per tile shape and key order. (Run by test_fp8_vt_producer.py.)
#include <cstdio>
#include <cstdint>
#include <vector>
#include "attn_sm90.cuh"

static uint32_t host_prmt(uint32_t a, uint32_t b, uint32_t sel) {
  const uint64_t both = uint64_t(a) | (uint64_t(b) << 32);
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i) {
    const int pick = (sel >> (4 * i)) & 7;
    out |= uint32_t((both >> (8 * pick)) & 0xff) << (8 * i);
  }
  return out;
}

// the column (within 16 keys) of key k in V^T: natural: k; accumulator: key 8h + 2q + b at column 4q + 2h + b
static int vt_col(int k, bool acc) {
  if (!acc) return k;
  const int h = (k % 16) / 8, q = (k % 8) / 2, b = k % 2;
  return (k / 16) * 16 + 4 * q + 2 * h + b;
}

template <int kBlockN, int kHeadDimV, int kChunkStage, int kChunkVt, bool kAcc, int kWarps>
static bool check(int keys) {   // keys < kBlockN: the tile's last keys past the sequence, zeros in V^T
  std::vector<uint8_t> stage(kBlockN * kHeadDimV), vt(kBlockN * kHeadDimV, 0), want(kBlockN * kHeadDimV, 0);
  std::vector<int> written(kBlockN * kHeadDimV, 0);
  auto value = [](int key, int d) { return uint8_t((key * 131 + d * 7 + (key >> 3) * 17) & 0xff); };
  for (int key = 0; key < kBlockN; ++key)
    for (int d = 0; d < kHeadDimV; ++d) {
      stage[attn_sm90::swizzled_byte<kBlockN, kChunkStage>(key, d & ~15) + (d & 15)] = value(key, d);
      const int c = vt_col(key, kAcc);
      want[attn_sm90::swizzled_byte<kHeadDimV, kChunkVt>(d, c & ~15) + (c & 15)] = key < keys ? value(key, d) : 0;
    }
  if (keys < kBlockN)   // transpose_v_tile's zeros past the tile's keys, every thread's share
    for (int t = 0; t < 32 * kWarps; ++t)
      attn_sm90::zero_staged_rows<kBlockN, kHeadDimV, kChunkStage, 32 * kWarps>(stage.data(), keys, t);
  constexpr int kKeyGroups = kBlockN / 16;
  for (int warp = 0; warp < kWarps; ++warp) {
    for (int p = 0; p < kHeadDimV / 32; ++p)   // transpose_v_tile's walk
    for (int g = attn_sm90::vt_first_group<kKeyGroups, kWarps>(warp, p); g < kKeyGroups; g += kWarps) {
      uint32_t regs[32][4];
      // ldmatrix.x4.trans (16-bit elements): lane l addresses row l % 8 of matrix l / 8; lane 4r + q receives of
      // matrix m the elements (row 2q, column r) (low half) and (row 2q + 1, column r) (high half)
      int addr[32];
      for (int l = 0; l < 32; ++l) {
        const attn_sm90::VtLanes ln = attn_sm90::vt_lanes<kAcc>(l);
        addr[l] = attn_sm90::vt_stage_offset<kBlockN, kHeadDimV, kChunkStage, kChunkVt>(ln, g, p);
        if (addr[l] % 16) return false;
      }
      for (int l = 0; l < 32; ++l) {
        const int r = l / 4, q = l % 4;
        for (int m = 0; m < 4; ++m) {
          const uint8_t* row0 = &stage[addr[8 * m + 2 * q]];
          const uint8_t* row1 = &stage[addr[8 * m + 2 * q + 1]];
          regs[l][m] = uint32_t(row0[2 * r]) | (uint32_t(row0[2 * r + 1]) << 8) | (uint32_t(row1[2 * r]) << 16) |
                       (uint32_t(row1[2 * r + 1]) << 24);
        }
      }
      // prmt, then stmatrix.x4: lane l addresses row l % 8 of matrix l / 8; lane 4r + q's word m goes to row r of
      // matrix m, bytes 4q .. 4q + 3
      uint32_t out[32][4];
      int dst[32];
      for (int l = 0; l < 32; ++l) {
        const attn_sm90::VtLanes ln = attn_sm90::vt_lanes<kAcc>(l);
        out[l][0] = host_prmt(regs[l][0], regs[l][1], ln.sel_a);
        out[l][1] = host_prmt(regs[l][0], regs[l][1], ln.sel_b);
        out[l][2] = host_prmt(regs[l][2], regs[l][3], ln.sel_a);
        out[l][3] = host_prmt(regs[l][2], regs[l][3], ln.sel_b);
        dst[l] = attn_sm90::vt_tile_offset<kBlockN, kHeadDimV, kChunkStage, kChunkVt>(ln, g, p);
        if (dst[l] % 16) return false;
      }
      for (int l = 0; l < 32; ++l) {
        const int r = l / 4, q = l % 4;
        for (int m = 0; m < 4; ++m)
          for (int b = 0; b < 4; ++b) {
            const int at = dst[8 * m + r] + 4 * q + b;
            vt[at] = uint8_t(out[l][m] >> (8 * b));
            ++written[at];
          }
      }
    }
  }
  for (size_t i = 0; i < vt.size(); ++i)
    if (vt[i] != want[i] || written[i] != 1) return false;
  return true;
}

#define CHECK(N, D, CS, CV, ACC)                                                                            \
  std::printf("%s block_n %d d %d stage %d vt %d %s\n",                                                         \
              check<N, D, CS, CV, ACC, 3>(N) && check<N, D, CS, CV, ACC, 3>(1) && check<N, D, CS, CV, ACC, 3>(17) &&   \
                      check<N, D, CS, CV, ACC, 3>(N - 1) && check<N, D, CS, CV, ACC, 3>(N - 6)                      \
                  ? "OK"                                                                                       \
                  : "FAIL",                                                                                    \
              N, D, CS, CV, ACC ? "accumulator" : "natural")

// swizzled_byte against the byte images the kernels already use: the 64-byte swizzle of attn_sm90::sw64_offset (checked
// against CuTe's Layout_K_SW64_Atom by tests/translate), and the 128-byte one of the varlen epilogue (chunk j of row r
// at j ^ (r % 8)); the 32-byte one is CUTLASS's Swizzle<1, 4, 3> (bit 4 ^= bit 7).
static bool swizzles_agree() {
  for (int r = 0; r < 256; ++r) {
    for (int j = 0; j < 16; ++j) {
      if (attn_sm90::swizzled_byte<256, 64>(r, 16 * j) != 2 * attn_sm90::sw64_offset<256>(r, j)) return false;
      if (attn_sm90::swizzled_byte<256, 128>(r, 16 * j) != (j / 8) * 256 * 128 + r * 128 + (((j % 8) ^ (r % 8)) * 16))
        return false;
      const int b32 = (j / 2) * 256 * 32 + r * 32 + (j % 2) * 16;   // unswizzled byte, then bit 4 ^= bit 7
      if (attn_sm90::swizzled_byte<256, 32>(r, 16 * j) != (b32 ^ (((b32 >> 7) & 1) << 4))) return false;
    }
  }
  return true;
}

int main() {
  std::printf("%s swizzled_byte: the 128-, 64- and 32-byte swizzles\n", swizzles_agree() ? "OK" : "FAIL");
  for (int acc = 0; acc < 2; ++acc) {
    if (acc) {
      CHECK(64, 64, 64, 64, true); CHECK(128, 64, 64, 128, true); CHECK(160, 64, 64, 32, true);
      CHECK(192, 64, 64, 64, true); CHECK(128, 128, 128, 128, true); CHECK(224, 128, 128, 32, true);
      CHECK(256, 128, 128, 128, true);
    } else {
      CHECK(64, 64, 64, 64, false); CHECK(128, 64, 64, 128, false); CHECK(160, 64, 64, 32, false);
      CHECK(192, 64, 64, 64, false); CHECK(128, 128, 128, 128, false); CHECK(224, 128, 128, 32, false);
      CHECK(256, 128, 128, 128, false);
    }
  }
  return 0;
}
