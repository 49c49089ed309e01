"""FP8 (e4m3) Hopper kernels on the CPU: what the spec, the parameters and the translator accept and refuse, and what
the generated kernel holds (the e4m3 wgmma ops, V transposed, P's exchange, the descales, the bf16 output)."""
from __future__ import annotations

import pytest

import tl
import translate
from hardware_profiles import load_profile
from kernel_abi.spec import KernelSpec, Problem, spec_for
from translate.defaults import hopper_params
from translate.kernel import TranslationError
from translate.params import KernelParams, validate
from translate.sm90 import frame

H100 = load_profile("h100")


def _spec(d=128, causal=True, variant="mha", layout="dense"):
    return KernelSpec(variant, d, d, causal, "fp8", layout=layout)


def _problem(d=128, **kw):
    base = dict(variant="mha", batch=1, heads_q=16, heads_kv=16, seqlen_q=1024, seqlen_k=1024, d_qk=d, d_v=d,
                causal=True, dtype="fp8")
    base.update(kw)
    return Problem(**base)


def _generate(spec, **changes):
    """The spec's default (paged: built for pages of 128, whole tiles, so K by TMA) with ``changes``."""
    page_size = 128 if spec.layout == "paged" else None
    params = KernelParams.from_dict({**hopper_params(H100, spec, page_size=page_size).to_dict(), **changes})
    program = tl.parse_program(tl.load_sketch(spec.variant, spec.causal, "ws_overlap", spec.layout))
    return translate.generate(program, params, H100, spec)


def test_fp8_problems_take_head_dims_64_96_128_192_and_256_without_options():
    _problem(64), _problem(96), _problem(128), _problem(192), _problem(256)
    for d in (80, 160):
        with pytest.raises(ValueError, match="fp8 kernels take head dims 64, 96, 128, 192 and 256 with d_qk == d_v"):
            _problem(d)
    with pytest.raises(ValueError, match="no sliding window, soft-capping or sinks"):
        _problem(128, softcap=50.0)
    assert spec_for("mha", 192, "fp8", True).d_qk == 192
    mla = spec_for("mla", None, "fp8", True)   # MLA's 192/128 prefill, FA3's FP8 hdim-192 kernel
    assert (mla.d_qk, mla.d_v, mla.dtype) == (192, 128, "fp8")
    with pytest.raises(ValueError, match=r"with d_qk == d_v \(mla 192/128\), not gqa 192/128"):
        _problem(192, variant="gqa", d_v=128)


@pytest.mark.parametrize("change, reason", [
    ({"pv_operand": "ss"}, "keep P in registers"),
    ({"block_n": 176}, "block_n 176 must be one of"),
    ({"rescale_threshold": 8}, "fp8 rescale_threshold 8 must be one of (0, 2)"),
    ({"rescale_threshold": 4}, "at 4 a settled row's small P fall into e4m3's subnormals"),
    ({"pack_gqa": True}, "pack_gqa is not built for fp8"),
])
def test_parameters_an_fp8_kernel_cannot_take_are_refused_with_their_reason(change, reason):
    params = KernelParams.from_dict({**hopper_params(H100, _spec()).to_dict(), **change})
    errors = validate(params, H100, _problem(128), warp_specialized=True)
    assert any(reason in e for e in errors), errors


def test_fp8_needs_a_hopper_and_the_warp_specialised_schedule():
    a100 = load_profile("a100")
    params = KernelParams(block_m=128, block_n=64, num_warps=4, kv_stages=2)
    assert any("fp8 kernels are Hopper kernels" in e for e in validate(params, a100, _problem(128)))
    plain = KernelParams.from_dict({**hopper_params(H100, _spec()).to_dict(), "g2s_atom": "SM80_CP_ASYNC_CACHEGLOBAL",
                                    "persistent": False})
    assert any("warp-specialised" in e for e in validate(plain, H100, _problem(128), warp_specialized=False))


