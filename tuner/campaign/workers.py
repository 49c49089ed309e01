"""GPU workers: one Ray actor per GPU of the requested type, running each trial in a fresh process.

A worker asks Ray for one whole GPU, pinned to the accelerator type (label or resource, cluster.py), and
keeps a warm fork server (trialproc.py) that has imported torch, cuda-python and triton once. Every trial (and
the library baselines) is a fork of it: a new process with a new CUDA context, so a kernel that corrupts
its context or hangs takes down only its own trial, while starting one costs milliseconds instead of the
~7-13 s of a fresh Python (H100, BENCHMARKS.md). Up to ``--gpu-overlap K`` trials per GPU are in
flight: the next ones load their kernels and warm up while one is timed; the GPU lock (gpulock.py)
keeps timed sections apart, and the worker enforces each trial's limits (trialproc.py).

A worker that dies (its node lost, or killed because a call outlived every limit) fails its trials in
flight as infrastructure failures; the pool starts a new one in its place.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any

import ray

from .backends import BackendSpec
from .cluster import GpuPool

# What each backend's fork server imports once: everything a trial needs before its first CUDA call.
# CUDA itself is never initialised there (a forked child could not use it).
PRELOAD = {
    "gpu": ("tuner.campaign.trialproc", "tuner.campaign.backends", "tuner.campaign.retime", "torch",
            "cuda.bindings.driver", "triton.testing", "tuner.measure.trial", "tuner.measure.dense",
            "tuner.measure.verify", "tuner.serving.launch.kernel"),
    "replay": ("tuner.campaign.trialproc", "tuner.campaign.backends", "tuner.campaign.retime",
               "tuner.campaign.perfmodel", "hardware_profiles", "translate.params"),
}


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class GpuWorker:
    def __init__(self, backend_kind: str) -> None:
        from .gpulock import GPU_KEY_ENV, gpu_key
        from .trialproc import FreshProcesses

        os.environ[GPU_KEY_ENV] = gpu_key()        # the trial processes lock this worker's GPU
        self._runner = FreshProcesses(PRELOAD.get(backend_kind, PRELOAD["replay"]))
        self._boot_s = self._runner.boot()
        ctx = ray.get_runtime_context()
        self._where = {"node_id": ctx.get_node_id(), "hostname": socket.gethostname(),
                       "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    def info(self) -> dict:
        return {**self._where, "boot_s": round(self._boot_s, 3), "worker_pid": os.getpid()}

    def run_trial(self, backend: BackendSpec, payload: dict, timeout_s: float, wait_s: float) -> dict:
        from .backends import trial_job

        return self._report(self._runner.run(trial_job, (backend, payload), timeout_s=timeout_s, wait_s=wait_s))

    def run_baselines(self, backend: BackendSpec, problems: list, timing: dict | None, timeout_s: float,
                      wait_s: float) -> dict:
        from .backends import baselines_job

        out = self._runner.run(baselines_job, (backend, problems, timing), timeout_s=timeout_s, wait_s=wait_s)
        return self._report(out)

    def run_retime(self, backend: BackendSpec, payload: dict, timeout_s: float, wait_s: float) -> dict:
        """A bucket's contenders timed again side by side (retime.py), in a fresh process like a trial."""
        from .retime import retime_job

        return self._report(self._runner.run(retime_job, (backend, payload), timeout_s=timeout_s, wait_s=wait_s))

    def _report(self, out) -> dict:
        held = None if out.locked_after_s is None else max(0.0, out.seconds - out.locked_after_s)
        return {"outcome": out.kind, "value": out.value, "message": out.message, **self._where,
                "pid": out.pid, "seconds": out.seconds, "held_s": held}


@dataclass
class WorkerPool:
    """The campaign's GPU workers, one per GPU of the pool, and their trials in flight."""

    pool: GpuPool
    backend: BackendSpec
    overlap: int
    handles: list = field(default_factory=list)
    inflight: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.handles = [self._start() for _ in range(self.pool.gpus)]
        self.inflight = [0] * len(self.handles)

    def _start(self):
        return GpuWorker.options(num_gpus=1, max_concurrency=self.overlap + 1,
                                 **self.pool.task_options()).remote(self.backend.kind)

    def free_slot(self) -> int | None:
        """The worker with the fewest trials in flight, if it has room for one more."""
        if not self.handles:
            return None
        i = min(range(len(self.handles)), key=lambda j: self.inflight[j])
        return i if self.inflight[i] < self.overlap else None

    def free_slots(self) -> int:
        """Trials the workers could take now (each up to ``overlap`` in flight)."""
        return sum(max(0, self.overlap - n) for n in self.inflight)

    def idle_gpus(self) -> int:
        """Workers with no trial in flight: their GPU has nothing to run or to start up."""
        return sum(1 for n in self.inflight if n == 0)

    def submit(self, slot: int, payload: dict, timeout_s: float, wait_s: float) -> tuple[Any, Any]:
        self.inflight[slot] += 1
        handle = self.handles[slot]
        return handle.run_trial.remote(self.backend, payload, timeout_s, wait_s), handle

    def release(self, slot: int) -> None:
        self.inflight[slot] = max(0, self.inflight[slot] - 1)

    def replace(self, slot: int, handle) -> bool:
        """Kill ``handle`` (its trial processes die with it) and start a new worker in its place, unless
        that already happened. Its calls in flight fail with RayActorError, each released as it fails."""
        if self.handles[slot] is not handle:
            return False
        ray.kill(handle, no_restart=True)
        self.handles[slot] = self._start()
        return True

    def submit_baselines(self, problems: list, timing: dict | None, timeout_s: float):
        """The library baselines on the first GPU, in a fresh process like a trial (under the GPU lock).
        They may queue for the lock behind every trial in flight there (flock is not first-come first-
        served), each bounded by its own timeout: hence the longer wait."""
        wait_s = timeout_s * (self.overlap + 2)
        return self.handles[0].run_baselines.remote(self.backend, problems, timing, timeout_s, wait_s)

    def submit_retime(self, payload: dict, timeout_s: float, wait_s: float):
        """A re-timing (retime.py) on the worker with the fewest calls in flight; ``(ref, slot)``: release the
        slot when it returns."""
        if not self.handles:   # stopped (a --timeout that killed trials in flight): the finish needs a GPU
            self.__post_init__()
        slot = min(range(len(self.handles)), key=lambda j: self.inflight[j])
        self.inflight[slot] += 1
        return self.handles[slot].run_retime.remote(self.backend, payload, timeout_s, wait_s), slot

    def shutdown(self) -> None:
        for handle in self.handles:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.handles, self.inflight = [], []
