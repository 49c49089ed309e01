"""The re-timing job (tuner/campaign/retime.py) through the replay backend: the recorded speeds (or a kernel's
``retimed`` ones), the replay's noise per round, faults; and on a GPU worker, in a fresh process with a trial's
crash and hang protection."""
import json
import os

import pytest

from translate.params import KernelParams
from tuner.campaign.backends import BackendSpec, replay_noise
from tuner.campaign.confirm import ConfirmRule
from tuner.campaign.retime import _replay_retime, round_order
from kernel_abi.spec import grid_problems

PROBLEM = grid_problems("mha", 128, "bf16", True, seqlens=(4096,))[0]
A, B, C = (KernelParams(block_m=128, block_n=n) for n in (64, 96, 128))


def _replay(tmp_path, rows, meta=None):
    path = tmp_path / "r.jsonl"
    lines = [{"_meta": {"device_name": "X", **(meta or {})}}] + rows
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    return str(path)


def _payload(*kernels, rounds=9):
    return {"bucket": "s4096", "profile": "h100", "problem": PROBLEM, "rule": ConfirmRule(rounds=rounds).to_dict(),
            "nonce": "study/s4096", "kernels": [{"role": role, "params": p.to_dict(), "schedule": None}
                                                 for role, p in kernels]}


def _ms(tflops):
    return PROBLEM.flops / (tflops * 1e12) * 1e3


def test_rounds_rotate_the_order():
    assert [round_order(["a", "b", "c"], r) for r in range(4)] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"],
                                                                  ["a", "b", "c"]]


def test_a_noiseless_replay_times_each_kernel_at_its_recorded_or_retimed_speed(tmp_path):
    path = _replay(tmp_path, [{"params": A.to_dict(), "tflops": {"4096": 600.0}},
                              {"params": B.to_dict(), "tflops": {"4096": 620.0}, "retimed": {"4096": 590.0}}])
    out = _replay_retime(path, _payload(("challenger", B), ("seed", A)))
    assert out["ms"]["seed"] == pytest.approx([_ms(600.0)] * 9)
    assert out["ms"]["challenger"] == pytest.approx([_ms(590.0)] * 9)       # its lucky trial said 620
    assert out["tflops"] == {"challenger": 590.0, "seed": 600.0} and out["failed"] == {}
    assert out["order"][1] == ["seed", "challenger"]


def test_a_noisy_replay_draws_a_new_deterministic_factor_per_round(tmp_path):
    meta = {"noise": {"sigma": 0.04, "seed": 3}}
    path = _replay(tmp_path, [{"params": A.to_dict(), "tflops": {"4096": 600.0}}], meta)
    first = _replay_retime(path, _payload(("challenger", A), ("seed", C)))
    again = _replay_retime(path, _payload(("challenger", A), ("seed", C)))
    assert first["ms"] == again["ms"]
    times = first["ms"]["challenger"]
    assert len(set(times)) == 9
    factors = [_ms(600.0) / t for t in times]
    assert factors[0] == pytest.approx(replay_noise(meta, "retime", "study/s4096", A.key(), "4096", 0))
    assert 0.85 < min(factors) and max(factors) < 1.15
    assert first["ms"]["seed"] and "seed" not in first["failed"]            # C is not in the file: the model


def test_a_wrong_contender_is_reported_and_not_timed(tmp_path):
    path = _replay(tmp_path, [{"params": A.to_dict(), "tflops": {"4096": 600.0}},
                              {"params": B.to_dict(), "fault": "wrong"}])
    out = _replay_retime(path, _payload(("challenger", B), ("seed", A)))
    assert list(out["ms"]) == ["seed"] and "wrong result" in out["failed"]["challenger"]


@pytest.mark.slow
def test_on_a_gpu_worker_the_re_timing_runs_in_a_fresh_process_and_a_crash_or_hang_is_an_outcome(
        ray_cluster, tmp_path):
    """The GPU worker's job, as the campaign submits it (WorkerPool.submit_retime): a fresh process of its
    fork server; a planted out-of-bounds kernel kills only that process, a hang is killed at its limit."""
    import ray

    from tuner.campaign.cluster import gpu_pool
    from tuner.campaign.workers import WorkerPool

    path = _replay(tmp_path, [{"params": A.to_dict(), "tflops": {"4096": 600.0}},
                              {"params": B.to_dict(), "fault": "oob"}, {"params": C.to_dict(), "fault": "hang"}])
    workers = WorkerPool(gpu_pool("H100"), BackendSpec("replay", path), overlap=2)
    try:
        ok, slot = workers.submit_retime(_payload(("challenger", A), ("seed", A)), timeout_s=20, wait_s=60)
        crash, _ = workers.submit_retime(_payload(("challenger", B), ("seed", A)), timeout_s=20, wait_s=60)
        hang, _ = workers.submit_retime(_payload(("challenger", C), ("seed", A)), timeout_s=3, wait_s=60)
        ok, crash, hang = ray.get([ok, crash, hang], timeout=120)
        worker_pids = {ray.get(h.info.remote())["worker_pid"] for h in workers.handles}
    finally:
        workers.shutdown()
    assert ok["outcome"] == "result" and ok["value"]["ms"]["challenger"] == pytest.approx([_ms(600.0)] * 9)
    assert ok["pid"] == ok["value"]["pid"] and ok["pid"] not in worker_pids and ok["pid"] != os.getpid()
    assert ok["value"]["gpu_lock"]["key"].startswith("gpu-")
    assert crash["outcome"] == "crash" and "SIGSEGV" in crash["message"]
    assert hang["outcome"] == "timeout" and "no result after 3 s" in hang["message"]
