"""Campaigns of kernels built with attention options (--window, --softcap, --sinks, a preset's layers): the
combinations and study names they make, the sketches they search (the warp-specialised ones, with the options'
statements), what is refused where the kernels cannot build them, and (slow: the fake-GPU Ray cluster, the replay
backend) a window campaign that stores and exports local kernels."""
import dataclasses
import json

import pytest
from typer.testing import CliRunner

from hardware_profiles import load_profile
from tuner.campaign.combos import ComboError, expand_combinations
from tuner.campaign import sketches as sk
from tuner.campaign import study as st


def test_a_preset_with_local_and_global_layers_is_two_combinations_with_their_options():
    combos = expand_combinations(load_profile("h100"), None, None, None, None, "gpt-oss-20b")
    assert [(c.layer, c.window, c.softcap, c.sinks) for c in combos] == [("local", (127, 0), 0.0, True),
                                                                           ("global", (-1, -1), 0.0, True)]
    local, global_ = (c.spec() for c in combos)
    assert local.features == ("local", "sinks") and global_.features == ("sinks",)
    names = [st.study_name("h100", c.spec(), heads=c.heads, options_tag=c.options_tag()) for c in combos]
    assert names == ["h100-gqa-bf16-d64-causal-64q8kv-w127-sinks", "h100-gqa-bf16-d64-causal-64q8kv-sinks"]
    problem = combos[0].problems(seqlens=(2048,))[0]
    assert (problem.window, problem.sinks, problem.heads_q, problem.heads_kv) == ((127, 0), True, 64, 8)
    (only,) = expand_combinations(load_profile("h100"), None, None, None, None, "gpt-oss-20b", layer="global")
    assert only.layer == "global" and only.window == (-1, -1)
    plain = expand_combinations(load_profile("h100"), None, None, None, None, "llama3-8b")
    assert [c.has_options() for c in plain] == [False] and st.study_name(
        "h100", plain[0].spec(), heads=plain[0].heads, options_tag=plain[0].options_tag()) == "h100-gqa-bf16-d128-causal-32q8kv"


def test_phi3_minis_preset_is_a_head_dim_96_campaign_of_its_sliding_window():
    (combo,) = expand_combinations(load_profile("h100"), None, None, None, None, "phi3-mini")
    spec = combo.spec()
    assert (spec.variant, spec.d_qk, spec.d_v, spec.causal, spec.features) == ("mha", 96, 96, True, ("local",))
    problem = combo.problems(seqlens=(4096,))[0]
    assert (problem.heads_q, problem.heads_kv, problem.window) == (32, 32, (2046, 0))


@pytest.mark.parametrize("layout, page", [("varlen", None), ("paged", 16)])
def test_a_serving_layouts_campaign_builds_and_times_a_presets_options(layout, page):
    """Gemma 2's local layers in a serving layout: kernels built with the window and the cap (the warp-specialised
    sketches with their statements) and every mix carrying them, so that a trial times what the layer computes."""
    from tl.options import options_of
    import tl

    (c,) = [c for c in expand_combinations(load_profile("h100"), None, None, None, None, "gemma2-9b", layout, page)
            if c.layer == "local"]
    spec = c.spec()
    assert (spec.layout, spec.features, spec.d_qk) == (layout, ("local", "softcap"), 256)
    problems = c.problems()
    assert problems and all((p.window, p.softcap, p.sinks, p.layout) == ((4095, 0), 50.0, False, layout)
                            for p in problems)
    assert all(p.pairs < dataclasses.replace(p, window=(-1, -1)).pairs for p in problems if p.max_seqlen_k > 4096)
    sketches = sk.campaign_sketches(spec.variant, spec.causal, ["fa2", "ws_overlap", "ws_serial"], (), layout,
                                    features=spec.features)
    assert sketches and all(s.base.startswith("ws_") for s in sketches)
    assert all(options_of(tl.parse_program(s.text)) == {"local", "softcap"} for s in sketches)


def test_flags_apply_to_every_combination_and_win_over_a_presets_options():
    combos = expand_combinations(load_profile("h100"), "mha,gqa", "128", None, "both", None, window=(4096, 0),
                                 softcap=50.0)
    assert len(combos) == 4 and all(c.spec().features == ("local", "softcap") for c in combos)
    assert {c.options_tag() for c in combos} == {"-w4096-cap50", "-w4096x0-cap50"}
    (c,) = expand_combinations(load_profile("h100"), None, None, None, None, "gpt-oss-20b", window=(255, 0))
    assert (c.window, c.sinks, c.layer) == ((255, 0), False, None)


@pytest.mark.parametrize("kwargs, words", [
    (dict(variant="mha", window=(128, 0), gpu="a100"), "a100 is not a Hopper GPU"),
    (dict(variant="mla", softcap=30.0, phase="decode"), "absorbed MLA decode kernels are built without"),
    (dict(variant="mha", layer="local"), "give --model"),
    (dict(model="mistral-7b-v0.1", layer="global"), "has local layers; --layer global is not one of them"),
])
def test_what_cannot_be_tuned_is_refused_saying_why(kwargs, words):
    profile = load_profile(kwargs.pop("gpu", "h100"))
    args = dict(variant=None, head_dim=None, dtype=None, causal=None, model=None)
    args.update({k: kwargs.pop(k) for k in list(kwargs) if k in args})
    with pytest.raises(ComboError, match=words):
        expand_combinations(profile, args["variant"], args["head_dim"], args["dtype"], args["causal"], args["model"],
                            **kwargs)


