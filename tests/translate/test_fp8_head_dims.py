"""FP8 (e4m3) kernels at head dims 96 (Phi-3-mini), 192 and 256 (Gemma): the defaults (FA3's FP8 tiles,
hopper/tile_size.h: 192 x 128 at d96, 128 x 160 at d192, 128 x 128 at d256, 128 x 64 where a serving producer leaves
d256's consumers 232 registers), what validation refuses there and why, what the generated kernels hold (d96's three
32-byte boxes a row, its bf16 O in 32-column boxes; d192's three 64-byte boxes; d256's two 128-byte boxes), and
(slow) that nvcc builds the defaults for sm_90a without spills, on the e4m3 wgmma, without wgmma serialisation
(C7510) or an ignored setmaxnreg (C7508)."""
from __future__ import annotations

import pytest
from sass_counts import compiled_or_skip, sass_summary_of

import tl
import translate
from hardware_profiles import load_profile
from kernel_abi.spec import FP8_HEAD_DIMS, KernelSpec, Problem
from translate.defaults import hopper_params
from translate.params import KernelParams, validate
from translate.sm90 import frame

H100 = load_profile("h100")
NEW = (96, 192, 256)
LAYOUTS = ("dense", "varlen", "paged")
# the defaults: (head dim, layout) -> (block_m, block_n); paged at pages of 128 (whole tiles: K by TMA)
DEFAULT_TILES = {(96, "dense"): (192, 128), (96, "varlen"): (192, 128), (96, "paged"): (128, 128),
                 (192, "dense"): (128, 160), (192, "varlen"): (128, 160), (192, "paged"): (128, 160),
                 (256, "dense"): (128, 128), (256, "varlen"): (128, 64), (256, "paged"): (128, 64)}


def _spec(d, causal=True, layout="dense", variant="mha"):
    return KernelSpec(variant, d, d, causal, "fp8", layout=layout)


def _problem(d, causal=True):
    return Problem(variant="mha", batch=1, heads_q=16, heads_kv=16, seqlen_q=1024, seqlen_k=1024, d_qk=d, d_v=d,
                   causal=causal, dtype="fp8")


def _params(spec, page_size=128, **changes):
    page = page_size if spec.layout == "paged" else None
    return KernelParams.from_dict({**hopper_params(H100, spec, page_size=page).to_dict(), **changes})


def _generate(spec, page_size=128, **changes):
    program = tl.parse_program(tl.load_sketch(spec.variant, spec.causal, "ws_overlap", spec.layout))
    return translate.generate(program, _params(spec, page_size, **changes), H100, spec)


def test_the_fp8_head_dims_are_64_96_128_192_and_256():
    assert FP8_HEAD_DIMS == (64, 96, 128, 192, 256)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("d", NEW)
@pytest.mark.parametrize("causal", [False, True])
def test_the_defaults_are_fa3s_fp8_tiles_and_valid(d, layout, causal):
    params = _params(_spec(d, causal, layout))
    assert (params.block_m, params.block_n) == DEFAULT_TILES[d, layout]
    assert params.pv_operand == "rs" and params.vt_key_order == "accumulator"
    assert not validate(params, H100, _problem(d, causal), warp_specialized=True)


def test_d96_loads_k_by_tma_even_from_pages_of_16():
    """The cp.async producer copies e4m3 rows as 16-bit rows of 32- or 64-column blocks: a 96-byte row is three
    32-byte atoms, so a d96 paged kernel reads K by TMA (boxes of 16 rows within the pages), and validation refuses
    the cp.async producer with its reason."""
    params = _params(_spec(96, layout="paged"), page_size=16)
    assert params.g2s_atom == "SM90_TMA"
    cp_async = KernelParams.from_dict({**params.to_dict(), "g2s_atom": "SM80_CP_ASYNC_CACHEGLOBAL",
                                       "producer_regs": 56})
    errors = validate(cp_async, H100, _problem(96), warp_specialized=True)
    assert any("fp8 head dim 96: the cp.async producer" in e for e in errors), errors
    d256 = _params(_spec(256, layout="paged"), page_size=16)   # 256 bytes: two 64-column 16-bit blocks
    assert d256.g2s_atom == "SM80_CP_ASYNC_CACHEGLOBAL" and (d256.block_m, d256.block_n) == (128, 64)
    # 192 bytes: refused by validate_sm90's whole-row rule (written for 16-bit rows, applied to the head dim), so TMA
    # boxes within the pages; the 16-bit image (96 columns) is bf16 d96's, which the copy takes: not built here yet
    d192 = _params(_spec(192, layout="paged"), page_size=16)
    assert d192.g2s_atom == "SM90_TMA" and (d192.block_m, d192.block_n) == (128, 160)
    cp_async = KernelParams.from_dict({**d192.to_dict(), "g2s_atom": "SM80_CP_ASYNC_CACHEGLOBAL", "producer_regs": 56})
    assert any("cp.async producer copies whole rows" in e
               for e in validate(cp_async, H100, _problem(192), warp_specialized=True))


