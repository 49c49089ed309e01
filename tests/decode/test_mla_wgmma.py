"""The Hopper wgmma variant of the MLA split-d_v decode kernel (DecodeParams.mma = "sm90_wgmma",
translate/include/attn_decode_sm90.cuh) on the CPU: its validation reasons, the key and dict round trip, the
generated configuration (default sources untouched), and with nvcc the compiled kernel (no spills, 36 + 4
HGMMA, no wgmma serialisation) and (slow) a host check that the cp.async writes' swizzled layouts address the
bytes the GMMA views read and that each warpgroup's K / V descriptors are the other's shifted by its slice."""
import dataclasses
import re
import shutil
import sys
from pathlib import Path

import pytest

from hardware_profiles import load_profile
from tl.parser import parse
from translate.compiler import generate
from translate.decode import DecodeParams, default_decode_params, validate_decode
from translate.kernel import TranslationError
from kernel_abi.spec import KernelSpec

H100, A100 = load_profile("h100"), load_profile("a100")
SKETCHES = Path(__file__).resolve().parents[2] / "tl" / "sketches" / "decode"
MLA = KernelSpec("mla", 576, 512, True, "bf16", "paged", "decode")
GQA = KernelSpec("gqa", 128, 128, True, "bf16", "paged", "decode")
WG = dataclasses.replace(default_decode_params(MLA, 128), mma="sm90_wgmma")
HAVE_NVCC = shutil.which("nvcc") is not None


def kernel(params=WG, spec=MLA, profile=H100):
    return generate(parse((SKETCHES / f"mla_{spec.layout}.tl").read_text()).program, params, profile, spec)


def test_the_default_key_is_unchanged_and_wgmma_appends_a_suffix():
    assert DecodeParams().mma == "sm80" and default_decode_params(MLA, 128).mma == "sm80"
    assert default_decode_params(MLA, 128).key() == "dm64n64w4x2s2p_b2_sw3"
    assert WG.key() == "dm64n64w4x2s2p_b2_sw3_wg"
    assert DecodeParams.from_dict(WG.to_dict()) == WG
    with pytest.raises(ValueError, match="mma must be a string"):
        DecodeParams.from_dict({"mma": 90})


def test_the_wgmma_default_tile_is_legal_on_hopper_only():
    assert validate_decode(WG, H100, MLA) == []
    assert validate_decode(WG, load_profile("h200"), MLA) == []
    assert validate_decode(WG, H100, dataclasses.replace(MLA, layout="dense", causal=False, dtype="fp16")) == []
    assert any("sm_90a" in r for r in validate_decode(WG, A100, MLA))


@pytest.mark.parametrize("change,words", [
    ({"block_m": 16, "warps_m": 1, "warps_n": 4}, "block_m 64, block_n 64, warps 4 x 2"),
    ({"block_n": 32}, "block_m 64, block_n 64, warps 4 x 2"),
    ({"kv_stages": 3}, "per-block limit"),
    ({"swizzle": 2}, "swizzle 3"),
    ({"mma": "sm100"}, "mma must be one of"),
])
def test_illegal_wgmma_candidates_are_rejected_with_the_reason(change, words):
    reasons = validate_decode(dataclasses.replace(WG, **change), H100, MLA)
    assert any(words in r for r in reasons), reasons


def test_wgmma_needs_split_dv_with_v_from_k_and_q_in_shared_memory():
    assert any("V read from K" in r for r in validate_decode(WG, H100, GQA, split_dv=True))
    assert any("V read from K" in r for r in validate_decode(WG, H100, MLA, split_dv=False))
    assert any("reads Q from shared memory" in r for r in validate_decode(WG, H100, MLA, q_in_regs=True))
    with pytest.raises(TranslationError, match="sm_90a"):
        kernel(profile=A100)