def test_option_sketches_are_the_warp_specialised_ones_with_the_options_stated():
    from tl.options import options_of
    import tl

    out = sk.campaign_sketches("gqa", True, ["fa2", "fa2_late_prefetch", "ws_overlap", "ws_serial"],
                               features=("local", "sinks"))
    assert out and all(s.base.startswith("ws_") for s in out)
    assert all(options_of(tl.parse_program(s.text)) == {"local", "sinks"} for s in out)
    plain = sk.campaign_sketches("gqa", True, ["fa2", "ws_overlap"])
    assert any(s.base == "fa2" for s in plain) and all(not options_of(tl.parse_program(s.text)) for s in plain)


def test_the_cli_takes_the_flags_and_refuses_bad_values_in_one_line(tmp_path):
    from tuner.commands.cli import app

    for args, words in ((["--window", "abc"], "--window must be L,R"), (["--softcap", "-3"], "--softcap must be"),
                        (["--gpu", "a100", "--sinks"], "not a Hopper GPU")):
        argv = ["--gpu", "h100", "--variant", "mha", "--dry-run", "--study-dir", str(tmp_path / "s"), *args]
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 2 and result.stderr.count("\n") == 1 and words in result.stderr, result.stderr
        assert not (tmp_path / "s").exists()


@pytest.mark.slow
def test_a_window_campaign_stores_and_exports_local_kernels(ray_cluster, tmp_path):
    from tuner.campaign import run_campaign
    from tuner.serving import read_configs
    from tuner.store.export import run_export
    from tuner.store.records import KernelStore

    from .conftest import STUDY, replay_options

    studies = tmp_path / "studies"
    assert run_campaign(replay_options(studies, window=(4096, 0), trials=6)) == 0
    name = f"{STUDY}-w4096"
    summary = json.loads((studies / name / "summary.json").read_text())
    assert summary["trials"]["done"] == 6
    records = KernelStore(studies).records(gpu="h100", variant="mha")
    assert records and all(r.features == ("local",) for r in records)
    assert all("Window" in r.tl_program and tuple(r.problem["window"]) == (4096, 0) for r in records)
    assert all(r.kernel_meta["spec"]["local"] is True for r in records)
    out = tmp_path / "exported"
    assert run_export(gpu="h100", variant="mha", study_dir=studies, out_dir=out) == 0
    (config,) = read_configs(out)
    assert config.features == ("local",) and ",features=local," in config.path.name


@pytest.mark.slow
def test_a_varlen_window_campaign_stores_and_exports_local_serving_kernels(ray_cluster, tmp_path):
    from tuner.campaign import run_campaign
    from tuner.serving import read_configs
    from tuner.store.export import run_export
    from tuner.store.records import KernelStore

    from .conftest import replay_options

    studies = tmp_path / "studies"
    assert run_campaign(replay_options(studies, window=(4096, 0), trials=6, layout="varlen")) == 0
    (summary,) = studies.glob("*-w4096-varlen/summary.json")
    assert json.loads(summary.read_text())["trials"]["done"] == 6
    records = KernelStore(studies).records(gpu="h100", variant="mha")
    assert records and all(r.features == ("local",) and r.kernel_meta["spec"]["layout"] == "varlen" for r in records)
    assert all("Window" in r.tl_program and tuple(r.problem["window"]) == (4096, 0) for r in records)
    out = tmp_path / "exported"
    assert run_export(gpu="h100", variant="mha", study_dir=studies, out_dir=out) == 0
    configs = read_configs(out)
    assert configs and all(c.features == ("local",) and c.layout == "varlen" for c in configs)


@pytest.mark.parametrize("model, layer, features, window", [
    ("gpt-oss-20b", "local", ("local", "sinks"), (127, 0)), ("gpt-oss-20b", "global", ("sinks",), (-1, -1)),
    ("gemma2-9b", "local", ("local", "softcap"), (4095, 0)), ("mistral-7b-v0.1", None, ("local",), (4095, 0))])
def test_a_decode_campaign_of_a_model_builds_and_times_its_layers_options(model, layer, features, window):
    """--phase decode of a preset with options: kernels built with them (its decode sketches with their statements)
    and every bucket's problem carrying them, so that the trial times and cross-checks what the layer computes."""
    from tuner.campaign.sketches import campaign_sketches
    from tl.options import options_of
    import tl

    (c,) = [c for c in expand_combinations(load_profile("a100"), None, None, None, None, model, "paged", 16, "decode")
            if layer is None or c.layer == layer]
    spec = c.spec()
    assert spec.phase == "decode" and spec.features == features
    problems = c.problems()
    assert problems and all(p.window == window and p.sinks == spec.sinks and p.softcap == c.softcap
                            for p in problems)
    sketches = campaign_sketches(spec.variant, spec.causal, list(tl.DECODE_SCHEDULES), (), spec.layout, spec.phase,
                                 spec.features)
    assert [s.name for s in sketches] == list(tl.DECODE_SCHEDULES)
    assert all(set(options_of(tl.parse_program(s.text))) == set(features) for s in sketches)


def test_a_windowed_decode_problem_counts_the_keys_it_reads():
    (c,) = expand_combinations(load_profile("h100"), "gqa", "64", None, None, None, "paged", 16, "decode",
                               window=(127, 0), sinks=True)
    p = max(c.problems(), key=lambda p: p.kv_len)
    plain = max(c.__class__(**{**c.__dict__, "window": (-1, -1), "sinks": False}).problems(), key=lambda p: p.kv_len)
    assert p.kv_len == plain.kv_len > 128
    assert p.flops == plain.flops * 128 / p.kv_len and p.kv_bytes == plain.kv_bytes * 128 / p.kv_len
    assert "window 127,0 sinks" in p.label()
