"""The out-of-step ("seesaw") variant of the Hopper MLA decode kernel (DecodeParams.mma = "sm90_seesaw",
translate/include/attn_decode_sm90_seesaw.cuh) on the CPU: its validation reasons, key, shared-memory plan and
generated configuration, and with nvcc the compiled kernel: no spills, no wgmma serialisation, the score GEMM as
SS wgmmas plus RS ones for Q's last chunk, mbarrier waits instead of cp.async group waits. Its results are checked
on a GPU by tests/gpu/test_mla_decode_gpu.py (the decode gate). A host check (slow) proves the shared-memory
claims the kernel rests on: the cp.async views are the GMMA views, P1 addresses exactly Q's last chunk, and the
register copy of that chunk reads each element once."""
import dataclasses
import re
from pathlib import Path

import pytest

from hardware_profiles import load_profile
from translate.decode import DecodeParams, default_decode_params, validate_decode
from translate.decode.params import decode_smem_bytes
from translate.kernel import TranslationError

# the wgmma tests' profiles, spec, generator and host-program builder
from test_mla_wgmma import A100, H100, HAVE_NVCC, MLA, host_program, kernel as wgmma_kernel  # noqa: E402

SEESAW = dataclasses.replace(default_decode_params(MLA, 128), mma="sm90_seesaw")
# HGMMAs of every seesaw build. Scores: 32 SS + 4 RS k-steps a tile, issued in the prologue by each warpgroup and once
# in each one's loop body; P.V: 4 RS (own P) + 4 SS (the other's P) in each loop body
SEESAW_HGMMAS = 2 * 36 + 2 * (36 + 8)


def kernel(params=SEESAW, spec=MLA, profile=H100):
    return wgmma_kernel(params, spec, profile)


def test_the_key_names_the_schedule_and_round_trips():
    assert SEESAW.key() == "dm64n64w4x2s2p_b2_sw3_ss"
    assert DecodeParams.from_dict(SEESAW.to_dict()) == SEESAW


def test_the_seesaw_is_legal_on_hopper_only_with_two_slots():
    assert validate_decode(SEESAW, H100, MLA) == []
    assert validate_decode(SEESAW, load_profile("h200"), dataclasses.replace(MLA, layout="dense")) == []
    assert any("sm_90a" in r for r in validate_decode(SEESAW, A100, MLA))
    assert any("kv_stages 2" in r for r in validate_decode(dataclasses.replace(SEESAW, kv_stages=3), H100, MLA))
    assert any("block_m 64, block_n 64" in r
               for r in validate_decode(dataclasses.replace(SEESAW, block_n=32), H100, MLA))
    with pytest.raises(TranslationError, match="sm_90a"):
        kernel(profile=A100)


def test_shared_memory_holds_q_two_slots_and_one_p_tile():
    # Q 72 KB + two 72 KB slots + P0 8 KB + max and two scales (64 fp32 each) + 4 mbarriers; P1 reuses Q's last
    # chunk, which is what keeps it under the 227 KB of an H100 block
    assert decode_smem_bytes(SEESAW, MLA) == 3 * 64 * 576 * 2 + 64 * 64 * 2 + 3 * 64 * 4 + 32 == 230176
    assert decode_smem_bytes(SEESAW, MLA) <= H100.smem_per_block_bytes
    assert decode_smem_bytes(SEESAW, MLA) + 64 * 64 * 2 > H100.smem_per_block_bytes   # no room for a second P tile


def test_the_generated_source_is_the_seesaw_config():
    k = kernel()
    src = k.source
    assert '#include "attn_decode_sm90_seesaw.cuh"' in src and "attn_decode::split_kv_seesaw<" in src
    assert "GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, _64>>" in src
    assert "GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, _64>>" in src
    assert "Shape<_64, Int<kHeadDimV / 2>, Int<kBlockN>>, GMMA::Major::K, GMMA::Major::MN>" in src
    assert k.smem_bytes == 230176 and k.num_threads == 256 and "_sw3_ss_dec" in k.name
    wg = kernel(dataclasses.replace(SEESAW, mma="sm90_wgmma"))
    assert "seesaw" not in wg.source and "split_kv_wgmma<" in wg.source


def compile_one(tmp_path_factory, k, tag):
    """(folder, kernel, CompileResult) of ``k`` compiled for sm_90a into a fresh folder; skipped without nvcc."""
    if not HAVE_NVCC:
        pytest.skip("nvcc not on PATH")
    from translate.nvcc import compile_kernels
    out = tmp_path_factory.mktemp(tag)
    return out, k, compile_kernels([k], "sm_90a", cache_dir=out, jobs=1)[0]


