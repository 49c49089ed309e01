"""`tune bench`: the grid, FLOP counts, the row logic (CPU stand-ins) and the no-GPU path; GPU run marked gpu."""
from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from tuner.commands import bench as bench_cmd
from tuner.measure import dense
from tuner.measure import timer
from tuner.commands.cli import app
from kernel_abi.spec import Problem


def invoke(*args, env=None):
    return CliRunner().invoke(app, list(args), env=env)


# -- grid and FLOPs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("variant,hd,heads,dims", [
    ("mha", 64, (32, 32), (64, 64)),
    ("mha", 128, (16, 16), (128, 128)),
    ("mha", None, (16, 16), (128, 128)),
    ("gqa", 128, (16, 2), (128, 128)),
    ("mqa", 128, (16, 1), (128, 128)),
    ("mla", None, (16, 16), (192, 128)),
])
def test_grid_is_16k_tokens_hidden_2048(variant, hd, heads, dims):
    problems = dense.bench_problems(variant, hd, "bf16", None)
    assert len(problems) == 12  # 6 seqlens x causal/non-causal
    assert {p.causal for p in problems} == {False, True}
    assert sorted({p.seqlen_q for p in problems}) == [512, 1024, 2048, 4096, 8192, 16384]
    for p in problems:
        assert p.batch * p.seqlen_q == 16384 and p.seqlen_k == p.seqlen_q
        assert (p.heads_q, p.heads_kv) == heads and (p.d_qk, p.d_v) == dims
        if variant != "mla":
            assert p.heads_q * p.d_qk == 2048


def test_only_the_asked_causality_and_seqlens():
    problems = dense.bench_problems("mha", 64, "fp16", True, (1024, 4096))
    assert [(p.seqlen_q, p.batch, p.causal) for p in problems] == [(1024, 16, True), (4096, 4, True)]


def test_flops_and_tflops_follow_the_paper_convention():
    mha = Problem("mha", 4, 16, 16, 4096, 4096, 128, 128, False, "bf16")
    assert mha.flops == 4 * 4 * 16 * 4096 ** 2 * 128
    assert mha.with_(causal=True).flops == mha.flops / 2
    mla = Problem("mla", 1, 16, 16, 16384, 16384, 192, 128, True, "bf16")
    assert mla.flops == 2 * 16 * 16384 ** 2 * (192 + 128) / 2
    assert dense.tflops(mha, 1.0) == pytest.approx(mha.flops / 1e-3 / 1e12)


@pytest.mark.parametrize("text,expect", [(None, dense.DEFAULT_SEQLENS), ("1024, 4096", (1024, 4096))])
def test_parse_seqlens(text, expect):
    assert bench_cmd.parse_seqlens(text) == expect


@pytest.mark.parametrize("text", ["1k", "", "0,512"])
def test_parse_seqlens_rejects_garbage(text):
    with pytest.raises(ValueError, match="--seqlens"):
        bench_cmd.parse_seqlens(text)


# -- rows (CPU stand-ins for the GPU measurements) ----------------------------------------------------


def _reference(q, k, v, causal):
    """Plain attention in (b, s, h, d), fp32; GQA by repeating KV heads."""
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) / math.sqrt(q.shape[-1])
    if causal:
        sq, sk = s.shape[-2:]
        mask = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)
        s = s.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v.float()).to(q.dtype)


@pytest.fixture
def cpu_measurements(monkeypatch):
    """make_inputs on CPU, baselines = 100/200/None/400 TFLOPS with the reference as their output, ours 1 ms."""
    monkeypatch.setattr(dense, "make_inputs", lambda p, sets=3, seed=0: _make_cpu(p, sets))

    def baselines(problem, inputs, *, rotate=3, errors=None, outputs=None):
        outputs["flash"] = _reference(*inputs[0], problem.causal)
        errors["efficient"] = "No available kernel."
        return {"flash": 100.0, "cudnn": 200.0, "efficient": None, "fa4": 400.0}

    timed = []
    monkeypatch.setattr(dense, "measure_baselines", baselines)
    monkeypatch.setattr(dense, "measure_problem", lambda k, p, rotate=3, inputs=None: timed.append(p) or 1e-3)
    return timed