def test_the_generated_source_is_the_wgmma_config():
    k = kernel()
    assert "_sw3_wg_dec" in k.name
    src = k.source
    assert '#include "attn_decode_sm90.cuh"' in src and "attn_decode::split_kv_wgmma<" in src
    assert "GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN / 2>, Int<kHeadDimQK>>>" in src
    assert "Shape<_64, Int<kHeadDimV / 2>, Int<kBlockN>>, GMMA::Major::K, GMMA::Major::MN>" in src
    assert "GMMA::Layout_MN_SW128_Atom<Element>" in src and "__launch_bounds__(256, 1)" in src
    assert "kSplitDV = true, kVFromK = true" in src and "kQInRegs = false" in src
    assert k.num_threads == 256 and k.smem_bytes == 229888 and k.smem_bytes <= H100.smem_per_block_bytes
    default = kernel(default_decode_params(MLA, 128))
    assert "wgmma" not in default.source and "attn_decode_sm90" not in default.source
    assert default.name.replace("_sw3_dec", "_sw3_wg_dec") == k.name


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    if not HAVE_NVCC:
        pytest.skip("nvcc not on PATH")
    from translate.nvcc import compile_kernels
    kernels = [kernel(), kernel(spec=dataclasses.replace(MLA, layout="dense", causal=False, dtype="fp16"))]
    out = tmp_path_factory.mktemp("mla_wgmma")
    return out, list(zip(kernels, compile_kernels(kernels, "sm_90a", cache_dir=out, jobs=1)))


@pytest.mark.slow
@pytest.mark.parametrize("which", [0, 1], ids=["paged_causal_bf16", "dense_fp16"])
def test_the_wgmma_kernel_compiles_without_spills_or_serialisation(compiled, which):
    from translate.sass import find_cuobjdump, sass_summary

    out, pairs = compiled
    k, result = pairs[which]
    assert result.ok, result.log[-2000:]
    assert result.spill_stores == 0 and result.spill_loads == 0, (result.registers, result.spill_stores)
    assert result.registers <= 232, result.registers     # 208 with nvcc 13.0 (2026-11-24)
    # ptxas says when it serialises the wgmma (C7510: a call or a register dependency between arrive and commit)
    assert "C7510" not in result.log and "serialized" not in result.log, result.log[-3000:]
    try:
        find_cuobjdump()
    except Exception:
        pytest.skip("cuobjdump not installed")
    cubin = out / f"wg{which}.cubin"
    cubin.write_bytes(result.cubin)
    main = sass_summary(cubin, k.name)
    # one wgmma batch per GEMM a tile: 576 / 16 k-steps of Q.K^T, 64 / 16 of P.V; no mma.sync, no ldmatrix
    assert main["HGMMA"] == 576 // 16 + 64 // 16, main
    assert main["HMMA"] == 0 and main["LDSM"] == 0 and main["LDGSTS"] > 0
    assert sass_summary(cubin, k.name + "_combine")["instructions"] > 0


def host_program(k, check: str) -> str:
    """A host program of ``check`` (C++ using ``Cfg``) over the configuration namespace of generated kernel ``k``
    (tests/decode/test_mla_seesaw.py uses it too)."""
    ns = k.body[:k.body.index("}  // namespace") + len("}  // namespace")]
    name = re.match(r"namespace (\S+) \{", ns).group(1)
    return ("#include <cstdio>\n#include <cute/tensor.hpp>\n#include \"attn_sm90.cuh\"\n" + ns + "\n"
            f"using Cfg = {name}::Cfg;\n" + check)