def test_the_defaults_are_valid_fp8_kernels():
    for d in (64, 128):
        for causal in (False, True):
            params = hopper_params(H100, _spec(d, causal))
            assert params.rescale_threshold == 0 and params.pv_operand == "rs"
            assert not validate(params, H100, _problem(d, causal=causal), warp_specialized=True)


@pytest.mark.parametrize("d", [64, 128])
def test_the_kernel_reads_e4m3_writes_bf16_and_takes_the_descales(d):
    gen = _generate(_spec(d, causal=True, variant="gqa"))
    body = gen.body
    assert "using Element = cutlass::float_e4m3_t;" in body and "using ElementO = cutlass::bfloat16_t;" in body
    assert "ElementO* __restrict__ o_ptr" in body
    # V arrives transposed, loaded by keys, in P's accumulator order (the default): P converts into the e4m3 A
    # operand in place; in natural order through the quad exchange
    assert "attn_sm90::tma_load_vt<kBlockN / kChunkV, kHeadDimV, kChunkV>" in body
    assert "attn_sm90::convert_p_fp8_in_place(" in body and "fp8_p_lanes" not in body
    assert gen.tensor_maps["v"]["key_order"] == "accumulator"
    natural = _generate(_spec(d, causal=True, variant="gqa"), vt_key_order="natural")
    assert "attn_sm90::convert_p_fp8(" in natural.body and "fp8_p_lanes(mma_tidx % 32)" in natural.body
    assert "key_order" not in natural.tensor_maps["v"]
    # the softmax keeps P's row maximum at 2^8 and uses the tile's descaled exponent scale
    assert "softmax_tile<0, 0, kMaxOffset, kMaxChains>" in body and "tile_scale_log2);" in body
    assert "normalize_rows(acc_O_register, Ssum, out_descale)" in body
    assert "convert_type<ElementO>" in body
    names = [a for a, _ in gen.extra_args]
    assert names[-7:-4] == ["q_descale", "k_descale", "v_descale"]
    assert gen.tensor_maps["v"]["transposed"] and gen.tensor_maps["v"]["rows"] == d
    assert gen.tensor_maps["q"]["cols"] == (128 if d == 128 else 64)
    # e4m3 wgmma ops (k-blocks of 32), both operands K-major
    assert "GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kHeadDimQK>>>()" in body
    assert "GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDimV>, Int<kBlockN>>>()" in body


def test_the_16_bit_kernels_source_is_untouched_by_the_fp8_path():
    spec = KernelSpec("gqa", 128, 128, True, "bf16")
    body = _generate(spec).body
    for fp8_only in ("ElementO", "descale", "kMaxOffset", "tma_load_vt", "convert_p_fp8"):
        assert fp8_only not in body


def test_an_fp8_operand_is_the_16_bit_operand_of_half_the_columns():
    """e4m3 tiles are laid out in bytes as 16-bit tiles of half the columns: the same descriptors."""
    fp8, bf16 = _spec(128), KernelSpec("mha", 64, 64, True, "bf16")
    p8 = hopper_params(H100, fp8)
    for which in ("q", "k"):
        a = frame.gmma_operand(which, fp8, p8, 2)
        b = frame.gmma_operand(which, bf16, p8, 2)
        assert (a.layout, a.leading, a.stride, a.layout_type) == (b.layout, b.leading, b.stride, b.layout_type)
        assert a.per_warpgroup == 2 * b.per_warpgroup   # elements: bytes for e4m3
    v = frame.gmma_operand("v", fp8, p8, 2)      # (d_v = 128 rows) x (128 keys): K-major, one 128-byte atom a row
    assert v.layout_type == 1 and v.stride == 64


def test_fp8_layouts_are_dense_varlen_and_paged_and_an_unknown_one_is_refused_with_the_reason():
    from kernel_abi.spec import fp8_layout_errors

    assert not any(fp8_layout_errors(layout) for layout in ("dense", "varlen", "paged"))
    assert "V is read transposed" in fp8_layout_errors("ragged")[0]


