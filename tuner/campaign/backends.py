"""What runs inside a GPU trial: the real GPU backend, or the replay backend that serves recorded results.

Both run inside the same Ray GPU task (tasks.py), so scheduling, pinning, timeouts and cancellation are
exercised for real whichever serves the numbers (Kernel Tuner's trick: a results log replayed in CI).

Replay file: JSON Lines (optionally gzip, ``.gz``). The first line may be ``{"_meta": {...}}`` with
``device_name``, ``gpu``, ``baselines`` (``{"<seqlen>": {"flash": ., "cudnn": ., "efficient": .}}``);
every other line is ``{"params": {...}, "tflops": {"<seqlen>": TFLOPS, ...}}`` or ``{"params": {...},
"fault": F}`` with F one of:
  ``oob``     the worker process dies of SIGSEGV, as a kernel writing out of bounds kills its CUDA context;
  ``hang``    the trial never returns (the driver's timeout and forced cancel end it);
  ``wrong``   verification fails with a reason;
  ``compile`` the (fake) compile fails (handled by the compile step).
Entries are keyed by ``KernelParams.key()``. A configuration the file does not hold is valued by the
deterministic model of perfmodel.py and marked ``replay_unknown`` on its trial.
"""
from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

FAULTS = ("oob", "hang", "wrong", "compile")


class BackendError(ValueError):
    """A --backend value or replay file that cannot be used."""


@dataclass(frozen=True)
class BackendSpec:
    kind: str                 # "gpu" or "replay"
    path: str | None = None   # replay file

    @property
    def label(self) -> str:
        return self.kind if self.path is None else f"{self.kind}:{self.path}"


def parse_backend(text: str | None) -> BackendSpec:
    if text is None or text == "gpu":
        return BackendSpec("gpu")
    if text.startswith("replay:"):
        path = Path(text[len("replay:"):]).expanduser()
        if not path.is_file():
            raise BackendError(f"replay file {str(path)!r} does not exist")
        load_replay(path)  # fail early on a broken file
        return BackendSpec("replay", str(path.resolve()))
    raise BackendError(f"unknown backend {text!r}; choose gpu or replay:FILE")


@dataclass(frozen=True)
class ReplayData:
    meta: dict
    entries: dict             # key -> entry dict


def load_replay(path: str | Path) -> ReplayData:
    from translate.params import KernelParams

    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    meta: dict = {}
    entries: dict[str, dict] = {}
    try:
        with opener(path, "rt") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise BackendError(f"{path}:{lineno}: not JSON: {exc}") from None
                if "_meta" in row:
                    meta = row["_meta"]
                    continue
                if not isinstance(row.get("params"), dict):
                    raise BackendError(f"{path}:{lineno}: an entry needs a 'params' object")
                try:
                    key = KernelParams.from_dict(row["params"]).key()
                except (TypeError, ValueError) as exc:
                    raise BackendError(f"{path}:{lineno}: {exc}") from None
                fault = row.get("fault")
                if fault is not None and fault not in FAULTS:
                    raise BackendError(f"{path}:{lineno}: unknown fault {fault!r}; known: {', '.join(FAULTS)}")
                if fault is None and not isinstance(row.get("tflops"), dict):
                    raise BackendError(f"{path}:{lineno}: an entry needs 'tflops' or 'fault'")
                entries[key] = row
    except OSError as exc:
        raise BackendError(f"cannot read replay file {path}: {exc}") from None
    return ReplayData(meta, entries)


def replay_fault(path: str, params: dict) -> str | None:
    from translate.params import KernelParams

    entry = load_replay(path).entries.get(KernelParams.from_dict(params).key())
    return None if entry is None else entry.get("fault")


def _where() -> dict:
    import ray

    ctx = ray.get_runtime_context()
    return {"node_id": ctx.get_node_id(), "hostname": socket.gethostname(), "pid": os.getpid(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}


def measure(backend: BackendSpec, payload: dict) -> dict:
    """One trial's verify + benchmark; returns the TrialMeasurement dict (see module doc)."""
    where = _where()
    if backend.kind == "replay":
        result = _replay_measure(backend.path, payload)
    else:
        result = _gpu_measure(payload)
    result.update(where)
    return result


def _replay_measure(path: str, payload: dict) -> dict:
    from hardware_profiles import load_profile
    from translate.params import KernelParams

    from .perfmodel import model_tflops

    data = load_replay(path)
    params = KernelParams.from_dict(payload["params"])
    entry = data.entries.get(params.key())
    fault = None if entry is None else entry.get("fault")
    if fault == "oob":
        # What an out-of-bounds write does to a real trial: the CUDA context dies with the process.
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(60)
    if fault == "hang":
        while True:
            time.sleep(3600)
    device = data.meta.get("device_name", "replay")
    if fault == "wrong":
        reason = ("wrong result: max |out - ref| 0.41 exceeds the bound 0.0156 (2x the low-precision "
                  "torch error + slack) at the first check shape")
        return {"verified": False, "reason": reason, "tflops": {}, "device_name": device,
                "verification": {"passed": False, "reason": reason, "backend": "replay"}, "replay_unknown": False}
    profile = load_profile(payload["profile"])
    tflops: dict[str, float] = {}
    for problem in payload["problems"]:
        recorded = (entry or {}).get("tflops", {}).get(str(problem.seqlen_k))
        tflops[str(problem.seqlen_k)] = float(recorded) if recorded is not None else model_tflops(params, problem, profile)
    return {"verified": True, "reason": None, "tflops": tflops, "device_name": device,
            "verification": {"passed": True, "backend": "replay", "recorded": entry is not None},
            "replay_unknown": entry is None}


def _gpu_measure(payload: dict) -> dict:
    import torch

    from tuner import bench, runtime, verify

    device = torch.cuda.get_device_name()
    try:
        kernel = runtime.load_kernel(payload["cubin"], payload["meta"])
        report = verify.verify(kernel, payload["spec"])
    except Exception as exc:  # a kernel that cannot load or launch is this candidate's fault
        reason = f"load/launch failed: {type(exc).__name__}: {exc}"
        return {"verified": False, "reason": reason, "tflops": {}, "device_name": device,
                "verification": {"passed": False, "reason": reason}}
    if not report.passed:
        return {"verified": False, "reason": f"verification failed: {report.reason}", "tflops": {},
                "device_name": device, "verification": report.to_dict()}
    tflops = {}
    for problem in payload["problems"]:
        ms = bench.measure_problem(kernel, problem)
        tflops[str(problem.seqlen_k)] = round(problem.flops / (ms * 1e-3) / 1e12, 2)
    return {"verified": True, "reason": None, "tflops": tflops, "device_name": device,
            "verification": report.to_dict()}


def baselines(backend: BackendSpec, problems: list) -> dict:
    """Library baselines per seqlen, measured once per campaign on the requested GPU type."""
    where = _where()
    if backend.kind == "replay":
        data = load_replay(backend.path)
        recorded = data.meta.get("baselines", {})
        rows = {str(p.seqlen_k): recorded.get(str(p.seqlen_k), {}) for p in problems}
        return {"device_name": data.meta.get("device_name", "replay"), "baselines": rows, **where}
    import torch

    from tuner import bench

    rows = {str(p.seqlen_k): bench.measure_baselines(p) for p in problems}
    return {"device_name": torch.cuda.get_device_name(), "baselines": rows, **where}
