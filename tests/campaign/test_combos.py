"""Expanding a campaign's --variant/--head-dim/--dtype/--causal/--model values into combinations."""
import pytest

from hardware_profiles import load_profile
from tuner.campaign.combos import Combination, ComboError, expand_combinations
from kernel_abi.spec import grid_problems

H100, T4 = load_profile("h100"), load_profile("t4")


def expand(profile=H100, variant=None, head_dim=None, dtype=None, causal=None, model=None):
    return expand_combinations(profile, variant, head_dim, dtype, causal, model)


def test_defaults_are_one_causal_bf16_d128_combination():
    assert expand(variant="mha") == [Combination("mha", 128, "bf16", True)]
    assert expand(T4, variant="mha") == [Combination("mha", 128, "fp16", True)]  # t4 has no bf16


def test_all_is_the_four_variants_with_mla_at_192_128():
    combos = expand(variant="ALL")
    assert [c.variant for c in combos] == ["mha", "gqa", "mqa", "mla"]
    assert combos[-1].head_dim is None and combos[-1].spec().d_qk == 192 and combos[-1].spec().d_v == 128


def test_lists_keep_order_drop_duplicates_and_nest_variant_major():
    combos = expand(variant="gqa, mha,gqa", head_dim="128,64", dtype="fp16,bf16", causal="both")
    assert len(combos) == 2 * 2 * 2 * 2
    assert [c.label() for c in combos[:5]] == ["gqa d128 fp16 causal", "gqa d128 fp16 noncausal",
                                               "gqa d128 bf16 causal", "gqa d128 bf16 noncausal",
                                               "gqa d64 fp16 causal"]
    assert {c.variant for c in combos[8:]} == {"mha"}


@pytest.mark.parametrize("word, flags", [("both", [True, False]), ("Causal", [True]), ("yes", [True]),
                                         ("1", [True]), ("noncausal", [False]), ("FALSE", [False]),
                                         ("0", [False]), (False, [False]), (True, [True])])
def test_causal_words(word, flags):
    assert [c.causal for c in expand(variant="mha", causal=word)] == flags


def test_bad_causal_word_lists_the_accepted_ones():
    with pytest.raises(ComboError, match=r"--causal 'sometimes' is not one of: both, true, causal, yes"):
        expand(variant="mha", causal="sometimes")


def test_dtype_the_gpu_lacks_names_the_profile():
    with pytest.raises(ComboError, match=r"t4 does not support bf16; choose one of: fp16"):
        expand(T4, variant="mha", dtype="fp16,bf16")
    with pytest.raises(ComboError, match=r"t4 does not support fp8"):
        expand(T4, variant="mha", dtype="fp8")
    with pytest.raises(ComboError, match="unknown dtype 'fp4'"):
        expand(variant="mha", dtype="fp4")


def test_mla_ignores_head_dims_beside_other_variants():
    combos = expand(variant="mha,mla", head_dim="64,128")
    assert [c.label() for c in combos] == ["mha d64 bf16 causal", "mha d128 bf16 causal", "mla d192/128 bf16 causal"]


def test_mla_alone_rejects_other_head_dims_like_spec_for():
    with pytest.raises(ComboError, match="mla has head dims q/k 192, v 128; --head-dim 64 does not apply"):
        expand(variant="mla", head_dim=64)
    assert expand(variant="mla", head_dim="192") == [Combination("mla", None, "bf16", True)]


def test_head_dims_192_and_256_are_combinations_of_their_own_beside_mla():
    combos = expand(variant="mha,mla", head_dim="192,256")
    assert [(c.variant, c.spec().d_qk, c.spec().d_v) for c in combos] == [("mha", 192, 192), ("mha", 256, 256),
                                                                             ("mla", 192, 128)]
    problem = combos[1].problems()[0]
    assert (problem.d_qk, problem.heads_q) == (256, 8)          # the paper grid: hidden 2048


@pytest.mark.parametrize("variant, head_dim, message", [
    ("mha,flash", None, r"unknown variant 'flash'; choose from: mha, gqa, mqa, mla"),
    ("mha", "80", "head dim 80 is not supported; choose 64, 96, 128, 192, 256"),
    ("mha,mla", "320", "head dim 320 is not supported"),
    ("mha", "sixty-four", "--head-dim must be a comma list"),
    (" , ", None, "--variant is empty"),
    (None, None, "give --variant"),
])
def test_bad_variants_and_head_dims(variant, head_dim, message):
    with pytest.raises(ComboError, match=message):
        expand(variant=variant, head_dim=head_dim)


