"""One fresh process per GPU trial, forked from a warm fork server.

A trial must run in a process of its own: a kernel that writes out of bounds kills its CUDA context, and a
hung kernel can only be stopped by killing its process. Starting a fresh Python for every trial costs
~7-13 s of CPU (interpreter, Ray worker, torch, CuPy, triton; H100, BENCHMARKS.md) against
~1-2 s of GPU work, so the GPU waited on process start-ups. Here a fork server (``multiprocessing``'s
"forkserver" start method) imports those modules once; each trial is a ``fork()`` of it: a new process
with a new CUDA context (CUDA is never initialised in the server), ready in milliseconds.

Each trial reports ``("locked", t)`` when it takes its GPU's lock and ``("result", value)`` at the end
over a pipe. Limits, enforced here by killing the child (SIGKILL):
  * ``timeout_s`` from the moment it took the lock (verify + benchmark);
  * ``wait_s`` from its start until it takes the lock (start-up plus the other trials' timed sections).
A child that dies without a result is a crash, named by its signal. Children die with the fork server
(``PR_SET_PDEATHSIG``), and the fork server exits when its owner does, so no trial outlives its campaign
holding a GPU lock.
"""
from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

# The main script of the process that owns the fork server, for the server to run once (see _preload_main).
MAIN_PATH_ENV = "TUNER_FORKSERVER_MAIN"
# Set by tests (and the device rehearsal) to install CPU stand-ins for the GPU in every trial process:
# "package.module:function" or "package.module.function", called in each child before its job.
SETUP_HOOK_ENV = "TUNER_TRIAL_SETUP_HOOK"
POLL_S = 0.2
_STARTED_AT: float | None = None     # in a trial process: time.time() when its worker started it


@dataclass(frozen=True)
class ProcessOutcome:
    kind: str                      # "result" | "crash" | "timeout" | "error"
    value: Any = None              # the job's return value (kind "result")
    message: str = ""              # why not (other kinds)
    pid: int | None = None
    locked_after_s: float | None = None   # seconds from start to taking the GPU lock, if it did
    seconds: float = 0.0           # start to end, as the parent saw it


@dataclass
class FreshProcesses:
    """Runs jobs in fresh processes forked from one fork server that preloaded ``preload``."""

    # Never empty: only with a preload list does the fork server inherit this process's sys.path.
    preload: tuple[str, ...] = ("tuner.campaign.trialproc",)
    setup_hook: str | None = field(default_factory=lambda: os.environ.get(SETUP_HOOK_ENV) or None)
    _ctx: Any = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self._ctx = multiprocessing.get_context("forkserver")
        # The preload list belongs to the (one) fork server of this process: set it before it starts.
        self._ctx.set_forkserver_preload([*(self.preload or ("tuner.campaign.trialproc",)), _preload_main()])

    def boot(self) -> float:
        """Start the fork server now (its imports take seconds) by running an empty job; returns seconds."""
        started = time.monotonic()
        self.run(_noop, (), timeout_s=600.0, wait_s=600.0)
        return time.monotonic() - started

    def run(self, job: Callable, args: tuple, *, timeout_s: float, wait_s: float) -> ProcessOutcome:
        """Run ``job(*args, on_locked=callback)`` in a fresh process; never raises for the job's faults."""
        parent, child = self._ctx.Pipe(duplex=False)
        with self._lock:       # forkserver start-up is not meant to race between threads
            started = time.monotonic()
            # time.time() goes along: the child's own record of when it was started (started_at)
            proc = self._ctx.Process(target=_child_main, args=(child, job, args, self.setup_hook, time.time()),
                                     daemon=False)
            proc.start()
        child.close()
        locked: float | None = None
        try:
            while True:
                limit = locked + timeout_s if locked is not None else started + wait_s
                remaining = limit - time.monotonic()
                if remaining <= 0:
                    _kill(proc)
                    if locked is not None:
                        why = f"timeout: no result after {timeout_s:g} s (process killed)"
                    else:
                        why = f"timeout: GPU lock not taken, or no result, after {wait_s:g} s (process killed)"
                    return self._outcome("timeout", proc, started, locked, message=why)
                if not parent.poll(min(remaining, POLL_S)):
                    if proc.is_alive():
                        continue
                    if not parent.poll(0):   # dead, and nothing left to read
                        return self._died(proc, started, locked)
                try:
                    kind, value = parent.recv()
                except (EOFError, OSError):
                    return self._died(proc, started, locked)
                if kind == "locked":
                    locked = time.monotonic()
                    continue
                proc.join(10)
                if kind == "result":
                    return self._outcome("result", proc, started, locked, value=value)
                return self._outcome("error", proc, started, locked, message=str(value))
        finally:
            parent.close()
            if proc.is_alive():
                _kill(proc)

    def _died(self, proc, started: float, locked: float | None) -> ProcessOutcome:
        proc.join(10)
        code = proc.exitcode
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            how = f"died of {name}"
        else:
            how = f"exited with code {code} without a result"
        return self._outcome("crash", proc, started, locked, message=f"the trial's process {how}")

    @staticmethod
    def _outcome(kind: str, proc, started: float, locked: float | None, **kw) -> ProcessOutcome:
        return ProcessOutcome(kind, pid=proc.pid, locked_after_s=None if locked is None else round(locked - started, 3),
                              seconds=round(time.monotonic() - started, 3), **kw)


