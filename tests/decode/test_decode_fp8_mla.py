"""Absorbed-MLA decode over an FP8 (e4m3) latent cache, without a GPU: the spec and parameter rules (the split-d_v
mma.sync kernel only, its gather's rule), the defaults, the generated source (attn_decode_fp8_mla.cuh, fp16 GEMMs,
the scales' argument), and the layout its reads rely on, mirrored from attn_decode_fp8_mla.cuh (the two regions of a
slot, the gather, the offsets rebuilt from eight bases, conflict-free 32-bit reads); with nvcc (slow) the CuTe
fragments of its tile shapes and the compiled defaults (no spills, the expected MMAs, ldmatrix and cp.async)."""
import dataclasses
import shutil
from pathlib import Path

import pytest

from hardware_profiles import load_profile
from kernel_abi.spec import KernelSpec, kv_dtype_errors
from tl.parser import parse
from translate.compiler import generate
from translate.decode import DecodeParams, validate_decode
from translate.decode.params import decode_smem_bytes, default_decode_params
from translate.kernel import TranslationError

H100, H200, A100 = load_profile("h100"), load_profile("h200"), load_profile("a100")
SKETCHES = Path(__file__).resolve().parents[2] / "tl" / "sketches" / "decode"
MLA8 = KernelSpec("mla", 576, 512, True, "bf16", "paged", "decode", kv_dtype="fp8")
MLA16 = KernelSpec("mla", 576, 512, True, "bf16", "paged", "decode")
H128 = DecodeParams(block_m=64, block_n=64, warps_m=4, warps_n=2, kv_stages=3)
H16 = DecodeParams(block_m=16, block_n=64, warps_m=1, warps_n=4, kv_stages=2)


def kernel(spec=MLA8, params=H128, sketch="mla_paged.tl", profile=H200):
    return generate(parse((SKETCHES / sketch).read_text()).program, params, profile, spec)


def test_the_spec_is_accepted_and_named():
    assert kv_dtype_errors(MLA8) == []
    assert MLA8.label() == "mla_d576x512_causal_bf16_kvfp8_paged_decode"
    assert any("absorbed" in e for e in validate_decode(H128, H100, dataclasses.replace(MLA8, d_qk=192, d_v=128)))


def test_defaults_take_the_16_bit_tiles_with_deeper_rings_and_fit_every_profile():
    assert default_decode_params(MLA8, 128, H100) == H128 and default_decode_params(MLA8, None, H200) == H128
    assert default_decode_params(MLA8, 16, H100) == H16
    for hq in (16, 128):
        for profile in (H100, H200, A100):
            p = default_decode_params(MLA8, hq, profile)
            assert p.mma == "sm80" and p.kv_load == "gather" and not p.rescale_threshold
            assert validate_decode(p, profile, MLA8) == [], (hq, profile.name)
    assert default_decode_params(MLA8, 128, A100).kv_stages == 2 and default_decode_params(MLA8, 16, A100).kv_stages == 2
    # 16 heads: two CTAs an SM on Hopper (228 KB of shared memory an SM, 1 KB reserved a CTA)
    assert 2 * (decode_smem_bytes(H16, MLA8) + 1024) <= 228 * 1024
    # the 16-bit MLA defaults are untouched (Hopper: the seesaw at 128 heads)
    assert default_decode_params(MLA16, 128, H100).mma == "sm90_seesaw"


def test_shared_memory_is_q_the_e4m3_ring_and_the_p_tile():
    # Q 64 x 576 16-bit, 3 slots of 64 x 576 bytes, P 64 x 64 fp16, the max exchange 2 x 64 fp32
    assert decode_smem_bytes(H128, MLA8) == 64 * 576 * 2 + 3 * 64 * 576 + 64 * 64 * 2 + 2 * 64 * 4
    assert decode_smem_bytes(H16, MLA8) == 16 * 576 * 2 + 2 * 64 * 576 + 16 * 64 * 2 + 4 * 16 * 4
    assert kernel().smem_bytes == decode_smem_bytes(H128, MLA8)