def test_model_preset_sets_variant_head_dim_and_heads():
    (combo,) = expand(model="llama3-8b")
    assert combo == Combination("gqa", 128, "bf16", True, heads=(32, 8), model="llama3-8b")
    assert combo.label() == "gqa d128 bf16 causal (llama3-8b, 32q/8kv)"
    (mla,) = expand(model="DeepSeek-V3")
    assert (mla.variant, mla.head_dim, mla.heads) == ("mla", None, (128, 128))


def test_explicit_dtype_and_causal_override_the_preset():
    combos = expand(model="llama3-8b", dtype="fp16", causal="both")
    assert [(c.dtype, c.causal, c.heads) for c in combos] == [("fp16", True, (32, 8)), ("fp16", False, (32, 8))]


def test_model_with_variant_or_head_dim_is_an_error():
    with pytest.raises(ComboError, match="--model sets the variant and head dim; drop --variant/--head-dim"):
        expand(model="llama3-8b", variant="gqa")
    with pytest.raises(ComboError, match="drop --variant/--head-dim"):
        expand(model="llama3-8b", head_dim=128)


def test_model_errors():
    with pytest.raises(ComboError, match="unknown model 'gpt-5'; choose one of: "):
        expand(model="gpt-5")
    # llama3-8b is a bf16 model and t4 has only fp16: nothing to tune unless --dtype says so.
    with pytest.raises(ComboError, match=r"llama3-8b runs in bf16, which t4 does not support"):
        expand(T4, model="llama3-8b")
    assert expand(T4, model="llama3-8b", dtype="fp16")[0].dtype == "fp16"


def test_grid_problems_with_model_heads():
    default = grid_problems("gqa", 128, "bf16", True, seqlens=(1024, 4096))
    assert [(p.heads_q, p.heads_kv) for p in default] == [(16, 2), (16, 2)]  # the paper grid: hidden 2048
    with_heads = grid_problems("gqa", 128, "bf16", True, seqlens=(1024, 4096), heads=(32, 8))
    assert [(p.heads_q, p.heads_kv, p.d_qk, p.batch) for p in with_heads] == [(32, 8, 128, 16), (32, 8, 128, 4)]
    assert [p.with_(heads_q=16, heads_kv=2) for p in with_heads] == default  # only the heads differ
    with pytest.raises(ValueError, match="mha needs heads_q == heads_kv"):
        grid_problems("mha", 128, "bf16", True, heads=(32, 8))