def _preload_main() -> str:
    """The preload entry that has the fork server run this process's main script once, so that no trial
    process does. multiprocessing re-runs the parent's main script (as ``__mp_main__``) in every child it
    starts, unless the child's ``__main__`` is that script already; the fork server's ``"__main__"``
    preload that would do this once never does on Python 3.11 (it looks for a ``main_path`` key that the
    preparation data does not have). In a Ray GPU worker the main script is Ray's default_worker.py, which
    imports ray: 0.33 s per trial process on an idle 2-core machine (BENCHMARKS.md 2026-11-25), and on
    the H100 campaign of 2026-11-25 a trial process took 1.47 s (median) from its start to its job, while 4
    trial slots bounded the GPU at 0.72 trials/s (lock held 61%, kernels compiled and waiting)."""
    from multiprocessing import spawn

    path = spawn.get_preparation_data("trial").get("init_main_from_path")
    if path:
        os.environ[MAIN_PATH_ENV] = path     # the fork server, started later, inherits it
    else:
        os.environ.pop(MAIN_PATH_ENV, None)
    return "tuner.campaign.forkmain"


def _kill(proc) -> None:
    try:
        proc.kill()
    except (OSError, ValueError, AttributeError):
        pass
    proc.join(10)


def _noop(on_locked=None) -> None:
    return None


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent (the fork server) exits, whatever the reason. The fork
    server exits when every holder of its "alive" pipe has closed it; multiprocessing hands each child a
    copy (for nested processes, which trials never start), and a hung trial holding it would keep the
    server, and so itself, alive after its owner died: close it."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    alive = getattr(server, "_forkserver_alive_fd", None)
    if alive is not None:
        try:
            os.close(alive)
        except OSError:
            pass
        server._forkserver_alive_fd = None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)      # PR_SET_PDEATHSIG
        if os.getppid() == 1:              # the parent died before the call
            os._exit(1)
    except (OSError, AttributeError):
        pass


def _run_hook(spec: str | None) -> None:
    if not spec:
        return
    module, _, func = spec.replace(":", ".").rpartition(".")
    getattr(importlib.import_module(module), func)()


def started_at() -> float | None:
    """In a trial process: when its worker started it (host clock); else None."""
    return _STARTED_AT


def _child_main(conn, job: Callable, args: tuple, setup_hook: str | None, spawned: float | None = None) -> None:
    global _STARTED_AT
    _STARTED_AT = spawned
    _die_with_parent()

    def on_locked(*_):
        conn.send(("locked", time.time()))

    try:
        _run_hook(setup_hook)
        value = job(*args, on_locked=on_locked)
    except BaseException as exc:  # noqa: BLE001 - the parent reports it; the process ends either way
        text = str(exc).strip().splitlines()[0][:400] if str(exc).strip() else ""
        conn.send(("error", f"{type(exc).__name__}: {text}" if text else type(exc).__name__))
    else:
        conn.send(("result", value))
    finally:
        conn.close()
