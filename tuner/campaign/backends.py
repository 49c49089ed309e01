"""What runs inside a GPU trial: the real GPU backend, or the replay backend that serves recorded results.

Both run in the same fresh trial process of a Ray GPU worker (workers.py, trialproc.py), so scheduling,
pinning, timeouts and kills are exercised for real whichever serves the numbers (Kernel Tuner's trick: a
results log replayed in CI).

Replay file: JSON Lines (optionally gzip, ``.gz``). The first line may be ``{"_meta": {...}}`` with
``device_name``, ``gpu``, ``baselines`` (``{"<seqlen>": {"flash": ., "cudnn": ., "efficient": ., "fa4": .}}``;
a library a row lacks is reported as not recorded);
every other line is ``{"params": {...}, "tflops": {"<seqlen>": TFLOPS, ...}}`` or ``{"params": {...},
"fault": F}`` with F one of:
  ``oob``     the trial process dies of SIGSEGV, as a kernel writing out of bounds kills its CUDA context;
  ``hang``    the trial never returns (its GPU worker's timeout kills it);
  ``wrong``   verification fails with a reason;
  ``compile`` the (fake) compile fails (handled by the compile step).
``_meta.measure_seconds`` (optional) paces the replay: each trial then holds its GPU's lock that long, as a
real trial's verify + benchmark would (the overlap tests need timed sections that take time).
``_meta.noise`` (optional, ``{"sigma": 0.03, "seed": 0}``) makes the replay a noisy GPU: every measurement
(a trial's, an early-stop probe's, each round of a re-timing) is the recorded TFLOPS, taken as the kernel's
true speed, times exp(sigma * z), z drawn from a generator keyed by the seed, the kernel, the seqlen and the
measurement (the trial number or the re-timing round), so a replay stays deterministic.
An entry's optional ``"retimed": {"<seqlen>": TFLOPS}`` is what a re-timing (retime.py) measures instead of
``tflops``: a kernel whose single measurement in a trial was lucky (the winner's curse).
Entries are keyed by ``KernelParams.key()``, and by the sketch too when a line names it (``"schedule":
"ws_serial"``: the same parameters through two sketches are two kernels); a lookup tries the sketch's own
entry first, then one for any sketch. A configuration the file does not hold is valued by the
deterministic model of perfmodel.py and marked ``replay_unknown`` on its trial.
"""
from __future__ import annotations

import functools
import gzip
import json
import math
import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from search_spaces import params_from

from .earlystop import decide as early_stop_decide
from .gpulock import LockHold, gpu_lock
from .problems import problem_key

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
    """The replay file, parsed once per version of the file (a trial, a probe and a re-timing each read it)."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError as exc:
        raise BackendError(f"cannot read replay file {path}: {exc}") from None
    return _parse_replay(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _parse_replay(name: str, mtime_ns: int, size: int) -> ReplayData:
    path = Path(name)
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
                    key = replay_key(params_from(row["params"], row.get("schedule")), row.get("schedule"))
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


def replay_key(params, schedule: str | None = None) -> str:
    return f"{schedule}:{params.key()}" if schedule else params.key()


def replay_entry(data: ReplayData, params, schedule: str | None) -> dict | None:
    """The sketch's own entry, else one recorded for any sketch."""
    return data.entries.get(replay_key(params, schedule)) or data.entries.get(params.key())


def replay_noise(meta: dict, *parts) -> float:
    """The factor a noisy replay multiplies one measurement by (module doc); 1.0 without ``_meta.noise``."""
    noise = meta.get("noise") or {}
    sigma = float(noise.get("sigma") or 0.0)
    if sigma <= 0:
        return 1.0
    rng = random.Random(":".join(str(p) for p in (noise.get("seed", 0),) + parts))
    return math.exp(rng.gauss(0.0, sigma))


def replay_fault(path: str, params: dict, schedule: str | None = None) -> str | None:
    entry = replay_entry(load_replay(path), params_from(params, schedule), schedule)
    return None if entry is None else entry.get("fault")


OnAcquired = Optional[Callable[[LockHold], None]]


# The jobs a GPU worker runs in a fresh trial process (trialproc.py): module-level, in a module the fork
# server preloads, so that the child finds them without importing anything; no Ray in the child.
def trial_job(backend: BackendSpec, payload: dict, on_locked: OnAcquired = None) -> dict:
    return measure(backend, payload, on_acquired=on_locked)


def baselines_job(backend: BackendSpec, problems: list, timing: dict | None, on_locked: OnAcquired = None) -> dict:
    return baselines(backend, problems, timing, on_acquired=on_locked)


