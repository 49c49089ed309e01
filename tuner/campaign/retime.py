"""The re-timing job: a bucket's challenger and its incumbents timed again, side by side, on a GPU worker.

A job of the GPU worker like a trial (workers.py): a fresh process forked from its warm fork server, with a
trial's limits (trialproc.py: killed when it hangs, a crash is an outcome), the timed part under the GPU's
lock (gpulock.py), through the campaign's backend (the real GPU, or a replay: backends.py). For one
bucket's shape it loads every contender (the challenger, the best seed, the stored kernel), checks each on the
shared inputs as its trial did (tuner.measure.trial: the same inputs, the same reference), then runs
``rounds`` rounds; each round times every contender once, in an order rotated by one each round (A B C,
B C A, C A B, ...: interleaved, so that a drift of the GPU's clocks or temperature falls on all of them
alike). The judgement is the driver's (confirm.py, winners.py).

Payload: ``bucket``, ``profile``, ``spec``, ``problem``, ``rule`` (confirm.ConfirmRule.to_dict()), ``nonce``
(a replay's noise key) and ``kernels``: ``[{"role", "name", "cubin", "meta", "params", "schedule"}]``.
Result: ``ms`` (role -> milliseconds per round), ``order`` (the roles of each round, in timing order),
``failed`` (role -> why it could not be timed: it cannot win), ``tflops`` (role -> median TFLOPS),
``device_name``, ``gpu_lock``, ``seconds``, ``pid``.
"""
from __future__ import annotations

import os
import statistics
import time

from . import backends
from tuner.measure import timer
from tuner.measure.trial import cross_check_bound, problem_kind

from .backends import BackendSpec, OnAcquired, add_lock
from .gpulock import gpu_lock
from .problems import problem_key


def retime_job(backend: BackendSpec, payload: dict, on_locked: OnAcquired = None) -> dict:
    """Module-level, in a module the fork server preloads (workers.PRELOAD): the child finds it at once."""
    started = backends.process_age()
    if backend.kind == "replay":
        with gpu_lock(on_acquired=on_locked) as hold:   # a planted hang hangs holding it, as a real one would
            result = _replay_retime(backend.path, payload)
        add_lock(result, hold)
    else:
        result = _gpu_retime(payload, on_acquired=on_locked)
    if started is not None:
        result.setdefault("seconds", {})["process"] = round(started, 3)
    result["pid"] = os.getpid()
    return result


def round_order(roles: list[str], rnd: int) -> list[str]:
    """Round ``rnd``'s timing order: the roles rotated by one per round."""
    k = rnd % len(roles)
    return roles[k:] + roles[:k]


def _summary(payload: dict, ms: dict, order: list, failed: dict, device: str) -> dict:
    from tuner.measure import dense

    problem = payload["problem"]
    return {"bucket": payload["bucket"], "device_name": device, "ms": ms, "order": order, "failed": failed,
            "tflops": {role: round(dense.tflops(problem, statistics.median(times)), 2)
                       for role, times in ms.items() if times}}


