"""MLA absorbed decode (576/512, one latent KV head, V = the first 512 columns of K's rows) on the CPU: the sketch
chooses split-d_v mode, the parameters' reasons, the shared-memory count, the defaults, and (with nvcc) the
compiled kernels of both default configs: no spills, cp.async gathers, ldmatrix and tensor-core MMAs."""
import dataclasses
import shutil
from pathlib import Path

import pytest

from hardware_profiles import load_profile
from tl.parser import parse
from translate.compiler import generate
from translate.decode import DecodeParams, decode_smem_bytes, default_decode_params, v_from_k, validate_decode
from translate.kernel import TranslationError
from kernel_abi.spec import KernelSpec

H100 = load_profile("h100")
SKETCHES = Path(__file__).resolve().parents[2] / "tl" / "sketches" / "decode"
MLA_TEXT = (SKETCHES / "mla_paged.tl").read_text()
MLA = KernelSpec("mla", 576, 512, True, "bf16", "paged", "decode")
GQA = KernelSpec("gqa", 128, 128, True, "bf16", "paged", "decode")
H128, H16 = default_decode_params(MLA, 128), default_decode_params(MLA, 16)
HAVE_NVCC = shutil.which("nvcc") is not None


def kernel(text=MLA_TEXT, params=H128, spec=MLA):
    return generate(parse(text).program, params, H100, spec)


def test_defaults_gqa_unchanged_and_mla_per_head_count():
    assert default_decode_params(GQA) == DecodeParams()
    assert (H128.block_m, H128.warps_m, H128.warps_n, H128.block_n, H128.kv_stages) == (64, 4, 2, 64, 2)
    assert (H16.block_m, H16.warps_m, H16.warps_n, H16.block_n, H16.kv_stages) == (16, 1, 4, 64, 2)
    assert validate_decode(H128, H100, MLA) == [] and validate_decode(H16, H100, MLA) == []
    a100 = load_profile("a100")
    assert validate_decode(default_decode_params(MLA, 128, a100), a100, MLA) == []
    assert default_decode_params(MLA, 128, a100).block_n == 32 and default_decode_params(MLA, 128, a100).mma == "sm80"
    # Hopper: the 128-head tile on warpgroup MMAs out of step; the 16-head one (16 rows: no wgmma) stays on mma.sync
    assert default_decode_params(MLA, 128, H100) == dataclasses.replace(H128, mma="sm90_seesaw", kv_load="tma",
                                                                       rescale_threshold=8)
    assert default_decode_params(MLA, 16, H100) == H16
    assert v_from_k(MLA) and not v_from_k(GQA)


def test_shared_memory_is_q_the_k_ring_without_v_and_the_p_tile():
    # hq 128: Q 64 x 576, 2 stages of 64 K rows (no V ring), the P tile 64 x 64, the max exchange 2 x 64 fp32
    assert decode_smem_bytes(H128, MLA) == 64 * 576 * 2 + 2 * 64 * 576 * 2 + 64 * 64 * 2 + 2 * 64 * 4 == 229888
    assert decode_smem_bytes(H128, MLA) <= H100.smem_per_block_bytes
    assert decode_smem_bytes(H16, MLA) == 16 * 576 * 2 + 2 * 64 * 576 * 2 + 16 * 64 * 2 + 4 * 16 * 4
    # the merge buffer (one fp32 O tile, a max and a sum per group and row; from the start: Q is dead too) when it
    # outgrows Q and the ring
    p = DecodeParams(block_m=64, block_n=16, warps_m=4, warps_n=1, kv_stages=2)
    assert decode_smem_bytes(p, MLA) == 64 * 512 * 4 + 64 * 2 * 4
    assert decode_smem_bytes(DecodeParams(), GQA) == 16 * 128 * 2 + 3 * 64 * 256 * 2     # GQA: as before


