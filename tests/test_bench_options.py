"""`tune bench` / `tune build` with --window, --softcap, --sinks: parsing, the spec and sketch they build, the
baselines' calls (SDPA's window mask, FA4's keywords) and the reference cross-check, on the CPU."""
import math

import pytest
import torch
from typer.testing import CliRunner

from kernel_abi.spec import Problem
from tuner.build import NO_OPTIONS, ModelOptions, UsageError, load_checked_program, parse_options, resolve_target
from tuner.commands.cli import app
from tuner.measure import dense, fa4
from tuner.measure.verify import reference


def _problem(**changes) -> Problem:
    base = Problem(variant="gqa", batch=2, heads_q=4, heads_kv=2, seqlen_q=37, seqlen_k=53, d_qk=32, d_v=32,
                   causal=True, dtype="bf16")
    return base.with_(**changes)


def _qkv(p: Problem, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(p.batch, p.seqlen_q, p.heads_q, p.d_qk, generator=gen),
            torch.randn(p.batch, p.seqlen_k, p.heads_kv, p.d_qk, generator=gen),
            torch.randn(p.batch, p.seqlen_k, p.heads_kv, p.d_v, generator=gen))


# --- parsing ---------------------------------------------------------------------------------------------------

def test_parse_options_reads_the_three_flags():
    options = parse_options("4096, 0", 50.0, True)
    assert options == ModelOptions((4096, 0), 50.0, True)
    assert parse_options(None, None, False) == NO_OPTIONS


@pytest.mark.parametrize("window, needle", [("a,b", "--window must be L,R"), ("1,2,3", "two numbers"),
                                            ("-1,-1", "no window"), ("-5,0", "--window -5,0")])
def test_parse_options_refuses_bad_windows_naming_the_flag(window, needle):
    with pytest.raises(UsageError, match=needle):
        parse_options(window, None, False)


@pytest.mark.parametrize("cap", [0.0, -3.0, math.nan, math.inf])
def test_parse_options_refuses_a_cap_that_is_not_positive(cap):
    with pytest.raises(UsageError, match="--softcap must be a positive number"):
        parse_options(None, cap, False)


def test_a_causal_target_closes_the_windows_right_side():
    options = ModelOptions((128, 64))
    assert options.window_for(True) == (128, 0)
    assert options.window_for(False) == (128, 64)
    assert NO_OPTIONS.window_for(True) == (-1, -1)
    assert options.problem_changes(True) == {"window": (128, 0), "softcap": 0.0, "sinks": False}


# --- the spec and the sketch -----------------------------------------------------------------------------------

def test_resolve_target_builds_the_options_into_the_spec():
    _, spec = resolve_target("h100", "gqa", 64, None, True, options=ModelOptions((128, 0), 30.0, True))
    assert (spec.local, spec.softcap, spec.sinks) == (True, True, True)
    assert set(spec.features) == {"local", "softcap", "sinks"}
    _, plain = resolve_target("h100", "gqa", 64, None, True)
    assert plain.features == ()


def test_a_causal_window_open_on_the_left_is_plain_causal():
    _, spec = resolve_target("h100", "mha", 128, None, True, options=ModelOptions((-1, 5)))
    assert not spec.local


def test_the_reference_sketch_gains_the_options_statements():
    _, spec = resolve_target("h100", "mha", 128, None, True, options=ModelOptions((4096, 0), 50.0, True))
    program, text, label, diagnostics = load_checked_program("mha", True, None, "ws_overlap", "dense", spec)
    assert program is not None, diagnostics
    assert "Softcap" in text and "Sink" in text and "Window" in text
    assert label.endswith("local softcap sinks>")
    _, plain_text, plain_label, _ = load_checked_program("mha", True, None, "ws_overlap", "dense", None)
    assert "Softcap" not in plain_text and "Window" not in plain_text and plain_label.endswith("causal>")


@pytest.mark.parametrize("layout", ["paged", "dense"])
def test_a_decode_target_builds_the_options_into_its_spec_and_sketch(layout):
    from tuner.commands.bench_decode import resolve_decode_target

    _, spec, heads, _, _ = resolve_decode_target("h200", "gqa", None, 64, None, True, layout, None,
                                                 ModelOptions((127, 64), 0.0, True))
    assert spec.phase == "decode" and spec.layout == layout and spec.features == ("local", "sinks")
    program, text, label, diagnostics = load_checked_program("gqa", True, None, "decode", layout, spec)
    assert program is not None and not diagnostics, diagnostics
    assert "Sink" in text and "Window" in text and "Softcap" not in text and label.endswith("local sinks>")
    _, plain, _, _, _ = resolve_decode_target("h200", "gqa", None, 64, None, True, layout, None, NO_OPTIONS)
    assert plain.features == ()