def measure(backend: BackendSpec, payload: dict, on_acquired: OnAcquired = None) -> dict:
    """One trial's verify + benchmark; returns the TrialMeasurement dict (see module doc). The timed part
    runs under the GPU's lock (gpulock.py); ``on_acquired`` is told when the lock is taken."""
    if backend.kind == "replay":
        with gpu_lock(on_acquired=on_acquired) as hold:   # a planted hang hangs holding it, as a real one would
            result = _replay_measure(backend.path, payload)
        add_lock(result, hold)
    else:
        started = process_age()
        result = _gpu_measure(payload, on_acquired=on_acquired)
        if started is not None:   # from the worker's fork of this process to here
            result.setdefault("seconds", {})["process"] = round(started, 3)
    result["pid"] = os.getpid()
    return result


def add_lock(result: dict, hold: LockHold) -> dict:
    result.setdefault("seconds", {})["lock_wait"] = round(hold.waited_s, 3)
    result["gpu_lock"] = hold.to_dict()
    return result


def process_age() -> float | None:
    """Seconds from the start of this trial process (its fork, as the worker timed it) to now; None
    outside a trial process."""
    from .trialproc import started_at

    start = started_at()
    return None if start is None else max(0.0, time.time() - start)


def play_fault(fault: str | None) -> None:
    """What a planted ``oob`` or ``hang`` does to the process measuring that kernel."""
    if fault == "oob":
        # What an out-of-bounds write does to a real trial: the CUDA context dies with the process.
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(60)
    if fault == "hang":
        while True:
            time.sleep(3600)


def _replay_measure(path: str, payload: dict) -> dict:
    from hardware_profiles import load_profile

    from .perfmodel import model_tflops

    data = load_replay(path)
    params = params_from(payload["params"], payload.get("schedule"))
    entry = replay_entry(data, params, payload.get("schedule"))
    fault = None if entry is None else entry.get("fault")
    play_fault(fault)
    paced = float(data.meta.get("measure_seconds") or 0)
    device = data.meta.get("device_name", "replay")
    if fault == "wrong":
        time.sleep(paced)
        reason = ("wrong result: max |out - ref| 0.41 exceeds the bound 0.0156 (2x the low-precision "
                  "torch error + slack) at the first check shape")
        return {"verified": False, "reason": reason, "tflops": {}, "device_name": device,
                "verification": {"passed": False, "reason": reason, "backend": "replay"}, "replay_unknown": False}
    profile = load_profile(payload["profile"])
    key = replay_key(params, payload.get("schedule"))
    result = {"verified": True, "reason": None, "device_name": device, "replay_unknown": entry is None,
              "verification": {"passed": True, "backend": "replay", "recorded": entry is not None}}

    def speed(problem) -> float:
        recorded = (entry or {}).get("tflops", {}).get(problem_key(problem))
        return float(recorded) if recorded is not None else model_tflops(params, problem, profile)

    plan = payload.get("early_stop")
    if plan:   # the longest seqlen first, a short window (earlystop.py): a probe is a measurement of its own
        probed = next(p for p in payload["problems"] if problem_key(p) == str(plan["seqlen"]))
        probe = speed(probed) * replay_noise(data.meta, "probe", key, problem_key(probed), payload.get("trial"))
        stopped = early_stop_decide(plan, probe)
        if stopped is not None:   # paced as the GPU would hold it: verification and one short probe
            from .earlystop import EarlyStop, TrialCost

            timing, n = payload.get("timing") or {}, len(payload["problems"])
            rule = EarlyStop(plan["margin"], plan["probe"]["warmup_ms"], plan["probe"]["rep_ms"])
            time.sleep(paced * TrialCost().probed(n, timing, rule, True) / TrialCost().full(n, timing))
            return {**result, "tflops": {problem_key(probed): probe}, "early_stop": stopped}
    time.sleep(paced)
    result["tflops"] = {problem_key(p): speed(p) * replay_noise(data.meta, "trial", key, problem_key(p),
                                                                payload.get("trial"))
                        for p in payload["problems"]}
    return result


# Where the real backend allocates its tensors. Only the CPU tests change it (with torch.cuda stubs in
# their Ray workers, tests/campaign/gpu_fakes.py), so that this very code runs without a GPU.
TRIAL_DEVICE = "cuda"


def baseline_names(problems) -> tuple[str, ...]:
    """The libraries a campaign's problems are compared with: SDPA's backends and FA4 (dense), the serving
    baselines (varlen/paged mixes), FA4's paged decode and the copy bound (decode)."""
    from tuner.measure.trial import problem_kind

    return problem_kind(problems[0]).baseline_names if problems else ()


