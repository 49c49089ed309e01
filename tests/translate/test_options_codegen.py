"""The options of kernel_abi.spec in the warp-specialised Hopper kernel (translate/sm90): what a local, soft-capping
or sinks kernel takes and emits, the tiles a window skips, and the errors for a sketch and a spec that disagree."""
import re

import pytest

import tl
import translate
from hardware_profiles import load_profile
from kernel_abi.spec import KernelSpec
from tl.options import with_options
from translate.defaults import default_params

H100 = load_profile("h100")


def build(variant="gqa", causal=True, layout="dense", options=(True, True, True), sketch_options=None, changes=None,
          schedule="ws_overlap"):
    spec = KernelSpec(variant, 128, 128, causal, "bf16", layout, local=options[0], softcap=options[1],
                      sinks=options[2])
    program = tl.parse_program(tl.load_sketch(variant, causal, schedule, layout))
    program = with_options(program, *(options if sketch_options is None else sketch_options))
    params = default_params(H100, spec, "ws_overlap" if schedule.startswith("ws") else "fa2",
                            page_size=16 if layout == "paged" else None)
    if changes:
        params = type(params).from_dict({**params.to_dict(), **changes})
    return translate.generate(program, params, H100, spec)


def test_an_option_kernel_takes_its_values_after_the_layouts_arguments_and_before_the_descriptors():
    k = build()
    names = [n for n, _ in k.meta()["args"]]
    at = names.index("tile_counter")
    assert names[at + 1:at + 5] == ["window_left", "window_right", "softcap_prescale", "sinks"]
    assert names[at + 5] == "tma_q"
    assert k.meta()["abi"] >= 4 and k.meta()["spec"]["local"] is True
    for decl in ("const int window_left", "const int window_right", "const float softcap_prescale",
                 "const float* __restrict__ sinks"):
        assert decl in k.source
    varlen = build(layout="varlen")
    names = [n for n, _ in varlen.meta()["args"]]
    assert names.index("seqused_k") < names.index("window_left") < names.index("tma_q")


def test_a_window_bounds_the_kv_blocks_both_roles_walk_and_masks_the_tiles_at_both_ends():
    src = build(options=(True, False, False)).source
    assert src.count("const int n_block_min = wl >= 0 ? max(0, (m_block * kBlockM + causal_offset - wl) / kBlockN)") \
        == 2                                                     # producer and consumers agree on the walk
    assert src.count("n_tiles = n_block_max - n_block_min;") == 2
    loads = re.findall(r"const int n_block = (\w+) - 1 - \(j\);", src)
    assert loads and set(loads) == {"n_block_max"}              # the producer loads the window's blocks only
    assert "if (tile_S < n_masked || tile_S >= n_tiles - n_masked_left)" in src
    assert "attn_sm90::apply_mask_window(acc_S, tScS, m_block * kBlockM, (n_block_max - 1 - tile_S) * kBlockN" in src
    assert "wr = kCausal ? 0 : window_right" in src


def test_softcap_caps_the_raw_scores_before_the_mask_and_sinks_join_before_the_division():
    src = build(options=(True, True, True)).source
    cap, mask = src.index("attn_sm90::softcap_tile(acc_S, softcap_prescale)"), src.index("apply_mask_window(acc_S")
    assert cap < mask
    sink, divide = src.index("attn_sm90::add_sink(acc_O_register"), src.index("attn_sm90::normalize_rows(")
    assert sink < divide
    before_sink = src[:sink]
    assert before_sink.rstrip().splitlines()[-1].strip().startswith("if (g")   # the last P.V GEMM waited for first


def test_packed_heads_give_each_row_its_head_for_the_sink_and_its_token_for_the_window():
    src = build(options=(True, False, True), changes={"pack_gqa": True}).source
    assert "add_sink(acc_O_register, Smax, Ssum, tScS, sinks, bidh * pack, pack," in src
    assert "seqlen_k, causal_offset, wl, wr, pack);" in src


def test_a_kernel_without_options_is_emitted_as_before():
    plain = build(options=(False, False, False)).source
    for word in ("n_block_max", "window_left", "softcap", "sinks", "n_masked_left"):
        assert word not in plain


@pytest.mark.parametrize("spec_options,sketch_options,words", [
    ((True, False, False), (False, False, False), "the kernel spec has a sliding window; the sketch states none"),
    ((False, True, False), (False, False, False), "the kernel spec has soft-capping"),
    ((False, False, True), (False, False, False), "the kernel spec has attention sinks"),
    ((False, False, False), (False, True, False), "the sketch states soft-capping but the kernel spec has none"),
    ((False, False, False), (True, False, False), "the sketch states a sliding window but the kernel spec has none"),
])
def test_a_sketch_and_a_spec_that_disagree_on_an_option_do_not_translate(spec_options, sketch_options, words):
    with pytest.raises(translate.TranslationError, match=words):
        build(options=spec_options, sketch_options=sketch_options)


def test_the_fa2_kernels_refuse_the_options_by_name():
    with pytest.raises(translate.TranslationError, match="local, softcap: built by the warp-specialised Hopper"):
        build(options=(True, True, False), schedule="fa2", changes={"mma_atom": "SM80_16x8x16",
                                                                     "g2s_atom": "SM80_CP_ASYNC_CACHEGLOBAL"})