def test_a_model_presets_decode_bench_takes_its_layers_options():
    from tuner.commands.bench import preset_options

    options, note = preset_options("gemma2-9b", "local", NO_OPTIONS)
    assert options == ModelOptions((4095, 0), 50.0, False) and "gemma2-9b local layers" in note


# --- the command line ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, needle", [
    (["bench", "--gpu", "h100", "--variant", "mla", "--phase", "decode", "--window", "128,0"],
     "absorbed MLA decode kernels are built without"),
    (["bench", "--gpu", "h100", "--variant", "gqa", "--window", "x"], "--window must be L,R"),
    (["build", "--gpu", "h100", "--variant", "gqa", "--softcap", "-1", "--out", "unused"], "--softcap must be"),
    (["build", "--gpu", "h100", "--variant", "mla", "--phase", "decode", "--sinks", "--out", "unused"],
     "absorbed MLA decode kernels are built without"),
    (["build", "--gpu", "h100", "--variant", "gqa", "--phase", "decode", "--window", "5,5,5", "--out", "unused"],
     "--window"),
])
def test_options_where_they_do_not_apply_are_one_line_errors(args, needle, tmp_path):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    message = result.output.strip()
    assert needle in message and len(message.splitlines()) == 1


# --- the baselines' calls --------------------------------------------------------------------------------------

@pytest.mark.parametrize("window, causal", [((5, 0), True), ((7, 3), False), ((0, 0), True), ((-1, 4), False),
                                            ((9, -1), False)])
def test_sdpa_with_a_window_mask_matches_the_reference(window, causal):
    p = _problem(window=window, causal=causal)
    q, k, v = _qkv(p)
    out = dense.sdpa_call(p)(q, k, v).transpose(1, 2)
    ref = reference(q, k, v, causal, window=window, scale=p.softmax_scale)
    # rows with no visible key: SDPA gives NaN where the reference gives 0; windows here leave none empty
    assert torch.allclose(out, ref, atol=1e-5), float((out - ref).abs().max())


@pytest.mark.parametrize("changes, needle", [({"softcap": 30.0}, "soft-capping"), ({"sinks": True}, "sinks")])
def test_sdpa_refuses_what_it_cannot_compute(changes, needle):
    with pytest.raises(NotImplementedError, match=needle):
        dense.sdpa_call(_problem(**changes))


def test_fa4_gets_the_options_as_its_keywords(monkeypatch):
    seen = {}

    def fake_flash_attn_func(q, k, v, **kwargs):
        seen.update(kwargs)
        return q, None

    monkeypatch.setattr(fa4, "_flash_attn_func", lambda: fake_flash_attn_func)
    p = _problem(window=(128, -1), softcap=50.0, sinks=True)
    sinks = dense.problem_sinks(p, "cpu")
    fa4.attention_call(p, sinks)(*_qkv(p))
    assert seen["window_size"] == (128, None)      # FA4: None leaves a side open
    assert seen["softcap"] == 50.0 and seen["causal"] is True
    assert seen["learnable_sink"].dtype == torch.bfloat16
    assert torch.equal(seen["learnable_sink"].float(), sinks)   # bf16-exact: FA4 and ours read the same values
    seen.clear()
    fa4.attention_call(_problem())(*_qkv(_problem()))
    assert set(seen) == {"causal", "softmax_scale"}


def test_kernel_options_and_sinks_follow_the_problem():
    assert dense.kernel_options(_problem(), "cpu") == {}
    options = dense.kernel_options(_problem(window=(16, 0), softcap=20.0, sinks=True), "cpu")
    assert options["window_size"] == (16, 0) and options["softcap"] == 20.0
    assert options["sinks"].shape == (4,)
    assert dense.problem_sinks(_problem(), "cpu") is None
    again = dense.problem_sinks(_problem(sinks=True), "cpu")
    assert torch.equal(again, options["sinks"])      # seeded: every library reads the same logits


def test_the_reference_cross_check_sees_a_planted_fault():
    p = _problem(window=(9, 0), softcap=15.0, sinks=True, seqlen_q=300, seqlen_k=300)
    q, k, v = _qkv(p, seed=3)
    right = reference(q, k, v, True, window=p.window, softcap=p.softcap, sinks=dense.problem_sinks(p, "cpu"),
                      scale=p.softmax_scale)
    assert dense.reference_rel_err(right, p, (q, k, v)) < 1e-6
    wrong = reference(q, k, v, True, window=p.window, softcap=p.softcap, scale=p.softmax_scale)   # sinks dropped
    assert dense.reference_rel_err(wrong, p, (q, k, v)) > 1e-2