@pytest.mark.parametrize("params,words", [
    (DecodeParams(block_m=64, block_n=64, warps_m=4, warps_n=2, kv_stages=3), "per-block limit"),
    (DecodeParams(block_m=64, block_n=64, warps_m=4, warps_n=1, kv_stages=2), "registers per thread"),
    (DecodeParams(block_m=16, block_n=96, warps_m=1, warps_n=2, kv_stages=2), "multiple of 64"),
])
def test_illegal_mla_candidates_are_rejected_with_the_reason(params, words):
    reasons = validate_decode(params, H100, MLA)
    assert any(words in r for r in reasons), reasons


def test_mla_decode_is_the_absorbed_form_and_needs_the_split_dv_flow():
    assert any("absorbed" in r for r in validate_decode(H16, H100, KernelSpec("mla", 192, 128, True, "bf16", "paged",
                                                                               "decode")))
    # the column-group flow (P reshaped in registers) keeps all 512 columns of O in every warp: refused
    reasons = validate_decode(H16, H100, MLA, split_dv=False)
    assert any("registers per thread" in r for r in reasons), reasons
    gqa_flow = (SKETCHES / "gqa_paged.tl").read_text()
    with pytest.raises(TranslationError, match="registers per thread"):
        kernel(gqa_flow, H16)


def test_the_sketch_chooses_split_dv_and_v_from_k():
    k = kernel()
    assert "kSplitDV = true, kVFromK = true" in k.source and "SmemLayoutP" in k.source
    assert "kQInRegs = false" in k.source and k.smem_bytes == 229888 and k.num_threads == 256
    gqa = generate(parse((SKETCHES / "gqa_paged.tl").read_text()).program, DecodeParams(), H100, GQA)
    assert "kSplitDV = false, kVFromK = false" in gqa.source and "SmemLayoutP" not in gqa.source


def test_split_dv_for_gqa_when_its_sketch_sends_p_through_shared_memory():
    # the flow is the sketch's: a GQA kernel may take it too (V stays a ring of its own)
    k = kernel(MLA_TEXT.replace("HeadDimQK", "HeadDim").replace("HeadDimV", "HeadDim"), DecodeParams(), GQA)
    assert "kSplitDV = true, kVFromK = false" in k.source
    assert k.smem_bytes == decode_smem_bytes(DecodeParams(), GQA, split_dv=True)


def test_without_the_p_copy_the_loop_needs_its_reshape():
    text = MLA_TEXT.replace("    Copy P from register to shared\n", "").replace("GEMM P_shared", "GEMM P")
    with pytest.raises(TranslationError, match="Reshape"):
        kernel(text)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    if not HAVE_NVCC:
        pytest.skip("nvcc not on PATH")
    from translate.nvcc import compile_kernels
    kernels = [kernel(params=H128), kernel(params=H16)]
    out = tmp_path_factory.mktemp("mla")
    return out, list(zip(kernels, compile_kernels(kernels, "sm_90a", cache_dir=out, jobs=2)))


@pytest.mark.slow
@pytest.mark.parametrize("which", [0, 1], ids=["h128_w4x2", "h16_w1x4"])
def test_the_mla_kernels_compile_without_spills_with_ldgsts_ldsm_hmma(compiled, which):
    from translate.sass import find_cuobjdump, sass_summary

    out, pairs = compiled
    k, result = pairs[which]
    assert result.ok, result.log[-2000:]
    assert result.spill_stores == 0 and result.spill_loads == 0, (result.registers, result.spill_stores)
    assert result.registers <= 255
    try:
        find_cuobjdump()
    except Exception:
        pytest.skip("cuobjdump not installed")
    cubin = out / f"{which}.cubin"
    cubin.write_bytes(result.cubin)
    main = sass_summary(cubin, k.name)
    assert main["LDGSTS"] > 0 and main["HMMA"] > 0 and main["LDSM"] > 0
    assert sass_summary(cubin, k.name + "_combine")["instructions"] > 0