def gpu_name(device: str) -> str:
    """The GPU's name as torch reports it (Ray gives the task one GPU: it is device 0)."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else device


def _gpu_measure(payload: dict, device: str | None = None, on_acquired: OnAcquired = None) -> dict:
    """Load the cubin, then the trial of its kind (tuner.measure.trial: the verification gate, a cross-check at each
    benchmark shape, the timing). Any failure of the candidate is a result with a reason, never a raise.

    Imports, CUDA context, kernel load and warm-up run freely (they overlap another trial's timed work on this
    GPU); verification and benchmarking hold the GPU's lock (gpulock.py)."""
    import time as _time

    t_imports = _time.perf_counter()
    from tuner.measure import timer, verify  # noqa: F401 - verify's import cost belongs to "imports"
    from tuner.measure.trial import failure, run_trial, trial_kind
    from tuner.serving import launch

    device = device or TRIAL_DEVICE
    name = gpu_name(device)          # initialises CUDA: part of the "imports" stage
    timing = timer.Timing(**payload.get("timing", {}))
    t0 = _time.perf_counter()
    seconds: dict[str, float] = {"imports": round(t0 - t_imports, 3)}
    try:
        kernel = launch.load_kernel(payload["cubin"], payload["meta"])
    except Exception as exc:  # a kernel that cannot load is this candidate's fault
        return failure(name, f"load failed: {type(exc).__name__}: {timer.first_line(exc)}")
    t1 = _time.perf_counter()
    seconds["load"] = round(t1 - t0, 3)
    warm_up(payload["spec"], device)
    seconds["warmup"] = round(_time.perf_counter() - t1, 3)
    with gpu_lock(on_acquired=on_acquired) as hold:
        result = run_trial(trial_kind(payload["spec"]), kernel, payload, device, name, timing, seconds,
                           early_stop_decide)
    result["seconds"] = seconds
    return add_lock(result, hold)


def warm_up(spec, device: str) -> None:
    """Pay the first-use costs before taking the GPU lock: triton's import (do_bench), the cuBLAS handle
    and workspace, and the lazily loaded torch kernels that verification and the SDPA cross-check use.
    On a GPU these cost ~1 s of host time but only microseconds of GPU time (tensors of a few KB), so a
    trial timed meanwhile is not disturbed, and the locked section holds only the trial's own work.
    Best effort: whatever fails here fails again, with its reason, in verification."""
    try:
        import triton.testing  # noqa: F401 - imported for its side effect: do_bench ready
    except ImportError:
        pass
    try:
        import torch

        from tuner.measure import verify
        from tuner.measure import dense
        from kernel_abi.spec import Problem

        hq, hkv = verify.CHECK_HEADS[spec.variant]
        tiny = Problem(spec.variant, 1, hq, hkv, 16, 16, spec.d_qk, spec.d_v, spec.causal, spec.dtype)
        q, k, v = dense.make_inputs(tiny, 1, seed=0, device=device)[0]
        verify.reference(q, k, v, tiny.causal)
        verify.reference(q, k, v, tiny.causal, dtype=q.dtype)
        dense.sdpa_call(tiny)(q, k, v)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - see the docstring
        pass


def baselines(backend: BackendSpec, problems: list, timing: dict | None = None, device: str | None = None,
              on_acquired: OnAcquired = None) -> dict:
    """Library baselines per seqlen, measured once per campaign on the requested GPU type, with the
    trials' timing (``timer.Timing`` fields)."""
    # library timings are as clean as the trials' they are compared with
    with gpu_lock(on_acquired=on_acquired) as hold:
        result = _baselines(backend, problems, timing, device)
    return add_lock(result, hold)


def _baselines(backend: BackendSpec, problems: list, timing: dict | None, device: str | None) -> dict:
    from tuner.measure import timer
    from tuner.measure.trial import problem_kind

    if backend.kind == "replay":
        data = load_replay(backend.path)
        recorded = data.meta.get("baselines") or {}
        rows = {problem_key(p): dict(recorded.get(problem_key(p)) or {}) for p in problems}
        errors = {}
        names = baseline_names(problems)
        for seqlen, row in rows.items():   # e.g. a grid recorded before FA4 was a baseline: no number, a reason
            missing = {name: "not recorded in the replay file" for name in names if name not in row}
            row.update(dict.fromkeys(missing))
            if missing:
                errors[seqlen] = missing
        return {"device_name": data.meta.get("device_name", "replay"), "baselines": rows, "errors": errors}

    device = device or TRIAL_DEVICE
    timing_ = timer.Timing(**(timing or {}))
    rows, errors = {}, {}
    for p in problems:
        errs: dict = {}
        rows[problem_key(p)] = problem_kind(p).baselines(p, timing_, device, errs)
        if errs:
            errors[problem_key(p)] = errs
    return {"device_name": gpu_name(device), "baselines": rows, "errors": errors}