def test_grid_problems_default_output_unchanged():
    # The full default grid, as before heads= existed: both masks, six seqlens, 16k tokens.
    probs = grid_problems("mha", 64, "fp16")
    assert [(p.causal, p.seqlen_q, p.batch) for p in probs] == [
        (c, s, 16384 // s) for c in (False, True) for s in (512, 1024, 2048, 4096, 8192, 16384)]
    assert {(p.heads_q, p.heads_kv, p.d_qk, p.d_v) for p in probs} == {(32, 32, 64, 64)}


def test_combination_problems_carry_the_model_heads():
    (combo,) = expand(model="qwen2.5-72b")
    probs = combo.problems(seqlens=(2048,))
    assert [(p.variant, p.heads_q, p.heads_kv, p.d_qk, p.causal, p.dtype) for p in probs] == [
        ("gqa", 64, 8, 128, True, "bf16")]


def test_the_campaign_reads_causal_both_beside_the_causal_flags():
    from tuner.commands.cli import campaign_argv

    assert campaign_argv(["--gpu", "h100", "--variant", "mha,gqa", "--causal", "both"])[-1] == "--causal-mode=both"
    assert campaign_argv(["--gpu", "h100", "--causal=false"])[-1] == "--causal-mode=false"
    assert campaign_argv(["--gpu", "h100", "--causal", "--dtype", "bf16"]) == ["--gpu", "h100", "--causal", "--dtype",
                                                                             "bf16"]
    assert campaign_argv(["bench", "--gpu", "h100", "--causal"]) == ["bench", "--gpu", "h100", "--causal"]


# ---- one run for a model's serving: several layouts and phases ---------------------------------------------

def test_layout_all_phase_all_gives_a_model_every_serving_kernel_one_combination_each():
    from tuner.campaign.combos import expand_combinations

    notes = []
    combos = expand_combinations(load_profile("h100"), None, None, None, None, "llama3-8b", "all", None, "all",
                                 notes=notes)
    assert [(c.layout, c.phase, c.page_size) for c in combos] == [
        ("dense", "prefill", None), ("varlen", "prefill", None), ("paged", "prefill", 16), ("paged", "decode", 16)]
    assert notes == [] and len({c.spec() for c in combos}) == 4
    assert all(c.heads == (32, 8) and c.model == "llama3-8b" for c in combos)
    # page sizes given: each paged kernel, prefill and decode, for each
    combos = expand_combinations(load_profile("h100"), "gqa", None, None, None, None, "all", (16, 64), "all")
    assert [(c.layout, c.phase, c.page_size) for c in combos if c.layout == "paged"] == [
        ("paged", "prefill", 16), ("paged", "prefill", 64), ("paged", "decode", 16), ("paged", "decode", 64)]


def test_several_layouts_keep_what_the_gpu_and_the_options_allow_and_say_what_they_leave_out():
    from tuner.campaign.combos import expand_combinations

    notes = []
    combos = expand_combinations(load_profile("a100"), "mha", None, None, None, None, "all", None, "all", notes=notes)
    assert [(c.layout, c.phase) for c in combos] == [("dense", "prefill"), ("paged", "decode")]
    assert len(notes) == 2 and all("not a Hopper GPU" in n for n in notes)
    notes = []
    combos = expand_combinations(load_profile("h100"), None, None, None, None, "gpt-oss-20b", "all", None, "all",
                                 notes=notes)
    # gpt-oss's local and global layers: every layout and phase builds their options
    assert [(c.layout, c.phase, c.layer) for c in combos] == [
        (layout, phase, layer) for layout, phase in (("dense", "prefill"), ("varlen", "prefill"), ("paged", "prefill"),
                                                     ("paged", "decode")) for layer in ("local", "global")]
    assert all(c.sinks for c in combos) and combos[2].window == (127, 0) and combos[2].spec().features == \
        ("local", "sinks") and combos[2].spec().layout == "varlen"
    assert notes == []
    notes = []
    combos = expand_combinations(load_profile("h100"), "gqa,mla", None, None, None, None, "all", None, "all",
                                 softcap=30.0, notes=notes)
    assert ("mla", "decode") not in [(c.variant, c.phase) for c in combos] and len(notes) == 1
    assert "absorbed-MLA combination(s) with a window, softcap or sinks are left out" in notes[0]
    dense_decode = expand_combinations(load_profile("h100"), "mha", None, None, None, None, "dense", None, "all")
    assert [(c.layout, c.phase) for c in dense_decode] == [("dense", "prefill"), ("dense", "decode")]


@pytest.mark.parametrize("layout, phase, page_size, words", [
    ("dense,ragged", "prefill", None, "--layout must be dense, varlen, paged"),
    ("all", "training", None, "--phase must be prefill, decode"),
    ("all", "all", (16, 48), "--page-size must be among"),
    ("dense,varlen", "prefill", (16, 32), "--page-size applies to a paged layout"),
])
def test_several_layouts_refuse_bad_values_by_name(layout, phase, page_size, words):
    from tuner.campaign.combos import expand_combinations

    with pytest.raises(ComboError, match=words):
        expand_combinations(load_profile("h100"), "mha", None, None, None, None, layout, page_size, phase)
    with pytest.raises(ComboError, match="nothing to tune on t4"):
        expand_combinations(load_profile("t4"), "mha", None, "fp16", None, None, "varlen,paged", None, "prefill")


def test_head_dim_96_is_a_combination_with_heads_every_variant_divides():
    combos = expand_combinations(load_profile("h100"), "mha,gqa", "64,96", "bf16", "true", None)
    assert [(c.variant, c.spec().d_qk, c.spec().d_v) for c in combos] == [("mha", 64, 64), ("mha", 96, 96),
                                                                          ("gqa", 64, 64), ("gqa", 96, 96)]
    problem = combos[3].problems()[0]
    assert (problem.heads_q, problem.heads_kv, problem.d_qk) == (16, 2, 96)   # kernel_abi.spec.GRID_HEADS
