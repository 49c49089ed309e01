"""The real GPU backend without a GPU: tuner.campaign.backends._gpu_measure / baselines run the real
tuner.measure.verify and tuner.bench code with stand-ins only where a GPU is needed (tests/campaign/gpu_fakes.py):
first in this process, then a whole campaign on its own Ray cluster through store, export and loader."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from hardware_profiles import load_profile
from tuner.campaign import backends
from kernel_abi.spec import Problem, spec_for

from . import gpu_fakes
from .conftest import REPO

SPEC = spec_for("mha", 128, "bf16", True)


def _problem(seqlen: int, batch: int = 1, heads: int = 2) -> Problem:
    return Problem("mha", batch, heads, heads, seqlen, seqlen, 128, 128, True, "bf16")


@pytest.fixture
def fake_gpu(monkeypatch):
    """torch.cuda stubs and a fake timer in this process; tensors on the CPU. The gate's check shapes are cut to the
    small ones: on the CPU a bf16 reference of the large ones takes tens of seconds, and what these tests check is
    the trial's flow around the gate (tests/test_verify*.py check the gate itself)."""
    from tuner.measure import timer, verify

    monkeypatch.setattr(verify, "CHECK_SHAPES", tuple(s for s in verify.CHECK_SHAPES if s[1] * s[2] <= 300 * 300))
    gpu_fakes.patch_torch_cuda(monkeypatch.setattr)
    monkeypatch.setattr(timer, "time_ms", gpu_fakes.fake_time_ms)
    monkeypatch.setattr(backends, "TRIAL_DEVICE", "cpu")
    monkeypatch.setattr(gpu_fakes, "LOADED", [])
    monkeypatch.setattr(gpu_fakes, "LAST_TIMINGS", [])


@pytest.fixture(scope="module")
def generated():
    """A real translated kernel (its meta is what the campaign ships to the GPU task); no nvcc."""
    import translate
    from translate.defaults import default_params
    from tuner.build import load_checked_program

    program, _, _, diagnostics = load_checked_program("mha", True, None)
    assert program is not None and not diagnostics
    return translate.generate(program, default_params(load_profile("h100"), SPEC), load_profile("h100"), SPEC)


def _payload(generated, problems, cubin=None) -> dict:
    return {"trial": 0, "params": generated.params.to_dict(), "profile": "h100", "spec": SPEC, "problems": problems,
            "cubin": cubin if cubin is not None else b"\x7fELF" + generated.name.encode(), "meta": generated.meta(),
            "timing": {"warmup_ms": 5.0, "rep_ms": 20.0, "rotate": 2}}


def _use_loader(monkeypatch, **kw):
    from tuner.serving import launch

    def load(binary, meta):
        kernel = gpu_fakes.fake_load_kernel(binary, meta, **kw)
        gpu_fakes.LOADED.append(kernel)
        return kernel

    monkeypatch.setattr(launch, "load_kernel", load)


def test_a_correct_kernel_is_verified_cross_checked_and_timed(fake_gpu, generated, monkeypatch):
    from tuner.measure import verify
    from tuner.measure import timer
    from tuner.measure import dense

    _use_loader(monkeypatch)
    problems = [_problem(256, batch=2), _problem(512)]
    result = backends._gpu_measure(_payload(generated, problems))
    assert result["verified"] is True and result["reason"] is None, result["reason"]
    assert result["device_name"] == gpu_fakes.DEVICE_NAME
    ver = result["verification"]
    assert ver["passed"] is True and len(ver["checks"]) == len(verify.CHECK_SHAPES)
    assert set(ver["bench_cross_check"]) == {"256", "512"} and max(ver["bench_cross_check"].values()) < 1e-2
    (kernel,) = gpu_fakes.LOADED
    for p in problems:   # TFLOPS = the problem's FLOPs over the (fake) median time of the kernel's calls
        assert result["tflops"][str(p.seqlen_k)] == pytest.approx(dense.tflops(p, _kernel_ms(kernel)), abs=0.01)
    # the payload's timing reached do_bench's place
    assert gpu_fakes.LAST_TIMINGS and all(t == timer.Timing(5.0, 20.0, 2) for t in gpu_fakes.LAST_TIMINGS)
    assert set(result["seconds"]) == {"imports", "load", "warmup", "lock_wait", "verify", "bench"}
    assert result["gpu_lock"]["released_at"] >= result["gpu_lock"]["acquired_at"] > 0
    json.dumps(result["verification"], allow_nan=False)   # what the store will write