def _replay_retime(path: str, payload: dict) -> dict:
    """The recorded speed of each contender (its ``retimed`` entry if it has one, else its ``tflops``; the
    performance model for a configuration the file lacks) times the replay's noise, per round."""
    from hardware_profiles import load_profile
    from search_spaces import params_from

    from .perfmodel import model_tflops

    data = backends.load_replay(path)
    problem, rule = payload["problem"], payload["rule"]
    seqlen = problem_key(problem)
    speeds, failed = {}, {}
    for k in payload["kernels"]:
        params = params_from(k["params"], k.get("schedule"))
        entry = backends.replay_entry(data, params, k.get("schedule")) or {}
        backends.play_fault(entry.get("fault"))
        if entry.get("fault") == "wrong":
            failed[k["role"]] = "wrong result against torch SDPA on the re-timing inputs (recorded fault)"
            continue
        recorded = (entry.get("retimed") or {}).get(seqlen, (entry.get("tflops") or {}).get(seqlen))
        speeds[k["role"]] = (backends.replay_key(params, k.get("schedule")), float(recorded) if recorded is not None
                             else model_tflops(params, problem, load_profile(payload["profile"])))
    time.sleep(float(data.meta.get("measure_seconds") or 0))
    roles = list(speeds)
    ms: dict[str, list[float]] = {r: [] for r in roles}
    order = []
    for rnd in range(int(rule["rounds"]) if roles else 0):
        order.append(round_order(roles, rnd))
        for role in order[-1]:
            key, speed = speeds[role]
            tf = speed * backends.replay_noise(data.meta, "retime", payload.get("nonce", ""), key, seqlen, rnd)
            ms[role].append(problem.flops / (tf * 1e12) * 1e3)
    return _summary(payload, ms, order, failed, data.meta.get("device_name", "replay"))


def _gpu_retime(payload: dict, on_acquired: OnAcquired = None) -> dict:
    """Load and warm up every contender outside the GPU's lock; cross-check and time them under it."""
    from tuner.serving import launch

    device = backends.TRIAL_DEVICE
    name = backends.gpu_name(device)
    problem, rule = payload["problem"], payload["rule"]
    timing = timer.Timing(warmup_ms=rule["warmup_ms"], rep_ms=rule["rep_ms"], rotate=rule["rotate"])
    kernels, failed = {}, {}
    t0 = time.perf_counter()
    for k in payload["kernels"]:
        try:
            kernels[k["role"]] = launch.load_kernel(k["cubin"], k["meta"])
        except Exception as exc:  # noqa: BLE001 - e.g. a stored kernel of an older ABI: it cannot win here
            failed[k["role"]] = f"load failed: {type(exc).__name__}: {timer.first_line(exc)}"
    backends.warm_up(payload["spec"], device)
    seconds = {"load_warmup": round(time.perf_counter() - t0, 3)}
    with gpu_lock(on_acquired=on_acquired) as hold:
        t1 = time.perf_counter()
        ms, order = _kind_rounds(problem_kind(problem), kernels, failed, problem, timing, device, rule["rounds"])
        seconds["retime"] = round(time.perf_counter() - t1, 3)
    result = _summary(payload, ms, order, failed, name)
    result["seconds"] = seconds
    return add_lock(result, hold)


def _kind_rounds(kind, kernels: dict, failed: dict, problem, timing, device, rounds: int):
    """Every contender cross-checked on the problem's shared inputs, as its trial checked it (tuner.measure.trial;
    a wrong one goes to ``failed``), then the rounds in rotated order: (ms per role, the orders)."""
    inputs = kind.inputs(problem, timing, device)
    if kind.cross_check is not None:
        for role, kernel in list(kernels.items()):
            try:
                rel = kind.cross_check(kernel, problem, inputs)
            except Exception as exc:  # noqa: BLE001 - a launch failure: this contender cannot win
                rel, why = float("nan"), f"{type(exc).__name__}: {timer.first_line(exc)}"
            else:
                why = f"relative error {rel:.3g} against {kind.against(problem)} > {cross_check_bound(problem)}"
            if not rel <= cross_check_bound(problem):   # also NaN
                failed[role] = f"wrong result on the re-timing inputs: {why}"
                del kernels[role]
    return _rounds(list(kernels), rounds, lambda role: kind.time_ms(kernels[role], problem, inputs, timing))


def _rounds(roles: list, rounds: int, time_one):
    """``rounds`` rounds over ``roles`` in rotated order, ``time_one(role)`` ms each: (ms per role, the orders)."""
    ms: dict[str, list[float]] = {r: [] for r in roles}
    order = []
    for rnd in range(rounds if roles else 0):
        order.append(round_order(roles, rnd))
        for role in order[-1]:
            ms[role].append(time_one(role))
    return ms, order