def test_an_fp8_paged_kernel_takes_the_cp_async_producer_only_with_the_runtimes_v_t():
    """K by the producer warpgroup's cp.async, V^T by TMA (tests/translate/test_fp8_paged_cp_async.py); the in-kernel
    transpose's warps leave no warpgroup to copy K."""
    spec = _spec(128, layout="paged")
    params = KernelParams.from_dict({**hopper_params(H100, spec, page_size=16).to_dict(),
                                     "g2s_atom": "SM80_CP_ASYNC_CACHEGLOBAL", "producer_regs": 56})
    assert validate(params, H100, _problem(128), warp_specialized=True) == []
    producer = KernelParams.from_dict({**params.to_dict(), "v_transpose": "producer"})
    errors = validate(producer, H100, _problem(128), warp_specialized=True)
    assert any("v_transpose 'producer' load K and V with TMA" in e for e in errors), errors


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_an_fp8_paged_kernel_reads_k_by_pages_and_v_t_as_the_packed_kernel_does(d, causal):
    """K from the pages in TMA boxes of kChunkQK bytes (the 16-bit TMA producer's tma_load_paged), V^T from the packed
    V^T at the sequence's aligned key (the runtime gathers the pages into the varlen kernel's layout), the descales of
    the tile's sequence; the defaults are the TMA producer without the 16-bit paged kernel's ping-pong."""
    paged, varlen = _generate(_spec(d, causal, "gqa", "paged")), _generate(_spec(d, causal, "gqa", "varlen"))
    body = paged.body
    assert paged.params.g2s_atom == "SM90_TMA" and not paged.params.pingpong and paged.params.pv_wait == "after"
    assert ("attn_sm90::tma_load_paged<kHeadDimQK / kChunkQK, kBlockN, kChunkQK>(&tma_k, &k_full[slot], "
            "smem_k + slot * kTileKElems, n_block * kBlockN, seqlen_k, bidh_kv, pages, page_size);") in body
    vt_load = ("attn_sm90::tma_load_vt<kBlockN / kChunkV, kHeadDimV, kChunkV>(&tma_v, &v_full[slot], smem_v + slot * "
               "kTileVElems, attn_sm90::packed_vt_key0<kPackedVtAlign>(k_row0, vt.seq) + n_block * kBlockN, bidh_kv, "
               "bidb);")
    assert vt_load in body and vt_load in varlen.body
    assert "constexpr int kPackedVtAlign = 16;" in body and paged.tensor_maps["v"]["seq_align"] == 16
    assert "const int descale_at = vt.seq * (heads_q / group) + bidh_kv;" in body
    assert "cp_async" not in body and "tma_load_tile<kHeadDimQK / kChunkQK, kBlockN" not in body
    names = [name for name, _ in paged.extra_args]
    assert names[3:12] == ["cu_seqlens_q", "cu_seqlens_k", "seqused_k", "page_table", "page_table_stride",
                           "page_size", "q_descale", "k_descale", "v_descale"]
    assert paged.tensor_maps["k"]["cols"] == (128 if d == 128 else 64) and paged.tensor_maps["v"]["transposed"]
    assert paged.smem_bytes == varlen.smem_bytes   # the tile's lengths and the sequence order alike


@pytest.mark.parametrize("d", [64, 128])
def test_a_packed_fp8_kernel_reads_the_descales_of_its_tiles_sequence(d):
    """A dense tile's descales are its batch's; a packed tile's batch index is 0 (one 'batch' of packed rows), so the
    descales must come from the sequence the producer found for it (VarlenTile.seq)."""
    dense, packed = _generate(_spec(d, variant="gqa")), _generate(_spec(d, variant="gqa", layout="varlen"))
    assert "const int descale_at = bidb * (heads_q / group) + bidh_kv;" in dense.body
    assert "const int descale_at = vt.seq * (heads_q / group) + bidh_kv;" in packed.body
    assert "vt.seq" not in dense.body and "bidb *" not in packed.body.split("descale_at =")[1].split(";")[0]
    assert "attn_sm90::tma_load_vt<" in packed.body and "cu_seqlens_q" in packed.body
    names = [name for name, _ in packed.extra_args]   # the layout's pointers, then the descales (launch order)
    assert names[3:9] == ["cu_seqlens_q", "cu_seqlens_k", "seqused_k", "q_descale", "k_descale", "v_descale"]
    # the tile's lengths and the longest-first order beside the dense kernel's shared memory
    assert packed.smem_bytes - dense.smem_bytes in (32, 32 + 1024)
    assert packed.params.producer_regs == 32   # the producer walks the sequences (translate/defaults.py)
    # the packed epilogue's rows leave as bf16 (16-byte chunks of 8 outputs), never as the inputs' e4m3
    assert "convert_type<ElementO>(acc_O" in packed.body and "convert_type<Element>(acc_O" not in packed.body