def _make_cpu(problem, sets):
    return [(torch.randn(problem.batch, problem.seqlen_q, problem.heads_q, problem.d_qk),
             torch.randn(problem.batch, problem.seqlen_k, problem.heads_kv, problem.d_qk),
             torch.randn(problem.batch, problem.seqlen_k, problem.heads_kv, problem.d_v)) for _ in range(sets)]

SMALL = Problem("gqa", 2, 4, 2, 64, 64, 32, 32, True, "fp16")


def test_verified_kernel_is_timed_and_ratios_computed(cpu_measurements):
    rows = dense.bench_rows(lambda q, k, v: _reference(q, k, v, True), [SMALL], verified=True)
    (row,) = rows
    assert row["status"] == "ok" and cpu_measurements == [SMALL]
    ours = dense.tflops(SMALL, 1e-3)
    assert ours > 1 and row["ours"] == round(ours, 2) and row["ours_ms"] == 1e-3
    assert row["ours/flash"] == round(ours / 100.0, 3) and row["ours/cudnn"] == round(ours / 200.0, 3)
    assert row["fa4"] == 400.0 and row["ours/fa4"] == round(ours / 400.0, 3)
    assert row["efficient"] is None and row["ours/efficient"] is None and "No available" in row["efficient_err"]
    assert row["cross_check_rel_err"] < 1e-6
    assert (row["batch"], row["heads_q"], row["heads_kv"], row["seqlen"]) == (2, 4, 2, 64)


def test_unverified_kernel_is_failed_and_never_called(cpu_measurements):
    called = []
    rows = dense.bench_rows(lambda *a: called.append(a), [SMALL], verified=False, verify_reason="rel err 0.3")
    assert rows[0]["status"] == "FAILED" and rows[0]["reason"] == "rel err 0.3"
    assert rows[0]["ours"] is None and called == [] and cpu_measurements == []
    assert rows[0]["flash"] == 100.0  # baselines still reported


def test_kernel_wrong_on_the_benchmark_inputs_is_failed_not_timed(cpu_measurements):
    rows = dense.bench_rows(lambda q, k, v: _reference(q, k, v, False), [SMALL], verified=True)  # ignores the mask
    assert rows[0]["status"] == "FAILED" and "differs from SDPA" in rows[0]["reason"]
    assert rows[0]["ours"] is None and cpu_measurements == []


def test_kernel_that_raises_is_an_error_row(cpu_measurements):
    def boom(q, k, v):
        raise RuntimeError("CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure")

    rows = dense.bench_rows(boom, [SMALL, SMALL.with_(causal=False)], verified=True)
    assert [r["status"] for r in rows] == ["error", "error"] and "LAUNCH_FAILED" in rows[0]["reason"]


# -- the command without a GPU ------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_bench_without_gpu_exits_2_with_a_message(tmp_path):
    result = invoke("bench", "--gpu", "h100", "--variant", "mha", "--json", str(tmp_path / "b.json"))
    assert result.exit_code == 2
    assert "no CUDA GPU is visible" in result.stderr and "tune build" in result.stderr
    assert not (tmp_path / "b.json").exists()


def test_bench_bad_input_exits_2_before_touching_the_gpu():
    assert invoke("bench", "--gpu", "nope", "--variant", "mha").exit_code == 2
    result = invoke("bench", "--gpu", "h100", "--variant", "mha", "--seqlens", "abc")
    assert result.exit_code == 2 and "--seqlens" in result.stderr
    result = invoke("bench", "--gpu", "h100", "--variant", "mha", "--head-dim", "80")
    assert result.exit_code == 2 and "head dim 80" in result.stderr


# -- on a GPU -----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bench_on_gpu_reports_ours_and_baselines(tmp_path):
    from hardware_profiles import load_all_profiles

    cap = torch.cuda.get_device_capability()
    profile = next((p for p in load_all_profiles() if tuple(p.compute_capability) == cap), None)
    if profile is None:
        pytest.skip(f"no profile for compute capability {cap}")
    out = tmp_path / "bench.json"
    result = invoke("bench", "--gpu", profile.name, "--variant", "mha", "--head-dim", "128", "--causal",
                    "--seqlens", "1024,2048", "--json", str(out), env={"TUNER_CACHE_DIR": str(tmp_path / "cache")})
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    assert record["device"] == torch.cuda.get_device_name() and record["torch"] == torch.__version__
    rows = record["rows"]
    assert [r["seqlen"] for r in rows] == [1024, 2048] and all(r["causal"] for r in rows)
    assert all(r["status"] == "ok" for r in rows), rows
    for r in rows:
        assert r["ours"] > 0 and r["flash"] > 0
        assert r["ours/flash"] == pytest.approx(r["ours"] / r["flash"], rel=1e-2)


