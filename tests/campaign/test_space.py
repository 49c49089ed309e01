"""Search spaces as data: loading, validation of broken files, profile restrictions, suggest()."""
import warnings

import optuna
import pytest

from hardware_profiles import load_profile
from search_spaces import SpaceError, available_spaces, load_space, parse_space, suggest
from translate.params import KernelParams
from kernel_abi.spec import spec_for

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(autouse=True)
def package_spaces(monkeypatch):
    """The package's spaces, not the recorded ones the campaign tests replay (conftest.recorded_spaces)."""
    from search_spaces import SPACES_ENV

    monkeypatch.delenv(SPACES_ENV, raising=False)


def test_tuner_search_spaces_points_at_a_users_own_spaces(tmp_path, monkeypatch):
    from search_spaces import SPACES_ENV

    (tmp_path / "mha.toml").write_text('variant = "mha"\n[params.schedule]\nchoices = ["fa2"]\n')
    monkeypatch.setenv(SPACES_ENV, str(tmp_path))
    assert available_spaces() == ["mha"]
    assert load_space("mha").domains(load_profile("h100"), 128, "bf16")["schedule"] == ("fa2",)
    with pytest.raises(SpaceError, match="choose one of: mha"):
        load_space("gqa")


def test_every_variant_has_a_space_and_unknown_ones_list_the_choices():
    assert available_spaces() == ["gqa", "mha", "mla", "mqa"]
    for v in available_spaces():
        assert load_space(v).variant == v
    with pytest.raises(SpaceError, match="choose one of: gqa, mha, mla, mqa"):
        load_space("flash")


def test_sm75_gets_turing_atoms_only_and_bf16_never_gets_the_k8_atom():
    space = load_space("mha")
    t4 = space.domains(load_profile("t4"), 128, "fp16")
    assert t4["mma_atom"] == ("SM75_16x8x8",) and t4["g2s_atom"] == ("UniversalCopy128",)
    h100 = space.domains(load_profile("h100"), 128, "bf16")
    assert h100["mma_atom"] == ("SM90_GMMA",)   # Hopper's fa2 sketch on wgmma only ([arch.sm90])
    assert h100["schedule"] == ("ws_overlap", "ws_serial", "fa2")
    assert space.domains(load_profile("a100"), 128, "bf16")["schedule"] == ("fa2",)   # no wgmma: the paper's flow
    assert space.domains(load_profile("a100"), 128, "bf16")["mma_atom"] == ("SM80_16x8x16",)
    assert "SM75_16x8x8" in space.domains(load_profile("a100"), 128, "fp16")["mma_atom"]
    assert 256 in space.domains(load_profile("h100"), 64, "bf16")["block_n"]      # head-dim specific
    assert 256 not in space.domains(load_profile("h100"), 128, "bf16")["block_n"]
    assert load_space("mla").domains(load_profile("h100"), 192, "bf16")["block_m"] == (64, 128)


def _study(seed=0):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = optuna.samplers.TPESampler(multivariate=True, group=True, seed=seed, n_startup_trials=5)
    return optuna.create_study(direction="maximize", sampler=sampler)


@pytest.mark.parametrize("gpu,variant,dtype", [("h100", "mha", "bf16"), ("t4", "gqa", "fp16"), ("a100", "mla", "bf16")])
def test_suggest_stays_in_the_profile_and_keeps_distributions_fixed(gpu, variant, dtype):
    profile, space = load_profile(gpu), load_space(variant)
    spec = spec_for(variant, None, dtype, True)
    study = _study()
    dists = {}
    for i in range(30):
        trial = study.ask()
        p = suggest(trial, space, profile, spec)
        assert p.mma_atom in profile.mma_atoms and p.g2s_atom in profile.g2s_copy_atoms
        if p.g2s_atom == "UniversalCopy128":
            assert p.kv_stages == 1 and "kv_stages" not in trial.params      # conditional: not searched
        if p.s2r_atom == "UniversalCopy":
            assert p.swizzle == 3 and "swizzle" not in trial.params
        for name, d in trial.distributions.items():
            assert dists.setdefault(name, d) == d
        study.tell(trial, float(p.block_m * p.block_n % 97))


def test_project_maps_seeds_into_the_space_or_says_why_not():
    space, h100 = load_space("mha"), load_profile("a100")   # (FA2's seeds: mma.sync atoms, not offered on Hopper)
    chosen, problems = space.project(KernelParams(block_m=128, block_n=64).to_dict(), h100, 128, "bf16")
    assert problems == [] and chosen["block_n"] == 64 and "kv_stages" in chosen
    _, problems = space.project(KernelParams(block_n=72).to_dict(), h100, 128, "bf16")
    assert any("block_n=72" in p for p in problems)
    _, problems = space.project(KernelParams(g2s_atom="UniversalCopy128", kv_stages=2).to_dict(), h100, 128, "bf16")
    assert any("kv_stages=2 is fixed to 1" in p for p in problems)


