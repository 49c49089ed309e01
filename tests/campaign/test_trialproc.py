"""Fresh trial processes from a warm fork server (tuner/campaign/trialproc.py), without Ray: each job in a
new process, its faults turned into outcomes with reasons, its limits enforced by killing it."""
import os
import signal
import subprocess
import sys
import time

import pytest

from tuner.campaign.trialproc import SETUP_HOOK_ENV, FreshProcesses

from . import trial_jobs
from .conftest import REPO


@pytest.fixture(scope="module")
def runner():
    r = FreshProcesses(("tuner.campaign.trialproc", "tests.campaign.trial_jobs"))
    r.boot()
    return r


def test_every_job_runs_in_a_new_process_and_returns_its_value(runner):
    outs = [runner.run(trial_jobs.ok, (i,), timeout_s=20, wait_s=20) for i in range(3)]
    assert [o.kind for o in outs] == ["result"] * 3 and [o.value["x"] for o in outs] == [0, 1, 2]
    pids = {o.value["pid"] for o in outs}
    assert len(pids) == 3 and os.getpid() not in pids and {o.pid for o in outs} == pids
    assert all(o.locked_after_s is not None and o.seconds < 10 for o in outs)
    # the child knows when it was started (the trials' "process" stage): after the parent's clock before
    assert all(0 <= o.value["age"] < o.seconds + 0.5 for o in outs)


def test_a_process_killed_by_a_signal_is_a_crash_named_by_the_signal(runner):
    out = runner.run(trial_jobs.segv, (), timeout_s=20, wait_s=20)
    assert out.kind == "crash" and "died of SIGSEGV" in out.message
    out = runner.run(trial_jobs.exits, (), timeout_s=20, wait_s=20)
    assert out.kind == "crash" and "exited with code 3 without a result" in out.message


def test_an_exception_is_an_error_with_its_first_line(runner):
    out = runner.run(trial_jobs.raises, (), timeout_s=20, wait_s=20)
    assert out.kind == "error" and out.message == "ValueError: no such kernel symbol"


def test_a_hang_holding_the_lock_is_killed_timeout_s_after_it_took_the_lock(runner, tmp_path):
    pid_file = tmp_path / "pid"
    started = time.monotonic()
    out = runner.run(trial_jobs.hang_locked, (str(pid_file),), timeout_s=1.5, wait_s=30)
    took = time.monotonic() - started
    assert out.kind == "timeout" and out.message == "timeout: no result after 1.5 s (process killed)"
    assert 1.4 < took < 8
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_waiting_for_the_lock_has_its_own_bound(runner):
    out = runner.run(trial_jobs.hang_unlocked, (), timeout_s=30, wait_s=1.0)
    assert out.kind == "timeout" and "GPU lock not taken, or no result, after 1 s" in out.message
    # The timed section's clock starts at the lock: a late lock plus a section within the timeout is fine,
    # though the two together exceed the timeout.
    out = runner.run(trial_jobs.lock_later, (1.2, 1.2), timeout_s=2.0, wait_s=10)
    assert out.kind == "result" and out.value == "done" and out.locked_after_s >= 1.2


def test_the_setup_hook_runs_in_each_trial_process_and_not_in_the_owner(monkeypatch):
    monkeypatch.setenv(SETUP_HOOK_ENV, "tests.campaign.trial_jobs:hook")
    hooked = FreshProcesses(("tuner.campaign.trialproc", "tests.campaign.trial_jobs"))   # reads the variable
    assert [hooked.run(trial_jobs.ok, (i,), timeout_s=20, wait_s=20).value["hooked"] for i in range(2)] == ["yes"] * 2
    assert "TRIAL_JOBS_HOOKED" not in os.environ
    monkeypatch.delenv(SETUP_HOOK_ENV)
    plain = FreshProcesses(("tuner.campaign.trialproc", "tests.campaign.trial_jobs"))
    assert plain.run(trial_jobs.ok, (0,), timeout_s=20, wait_s=20).value["hooked"] is None


def test_trials_die_with_their_owner(tmp_path):
    """kill -9 of the process that owns the fork server: its fork server exits and the hung trial with it,
    so no trial outlives its campaign holding the GPU lock."""
    pid_file = tmp_path / "pid"
    code = ("from tuner.campaign.trialproc import FreshProcesses\n"
            "from tests.campaign import trial_jobs\n"
            "r = FreshProcesses(('tuner.campaign.trialproc', 'tests.campaign.trial_jobs'))\n"
            f"r.run(trial_jobs.hang_locked, ({str(pid_file)!r},), timeout_s=600, wait_s=600)\n")
    owner = subprocess.Popen([sys.executable, "-c", code], cwd=REPO)
    try:
        deadline = time.time() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.time() < deadline and owner.poll() is None
            time.sleep(0.1)
        trial = int(pid_file.read_text())
        os.kill(trial, 0)                      # alive while its owner is
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(10)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                os.kill(trial, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"trial process {trial} outlived its owner")
    finally:
        if owner.poll() is None:
            owner.kill()


def test_the_owners_main_script_runs_once_in_the_fork_server_not_in_each_trial(tmp_path):
    """multiprocessing re-runs the parent's main script in every child it starts; for a Ray GPU worker
    that is Ray's default_worker.py (import ray: 0.33 s a trial on 2 cores, 1.5 s on the loaded H100 host).
    The fork server runs it once (trialproc._preload_main) and the trial processes inherit it."""
    marker = tmp_path / "runs"
    script = tmp_path / "owner_main.py"
    script.write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "if __name__ != '__main__':   # a run of this script as multiprocessing's __mp_main__\n"
        f"    open({str(marker)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
        "if __name__ == '__main__':\n"
        "    from tuner.campaign.trialproc import FreshProcesses\n"
        "    from tests.campaign import trial_jobs\n"
        "    r = FreshProcesses(('tuner.campaign.trialproc', 'tests.campaign.trial_jobs'))\n"
        "    pids = {r.run(trial_jobs.ok, (0,), timeout_s=60, wait_s=60).value['pid'] for _ in range(3)}\n"
        "    assert len(pids) == 3 and os.getpid() not in pids, pids\n")
    # (the fork server imports its preloads from the environment's path, not the owner's sys.path: Python
    # 3.11 passes it but never applies it; an installed package, or PYTHONPATH as here, is found)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, str(script)], cwd=tmp_path, check=True, timeout=120, env=env)
    assert len(marker.read_text().split()) == 1      # the fork server's run; none per trial
