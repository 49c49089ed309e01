"""A serving trial (tuner/measure/trial.py, tuner/measure/serving.py) on the CPU: the verification gate over
length mixes first, then each mix timed and keyed by its name; baselines with their reasons."""
import pytest

from tuner.measure import serving as sm
from tuner.measure import timer
from tuner.measure.trial import run_trial, trial_kind
from tuner.campaign.earlystop import decide
from tuner.measure.mixes import ServingProblem
from kernel_abi.spec import KernelSpec

from tests.test_bench_mixes import CpuKernel as _Cpu


class CpuKernel(_Cpu):
    """The bench tests' CPU stand-in, with what verification asks too: seqused_k and the output buffer."""

    def varlen(self, q, k, v, cu_q, cu_k, max_q, max_k, seqused_k=None, softmax_scale=None, out=None):
        n = len(cu_k) - 1
        used = [int(cu_k[b + 1] - cu_k[b]) if seqused_k is None else int(seqused_k[b]) for b in range(n)]
        res = self._run(q, [k[cu_k[b]:cu_k[b] + used[b]] for b in range(n)],
                        [v[cu_k[b]:cu_k[b] + used[b]] for b in range(n)], cu_q, softmax_scale)
        return _into(out, res)

    def paged(self, q, kc, vc, cu_q, used, table, max_q, softmax_scale=None, out=None):
        return _into(out, super().paged(q, kc, vc, cu_q, used, table, max_q, softmax_scale))


def _into(out, res):
    if out is None:
        return res
    out.copy_(res.nan_to_num(0.0))   # a sequence with no key: rows of 0, as the kernels write
    return out

SPEC = KernelSpec("gqa", 64, 64, True, "bf16", "varlen")
MIXES = [ServingProblem("varlen", "a", (5, 33, 1), (5, 33, 1), "gqa", 4, 2, 64, 64, True, "bf16"),
         ServingProblem("varlen", "b", (64,), (64,), "gqa", 4, 2, 64, 64, True, "bf16")]


@pytest.fixture(autouse=True)
def fake_timer(monkeypatch):
    """A fake timer, no GPU synchronisation, and the gate's mixes cut to the ones of at most 300 keys a sequence: on
    the CPU the bf16 reference of 2000-3000-key sequences takes tens of seconds, and these tests check the trial's
    flow around the gate (tests/test_verify_varlen.py checks the gate itself)."""
    import torch

    from tuner.measure import verify_varlen

    monkeypatch.setattr(verify_varlen, "CHECK_MIXES", tuple(m for m in verify_varlen.CHECK_MIXES
                                                             if max(m.keys) <= 300))

    monkeypatch.setattr(timer, "time_ms", lambda fn, *a, **k: (fn(), 2e-6)[1])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)   # verify_varlen waits for the GPU


def run(kernel, problems=MIXES, plan=None):
    payload = {"spec": SPEC, "problems": problems, "early_stop": plan}
    seconds = {}
    return run_trial(trial_kind(SPEC), kernel, payload, "cpu", "cpu", timer.Timing(rotate=1), seconds, decide)


def test_a_correct_kernel_is_timed_on_every_mix_by_name():
    result = run(CpuKernel())
    assert result["verified"], result["reason"]
    assert list(result["tflops"]) == ["a", "b"]
    assert result["tflops"]["b"] == pytest.approx(MIXES[1].flops / 2e-9 / 1e12, abs=0.01)


def test_a_wrong_kernel_fails_the_gate_and_is_never_timed():
    result = run(CpuKernel(offset=0.5))
    assert not result["verified"] and "verification failed" in result["reason"] and result["tflops"] == {}


def test_the_probe_of_the_early_stop_can_stop_a_slow_kernel_on_its_mix():
    plan = {"seqlen": "b", "incumbent": 1e6, "margin": 0.2, "probe": {"warmup_ms": 1, "rep_ms": 1, "rotate": 1}}
    result = run(CpuKernel(), plan=plan)
    assert result["early_stop"]["seqlen"] == "b" and list(result["tflops"]) == ["b"]


def test_the_paged_check_mixes_take_the_campaigns_page_size():
    mixes = sm.check_mixes(KernelSpec("gqa", 64, 64, True, "bf16", "paged"), 32)
    assert mixes and {m.page_size for m in mixes} == {32}


def test_baselines_are_numbers_or_reasons():
    errors = {}
    row = sm.measure_baselines(MIXES[0], timer.Timing(rotate=1), "cpu", errors)
    assert set(row) == set(sm.baseline_names())
    assert row["sdpa"] is not None                       # torch is always there
    assert all(errors.get(k) for k, v in row.items() if v is None)
