"""Jobs for tests/campaign/test_trialproc.py: importable by the fork server's children."""
import os
import signal
import time
from pathlib import Path


def ok(x, on_locked):
    from tuner.campaign.trialproc import started_at

    on_locked()
    return {"pid": os.getpid(), "x": x, "hooked": os.environ.get("TRIAL_JOBS_HOOKED"), "age": time.time() - started_at()}


def lock_later(delay, work, on_locked):
    time.sleep(delay)
    on_locked()
    time.sleep(work)
    return "done"


def segv(on_locked):
    on_locked()
    os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(60)


def hang_locked(pid_file, on_locked):
    Path(pid_file).write_text(str(os.getpid()))
    on_locked()
    while True:
        time.sleep(3600)


def hang_unlocked(on_locked):
    while True:
        time.sleep(3600)


def raises(on_locked):
    raise ValueError("no such kernel symbol\nsecond line")


def exits(on_locked):
    os._exit(3)


def hook():
    os.environ["TRIAL_JOBS_HOOKED"] = "yes"