def test_alternating_rounds_reverse_the_order_every_other_round(monkeypatch):
    order = []
    monkeypatch.setattr(timer, "time_ms", lambda fn: fn())
    calls = {name: (lambda n=name, t=t: order.append(n) or t) for name, t in (("a", 1.0), ("b", 2.0), ("c", 3.0))}
    ms = timer.alternating_rounds(calls, 3)
    assert order == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert ms == {"a": [1.0] * 3, "b": [2.0] * 3, "c": [3.0] * 3}


# -- FP8 --------------------------------------------------------------------------------------------------


def _row(**extra):
    row = {"seqlen": 4096, "causal": False, "batch": 4, "heads_q": 16, "heads_kv": 16, "ours": 800.0,
           "flash": 600.0, "cudnn": 640.0, "efficient": 300.0, "fa4": 700.0, "ours/flash": 1.333, "ours/cudnn": 1.25,
           "ours/efficient": 2.667, "ours/fa4": 1.143, "status": "ok"}
    row.update(extra)
    return row


def test_an_fp8_bench_table_shows_our_bf16_kernel_beside():
    from rich.console import Console

    table = bench_cmd.results_table([_row(ours_bf16=640.0, **{"ours/ours_bf16": 1.25})], "fp8")
    columns = [c.header for c in table.columns]
    assert "ours bf16" in columns and "ours/bf16" in columns
    console = Console(width=240, record=True)
    console.print(table)
    text = console.export_text()
    assert "640" in text and "1.25" in text
    plain = bench_cmd.results_table([_row()], "bf16")
    assert "ours bf16" not in [c.header for c in plain.columns]


def test_fp8_inputs_and_options_for_the_bench():
    p = Problem("gqa", 2, 8, 2, 64, 64, 128, 128, True, "fp8")
    (q, k, v), = dense.make_inputs(p, 1, device="cpu")
    assert q.dtype == torch.float8_e4m3fn and k.shape == (2, 64, 2, 128)
    options = dense.kernel_options(p, device="cpu")
    assert set(options) == {"q_descale", "k_descale", "v_descale"}
    assert all(t.shape == (2, 2) and t.dtype == torch.float32 for t in options.values())
    assert dense.cross_check_bound(p) == dense.FP8_CROSS_CHECK_REL_ERR > dense.cross_check_bound(
        Problem("gqa", 2, 8, 2, 64, 64, 128, 128, True, "bf16"))


def test_a_trial_and_a_retiming_cross_check_an_fp8_kernel_by_the_fp8_bound():
    from tuner.measure import trial

    fp8 = Problem("gqa", 2, 8, 2, 64, 64, 128, 128, True, "fp8")
    assert trial.cross_check_bound(fp8) == dense.FP8_CROSS_CHECK_REL_ERR
    assert trial.cross_check_bound(Problem("gqa", 2, 8, 2, 64, 64, 128, 128, True, "bf16")) == \
        trial.BENCH_CROSS_CHECK_REL_ERR == 2e-2


def test_each_fp8_row_gets_the_bf16_twin_of_its_own_bucket(monkeypatch):
    """The bf16 twins are verified once (load_bf16_twins) and each FP8 row is timed against the twin whose seqlens hold
    its key length (the profile's table gives several), or the one for all lengths."""
    timed = []

    def fake_rows(kernel, problems, with_baselines=True):
        timed.append((kernel, problems[0].seqlen_k, problems[0].dtype))
        return [{"ours": {"short": 500.0, "all": 400.0}[kernel]}]

    monkeypatch.setattr(bench_cmd, "bench_rows", fake_rows)
    problems = [Problem("mha", 1, 16, 16, s, s, 128, 128, False, "fp8") for s in (512, 16384)]
    rows = [{"ours": 600.0}, {"ours": 800.0}]
    printed = []
    bench_cmd.add_bf16_twins(rows, {(512, 1024): "short", None: "all"}, problems, on_row=printed.append)
    assert timed == [("short", 512, "bf16"), ("all", 16384, "bf16")]
    assert [r["ours/ours_bf16"] for r in rows] == [1.2, 2.0]
    assert printed == rows    # each row's log line once its twin is timed