@pytest.mark.parametrize("params,words", [
    (dataclasses.replace(H128, mma="sm90_seesaw", kv_load="tma", kv_stages=2), "mma.sync gather kernels"),
    (dataclasses.replace(H128, mma="sm90_wgmma", kv_stages=2), "read K and V from shared memory as 16-bit"),
    (DecodeParams(block_m=64, block_n=32, warps_m=4, warps_n=2, kv_stages=2), None),
])
def test_what_the_fp8_latent_kernel_cannot_take_is_refused_by_name(params, words):
    errors = validate_decode(params, H200, MLA8)
    if words is None:
        assert errors == []
    else:
        assert any(words in e for e in errors), errors


def test_column_groups_are_refused_over_a_latent_cache():
    errors = validate_decode(H16, H200, MLA8, split_dv=False)
    assert any("split-d_v (P through shared memory), not column groups" in e for e in errors)


def test_the_source_runs_the_fp8_latent_kernel_with_fp16_gemms_and_takes_the_scales():
    k = kernel()
    src = k.source
    assert '#include "attn_decode_fp8_mla.cuh"' in src and '#include "attn_decode.cuh"' not in src
    assert "const attn_decode::Args args, const attn_decode::KvScales scales)" in src
    assert "attn_decode::split_kv_fp8_mla<" in src and "(args, scales, smem)" in src
    assert "kSplitDV = true, kVFromK = true" in src and "SmemLayoutP" in src and "kQInRegs = false" in src
    assert "using Element = cutlass::bfloat16_t;" in src and "SM80_16x8x16_F32F16F16F32_TN" in src
    assert k.meta()["args"] == [["args", "struct:attn_decode::Args"], ["scales", "struct:attn_decode::KvScales"]]
    assert k.meta()["spec"]["kv_dtype"] == "fp8" and "kvfp8" in k.name and k.num_threads == 256
    dense = kernel(dataclasses.replace(MLA8, layout="dense"), sketch="mla_dense.tl")
    assert "kPaged = false" in dense.source and "split_kv_fp8_mla<" in dense.source
    plain = kernel(MLA16, DecodeParams(block_m=64, block_n=64, warps_m=4, warps_n=2, kv_stages=2))
    assert "split_kv<" in plain.source and "fp8" not in plain.source and "KvScales" not in plain.source


def test_the_grouped_flow_is_refused_for_the_latent_cache():
    with pytest.raises(TranslationError, match="registers per thread|column groups"):
        kernel(params=H16, sketch="gqa_paged.tl")


# ---- the launcher's arguments (tuner/serving/launch/decode_kernel.py), checked before anything reaches a GPU ----

def _launcher():
    from types import SimpleNamespace

    from tuner.serving.launch.decode_kernel import DecodeKernel

    return DecodeKernel(SimpleNamespace(meta=kernel().meta(), device_index=0), None)


def test_the_launcher_reads_k_scale_for_v_and_refuses_another_v_scale_by_name():
    """V is the latent rows: v_scale None or k_scale itself (the scales then pass their checks and the CPU tensors
    are the next refusal); another tensor, a missing or malformed k_scale, each named."""
    import torch

    q = torch.zeros(2, 1, 16, 576, dtype=torch.bfloat16)
    cache = torch.zeros(4, 64, 1, 576, dtype=torch.float8_e4m3fn)
    ks = torch.ones(1)
    with pytest.raises(ValueError, match="v_scale: absorbed MLA reads V from k_cache's latent rows"):
        _launcher()(q, cache, None, k_scale=ks, v_scale=ks.clone())
    with pytest.raises(ValueError, match="k_scale is missing"):
        _launcher()(q, cache, None)
    with pytest.raises(ValueError, match="k_scale must be fp32"):
        _launcher()(q, cache, None, k_scale=ks.half())
    with pytest.raises(ValueError, match=r"k_scale must have shape \(\) or \(1,\)"):
        _launcher()(q, cache, None, k_scale=torch.ones(2))
    for v_scale in (None, ks):
        with pytest.raises(ValueError, match="must be a CUDA torch tensor"):
            _launcher()(q, cache, None, k_scale=ks, v_scale=v_scale)


