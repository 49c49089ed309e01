"""FlashAttention-4 as a baseline column (tuner/measure/fa4.py through tuner.bench): measured beside torch SDPA's
backends when ``flash_attn.cute`` imports (a CPU stand-in here, tests/fa4_stand_in.py), "not installed"
with its reason when it does not; its JIT compile kept out of the timing; its errors recorded like the
others'."""
from __future__ import annotations

import io
import sys

import pytest
import torch
from rich.console import Console

from tuner.commands import bench as bench_cmd
from tuner.measure import dense, fa4
from tuner.measure import timer as measure_timer
from tuner.serving import sdpa_attention
from kernel_abi.spec import Problem

GQA = Problem("gqa", 2, 4, 2, 64, 64, 64, 64, True, "bf16")   # head dim 64: FA4 and CPU SDPA flash run it
FAKE_MS = 1e-3        # the fake timer's milliseconds: a few TFLOPS at GQA's size
OURS_MS = 5e-4


@pytest.fixture
def timer(monkeypatch):
    """tuner.measure.timer.time_ms on the CPU: calls the timed function once, returns FAKE_MS; logs how many FA4 calls
    the stand-in had seen (before, after) each timing."""
    log = []

    def fake_time_ms(fn, warmup=10, reps=50, *, timing=None):
        before = len(_fa4_calls())
        fn()
        log.append((before, len(_fa4_calls())))
        return FAKE_MS

    monkeypatch.setattr(measure_timer, "time_ms", fake_time_ms)
    return log


def _fa4_calls() -> list:
    return getattr(sys.modules.get("flash_attn.cute"), "CALLS", [])


def _inputs(problem: Problem, sets: int = 2):
    return dense.make_inputs(problem, sets, device="cpu")


def _measure(problem: Problem):
    errors, outputs = {}, {}
    result = dense.measure_baselines(problem, _inputs(problem), errors=errors, outputs=outputs)
    return result, errors, outputs


# -- measure_baselines ---------------------------------------------------------------------------------


@pytest.mark.parametrize("return_lse", [False, True])
def test_fa4_is_measured_after_one_untimed_call_in_our_layout(fa4_stand_in, timer, return_lse):
    fa4_stand_in.RETURN_LSE = return_lse
    result, errors, outputs = _measure(GQA)
    assert list(result) == ["flash", "cudnn", "efficient", "fa4"]
    assert result["fa4"] == pytest.approx(dense.tflops(GQA, FAKE_MS)) and "fa4" not in errors
    assert result["flash"] == pytest.approx(dense.tflops(GQA, FAKE_MS))
    # flash timed (no FA4 call), then FA4: its first call (the JIT compile on a GPU) came before its timing
    assert timer == [(0, 0), (1, 2)]
    first = fa4_stand_in.CALLS[0]
    assert first == {"q": (2, 64, 4, 64), "k": (2, 64, 2, 64), "v": (2, 64, 2, 64), "causal": True,
                     "softmax_scale": GQA.softmax_scale}   # (b, s, h, d) as is, GQA as fewer KV heads
    out = outputs["fa4"]                                    # the output, not the (out, lse) tuple
    assert isinstance(out, torch.Tensor) and out.shape == (2, 64, 4, 64)
    assert dense.rel_err(out, outputs["flash"]) < 1e-2


def test_not_installed_is_a_reason_never_a_number_or_a_crash(fa4_missing, timer):
    result, errors, outputs = _measure(GQA)
    assert result["fa4"] is None and "fa4" not in outputs
    assert errors["fa4"].startswith("not installed: flash_attn.cute is not importable (ModuleNotFoundError")
    assert fa4.is_not_installed(errors["fa4"])
    assert result["flash"] == pytest.approx(dense.tflops(GQA, FAKE_MS)) and timer == [(0, 0)]


def test_a_shape_fa4_cannot_run_is_recorded_like_the_other_backends(fa4_stand_in, timer):
    problem = GQA.with_(d_qk=32, d_v=32)
    result, errors, _ = _measure(problem)
    assert result["fa4"] is None and errors["fa4"] == "head_dim 32 is not supported"
    assert not fa4.is_not_installed(errors["fa4"])
    assert result["cudnn"] is None and errors["cudnn"]            # CPU: cuDNN cannot run, same treatment
    assert result["flash"] is not None and len(timer) == 1