def test_a_d192_varlen_producer_keeps_40_registers():
    """d192's varlen producer spilled 20 bytes in the 16-bit serving kernels' 32 registers (nvcc 13.0, 128 x 160):
    defaults.FP8_SERVING_PRODUCER_REGS gives it the paged producer's 40; dense keeps 24."""
    assert _params(_spec(192, layout="varlen")).producer_regs == 40
    assert _params(_spec(192)).producer_regs == 24
    assert _params(_spec(128, layout="varlen")).producer_regs == 32


@pytest.mark.parametrize("d, change, reason", [
    # d256's O takes 128 registers: 160 keys (S 80 + O 128 + P 20 + 24 + 8) pass the consumers' 240
    (256, {"block_n": 160}, "a consumer thread needs about 260 registers"),
    # a varlen/paged producer's 32 leave 232: ptxas spilled 32 bytes there at 128 x 128
    (256, {"producer_regs": 32}, "a consumer thread needs about 240 registers"),
    # three stages of 128 x 512 bytes of K and V^T beside Q and O: past 227 KB
    (256, {"kv_stages": 3}, "exceeds the 227 KB"),
    # three consumer warpgroups of d96 at 160 keys: S 80 + O 48 + P 20 + 28 past their 160
    (96, {"block_n": 160}, "a consumer thread needs about 176 registers"),
    (96, {"block_n": 176}, "fp8 block_n 176 must be one of"),
    # d192's O takes 96 registers: 192 keys (S 96 + O 96 + P 24 + 24 + 8) past 240 (ptxas spilled 32 bytes there)
    (192, {"block_n": 192}, "a consumer thread needs about 248 registers"),
    (192, {"kv_stages": 3}, "exceeds the 227 KB"),
])
def test_tiles_that_do_not_fit_are_refused_with_the_reason(d, change, reason):
    params = KernelParams.from_dict({**_params(_spec(d)).to_dict(), **change})
    errors = validate(params, H100, _problem(d), warp_specialized=True)
    assert any(reason in e for e in errors), errors


def test_head_dims_that_are_not_rows_of_32_byte_atoms_are_refused():
    from translate.params_sm90 import head_dim_reasons

    assert head_dim_reasons(96, True, fp8=True) == [] and head_dim_reasons(256, True, fp8=True) == []
    assert "must be a multiple of 32 for fp8 kernels" in head_dim_reasons(80, True, fp8=True)[0]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_d96_kernel_reads_rows_in_three_32_byte_boxes_and_stores_o_in_32_column_boxes(layout):
    gen = _generate(_spec(96, layout=layout))
    maps, body = gen.tensor_maps, gen.body
    assert maps["q"]["cols"] == maps["k"]["cols"] == 32    # e4m3: 32 bytes, the 32-byte swizzle
    assert maps["o"]["cols"] == 32                         # bf16: 32 columns, the 64-byte swizzle (16-bit d96's)
    assert maps["v"]["rows"] == 96 and maps["v"]["transposed"]
    assert "constexpr int kChunkQK = 32;" in body and "constexpr int kMaxChains = 2;" in body
    # the dense kernel stores O by TMA in three boxes a row; a packed one row by row from the 64-byte swizzled tile
    # (store_rows_predicated picks the 64-byte path where 64 do not divide the head dim), as the 16-bit d96 kernels
    store = ("attn_sm90::tma_store_rows<kHeadDimV / 32, kBlockM, 32>" if layout == "dense" else
             "attn_sm90::store_rows_predicated<kHeadDimV, kBlockM>")
    assert store in body
    assert "cp_async" not in body


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_d256_kernel_reads_rows_in_two_128_byte_boxes(layout):
    gen = _generate(_spec(256, layout=layout))
    maps, body = gen.tensor_maps, gen.body
    assert maps["q"]["cols"] == maps["k"]["cols"] == 128 and "cols" not in maps["o"]   # bf16 O: 64-column boxes
    assert maps["v"]["rows"] == 256 and maps["v"]["cols"] == gen.params.block_n
    assert "constexpr int kChunkQK = 128;" in body and "constexpr int kMaxChains = 1;" in body
    assert gen.smem_bytes <= H100.smem_per_block_bytes


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_d192_kernel_reads_rows_in_three_64_byte_boxes(layout):
    gen = _generate(_spec(192, layout=layout))
    maps, body = gen.tensor_maps, gen.body
    assert maps["q"]["cols"] == maps["k"]["cols"] == 64 and "cols" not in maps["o"]   # bf16 O: 64-column boxes
    assert maps["v"]["rows"] == 192 and maps["v"]["cols"] == 32   # V^T rows of 160 keys: 32-byte boxes
    assert "constexpr int kChunkQK = 64;" in body and "constexpr int kMaxChains = 1;" in body
    assert gen.smem_bytes <= H100.smem_per_block_bytes


def test_the_max_chains_table_covers_every_fp8_head_dim():
    assert set(frame.FP8_MAX_CHAINS) == set(FP8_HEAD_DIMS)


