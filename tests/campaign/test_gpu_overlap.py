"""--gpu-overlap K: K trial processes per GPU, timed sections serialised by the per-GPU flock (gpulock.py).
Campaigns on the session's fake-GPU Ray cluster with a paced replay (each trial holds its GPU 0.4 s)."""
import fcntl
import json
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest
from optuna.trial import TrialState

from tuner.campaign import CampaignOptions, run_campaign
from tuner.campaign.gpulock import gpu_lock, lock_dir
from tuner.campaign.study import make_storage

from .conftest import REPO, campaign_seed_keys, paced_grid

STUDY = "h100-mha-bf16-d128-causal"


def _run(tmp_path, replay, **changes):
    opts = dict(gpu="h100", variant="mha", trials=8, study_dir=tmp_path, backend=f"replay:{replay}",
                compile_batch=2, trial_timeout=20.0, seed=3, live=False)
    opts.update(changes)
    rc = run_campaign(CampaignOptions(**opts))
    study = optuna.load_study(study_name=STUDY, storage=make_storage(None, tmp_path, STUDY))
    summary = json.loads((tmp_path / STUDY / "summary.json").read_text())
    return rc, study, summary


def _locked_intervals(study) -> dict[str, list[tuple[float, float, int]]]:
    by_gpu: dict[str, list] = {}
    for t in study.trials:
        lock = t.user_attrs.get("gpu_lock")
        if lock:
            by_gpu.setdefault(lock["key"], []).append((lock["acquired_at"], lock["released_at"], t.number))
    return by_gpu


def _lock_holders(fd: int) -> list[str]:
    """The processes holding a flock on the file open as ``fd``, from /proc/locks: pid and command line."""
    inode = os.fstat(fd).st_ino
    holders = []
    try:
        lines = open("/proc/locks").read().splitlines()
    except OSError:
        return ["(no /proc/locks)"]
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(inode):
            try:
                cmd = open(f"/proc/{fields[4]}/cmdline", "rb").read().replace(b"\0", b" ").decode()[:200]
            except OSError:
                cmd = "(gone)"
            holders.append(f"pid {fields[4]}: {cmd}")
    return holders


def _assert_disjoint(by_gpu) -> None:
    for key, spans in by_gpu.items():
        spans.sort()
        for (a0, a1, na), (b0, b1, nb) in zip(spans, spans[1:]):
            assert a0 <= a1 <= b0 <= b1, f"{key}: trial {na} held {a0:.3f}-{a1:.3f}, trial {nb} {b0:.3f}-{b1:.3f}"


