"""One timed section per GPU at a time: an exclusive ``fcntl.flock`` per GPU, shared by every trial process
on the node.

With ``--gpu-overlap K`` up to K trial processes share one GPU (workers.py), so the next trials create
their CUDA contexts, load their kernels and warm up while one is timed. Verification and benchmarking run
under this lock, so no two trials' timed sections ever overlap; library baselines take it too.

Why flock: the kernel drops the lock when the holder's process dies, however it dies (the kill of a hung
trial, SIGSEGV of a kernel that corrupts its context, SIGKILL), so a dead trial can never leave
its GPU locked. The lock belongs to the open file description: a child forked while it is held (none is)
would keep it; ``os.open`` here does not pass the descriptor across ``exec`` (Python fds are close-on-exec).
"""
from __future__ import annotations

import fcntl
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

LOCK_DIR_ENV = "TUNER_GPU_LOCK_DIR"
GPU_KEY_ENV = "TUNER_GPU_KEY"       # set by the GPU worker (workers.py) for its trial processes, which run outside Ray
DEFAULT_LOCK_DIR = "/tmp/tuner-gpu-locks"   # node-local: every worker of the node sees the same files


@dataclass
class LockHold:
    key: str
    waited_s: float = 0.0
    acquired_at: float = 0.0        # time.time(): comparable between processes of one host
    released_at: Optional[float] = None

    def to_dict(self) -> dict:
        return {"key": self.key, "waited_s": round(self.waited_s, 4), "acquired_at": self.acquired_at,
                "released_at": self.released_at}


def gpu_key() -> str:
    """This process's GPU, as Ray assigned it: Ray's GPU id is the index (or UUID) the raylet found in
    its CUDA_VISIBLE_DEVICES, one per physical GPU of the host, and it is the same id for every fractional
    task on that GPU. A trial process forked for a GPU worker gets its worker's key in TUNER_GPU_KEY.
    Otherwise: CUDA_VISIBLE_DEVICES, else device 0."""
    if os.environ.get(GPU_KEY_ENV):
        return os.environ[GPU_KEY_ENV]
    ids: list[str] = []
    try:
        import ray

        if ray.is_initialized():
            ids = [str(g) for g in ray.get_gpu_ids()]
    except Exception:  # noqa: BLE001 - not in a Ray worker: fall back to the environment
        ids = []
    if not ids:
        ids = [x for x in os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",") if x.strip()][:1] or ["0"]
    return "gpu-" + re.sub(r"[^A-Za-z0-9._-]", "_", "+".join(ids))


def lock_dir() -> str:
    return os.environ.get(LOCK_DIR_ENV) or DEFAULT_LOCK_DIR


@contextmanager
def gpu_lock(key: str | None = None, directory: str | None = None,
             on_acquired: Callable[[LockHold], None] | None = None) -> Iterator[LockHold]:
    """Hold this GPU's lock for the ``with`` body; blocks until it is free. Released on exit, exceptions
    included (and by the kernel if the process dies). ``on_acquired`` runs right after acquisition (the
    driver starts the trial's timeout clock there); its failure never breaks the trial."""
    hold = LockHold(key or gpu_key())
    directory = directory or lock_dir()
    os.makedirs(directory, mode=0o777, exist_ok=True)
    fd = os.open(os.path.join(directory, hold.key + ".lock"), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        t0 = time.perf_counter()
        fcntl.flock(fd, fcntl.LOCK_EX)
        hold.waited_s = time.perf_counter() - t0
        hold.acquired_at = time.time()
        if on_acquired is not None:
            try:
                on_acquired(hold)
            except Exception:  # noqa: BLE001 - a report of the acquisition, not part of the trial
                pass
        try:
            yield hold
        finally:
            hold.released_at = time.time()
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
