"""Head dim 96 (d_qk = d_v; Phi-3-mini): 192 bytes a 16-bit row, which 128-byte swizzle rows do not divide. The Hopper
kernels lay it out in 32-column atoms of the 64-byte swizzle, read and written in three 32-column TMA boxes a row
(translate/sm90/swizzle.py); decode and the sm80-class kernels take 32-column atoms with a 2-bit swizzle. CPU checks of
the generated sources, the validation and the defaults; the host check of the 64-byte swizzle's offsets against CuTe's
layout is slow (nvcc). The descriptors and the stmatrix stores at d96 are checked in test_gmma_operands.py and
test_store_o.py."""
from dataclasses import replace
from pathlib import Path

import pytest
from sass_counts import compiled_or_skip, sass_summary_of

import translate
from hardware_profiles import load_profile
from kernel_abi.spec import HEAD_DIMS, KernelSpec, Problem, grid_problems, spec_for
from translate.decode.params import DecodeParams, default_decode_params, validate_decode
from translate.defaults import default_params, probe_problem
from translate.params import KernelParams, validate
from translate.sm90 import frame, swizzle
from translate.sm90.generate import tensor_map_boxes
from tuner.build import load_checked_program

from host_checks import run_host_checks

H100 = load_profile("h100")
MHA96 = KernelSpec("mha", 96, 96, True, "bf16")
GQA96 = KernelSpec("gqa", 96, 96, True, "bf16")


def _generate(profile, spec, schedule="ws_overlap", page_size=None, **changes):
    program, *_ = load_checked_program(spec.variant, spec.causal, None, schedule, spec.layout, spec)
    params = default_params(profile, spec, schedule, page_size=page_size)
    if changes:
        params = KernelParams.from_dict({**params.to_dict(), **changes})
    return translate.generate(program, params, profile, spec)


def test_96_is_a_head_dim_and_its_grid_has_heads_every_variant_divides():
    assert 96 in HEAD_DIMS and spec_for("mha", 96, "bf16", True) == MHA96
    # 2048 / 96 = 21 query heads, which no GQA group of 8 divides: the grid takes FA4's 16 heads at d96
    assert {(p.heads_q, p.heads_kv) for p in grid_problems("gqa", 96, "bf16", True)} == {(16, 2)}
    assert {(p.heads_q, p.heads_kv) for p in grid_problems("mqa", 96, "bf16", True)} == {(16, 1)}
    assert {(p.heads_q, p.heads_kv) for p in grid_problems("mha", 128, "bf16", True)} == {(16, 16)}   # unchanged
    assert {(p.heads_q, p.heads_kv) for p in grid_problems("mha", 192, "bf16", True)} == {(10, 10)}
    with pytest.raises(ValueError, match="head dim 80 is not supported"):
        spec_for("mha", 80, "bf16", True)
    assert spec_for("mha", 96, "fp8", True).dtype == "fp8"   # (FP8 at d96: tests/translate/test_fp8_head_dims.py)
    assert spec_for("mha", 192, "fp8", True).dtype == "fp8"   # every head dim here has FP8 kernels but MLA's 192/128


@pytest.mark.parametrize("width, atom, chunk", [(64, 64, 64), (128, 64, 64), (256, 64, 64), (96, 32, 32),
                                                (160, 32, 32), (144, 16, 32), (80, 16, 32)])
def test_the_widest_swizzle_that_divides_the_row(width, atom, chunk):
    assert swizzle.atom_width(width) == atom
    assert swizzle.chunk(width) == chunk
    assert swizzle.k_major_atom(width) == f"GMMA::Layout_K_{dict(swizzle.ATOMS)[atom]}_Atom<Element>"


def test_the_hopper_default_at_96_is_d128s_tile_and_validates():
    for spec in (MHA96, replace(MHA96, causal=False), GQA96, replace(GQA96, layout="varlen"),
                 replace(GQA96, local=True, softcap=True, sinks=True)):
        params = default_params(H100, spec, "ws_overlap")
        assert params.key().startswith("m128n128w8s2_sm90_tma"), (spec, params.key())
        assert validate(params, H100, probe_problem(spec), warp_specialized=True) == []
    paged = default_params(H100, replace(GQA96, layout="paged"), "ws_overlap", page_size=16)
    assert paged.g2s_atom == "SM80_CP_ASYNC_CACHEGLOBAL"   # the cp.async producer reads 32-column blocks too