@pytest.mark.parametrize("variant", ["mha", "gqa", "mqa"])
@pytest.mark.parametrize("d", NEW)
def test_the_search_spaces_have_fp8_tables_at_the_new_head_dims(variant, d):
    from search_spaces import load_space
    from translate.params_sm90 import FP8_BLOCK_N

    domains = load_space(variant).domains(H100, d, "fp8")
    assert domains["rescale_threshold"] == (0, 2)
    # d96: every FP8 block N (validation keeps what fits); d192 FA3's 160 and below; d256: O leaves no registers
    # for 160 keys or more
    assert domains["hopper_block_n"] == {96: FP8_BLOCK_N, 192: (64, 128, 160), 256: (64, 128)}[d]


@pytest.mark.parametrize("d", NEW)
def test_an_fp8_campaign_at_the_new_head_dims_has_feasible_points_with_the_default_tile(d):
    from kernel_abi.spec import grid_problems
    from search_spaces import load_space
    from search_spaces.feasible import default_sketches, feasible_space

    space = load_space("mha")
    fs = feasible_space(space, H100, d, "fp8", grid_problems("mha", d, "fp8", True),
                        default_sketches(space, H100, d, "fp8"))
    tiles = {(p.params.block_m, p.params.block_n) for p in fs.points}
    assert DEFAULT_TILES[d, "dense"] in tiles
    assert all(n <= {96: 256, 192: 160, 256: 128}[d] for _, n in tiles)
    if d == 96:
        assert (128, 256) in tiles


# -- nvcc (slow) ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("d", NEW)
def test_the_defaults_build_without_spills_on_the_e4m3_wgmma(d):
    """Dense non-causal and causal, varlen causal, paged at pages of 16 (d96 and d192: K by TMA in page boxes; d256: K
    by the cp.async producer): no local memory, QGMMA and no HGMMA, ptxas neither serialises the wgmma (C7510) nor ignores
    setmaxnreg (C7508)."""
    _assert_built_clean([(_spec(d, False), 128), (_spec(d, True), 128), (_spec(d, True, "varlen"), 128),
                         (_spec(d, False, "paged"), 16)])


def _assert_built_clean(specs):
    """Each (spec, page size)'s default, built by nvcc: no spills or local memory, QGMMA and no HGMMA, no C7510/C7508."""
    gens = [_generate(spec, page) for spec, page in specs]
    for gen, result in zip(gens, compiled_or_skip(gens)):
        assert result.spill_stores == 0 and result.spill_loads == 0, (gen.name, result.resources())
        assert "C7510" not in result.log and "C7508" not in result.log, result.log[-3000:]
        counts = sass_summary_of(result, gen.name)
        assert counts["QGMMA"] > 0 and counts.get("HGMMA", 0) == 0, counts
        assert counts.get("LDL", 0) == 0 and counts.get("STL", 0) == 0, counts


# -- MLA's 192/128 prefill in FP8 (FA3's FP8 hdim-192 kernel with a narrower V) ---------------------------------------


def _mla(causal=True, layout="dense"):
    return KernelSpec("mla", 192, 128, causal, "fp8", layout=layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_mla_fp8_kernel_takes_the_d192_tile_and_reads_v_t_of_128_rows(layout):
    """FA3's FP8 hdim-192 tile, 128 x 160, whatever d_v; K rows of three 64-byte boxes, V^T rows of 160 keys."""
    params = _params(_mla(layout=layout), page_size=16)
    assert (params.block_m, params.block_n) == (128, 160) and params.g2s_atom == "SM90_TMA"
    assert not validate(params, H100, Problem("mla", 1, 16, 16, 1024, 1024, 192, 128, True, "fp8"),
                        warp_specialized=True)
    gen = _generate(_mla(layout=layout), page_size=16)
    maps = gen.tensor_maps
    assert maps["q"]["cols"] == maps["k"]["cols"] == 64 and maps["v"]["rows"] == 128 and maps["v"]["transposed"]
    assert "constexpr int kHeadDimQK = 192;" in gen.body and "constexpr int kHeadDimV = 128;" in gen.body


def test_the_mla_space_has_an_fp8_table():
    from search_spaces import load_space

    domains = load_space("mla").domains(H100, 192, "fp8")
    assert domains["hopper_block_n"] == (64, 128, 160, 192, 224) and domains["pv_operand"] == ("rs",)
    assert domains["vt_key_order"] == ("accumulator", "natural") and domains["rescale_threshold"] == (0, 2)
    bf16 = load_space("mla").domains(H100, 192, "bf16")   # the 16-bit kernels read V as given
    assert bf16["vt_key_order"] == ("natural",) and bf16["v_transpose"] == ("runtime",)


@pytest.mark.slow
def test_the_mla_fp8_defaults_build_without_spills_on_the_e4m3_wgmma():
    _assert_built_clean([(_mla(False), 128), (_mla(True), 128), (_mla(True, "varlen"), 128), (_mla(False, "paged"), 16)])