def clean_sass(compiled, tag):
    """The checks every seesaw build passes (compiled, no spills, no wgmma serialisation), then (its SASS summary,
    its cubin's path); skipped without cuobjdump."""
    from translate.sass import find_cuobjdump, sass_summary

    out, k, result = compiled
    assert result.ok, result.log[-2000:]
    assert result.spill_stores == 0 and result.spill_loads == 0, (result.registers, result.spill_stores)
    assert "C7510" not in result.log and "serialized" not in result.log, result.log[-3000:]
    try:
        find_cuobjdump()
    except Exception:
        pytest.skip("cuobjdump not installed")
    cubin = out / f"{tag}.cubin"
    cubin.write_bytes(result.cubin)
    return sass_summary(cubin, k.name), cubin


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return compile_one(tmp_path_factory, kernel(), "mla_seesaw")


@pytest.mark.slow
def test_the_seesaw_compiles_without_spills_or_serialisation(compiled):
    k = compiled[1]
    sass, cubin = clean_sass(compiled, "seesaw")
    assert sass["HGMMA"] == SEESAW_HGMMAS, sass
    assert sass["HMMA"] == 0 and sass["LDGSTS"] > 0, sass
    # the gathers signal mbarriers (cp.async.mbarrier.arrive) that the warpgroups try-wait on; the only cp.async
    # group wait is Q's, once
    from translate.sass import sass_instructions
    lines = sass_instructions(cubin)[k.name]
    assert sum("SYNCS.PHASECHK" in line for line in lines) >= 8, "no mbarrier waits"
    # warpgroup 0 tests once a pair, without spinning (mbarrier.test_wait), whether its next tile's left half has
    # landed, to choose what goes first: that tile's score wgmmas or the odd tile's reload (BENCHMARKS.md 2026-11-26)
    # (unpredicated: a spin loop's retry after a try-wait is a predicated test)
    assert sum(re.match(r"\s*SYNCS\.PHASECHK\.TRANS64\s", line) is not None for line in lines) == 1
    # (and the output's bulk copies are waited for once, before the CTA exits)
    assert sum("DEPBAR.LE SB0" in line for line in lines) == 2, "more than Q's and the output's group waits"
    # the descriptors stay in uniform registers (a warp-uniform wg): no wgmma waits on an R2UR (there were 725)
    from translate.sass import wgmmas_fed_by_r2ur
    assert not wgmmas_fed_by_r2ur(lines), wgmmas_fed_by_r2ur(lines)[:3]
    # the output leaves the staging tile by bulk copies (the TMA unit), bf16 rows and fp32 partial rows; the only
    # global stores of the threads are the log-sum-exps (the old store wrote O one 2-byte element at a time)
    assert sum("UBLKCP.G.S" in line for line in lines) >= 2, "the output rows are not bulk copies"
    assert sum(re.search(r"\bSTG[.\s]", line) is not None for line in lines) <= 2, "threads store O"
    # the phase stamps of scripts/decode_trace.py are compiled in only with -DATTN_DECODE_TRACE
    assert not any("GLOBALTIMER" in line for line in lines), "trace stamps in the measured kernel"
    assert not any("SR_CLOCK" in line for line in lines), "wait sums (-DATTN_DECODE_WAITS) in the measured kernel"


@pytest.mark.slow
def test_the_combine_keeps_its_loads_in_flight_in_compact_code(compiled):
    """The combine kernel (attn_decode.cuh combine): partial rows loaded 8 float4s a lane before their sums, no local
    memory, and small code (its loops unrolled, 2.5k instructions, made batch 8-32 calls 0.96-0.98x)."""
    from translate.sass import sass_instructions

    k = compiled[1]
    _, cubin = clean_sass(compiled, "seesaw_combine")
    lines = sass_instructions(cubin)[k.name + "_combine"]
    assert not any(re.search(r"\b(LDL|STL)\b", line) for line in lines), "the combine spills"
    assert len(lines) < 1500, len(lines)
    longest = run = 0
    for line in lines:   # the longest run of 16-byte loads with no sum between them
        if "LDG.E.128" in line:
            run += 1
            longest = max(longest, run)
        elif "FFMA" in line:
            run = 0
    assert longest >= 8, longest