def test_the_dense_kernel_reads_and_writes_three_32_column_boxes_of_the_64_byte_swizzle():
    kernel = _generate(H100, MHA96)
    src = kernel.source
    assert "attn_sm90::tma_load_tile<kHeadDimQK / 32, kBlockM, 32>(&tma_q, q_full, smem_q" in src
    assert "attn_sm90::tma_load_tile<kHeadDimQK / 32, kBlockN, 32>(&tma_k" in src
    assert "attn_sm90::tma_load_tile<kHeadDimV / 32, kBlockN, 32>(&tma_v" in src
    assert "attn_sm90::tma_store_rows<kHeadDimV / 32, kBlockM, 32>(&tma_o, smem_o + wg * 64 * 32," in src
    assert "/ 64" not in src.split("namespace ", 1)[1]   # no 64-column box is left
    # Q, K and V's descriptors: layout type 2 (64-byte swizzle), 32-column atoms 512 bytes (32 units) a row group
    for name in ("tSrQ", "tSrK", "tOrV"):
        line = next(ln for ln in src.splitlines() if f"Tensor {name} = attn_sm90::gmma_operand<" in ln)
        assert line.split(">(")[0].endswith(", 32, 2"), line
    assert kernel.tensor_maps == {"q": {"rows": 128, "dim": "d_qk", "cols": 32},
                                  "k": {"rows": 128, "dim": "d_qk", "cols": 32},
                                  "v": {"rows": 128, "dim": "d_v", "cols": 32}, "o": {"rows": 64, "dim": "d_v", "cols": 32}}
    # the other head dims keep their 64-column boxes and maps without a width
    d128 = _generate(H100, KernelSpec("mha", 128, 128, True, "bf16"))
    assert "tma_load_tile<kHeadDimQK / 64, kBlockM>(" in d128.source and "/ 32" not in d128.source
    assert all("cols" not in box for box in d128.tensor_maps.values())


def test_the_smem_layouts_the_host_checks_use_take_the_64_byte_atoms_at_96():
    params = default_params(H100, MHA96, "ws_overlap")
    # (P's layout goes by block N: 128 columns, the 128-byte swizzle)
    text = "\n".join(ln for ln in frame.smem_layouts(params, MHA96) if "SmemLayoutP" not in ln)
    assert text.count("GMMA::Layout_K_SW64_Atom<Element>") == 3 and "GMMA::Layout_MN_SW64_Atom<Element>" in text
    assert "SW128" not in text
    d128 = "\n".join(ln for ln in frame.smem_layouts(params, KernelSpec("mha", 128, 128, True, "bf16"))
                     if "SmemLayoutP" not in ln)
    assert "SW64" not in d128 and d128.count("SW128") == 4


def test_varlen_paged_pack_and_options_build_at_96():
    varlen = _generate(H100, replace(GQA96, layout="varlen")).source
    assert "attn_sm90::store_rows_predicated<kHeadDimV, kBlockM>(" in varlen   # 32-column blocks: sw64_offset
    assert "tma_load_tile<kHeadDimQK / 32, kBlockN, 32>(&tma_k" in varlen
    cp_async = _generate(H100, replace(GQA96, layout="paged"), page_size=16).source
    assert "attn_sm90::cp_async_load_paged<kHeadDimQK, kBlockN>(" in cp_async   # dispatches to the 32-column copy
    tma_pages = _generate(H100, replace(GQA96, layout="paged"), page_size=128,
                          g2s_atom="SM90_TMA", producer_regs=40).source
    assert "attn_sm90::tma_load_paged<kHeadDimQK / 32, kBlockN, 32>(&tma_k" in tma_pages
    packed = _generate(H100, GQA96, pack_gqa=True)
    assert packed.tensor_maps["q"] == {"rows": 128, "dim": "d_qk", "cols": 32, "heads_first": True}
    assert packed.tensor_maps["o"] == {"rows": 64, "dim": "d_v", "cols": 32, "heads_first": True}
    options = _generate(H100, replace(GQA96, local=True, softcap=True, sinks=True)).source
    assert "apply_mask_window" in options and "softcap_tile" in options and "add_sink" in options


def _problem(d: int, dtype: str = "bf16") -> Problem:
    return Problem("mha", 1, 16, 16, 1024, 1024, d, d, True, dtype)


def test_hopper_validation_accepts_96_and_says_why_80_and_100_cannot_work():
    params = default_params(H100, MHA96, "ws_overlap")
    assert validate(params, H100, _problem(96), warp_specialized=True) == []
    for d in (80, 100):
        reasons = validate(params, H100, _problem(d), warp_specialized=True)
        assert any(f"head dim {d} must be a multiple of 32" in r and "64-byte swizzle" in r for r in reasons), reasons
    # the plain wgmma schedule's cp.async copies and layouts are the 128-byte ones
    plain = KernelParams.from_dict({**default_params(H100, KernelSpec("mha", 128, 128, True, "bf16"), "fa2").to_dict(),
                                    "mma_atom": "SM90_GMMA", "block_m": 128, "block_n": 128, "num_warps": 8,
                                    "kv_stages": 2})
    reasons = validate(plain, H100, _problem(96), warp_specialized=False)
    assert any("head dim 96 must be a multiple of 64 for the plain wgmma schedule" in r for r in reasons), reasons
    assert not any("head dim" in r for r in validate(plain, H100, _problem(128), warp_specialized=False))