def test_warm_up_runs_before_the_gpu_lock_and_its_first_uses_leave_the_locked_section(
        fake_gpu, generated, monkeypatch, tmp_path):
    """The first-use costs (cuBLAS, lazily loaded torch kernels, triton's import) are paid while another
    trial may be timed, so they must not hold the lock; and they are paid once: the warm-up really ran the
    reference and SDPA paths the locked section then uses."""
    import fcntl
    import os

    from tuner.measure import verify
    from tuner.measure import dense
    from tuner.campaign import gpulock

    monkeypatch.setenv(gpulock.LOCK_DIR_ENV, str(tmp_path))
    _use_loader(monkeypatch)
    events: list[str] = []

    def lock_is_free() -> bool:
        fd = os.open(tmp_path / (gpulock.gpu_key() + ".lock"), os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return True
        except BlockingIOError:
            return False
        finally:
            os.close(fd)

    real_reference, real_sdpa = verify.reference, dense.sdpa_call

    def reference(q, *a, **kw):
        events.append(f"reference s{q.shape[1]} lock {'free' if lock_is_free() else 'held'}")
        return real_reference(q, *a, **kw)

    def sdpa_call(problem):
        events.append(f"sdpa s{problem.seqlen_k} lock {'free' if lock_is_free() else 'held'}")
        return real_sdpa(problem)

    monkeypatch.setattr(verify, "reference", reference)
    monkeypatch.setattr(dense, "sdpa_call", sdpa_call)
    result = backends._gpu_measure(_payload(generated, [_problem(256)]))
    assert result["verified"] is True, result["reason"]
    assert events[:3] == ["reference s16 lock free", "reference s16 lock free", "sdpa s16 lock free"]
    later = events[3:]
    assert later and all(e.endswith("lock held") for e in later)   # verification + cross-check: under the lock


def _kernel_ms(kernel) -> float:
    import hashlib

    h = int.from_bytes(hashlib.sha256(kernel.name.encode()).digest()[:4], "big")
    return 1.0 + (h % 1000) / 1000


def test_a_wrong_kernel_fails_verification_with_the_shape_and_is_not_timed(fake_gpu, generated, monkeypatch):
    _use_loader(monkeypatch, error=0.05)
    result = backends._gpu_measure(_payload(generated, [_problem(256)]))
    assert result["verified"] is False and result["tflops"] == {}
    from tuner.measure import verify
    n = len(verify.CHECK_SHAPES)
    assert result["reason"].startswith(f"verification failed: {n} of {n} shapes failed; first: mha b1 hq3 hkv3 sq1 sk1")
    assert "max error" in result["reason"] and result["verification"]["passed"] is False
    assert gpu_fakes.LAST_TIMINGS == []


def test_a_kernel_wrong_only_at_benchmark_size_is_caught_by_the_cross_check(fake_gpu, generated, monkeypatch):
    _use_loader(monkeypatch, wrong_beyond=2600)      # every verification shape has seqlen_k <= 2500
    result = backends._gpu_measure(_payload(generated, [_problem(256), _problem(2688)]))
    assert result["verified"] is False and result["verification"]["passed"] is False
    assert "wrong result at the benchmark shape mha b1 hq2 hkv2 sq2688 sk2688" in result["reason"]
    assert "against torch SDPA > 0.02" in result["reason"]
    assert result["verification"]["bench_cross_check"]["256"] < 1e-2


def test_a_cubin_without_the_kernel_or_a_wrong_abi_is_a_load_failure(fake_gpu, generated, monkeypatch):
    _use_loader(monkeypatch)
    result = backends._gpu_measure(_payload(generated, [_problem(256)], cubin=b"\x7fELF other kernels"))
    assert result["verified"] is False and result["reason"].startswith("load failed: KernelLoadError: cannot load")
    payload = _payload(generated, [_problem(256)])
    payload["meta"] = dict(payload["meta"], abi=99)
    assert "ABI 99" in backends._gpu_measure(payload)["reason"]


def test_baselines_are_measured_per_seqlen_with_the_campaign_timing(fake_gpu, fa4_missing):
    from tuner.measure import timer
    from tuner.measure import dense

    out = backends.baselines(backends.BackendSpec("gpu"), [_problem(256), _problem(512)],
                             {"warmup_ms": 5.0, "rep_ms": 20.0, "rotate": 2})
    assert out["device_name"] == gpu_fakes.DEVICE_NAME and set(out["baselines"]) == {"256", "512"}
    for seqlen, row in out["baselines"].items():
        assert set(row) == {"flash", "cudnn", "efficient", "fa4"} == set(dense.BASELINES)
        flash = row["flash"]    # the CPU runs SDPA's flash backend; cuDNN and efficient cannot: None + reason
        assert flash == pytest.approx(dense.tflops(_problem(int(seqlen)), gpu_fakes.BASELINE_MS))
        assert row["cudnn"] is None and "cudnn" in out["errors"][seqlen]
        assert row["fa4"] is None and out["errors"][seqlen]["fa4"].startswith("not installed: flash_attn.cute")
    assert all(t == timer.Timing(5.0, 20.0, 2) for t in gpu_fakes.LAST_TIMINGS)


def test_fa4_is_a_campaign_baseline_where_it_is_installed(fake_gpu, fa4_stand_in):
    from tuner.measure import dense

    out = backends.baselines(backends.BackendSpec("gpu"), [_problem(256)], {"warmup_ms": 5.0, "rep_ms": 20.0,
                                                                           "rotate": 2})
    row = out["baselines"]["256"]
    assert row["fa4"] == pytest.approx(dense.tflops(_problem(256), gpu_fakes.BASELINE_MS)) == row["flash"]
    assert "fa4" not in out["errors"]["256"]
    assert fa4_stand_in.CALLS[0]["causal"] is True and fa4_stand_in.CALLS[0]["q"] == (1, 256, 2, 128)


def test_replayed_baselines_say_which_libraries_the_file_did_not_record():
    from .conftest import GRID

    out = backends.baselines(backends.BackendSpec("replay", str(GRID)), [_problem(512), _problem(1024)])
    for seqlen in ("512", "1024"):
        assert out["baselines"][seqlen]["flash"] > 0 and out["baselines"][seqlen]["fa4"] is None
        assert out["errors"][seqlen] == {"fa4": "not recorded in the replay file"}


@pytest.mark.slow
def test_a_campaign_with_the_gpu_backend_stores_exports_and_loads_a_kernel(tmp_path):
    """The whole path of `tune --gpu h100 --variant mha` on the GPU backend, a fake GPU in every Ray worker."""
    from tuner.store.export import run_export
    from tuner.serving import ExportedAttention, read_configs, sdpa_attention
    from tuner.store.records import KernelStore

    studies = tmp_path / "studies"
    proc = subprocess.run([sys.executable, "-m", "tests.campaign.fake_gpu_campaign", str(studies), "3"], cwd=REPO,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((studies / "h100-mha-bf16-d128-causal" / "summary.json").read_text())
    assert summary["trials"]["done"] == 3 and summary["trials"]["finished_this_run"] == 3
    assert summary["device_name"] == gpu_fakes.DEVICE_NAME and summary["trials_per_gpu_hour"] > 0
    assert summary["timing"] == {"warmup_ms": 5.0, "rep_ms": 20.0, "rotate": 2}
    assert [r["seqlen"] for r in summary["rows"]] == [128, 256]
    assert {"imports", "load", "warmup", "lock_wait", "verify", "bench"} <= set(summary["stage_seconds"])
    assert summary["gpu_overlap"] == 4      # the default: four trial processes on the one fake GPU at once
    steady = summary["steady_state"]        # occupancy from the first lock to the last release
    assert steady["gpus"] == 1 and steady["trials"] == 3 and 0 < steady["held_s"] <= steady["window_s"] + 1e-6
    assert steady["from"] < steady["to"] and 0 < steady["held_fraction"] <= 1
    pipe = summary["compile_pipeline"]     # each kernel's batch latency (the fakes compile in no time)
    assert pipe["kernels"] >= 3 and pipe["mean_batch"] >= 1 and pipe["nvcc_cached"] == 0
    assert pipe["gpus_take_per_s"] > 0 and pipe["compiled_per_s"] > 0
    assert 0 <= pipe["cpu_wait_s"] <= pipe["latency_s"] and pipe["nvcc_s_per_kernel"] >= 0
    driver = summary["driver"]             # where the loop's own time went (tuner/campaign/driver_clock.py)
    timed = sum(x["s"] for x in driver["sections"].values())
    assert 0 < timed <= driver["elapsed_s"] + 1e-6 and driver["untimed_s"] >= 0
    assert driver["sections"]["ask"]["calls"] >= 1 and driver["sections"]["launch"]["calls"] >= 3
    assert driver["sections"]["measured"]["calls"] == 3 and driver["sections"]["wait"]["s"] > 0
    assert driver["levels"]["measuring"]["max"] >= 1 and 0 <= driver["gpus_starved"] <= 1
    import optuna

    from tuner.campaign.study import make_storage

    from .test_gpu_overlap import _assert_disjoint, _locked_intervals

    name = "h100-mha-bf16-d128-causal"
    study = optuna.load_study(study_name=name, storage=make_storage(None, studies, name))
    spans = _locked_intervals(study)
    assert sum(map(len, spans.values())) == 3
    _assert_disjoint(spans)                 # the real verify + bench of two trials never overlapped
    for row in summary["rows"]:
        assert row["ours"] > 0 and row["flash"] > 0 and row["ratios"]["flash"] == pytest.approx(
            row["ours"] / row["flash"], abs=1e-3)
    (record,) = KernelStore(studies).records(gpu="h100", variant="mha")
    assert record.verification["passed"] is True and record.device_name == gpu_fakes.DEVICE_NAME
    assert record.provenance["backend"] == "gpu" and record.baselines["flash"] > 0
    assert record.kernel_name.encode() in record.cubin and record.kernel_meta["name"] == record.kernel_name

    out = tmp_path / "exported"
    assert run_export(gpu="h100", variant="mha", study_dir=studies, out_dir=out) == 0
    assert (out / "variant=mha,head_dim=128,dtype=bf16,causal=1,device_name=NVIDIA_H100_80GB_HBM3.json").is_file()

    from tuner.serving import DeviceFacts

    attention = ExportedAttention(read_configs(out), kernel_loader=gpu_fakes.fake_load_kernel,
                                  devices={("cpu", None): DeviceFacts(gpu_fakes.DEVICE_NAME, (9, 0))})
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 300, 4, 128, generator=g).to(torch.bfloat16) for _ in range(3))
    got = attention(q, k, v, causal=True)
    assert attention.last_path == "kernel", attention.last_reason
    torch.testing.assert_close(got, sdpa_attention(q, k, v, causal=True))

    # Resumed with more trials: this run's best (a seed measured now) meets the stored kernel, re-timed side by
    # side by the real backend in a fresh process of the GPU worker (the fake timer: a time per kernel name)
    proc = subprocess.run([sys.executable, "-m", "tests.campaign.fake_gpu_campaign", str(studies), "5", "--resume"],
                          cwd=REPO, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((studies / name / "summary.json").read_text())
    (w,) = summary["winners"]                               # seqlens 128 and 256: one bucket
    challenger, stored = w["challenger"], w["stored"]
    assert stored["sha256"] == record.kernel_sha256 and challenger["sha256"] != stored["sha256"], w
    retimed = w["retimed"]
    study = optuna.load_study(study_name=name, storage=make_storage(None, studies, name))
    assert retimed["rounds"] == 9 and retimed["failed"] == {}
    assert retimed["pid"] not in {t.user_attrs.get("pid") for t in study.trials}
    ratio = _kernel_ms(gpu_fakes.CpuKernel({"name": stored["kernel_name"]})) / \
        _kernel_ms(gpu_fakes.CpuKernel({"name": challenger["kernel_name"]}))
    assert w["vs_stored"]["ratio"] == pytest.approx(ratio, abs=1e-4) == w["vs_stored"]["low"]   # (4 decimals)
    assert w["store"] is (ratio > 1) and w["vs_stored"]["confirmed"] is (ratio > 1)
    (now,) = KernelStore(studies).records(gpu="h100", variant="mha")
    assert now.kernel_name == (challenger if ratio > 1 else stored)["kernel_name"]


def test_a_probe_far_behind_the_incumbent_stops_the_trial_after_the_longest_seqlen(fake_gpu, generated, monkeypatch):
    """Early stop (earlystop.py) in the real backend: the longest shape first, cross-checked, timed with the
    probe's short window; far behind the incumbent, nothing else is timed."""
    from tuner.measure import timer
    from tuner.campaign.earlystop import EarlyStop

    _use_loader(monkeypatch)
    problems = [_problem(256), _problem(512)]
    payload = dict(_payload(generated, problems), timing={"warmup_ms": 7.0, "rep_ms": 30.0, "rotate": 2})
    payload["early_stop"] = EarlyStop().plan(problems, 1e9, payload["timing"])   # an incumbent nothing reaches
    result = backends._gpu_measure(payload)
    assert result["verified"] is True and set(result["tflops"]) == {"512"}
    stop = result["early_stop"]
    assert stop["seqlen"] == 512 and stop["probe_tflops"] == result["tflops"]["512"] and stop["ratio"] < 0.8
    assert gpu_fakes.LAST_TIMINGS == [timer.Timing(5.0, 20.0, 2)]                  # one probe, nothing else
    assert set(result["verification"]["bench_cross_check"]) == {"512"}


def test_a_probe_near_the_incumbent_goes_on_to_the_full_measurement(fake_gpu, generated, monkeypatch):
    from tuner.measure import timer
    from tuner.campaign.earlystop import EarlyStop

    _use_loader(monkeypatch)
    problems = [_problem(256), _problem(512)]
    payload = dict(_payload(generated, problems), timing={"warmup_ms": 7.0, "rep_ms": 30.0, "rotate": 2})
    payload["early_stop"] = EarlyStop().plan(problems, 1e-3, payload["timing"])
    result = backends._gpu_measure(payload)
    assert result["verified"] is True and "early_stop" not in result
    assert list(result["tflops"]) == ["256", "512"]                                # in the shapes' order
    full, probe = timer.Timing(7.0, 30.0, 2), timer.Timing(5.0, 20.0, 2)
    assert gpu_fakes.LAST_TIMINGS == [probe, full, full]                           # probe, 512 in full, then 256


def _contender(generated, role: str, name: str) -> dict:
    meta = dict(generated.meta(), name=name)
    return {"role": role, "name": name, "cubin": b"\x7fELF" + name.encode(), "meta": meta,
            "params": generated.params.to_dict(), "schedule": "fa2"}


def test_the_re_timing_times_each_contender_interleaved_on_the_same_inputs_under_the_gpu_lock(
        fake_gpu, generated, monkeypatch):
    """retime.py's real backend: every contender loaded, cross-checked on the shared inputs, then 9 rounds,
    the order rotated each round, each kernel's times its own (the fake timer: a time per kernel name)."""
    from tuner.measure import timer
    from tuner.measure import dense
    from tuner.campaign import retime
    from tuner.campaign.confirm import ConfirmRule

    _use_loader(monkeypatch)
    timed: list[str] = []
    real_time = timer.time_ms

    def recording(fn, *a, **kw):
        before = {k.name: k.calls for k in gpu_fakes.LOADED}
        ms = real_time(fn, *a, **kw)
        timed.extend(k.name for k in gpu_fakes.LOADED if k.calls != before[k.name])
        return ms

    monkeypatch.setattr(timer, "time_ms", recording)
    seen_inputs = []
    real_make = dense.make_inputs
    monkeypatch.setattr(dense, "make_inputs", lambda *a, **kw: seen_inputs.append((a, kw)) or real_make(*a, **kw))
    payload = {"bucket": "s512", "profile": "h100", "spec": SPEC, "problem": _problem(512), "nonce": "t",
               "rule": ConfirmRule().to_dict(), "kernels": [_contender(generated, "challenger", "kern_a"),
                                                             _contender(generated, "seed", "kern_b")]}
    result = retime._gpu_retime(payload)
    assert result["failed"] == {} and result["device_name"] == gpu_fakes.DEVICE_NAME
    assert timed == ["kern_a", "kern_b", "kern_b", "kern_a"] * 4 + ["kern_a", "kern_b"]   # A B, B A, ...
    assert result["order"][:2] == [["challenger", "seed"], ["seed", "challenger"]] and len(result["order"]) == 9
    kernels = {k.name: k for k in gpu_fakes.LOADED}
    assert result["ms"]["challenger"] == [_kernel_ms(kernels["kern_a"])] * 9
    assert result["ms"]["seed"] == [_kernel_ms(kernels["kern_b"])] * 9
    shared = [kw for a, kw in seen_inputs if a[0].seqlen_k == 512]           # (the warm-up's are tiny)
    assert len(shared) == 1 and shared[0]["seed"] == 512                       # one input set, a trial's seed
    assert all(t == timer.Timing(10.0, 40.0, 3) for t in gpu_fakes.LAST_TIMINGS)
    assert result["gpu_lock"]["released_at"] >= result["gpu_lock"]["acquired_at"] > 0


def test_a_contender_that_cannot_load_or_is_wrong_is_not_timed(fake_gpu, generated, monkeypatch):
    from tuner.campaign import retime
    from tuner.campaign.confirm import ConfirmRule

    _use_loader(monkeypatch, wrong_beyond=400)      # every kernel is wrong at the 512 shape
    stale = _contender(generated, "stored", "kern_old")
    stale["meta"] = dict(stale["meta"], abi=0)
    payload = {"bucket": "s512", "profile": "h100", "spec": SPEC, "problem": _problem(512), "nonce": "t",
               "rule": ConfirmRule(rounds=3).to_dict(), "kernels": [_contender(generated, "challenger", "kern_a"),
                                                                    stale]}
    result = retime._gpu_retime(payload)
    assert result["ms"] == {} and result["order"] == []
    assert result["failed"]["stored"].startswith("load failed: KernelLoadError")
    assert result["failed"]["challenger"].startswith("wrong result on the re-timing inputs: relative error")