def test_smem_counts_one_byte_elements_and_the_bf16_output():
    gen = _generate(_spec(128, causal=False))
    p = gen.params
    want = p.block_m * (128 + 2 * 128) + p.kv_stages * p.block_n * 256 + (2 + 4 * p.kv_stages) * 8 + 16
    assert gen.smem_bytes == want


@pytest.mark.parametrize("variant", ["mha", "gqa", "mqa"])
def test_the_search_spaces_offer_fp8_only_what_fp8_kernels_take(variant):
    from search_spaces import load_space
    from translate.params_sm90 import FP8_BLOCK_N

    domains = load_space(variant).domains(H100, 128, "fp8")
    assert set(domains["schedule"]) <= {"ws_overlap", "ws_serial"}
    assert set(domains["hopper_block_n"]) <= set(FP8_BLOCK_N)
    assert domains["pv_operand"] == ("rs",) and domains["rescale_threshold"] == (0, 2)
    assert domains["hopper_kv_copy"] == ("SM90_TMA", "SM80_CP_ASYNC_CACHEGLOBAL")   # cp.async: paged spaces only
    assert set(load_space(variant).domains(H100, 128, "bf16")["hopper_block_n"]) - set(FP8_BLOCK_N)   # 16-bit: more


def test_fa3s_fp8_d64_tile_fits_three_consumer_warpgroups_and_a_wider_one_does_not():
    """192 x 160 at d64 (FA3's FP8 tile) is within the FP8 register estimate (ptxas builds it without spills); 192 x 192
    is refused with its registers (it spills 208-224 bytes)."""
    base = hopper_params(H100, _spec(64)).to_dict()
    fits = KernelParams.from_dict({**base, "block_m": 192, "num_warps": 12, "block_n": 160})
    assert validate(fits, H100, _problem(64), warp_specialized=True) == []
    wide = KernelParams.from_dict({**base, "block_m": 192, "num_warps": 12, "block_n": 192})
    assert any("registers" in e for e in validate(wide, H100, _problem(64), warp_specialized=True))


@pytest.mark.parametrize("threshold, offset", [(0, 8), (2, 6)])
def test_an_fp8_kernels_conditional_rescale_offsets_p_by_8_less_its_threshold(threshold, offset):
    """P may run 2^threshold past a row's running max before the max moves (attn_tl::update_row_max), so P is offset by
    8 - threshold (translate/sm90/frame.py fp8_max_offset) and still peaks at 2^8 < 448; the output's rescale skips a
    row whose factor is 1. Threshold 0 is the kernel as it was: offset 8, every tile rescaled."""
    for schedule in ("ws_overlap", "ws_serial"):
        spec = _spec(128)
        params = KernelParams.from_dict({**hopper_params(H100, spec).to_dict(), "rescale_threshold": threshold})
        assert validate(params, H100, _problem(128), warp_specialized=True) == []
        program = tl.parse_program(tl.load_sketch(spec.variant, spec.causal, schedule, spec.layout))
        body = translate.generate(program, params, H100, spec).body
        assert f"constexpr int kMaxOffset = {offset};" in body
        assert f"attn_sm90::softmax_tile<{threshold}, 0, kMaxOffset, kMaxChains>(" in body
        assert ("attn_sm90::rescale_rows<true>(" in body) == (threshold > 0)