def test_an_fa4_output_that_disagrees_with_sdpa_gets_no_number(fa4_stand_in, timer):
    fa4_stand_in.WRONG = True
    result, errors, outputs = _measure(GQA)
    assert result["fa4"] is None and "fa4" not in outputs
    assert errors["fa4"].startswith("output differs from torch SDPA flash on the benchmark inputs (rel err")
    assert timer == [(0, 0)]                                       # never timed


def test_status_says_whether_fa4_is_installed(fa4_stand_in):
    assert fa4.status() == {"installed": True, "version": None}   # the stand-in has no package metadata


def test_status_without_fa4_gives_the_reason(fa4_missing):
    status = fa4.status()
    assert status["installed"] is False and status["reason"].startswith("not installed: flash_attn.cute")


# -- `tune bench` rows and table -----------------------------------------------------------------------


@pytest.fixture
def cpu_bench(monkeypatch, timer):
    """bench_rows on CPU tensors with the real measure_baselines; our kernel takes OURS_MS."""
    real = dense.make_inputs
    monkeypatch.setattr(dense, "make_inputs", lambda p, sets=3, seed=0: real(p, sets, seed, device="cpu"))
    monkeypatch.setattr(dense, "measure_problem", lambda kernel, p, rotate=3, inputs=None: OURS_MS)


def _ours(q, k, v):
    return sdpa_attention(q, k, v, causal=True)


def _table_cells(row: dict) -> dict[str, str]:
    """The `tune bench` table of one row: column -> cell text."""
    console = Console(file=io.StringIO(), width=300, color_system=None)
    console.print(bench_cmd.results_table([row], "t"))
    lines = console.file.getvalue().splitlines()
    header = next(l for l in lines if "seqlen" in l)
    line = next(l for l in lines if f"{row['heads_q']}/{row['heads_kv']}" in l)
    split = lambda text: [c.strip() for c in text.replace("┃", "│").split("│")[1:-1]]
    return dict(zip(split(header), split(line)))


def test_bench_row_has_the_fa4_column_and_ratio(fa4_stand_in, cpu_bench):
    (row,) = dense.bench_rows(_ours, [GQA])
    ours, base = dense.tflops(GQA, OURS_MS), dense.tflops(GQA, FAKE_MS)
    assert row["status"] == "ok" and row["fa4"] == round(base, 2) and "fa4_err" not in row
    assert row["ours/fa4"] == round(ours / base, 3) == 2.0 and row["cross_check_against"] == "flash"
    cells = _table_cells(row)
    assert cells["fa4"] == f"{row['fa4']:g}" == cells["flash"] and cells["ours/fa4"] == "2"


def test_bench_row_without_fa4_says_not_installed(fa4_missing, cpu_bench):
    (row,) = dense.bench_rows(_ours, [GQA])
    assert row["status"] == "ok" and row["fa4"] is None and row["ours/fa4"] is None
    assert fa4.is_not_installed(row["fa4_err"]) and "flash_attn.cute" in row["fa4_err"]
    cells = _table_cells(row)
    assert cells["fa4"] == "not installed" and cells["ours/fa4"] == "–" and cells["ours/flash"] == "2"
    assert cells["cudnn"] == "–"     # a backend that cannot run this shape is not "not installed"


def test_ours_is_cross_checked_against_fa4_when_no_sdpa_backend_runs(fa4_stand_in, cpu_bench, monkeypatch):
    def no_kernel(problem):
        def call(q, k, v):
            raise RuntimeError("No available kernel. Aborting execution.")
        return call

    monkeypatch.setattr(dense, "sdpa_call", no_kernel)
    (good,) = dense.bench_rows(_ours, [GQA])
    assert good["status"] == "ok" and good["cross_check_against"] == "fa4" and good["flash"] is None
    (bad,) = dense.bench_rows(lambda q, k, v: sdpa_attention(q, k, v, causal=False), [GQA])  # ignores the mask
    assert bad["status"] == "FAILED" and "differs from FA4" in bad["reason"] and bad["ours"] is None