HOST_CHECK = r"""
using namespace cute;
using Element = Cfg::Element;
alignas(1024) static Element buf[1 << 17];
static int seen[64 * 576];
int main() {
  int bad = 0;
  constexpr int kLast = Cfg::kHeadDimQK - 64;   // Q's last chunk: its first column
  auto gq = make_tensor(make_smem_ptr(buf), Cfg::GmmaLayoutQ{});
  auto wq = make_tensor(make_smem_ptr(buf), Cfg::SmemLayoutQ{});
  auto gk = make_tensor(make_smem_ptr(buf), Cfg::GmmaLayoutK{});
  auto wk = make_tensor(make_smem_ptr(buf), Cfg::SmemLayoutK{});
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < Cfg::kHeadDimQK; ++c) { bad += &wq(r, c) != &gq(r, c); bad += &wk(r, c) != &gk(r, c); }
  // the score GEMM's chunks: chunk c of the flat_divide is columns [64 c, 64 c + 64)
  auto qc = flat_divide(gq, Shape<_64, _64>{})(_, _, _0{}, _);
  for (int c = 0; c < Cfg::kHeadDimQK / 64; ++c)
    for (int r = 0; r < 64; ++r)
      for (int k = 0; k < 64; ++k) bad += &qc(r, k, c) != &gq(r, 64 * c + k);
  // P1 lives in Q's last chunk: the P tile's layout at that chunk's start addresses exactly its elements
  auto gp1 = make_tensor(make_smem_ptr(buf + (Cfg::kHeadDimQK / 64 - 1) * 64 * 64), Cfg::GmmaLayoutP{});
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < 64; ++c) bad += &gp1(r, c) != &gq(r, kLast + c);
  // the register copy of that chunk (the RS score k-steps' A operand) reads each of its elements exactly once
  typename Cfg::TiledMmaQKrs mma_rs;
  for (int t = 0; t < 128; ++t) {
    auto part = mma_rs.get_thread_slice(t).partition_A(qc(_, _, Cfg::kHeadDimQK / 64 - 1));
    for (int i = 0; i < size(part); ++i) ++seen[&part(i) - &gq(0, 0)];
  }
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < 64; ++c) bad += seen[&gq(r, kLast + c) - &gq(0, 0)] != 1;
  std::printf("%s seesaw decode layouts (%d mismatches)\n", bad ? "FAIL" : "OK", bad);
  return bad ? 1 : 0;
}
"""


@pytest.mark.slow
def test_p1_lives_in_q_last_chunk_which_the_registers_hold_whole(tmp_path):
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "translate"))
    from host_checks import run_host_checks

    run_host_checks(host_program(kernel(), HOST_CHECK), "mla_seesaw_layouts", tmp_path, 1, opt="-O0", arch="sm_90a")


STAGING_CHECK = r"""
#include "attn_decode_sm90_output.cuh"
using namespace cute;
int main() {
  constexpr int kDV = Cfg::kHeadDimV, kDVW = kDV / 2, kStride = attn_decode::seesaw::kStageStride<kDV>;
  typename Cfg::TiledMmaPV mma;
  auto ident = make_identity_tensor(Shape<_64, Int<kDVW>>{});
  int bad = 0, stores = 0;
  bad += (kStride * 2) % 16 != 0;   // bf16 rows start 16-byte aligned (the read-out is 16 bytes a thread)
  for (int wg = 0; wg < 2; ++wg) {
    for (int warp = 0; warp < 4; ++warp) {
      auto c0 = mma.get_thread_slice(0).partition_C(ident);
      for (int i = 0; i < size(c0); i += 2) {   // one store instruction of the warp: a register pair a lane
        unsigned bf16_banks = 0, fp32_banks[2] = {0, 0};
        for (int lane = 0; lane < 32; ++lane) {
          auto c = mma.get_thread_slice(warp * 32 + lane).partition_C(ident);
          const int row = get<0>(c(i)), col = wg * kDVW + get<1>(c(i));
          bad += get<0>(c(i + 1)) != row || get<1>(c(i + 1)) != get<1>(c(i)) + 1;   // neighbouring columns
          const int e = row * kStride + col;
          const unsigned bank = (e / 2) % 32;   // bf16: one 32-bit word a lane, all 32 in distinct banks
          bad += (bf16_banks >> bank) & 1;
          bf16_banks |= 1u << bank;
          const unsigned b0 = e % 32, b1 = (e + 1) % 32;   // fp32: two words a lane, distinct within a half-warp
          unsigned& seen = fp32_banks[lane / 16];
          bad += ((seen >> b0) & 1) + ((seen >> b1) & 1);
          seen |= (1u << b0) | (1u << b1);
        }
        ++stores;
      }
    }
  }
  std::printf("%s seesaw staging stores conflict-free (%d stores, %d conflicts)\n", bad ? "FAIL" : "OK", stores, bad);
  return bad ? 1 : 0;
}
"""


@pytest.mark.slow
def test_the_output_staging_rows_take_the_accumulator_stores_without_bank_conflicts(tmp_path):
    """The staging tile's padded rows (seesaw::kStageStride): every store of the accumulator layout (a warp: 8 rows
    x 4 column pairs) lands in distinct banks, bf16 and fp32 (the unpadded tile had 8-way conflicts)."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "translate"))
    from host_checks import run_host_checks

    run_host_checks(host_program(kernel(), STAGING_CHECK), "mla_seesaw_staging", tmp_path, 1, opt="-O0",
                    arch="sm_90a")