HOST_CHECK = r"""
using namespace cute;
using Element = Cfg::Element;
alignas(1024) static Element buf[1 << 17];
static unsigned units(const Element* p) { return unsigned((reinterpret_cast<uintptr_t>(p) >> 4) & 0x3FFF); }
template <class D> static unsigned start(D const& d) { return GmmaDescriptor(d).bitfield.start_address_; }
template <class D> static uint64_t rest(D const& d) {
  GmmaDescriptor x(d);
  x.bitfield.start_address_ = 0;
  return x.desc_;
}
// warpgroup 1's descriptors are warpgroup 0's (CuTe's partition of a tile at the buffer's start) at its slice's
// start; each k-block's start is the sub-tile's element (0, 16 kk) (on the host the base address reads as 0)
template <class Frag, class Sub>
static int check_desc(Frag const& f0, Frag const& f1, Sub const& s0, Sub const& s1, int layout_type) {
  int bad = 0;
  for (int kk = 0; kk < size<2>(f0); ++kk) {
    GmmaDescriptor d0(f0(0, 0, kk)), d1(f1(0, 0, kk));
    // (14-bit address fields: the difference modulo 2^14, as where the buffer starts is up to the loader)
    bad += start(d0) != ((units(&s0(0, 16 * kk)) - units(&s0(0, 0))) & 0x3FFF);
    bad += start(d1) != ((units(&s1(0, 16 * kk)) - units(&s1(0, 0))) & 0x3FFF);
    bad += rest(d0) != rest(d1) || int(d0.bitfield.layout_type_) != layout_type;
  }
  return bad;
}
int main() {
  int bad = 0;
  auto wq = make_tensor(make_smem_ptr(buf), Cfg::SmemLayoutQ{});
  auto gq = make_tensor(make_smem_ptr(buf), Cfg::GmmaLayoutQ{});
  for (int r = 0; r < Cfg::kBlockM; ++r)
    for (int c = 0; c < Cfg::kHeadDimQK; ++c) bad += &wq(r, c) != &gq(r, c);
  auto wk = make_tensor(make_smem_ptr(buf), Cfg::SmemLayoutK{});
  auto gk = make_tensor(make_smem_ptr(buf), Cfg::GmmaLayoutK{});
  auto gv = make_tensor(make_smem_ptr(buf), Cfg::GmmaLayoutVt{});
  for (int r = 0; r < Cfg::kBlockN; ++r)
    for (int c = 0; c < Cfg::kHeadDimQK; ++c) {
      bad += &wk(r, c) != &gk(r, c);
      if (c < Cfg::kHeadDimV) bad += &wk(r, c) != &gv(c, r);   // V^T is the K slot's first d_v columns
    }
  typename Cfg::TiledMmaQK mma_qk;
  typename Cfg::TiledMmaPV mma_pv;
  auto gp = make_tensor(make_smem_ptr(buf), Cfg::GmmaLayoutP{});
  for (int t = 0; t < 128; ++t) {
    auto thr_qk = mma_qk.get_thread_slice(t);
    auto thr_pv = mma_pv.get_thread_slice(t);
    using TK = Shape<Int<Cfg::kBlockN / 2>, Int<Cfg::kHeadDimQK>>;
    using TV = Shape<Int<Cfg::kHeadDimV / 2>, Int<Cfg::kBlockN>>;
    auto k0 = local_tile(gk, TK{}, make_coord(0, 0)), k1 = local_tile(gk, TK{}, make_coord(1, 0));
    auto v0 = local_tile(gv, TV{}, make_coord(0, 0)), v1 = local_tile(gv, TV{}, make_coord(1, 0));
    bad += check_desc(thr_qk.partition_fragment_B(k0), thr_qk.partition_fragment_B(k1), k0, k1, 1);
    bad += check_desc(thr_pv.partition_fragment_B(v0), thr_pv.partition_fragment_B(v1), v0, v1, 1);
    bad += check_desc(thr_qk.partition_fragment_A(gq), thr_qk.partition_fragment_A(gq), gq, gq, 1);
    bad += check_desc(thr_pv.partition_fragment_A(gp), thr_pv.partition_fragment_A(gp), gp, gp, 1);
  }
  std::printf("%s wgmma decode layouts (%d mismatches)\n", bad ? "FAIL" : "OK", bad);
  return bad ? 1 : 0;
}
"""


@pytest.mark.slow
def test_the_cp_async_writes_land_where_the_gmma_views_read(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "translate"))
    from host_checks import run_host_checks
    run_host_checks(host_program(kernel(), HOST_CHECK), "mla_wgmma_layouts", tmp_path, 1, opt="-O0", arch="sm_90a")