@pytest.mark.parametrize("data,message", [
    ({"variant": "mha", "params": {"block_q": {"choices": [64]}}}, "unknown parameter 'block_q'"),
    ({"variant": "mha", "params": {"block_m": {"choices": ["64"]}}}, "'64' is not a int"),
    ({"variant": "mha", "params": {"block_m": {"choices": []}}}, "non-empty list"),
    ({"variant": "mha", "params": {"kv_stages": {"type": "int", "low": 1, "high": 2, "when": {"g2s_atom": ["X"]},
                                                 "default": 1}}}, "not declared before it"),
    ({"variant": "mha", "params": {"swizzle": {"choices": [3], "when": {}, "default": 3}},
      "arch": {"sm75": {"tile": [1]}}}, "unknown parameter 'tile'"),
    ({"variant": "mha", "params": {"num_warps": {"type": "float", "choices": [4]}}}, "type must be"),
    ({"params": {"num_warps": {"choices": [4]}}}, "missing 'variant'"),
    ({"variant": "mha", "params": {"block_m": {"choices": [64], "by_layout": {"ragged": {"128": [64]}}}}},
     "by_layout key 'ragged' is not a layout"),
    ({"variant": "mha", "params": {"block_m": {"choices": [64], "by_layout": {"paged": {"d128": [64]}}}}},
     "by_layout.paged key 'd128' is not a head dim"),
    ({"variant": "mha", "params": {"block_m": {"choices": [64], "by_layout": {"paged": {"128": ["64"]}}}}},
     "by_layout.paged.128: '64' is not a int"),
])
def test_broken_space_files_name_the_fault(data, message):
    with pytest.raises(SpaceError, match=message):
        parse_space(data, "broken.toml")


def test_a_layout_gets_its_own_choices_at_its_head_dims_and_no_other_layout_or_head_dim_does():
    """by_layout: pv_wait "half" is searched for paged d128 kernels only (measured ahead there, behind on dense d128
    and at d64); the dense space, which the recorded-grid replays sample, is unchanged."""
    h100 = load_profile("h100")
    for variant in ("mha", "gqa", "mqa"):
        dense, varlen, paged = (load_space(variant, layout=lay) for lay in ("dense", "varlen", "paged"))
        assert paged.domain("pv_wait", h100, 128, "bf16") == ("after", "half")
        assert dense.domain("pv_wait", h100, 128, "bf16") == varlen.domain("pv_wait", h100, 128, "bf16") == ("after",)
        assert paged.domain("pv_wait", h100, 64, "bf16") == dense.domain("pv_wait", h100, 64, "bf16") == ("after", "mid")
        assert dense == load_space(variant)
    with pytest.raises(SpaceError, match="unknown layout 'ragged'"):
        load_space("mha", layout="ragged")


def test_a_space_with_nothing_legal_for_a_profile_is_an_error():
    space = parse_space({"variant": "mha", "params": {"g2s_atom": {"choices": ["SM80_CP_ASYNC_CACHEGLOBAL"]}}})
    with pytest.raises(SpaceError, match="no legal value on t4"):
        space.domains(load_profile("t4"), 128, "fp16")


def test_hopper_space_draws_schedules_with_their_own_parameters():
    """On the H100 the sketch is a dimension: warp-specialised candidates get wgmma, TMA and a derived warp
    count; the paper's flow gets wgmma or the sm80-class atoms; distributions stay fixed per name."""
    from search_spaces import suggest_candidate

    profile, space = load_profile("h100"), load_space("mha")
    spec = spec_for("mha", 128, "bf16", True)
    study = _study(seed=3)
    seen = set()
    for _ in range(60):
        trial = study.ask()
        schedule, p = suggest_candidate(trial, space, profile, spec)
        seen.add(schedule)
        if schedule.startswith("ws_"):
            # (TMA, or cp.async for a paged cache: the feasible space keeps each layout's own)
            assert p.mma_atom == "SM90_GMMA" and "mma_atom" not in trial.params
            assert p.g2s_atom in ("SM90_TMA", "SM80_CP_ASYNC_CACHEGLOBAL")
            assert p.block_m in (64, 128, 192) and p.num_warps == p.block_m // 16 and p.kv_stages in (2, 3)
        else:
            assert not (p.pingpong or p.persistent) and "pingpong" not in trial.params
            if p.is_gmma:
                assert p.num_warps == p.block_m // 16 and p.g2s_atom.startswith("SM80_CP_ASYNC")
        study.tell(trial, float(p.block_n))
    assert seen == {"ws_overlap", "ws_serial", "fa2"}


def test_project_checks_derived_fields_and_the_schedule():
    space, h100 = load_space("mha"), load_profile("h100")
    ws = dict(KernelParams(block_m=128, block_n=128, num_warps=8, kv_stages=2, mma_atom="SM90_GMMA",
                           g2s_atom="SM90_TMA").to_dict(), schedule="ws_overlap")
    chosen, problems = space.project(ws, h100, 128, "bf16")
    assert problems == [] and chosen["schedule"] == "ws_overlap" and chosen["hopper_block_m"] == 128
    _, problems = space.project(dict(ws, num_warps=4), h100, 128, "bf16")
    assert any("num_warps=4 is derived: block_m / 16 = 8" in p for p in problems)
    _, problems = space.project(ws, load_profile("a100"), 128, "bf16")
    assert any("schedule='ws_overlap' is outside ['fa2']" in p for p in problems)


@pytest.mark.parametrize("data,message", [
    ({"variant": "mha", "params": {"hopper_block_m": {"target": "block_q", "choices": [64]}}}, "unknown parameter 'block_q'"),
    ({"variant": "mha", "params": {"block_m": {"choices": [64]}}, "derived": {"num_warps": {"when": {}}}},
     "needs a KernelParams field and an 'expr'"),
    ({"variant": "mha", "params": {"block_m": {"choices": [64]}},
      "derived": {"num_warps": {"expr": "block_m / 16", "when": {"mma_atom": ["X"]}}}}, "which no parameter sets"),
])
def test_broken_targets_and_derived_fields_name_the_fault(data, message):
    with pytest.raises(SpaceError, match=message):
        parse_space(data, "broken.toml")