def test_decode_at_96_takes_32_column_atoms_with_a_2_bit_swizzle():
    for gpu in ("h100", "a100", "l40s"):
        profile = load_profile(gpu)
        spec = replace(GQA96, layout="paged", phase="decode")
        params = default_decode_params(spec, 32, profile)
        assert params.swizzle == 2 and validate_decode(params, profile, spec) == [], gpu
    spec = replace(GQA96, layout="paged", phase="decode")
    assert any("swizzle 3 needs 64-column rows; head dim 96 takes 32-column atoms" in r
               for r in validate_decode(DecodeParams(), H100, spec))
    spec80 = replace(spec, d_qk=80, d_v=80)
    assert any("head dim 80 must be a multiple of 32" in r for r in validate_decode(DecodeParams(swizzle=2), H100,
                                                                                     spec80))
    assert default_decode_params(replace(spec, d_qk=128, d_v=128), 32, H100).swizzle == 3   # unchanged
    from translate.compiler import generate

    program, *_ = load_checked_program("gqa", True, None, "decode", "paged", spec)
    src = generate(program, default_decode_params(spec, 32, H100), H100, spec).source
    assert "using SmemAtom = decltype(composition(Swizzle<2, 3, 3>{}, Layout<Shape<_8, Int<32>>, " \
           "Stride<Int<32>, _1>>{}));" in src


@pytest.mark.parametrize("gpu, dtype", [("a100", "bf16"), ("l40s", "bf16"), ("t4", "fp16")])
def test_the_sm80_class_kernels_take_32_column_atoms_at_96(gpu, dtype):
    profile = load_profile(gpu)
    spec = KernelSpec("mha", 96, 96, True, dtype)
    params = default_params(profile, spec, "fa2")
    assert params.swizzle == 2 and validate(params, profile, probe_problem(spec)) == []
    src = _generate(profile, spec, "fa2").source
    assert "Layout<Shape<_8, Int<32>>, Stride<Int<32>, _1>>" in src and "Swizzle<2, 3, 3>" in src


def test_the_runtime_encodes_32_column_boxes_with_the_64_byte_swizzle():
    from tuner.serving.launch import tma

    spec = tma.tensor_map_spec(0x10000, (2, 300, 4, 96), (300 * 4 * 96, 4 * 96, 96, 1), 2, 128, box_columns=32)
    assert spec.box == (32, 128, 1, 1) and spec.swizzle_bytes == 64 and spec.dims == (96, 300, 4, 2)
    with pytest.raises(tma.TensorMapError, match="head dim 96 is not a multiple of 64"):
        tma.tensor_map_spec(0x10000, (2, 300, 4, 96), (300 * 4 * 96, 4 * 96, 96, 1), 2, 128)
    boxes = tensor_map_boxes(default_params(H100, MHA96, "ws_overlap"), MHA96)
    assert {t: b.get("cols") for t, b in boxes.items()} == {"q": 32, "k": 32, "v": 32, "o": 32}


HERE = Path(__file__).parent


@pytest.mark.slow
def test_the_64_byte_swizzle_offsets_are_cutes_sw64_layout(tmp_path):
    """attn_sm90::sw64_offset (the cp.async producer's and the varlen epilogue's addressing of 32-column blocks) against
    CuTe's tile_to_shape(GMMA::Layout_K_SW64_Atom) of the tile heights the kernels use, at every row and chunk."""
    rows = (64, 128, 192, 80, 144, 176)
    checks = []
    for r in rows:
        checks.append(f"""  {{
    using Layout = decltype(tile_to_shape(GMMA::Layout_K_SW64_Atom<cutlass::bfloat16_t>{{}}, Shape<Int<{r}>, _96>{{}}));
    alignas(1024) static cutlass::bfloat16_t buf[{r} * 96];   // 1024-byte aligned: the pointer's swizzle is the layout's
    Tensor tile = make_tensor(make_smem_ptr(buf), Layout{{}});
    int bad = 0;
    for (int row = 0; row < {r}; ++row)
      for (int j = 0; j < 12; ++j)
        if (int(&tile(row, 8 * j) - buf) != attn_sm90::sw64_offset<{r}>(row, j)) ++bad;
    std::printf("%s rows {r}: %d mismatches\\n", bad ? "FAIL" : "OK", bad);
    total += bad;
  }}""")
    source = "\n".join(["#include <cstdio>", "#include <cute/tensor.hpp>", '#include "attn_sm90.cuh"',
                        "using namespace cute;", "int main() {", "  int total = 0;", *checks, "  return total;", "}"])
    run_host_checks(source + "\n", "sw64_offsets", tmp_path, len(rows), opt="-O0", arch="sm_90a")