def test_lock_excludes_a_second_holder_and_a_killed_holder_frees_it(tmp_path):
    """flock: another process waits while one holds the lock; SIGKILL of the holder (what the worker does
    to a hung trial) releases it, and the waiter's wait is recorded."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from tuner.campaign.gpulock import gpu_lock\n"
        f"with gpu_lock('gpu-t', {str(tmp_path)!r}):\n    print('held', flush=True); time.sleep(600)")],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        killer_delay = 1.0
        started = time.monotonic()
        subprocess.Popen([sys.executable, "-c", f"import os, time; time.sleep({killer_delay}); os.kill({holder.pid}, 9)"])
        with gpu_lock("gpu-t", str(tmp_path)) as hold:
            waited = time.monotonic() - started
        assert waited >= killer_delay * 0.9 and hold.waited_s >= killer_delay * 0.9
        assert hold.released_at >= hold.acquired_at
        with gpu_lock("gpu-t", str(tmp_path)) as again:      # released on exit: no wait now
            assert again.waited_s < 0.5
        with pytest.raises(RuntimeError):                     # and released on an exception
            with gpu_lock("gpu-t", str(tmp_path)):
                raise RuntimeError("trial failed")
        with gpu_lock("gpu-t", str(tmp_path)) as after:
            assert after.waited_s < 0.5
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)


@pytest.mark.slow
def test_two_trials_per_gpu_never_overlap_their_timed_sections(ray_cluster, tmp_path):
    replay = paced_grid(tmp_path / "paced.jsonl", 0.4)
    rc, study, summary = _run(tmp_path / "studies", replay, gpu_overlap=2)
    assert rc == 0 and summary["gpu_overlap"] == 2
    measured = [t for t in study.trials if t.user_attrs.get("gpu_lock")]
    assert len(measured) >= 6
    by_gpu = _locked_intervals(study)
    _assert_disjoint(by_gpu)
    # Trials did share a GPU at once: some waited for the lock (without it their sections would overlap).
    waits = [t.user_attrs["stage_seconds"]["lock_wait"] for t in measured]
    assert max(waits) > 0.1, waits
    assert summary["stage_seconds"]["lock_wait"] == pytest.approx(sum(waits), abs=0.05)
    assert len({t.user_attrs["pid"] for t in measured}) == len(measured)       # still one process per trial
    held = sum(t.user_attrs["gpu_lock"]["released_at"] - t.user_attrs["gpu_lock"]["acquired_at"] for t in measured)
    assert summary["gpu_held_s"] == pytest.approx(held, abs=0.2)


@pytest.mark.slow
def test_gpu_overlap_1_runs_one_trial_per_gpu(ray_cluster, tmp_path):
    replay = paced_grid(tmp_path / "paced.jsonl", 0.2)
    rc, study, summary = _run(tmp_path / "studies", replay, gpu_overlap=1, trials=5)
    assert rc == 0 and summary["gpu_overlap"] == 1
    measured = [t for t in study.trials if t.user_attrs.get("gpu_lock")]
    assert len(measured) >= 3 and len({t.user_attrs["pid"] for t in measured}) == len(measured)
    _assert_disjoint(_locked_intervals(study))
    # A whole GPU per trial: no trial ever waits for another on its GPU, i.e. no other trial on that GPU
    # released the lock while this one was asking for it (a timing-free check: under load the lock call
    # itself can take a while, which is not waiting for a trial).
    for t in measured:
        lock = t.user_attrs["gpu_lock"]
        asked = lock["acquired_at"] - lock["waited_s"]
        released_meanwhile = [o.number for o in measured if o is not t and o.user_attrs["gpu_lock"]["key"] == lock["key"]
                              and asked <= o.user_attrs["gpu_lock"]["released_at"] <= lock["acquired_at"]]
        assert released_meanwhile == [], (t.number, released_meanwhile)


@pytest.mark.slow
def test_a_hung_trial_is_cancelled_and_frees_its_gpu_for_the_trial_waiting_on_it(ray_cluster, tmp_path):
    keys, by_key = campaign_seed_keys()
    # 2 s per trial: while the hang holds one GPU, the other GPU's two slots stay busy long enough that a
    # ready candidate must take the hung GPU's free slot (with 0.3 s the other GPU drained them all once, CI)
    replay = paced_grid(tmp_path / "paced.jsonl", 2.0, {keys[0]: (by_key[keys[0]], "hang")})
    started = time.monotonic()
    rc, study, summary = _run(tmp_path / "studies", replay, gpu_overlap=2, trials=6, trial_timeout=15.0)
    assert rc == 0 and time.monotonic() - started < 120
    hung = next(t for t in study.trials if t.user_attrs.get("params_key") == keys[0])
    assert hung.state == TrialState.PRUNED
    assert "timeout: no result after 15 s (process killed)" in hung.user_attrs["infeasible_reason"]
    others = [t for t in study.trials if t.number != hung.number and t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(others) == 5
    # Only the hang timed out: a trial waiting behind it on its GPU was not blamed for its wait.
    assert not [t for t in others if "timeout" in (t.user_attrs.get("infeasible_reason") or "")]
    assert all(t.state == TrialState.COMPLETE for t in others)
    _assert_disjoint(_locked_intervals(study))
    # The forced cancel freed the hung trial's GPU: every GPU's lock is free now (a killed holder that kept its
    # lock would block the next trial on that GPU for ever).
    # (The kill is asynchronous: a loaded machine may take a few seconds to reap the process and drop its lock.)
    for key in {t.user_attrs["gpu_lock"]["key"] for t in others} | {"gpu-0", "gpu-1"}:
        fd = os.open(os.path.join(lock_dir(), key + ".lock"), os.O_RDWR | os.O_CREAT, 0o666)
        deadline = time.monotonic() + 20
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)      # BlockingIOError while still held
                    break
                except BlockingIOError:
                    assert time.monotonic() < deadline, f"{key}'s lock still held after 20 s by {_lock_holders(fd)}"
                    time.sleep(0.5)
        finally:
            os.close(fd)
    # A trial that asked for the lock while the hang held it (it waited, and no finished trial released that
    # GPU's lock during its wait) got it when the cancel came, not before. Whether one asked depends on when
    # the hang was scheduled (late, the others had all finished), so this holds for each such trial, if any.
    killed_at = hung.datetime_complete.timestamp()
    for t in others:
        lock = t.user_attrs["gpu_lock"]
        asked = lock["acquired_at"] - lock["waited_s"]
        released_meanwhile = [o for o in others if o is not t and o.user_attrs["gpu_lock"]["key"] == lock["key"]
                              and asked <= o.user_attrs["gpu_lock"]["released_at"] <= lock["acquired_at"]]
        if lock["waited_s"] > 0.5 and not released_meanwhile:
            assert lock["acquired_at"] >= killed_at - 1.0, (t.number, lock, killed_at)