# ---- the layout attn_decode_fp8_mla.cuh reads (its functions and attn_decode_fp8.cuh's, in Python) ----

DV, ROPE = 512, 64


def fp8_off(row_bytes, row, col):
    sw = (row >> 1) & 3 if row_bytes == 64 else row & 7
    return row * row_bytes + (col ^ (sw << 4))


def pv_col(n):
    return (n & ~31) | ((n & 7) << 2) | ((n >> 3) & 3)


@pytest.mark.parametrize("block_n,warps", [(64, 8), (64, 4), (32, 8), (128, 4)])
def test_the_gather_writes_every_chunk_of_both_regions_once_from_its_own_row(block_n, warps):
    """load_latent_fp8: lane = (row lane / 8 of 4, chunk lane % 8); the latent's four 128-byte blocks, then chunk
    c < 4 of the rotary part. Every destination byte range of the slot is written once, by the chunk of its row."""
    written = {}
    for warp in range(warps):
        for lane in range(32):
            c = lane % 8
            for k in range(block_n // (4 * warps)):
                r = 4 * (warp + warps * k) + lane // 8
                for blk in range(DV // 128):
                    dst = fp8_off(DV, r, c * 16) + blk * 128
                    assert dst not in written
                    written[dst] = (r, blk * 128 + c * 16)            # (row, source byte)
                if c < ROPE // 16:
                    dst = block_n * DV + fp8_off(ROPE, r, c * 16)
                    assert dst not in written
                    written[dst] = (r, DV + c * 16)
    assert sorted(written) == list(range(0, block_n * (DV + ROPE), 16))
    for dst, (r, src) in written.items():   # the reads below find source byte src of row r there
        if dst < block_n * DV:
            assert dst == fp8_off(DV, r, src)
        else:
            assert dst == block_n * DV + fp8_off(ROPE, r, src - DV)


@pytest.mark.parametrize("keys_per_group,groups", [(32, 2), (16, 4)])
def test_k_reads_are_rebuilt_from_eight_bases_and_free_of_bank_conflicts(keys_per_group, groups):
    """k_off[ki % 8] + 128 (ki / 8) is byte 16 ki + 4 (lane % 4) of key n (latent), r_off the rotary blocks; n-block
    ni adds 8 ni rows; the 32 lanes of one read hit 32 banks."""
    block_n = keys_per_group * groups
    for wg in range(groups):
        for ki in range(576 // 16):
            for ni in range(keys_per_group // 8):
                banks = set()
                for lane in range(32):
                    n, t = wg * keys_per_group + 8 * ni + lane // 4, lane % 4
                    if ki < DV // 16:
                        base = fp8_off(DV, wg * keys_per_group + lane // 4, 16 * (ki % 8) + 4 * t)
                        got = base + 128 * (ki // 8) + ni * 8 * DV
                        assert got == fp8_off(DV, n, 16 * ki + 4 * t)
                    else:
                        j = ki - DV // 16
                        base = block_n * DV + fp8_off(ROPE, wg * keys_per_group + lane // 4, 16 * j + 4 * t)
                        got = base + ni * 8 * ROPE
                        assert got == block_n * DV + fp8_off(ROPE, n, 16 * j + 4 * t)
                    banks.add(got // 4 % 32)
                assert len(banks) == 32


@pytest.mark.parametrize("warps_n", [1, 2, 4])
def test_v_reads_of_a_groups_slice_are_rebuilt_from_four_bases_and_free_of_bank_conflicts(warps_n):
    """The P V GEMM of group wg: columns wg * d_v / warps_n + pv_col(n); word group m's offset is v_off[m % 4] + 128
    (m / 4); every read (one of the lane's four keys) hits 32 banks."""
    dvw = DV // warps_n
    for wg in range(warps_n):
        for m in range(dvw // 32):
            for e in (0, 1, 8, 9):
                banks = set()
                for lane in range(32):
                    cols = [wg * dvw + pv_col(8 * (4 * m + i) + lane // 4) for i in range(4)]
                    assert cols == list(range(cols[0], cols[0] + 4)) and cols[0] % 4 == 0
                    key = 2 * (lane % 4) + e
                    base_col = wg * dvw + pv_col(8 * (4 * (m % 4)) + lane // 4)
                    parity, plus = e % 2, (8 if e >= 8 else 0)
                    got = fp8_off(DV, 2 * (lane % 4) + parity, base_col) + 128 * (m // 4) + plus * DV
                    assert got == fp8_off(DV, key, cols[0])
                    banks.add(got // 4 % 32)
                assert len(banks) == 32


def test_q_groups_of_16_columns_are_two_whole_chunks_of_the_16_bit_swizzle():
    """q_to_fp16_qk_order reads a 16-column group as two 16-byte chunks: the Q tile's Swizzle<3, 3, 3> permutes
    8-column chunks, so columns 16 g .. 16 g + 7 and 16 g + 8 .. 16 g + 15 are each contiguous."""
    def swizzled(row, col):   # element offset in an 8 x 64 atom, Swizzle<3, 3, 3>
        off = (row % 8) * 64 + col % 64
        return off ^ (((off >> 6) & 7) << 3)
    for row in range(8):
        for g in range(4):
            for half in (0, 8):
                offs = [swizzled(row, 16 * g + half + j) for j in range(8)]
                assert offs == list(range(offs[0], offs[0] + 8)) and offs[0] % 8 == 0


@pytest.mark.slow
def test_the_mma_fragments_of_the_latent_tiles_are_laid_out_as_the_reads_assume(tmp_path):
    from mma_fragments import check_b_fragments

    check_b_fragments(tmp_path, ["Shape<_32, Int<576>>",   # K: a group's keys x d_qk (hq 128: 2 groups of 64 keys)
                                 "Shape<_16, Int<576>>",   # (hq 16: 4 groups)
                                 "Shape<_256, _64>",       # V^T: a group's d_v slice x the tile's keys
                                 "Shape<_128, _64>"], warps=(1, 4))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    from translate.nvcc import compile_kernels

    kernels = [kernel(params=H128), kernel(params=H16), kernel(dataclasses.replace(MLA8, dtype="fp16"), H128)]
    out = tmp_path_factory.mktemp("mla8")
    return out, list(zip(kernels, compile_kernels(kernels, "sm_90a", cache_dir=out, jobs=3)))


@pytest.mark.slow
@pytest.mark.parametrize("which,hmma", [(0, 36 * 4 + 4 * 32), (1, 36 * 2 + 4 * 16), (2, 36 * 4 + 4 * 32)],
                         ids=["h128_w4x2", "h16_w1x4", "h128_fp16"])
def test_the_fp8_latent_kernels_compile_without_spills(compiled, which, hmma):
    """No local memory; per tile and warp the score GEMM's 36 k-blocks x n-blocks of 8 keys and the P V GEMM's k-blocks
    x its slice's n-blocks of mma.sync, 36 ldmatrix of Q and 4 of P (one loop body: the MMAs appear once)."""
    from translate.sass import find_cuobjdump, sass_instructions, sass_summary

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
    if main is None:
        pytest.skip("cuobjdump not installed")
    assert main["HMMA"] == hmma and main["LDSM"] == 36 + 4 and main["LDGSTS"] > 0
    lines = sass_instructions(cubin)[k.name]
    assert not any(op in line.split() for line in lines for op in ("LDL", "STL", "LDL.64", "STL.64"))
    assert sum("F2FP" in line for line in lines) >= hmma   # the e4m3 -> f16x2 converts: two per B fragment
