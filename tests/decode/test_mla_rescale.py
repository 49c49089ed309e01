"""The seesaw MLA decode kernel's conditional rescale (DecodeParams.rescale_threshold,
translate/include/attn_decode_sm90_seesaw.cuh) on the CPU: its validation reasons and key, the Hopper default that
takes it, the generated configuration (the threshold stated only where it is set, so the kernels without it keep
their sources and caches), and with nvcc the compiled kernel: the same GEMMs, no spills or wgmma serialisation, and
warp votes that let a warp skip the output's multiplies. The results are checked on a GPU by the decode gate
(tests/gpu/test_mla_decode_gpu.py), which runs the Hopper default."""
import dataclasses

import pytest

from hardware_profiles import load_profile
from translate.decode import DecodeParams, default_decode_params, validate_decode

from test_mla_seesaw import SEESAW, SEESAW_HGMMAS, clean_sass, compile_one, kernel  # noqa: E402
from test_mla_wgmma import H100, MLA  # noqa: E402

TMA = dataclasses.replace(SEESAW, kv_load="tma")
RESCALE = dataclasses.replace(TMA, rescale_threshold=8)


def test_the_key_names_the_threshold_and_round_trips():
    assert SEESAW.rescale_threshold == 0 and DecodeParams().rescale_threshold == 0
    assert RESCALE.key() == "dm64n64w4x2s2p_b2_sw3_ss_tma_rt8"
    assert TMA.key() == "dm64n64w4x2s2p_b2_sw3_ss_tma"   # kernels without it keep their names
    assert DecodeParams.from_dict(RESCALE.to_dict()) == RESCALE
    with pytest.raises(ValueError, match="rescale_threshold must be an integer"):
        DecodeParams.from_dict({"rescale_threshold": 8.0})


def test_the_threshold_is_the_seesaw_kernels_only_and_bounded():
    assert validate_decode(RESCALE, H100, MLA) == []
    assert validate_decode(dataclasses.replace(SEESAW, rescale_threshold=4), H100, MLA) == []   # gathers too
    for mma in ("sm80", "sm90_wgmma"):
        reasons = validate_decode(dataclasses.replace(SEESAW, mma=mma, rescale_threshold=8), H100, MLA)
        assert any("rescale_threshold" in r and "sm90_seesaw" in r for r in reasons), reasons
    for bad in (-1, 17):
        reasons = validate_decode(dataclasses.replace(RESCALE, rescale_threshold=bad), H100, MLA)
        assert any("rescale_threshold must be 0..16" in r for r in reasons), reasons


def test_hopper_128_heads_default_to_it_and_other_gpus_do_not():
    assert default_decode_params(MLA, 128, H100) == RESCALE
    assert default_decode_params(MLA, 128, load_profile("h200")).rescale_threshold == 8
    assert default_decode_params(MLA, 128, load_profile("a100")).rescale_threshold == 0
    assert default_decode_params(MLA, 16, H100).rescale_threshold == 0   # the 16-row mma.sync tile


def test_the_config_states_the_threshold_only_where_set():
    with_it, without = kernel(RESCALE), kernel(TMA)
    assert "static constexpr int kRescaleThreshold = 8;" in with_it.source
    assert "kRescaleThreshold" not in without.source
    assert with_it.name != without.name and "_rt8_dec" in with_it.name
    assert with_it.smem_bytes == without.smem_bytes


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return compile_one(tmp_path_factory, kernel(RESCALE), "mla_rescale")


@pytest.mark.slow
def test_the_kernel_compiles_to_the_same_gemms_and_votes_before_the_multiplies(compiled):
    from translate.sass import sass_instructions

    k = compiled[1]
    sass, cubin = clean_sass(compiled, "rescale")
    assert sass["HGMMA"] == SEESAW_HGMMAS, sass   # the GEMMs are the kernel's without the threshold
    lines = sass_instructions(cubin)[k.name]
    # a vote per output scaling in the loop (two a warpgroup and pair), each guarding its 128 multiplies
    assert sum("VOTE.ANY" in line for line in lines) >= 4, "no warp vote before the output's multiplies"