@pytest.mark.parametrize("gpu, dtype", [("h100", "bf16"), ("t4", "fp16")])
def test_the_search_space_at_96_has_feasible_points_and_seeds(gpu, dtype):
    from search_spaces import load_space
    from search_spaces.feasible import default_sketches, feasible_space

    profile = load_profile(gpu)
    space = load_space("mha")
    fs = feasible_space(space, profile, 96, dtype, grid_problems("mha", 96, dtype, True),
                        default_sketches(space, profile, 96, dtype))
    assert fs.points and any("hdim96" in s.source for s in space.seeds_for(96))
    ws = [p for p in fs.points if p.sketch.startswith("ws_")]
    if profile.sm >= 90:
        assert ws and max(p.params.block_n for p in ws) >= 176   # d96's O leaves room for wide key tiles
    else:   # 32-column atoms: a 2-bit swizzle or none
        assert not ws and {p.params.swizzle for p in fs.points} <= {0, 2}


def _compiled(gen, profile):
    (result,) = compiled_or_skip([gen], profile.nvcc_arch, timeout=600)
    # ptxas says when it serialises wgmma (C7510) or ignores setmaxnreg (C7508)
    assert "C7510" not in result.log and "C7508" not in result.log, result.log[-3000:]
    return result


@pytest.mark.slow
def test_the_d96_default_builds_without_spills_on_wgmma_and_three_boxes_a_row():
    """28 wgmma a tile (two QK^T GEMMs of 6 k-blocks of 16, two P.V GEMMs of 8), Q, K and V in three boxes each, O
    stored in three, no local memory."""
    gen = _generate(H100, MHA96)
    result = _compiled(gen, H100)
    assert result.spill_stores == 0 and result.spill_loads == 0
    counts = sass_summary_of(result, gen.name)
    assert counts["HGMMA"] == 28 and counts["UTMALDG"] == 9 and counts["UTMASTG"] == 3, counts
    assert counts.get("LDL", 0) == 0 and counts.get("STL", 0) == 0, counts


@pytest.mark.slow
def test_the_d96_cp_async_producer_copies_32_column_blocks():
    """The paged default at d96: every producer thread copies 3 blocks of 16 bytes a row group (no 64-column copy),
    Q's three 32-column boxes by TMA; ptxas keeps no more producer values in local memory than at d128 (<= 32 B)."""
    spec = replace(GQA96, layout="paged")
    gen = _generate(H100, spec, page_size=16)
    assert gen.params.g2s_atom == "SM80_CP_ASYNC_CACHEGLOBAL"
    result = _compiled(gen, H100)
    assert result.spill_stores <= 32, result.spill_stores
    counts = sass_summary_of(result, gen.name)
    # 128-row tiles: 4 row groups a warp x 3 blocks, K and V, twice (full tiles and a sequence's last)
    assert counts["HGMMA"] == 28 and counts["UTMALDG"] == 3 and 48 <= counts["LDGSTS"] <= 96, counts


@pytest.mark.slow
@pytest.mark.parametrize("gpu", ["h100", "a100"])
def test_the_d96_decode_kernel_builds_without_spills(gpu):
    from translate.compiler import generate

    profile = load_profile(gpu)
    spec = replace(GQA96, layout="paged", phase="decode")
    program, *_ = load_checked_program("gqa", True, None, "decode", "paged", spec)
    gen = generate(program, default_decode_params(spec, 32, profile), profile, spec)
    assert _compiled(gen, profile).spill_stores == 0


@pytest.mark.slow
def test_the_d96_sm80_kernel_spills_no_more_than_d128s():
    """FA2's d96 tile on the A100 (128 x 64, 4 warps): the sm_80 defaults spill at every head dim (nvcc 13.0: d64 152
    bytes, d128 120, d96 64), so the check is relative: d96 no more than d128 at the same tile."""
    a100 = load_profile("a100")
    d96 = _compiled(_generate(a100, MHA96, "fa2"), a100)
    d128 = _compiled(_generate(a100, KernelSpec("mha", 128, 128, True, "bf16"), "fa2"), a100)
    assert d96.spill_stores <= d128.spill_stores, (d96.spill_stores, d128.spill_stores)
