"""What the campaign loop tells a study: a compile batch's outcomes, a GPU trial's report (measured,
unverified, crashed, hung, or lost to the infrastructure), the tally's counts and the GPU lock spans."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from . import study as st

if TYPE_CHECKING:
    from .state import Campaign, Candidate, Tally


def trial_value(result: dict) -> float:
    return round(st.geomean(result["tflops"].values()), 3)


def measured_value(result: dict) -> float | None:
    """The trial value of a kernel verified and measured in full; None otherwise (unverified, or stopped
    early: one short probe is no value to compare trials by)."""
    if not result.get("verified") or result.get("early_stop"):
        return None
    return trial_value(result)


def count_outcome(tally: Tally, state, value, number: int, infeasible: bool | None = None) -> None:
    from optuna.trial import TrialState

    if state == TrialState.FAIL or state == "fail":
        tally.failed += 1
        return
    if infeasible is None:
        infeasible = state == "infeasible"
    tally.told += 1
    if infeasible:
        tally.infeasible += 1
        return
    tally.done += 1
    if value is not None and value > tally.best:
        tally.best, tally.best_trial = value, number


def compile_outcomes(batch: list[Candidate], ref, wall_s: float):
    """(candidate, "ready" | reason-of-failure | ("infra", msg)) per candidate of a finished batch. Each
    trial records its batch's timing: ``compile`` = wall (driver: submit to result), task (the task's own
    run: wall minus task is the wait for a CPU), the nvcc unit's seconds and kernels."""
    import ray
    from ray.exceptions import RayTaskError

    try:
        results = ray.get(ref)
    except RayTaskError as exc:
        msg = str(exc).strip().splitlines()[-1][:500]
        return [(c, f"compile task error: {msg}") for c in batch]
    except ray.exceptions.RayError as exc:
        return [(c, ("infra", f"compile task lost: {type(exc).__name__}")) for c in batch]
    out = []
    for cand, res in zip(batch, results):
        cand.trial.set_user_attr("kernel_name", res.get("kernel_name"))
        if res.get("timing"):
            cand.trial.set_user_attr("compile", {"batch": len(batch), "wall_s": round(wall_s, 2), **res["timing"]})
        if not res["ok"]:
            out.append((cand, res["error"]))
            continue
        cand.compiled = res
        for attr in ("registers", "spill_stores"):
            if res.get(attr) is not None:
                cand.trial.set_user_attr(attr, res[attr])
        out.append((cand, "ready"))
    return out


def save_kernel(camp: Campaign, cand: Candidate, res: dict) -> None:
    """Keep every compiled kernel on disk: the store takes the best one from here after the loop."""
    import json

    stem = camp.kernels_dir / res["kernel_name"]
    stem.with_suffix(".cubin").write_bytes(res["cubin"])
    stem.with_suffix(".cu").write_text(res.get("source") or "")
    stem.with_suffix(".meta.json").write_text(json.dumps(res.get("meta") or {}, indent=1, default=str))


def tell_infra(camp: Campaign, cand: Candidate, reason: str) -> None:
    retries = int(cand.trial.user_attrs.get("infra_retries", 0))
    st.tell_infra_failure(camp.study, cand.trial, cand.trial.params, reason, retries < camp.options.infra_retries)
    camp.tally.failed += 1
    camp.console.print(f"[yellow]trial {cand.trial.number}: infrastructure failure ({reason}); "
                       f"{'queued again' if retries < camp.options.infra_retries else 'not retried again'}[/]")


def tell_measurement(camp: Campaign, cand: Candidate, ref) -> tuple[dict | None, dict | None, bool]:
    """Tell the study what the GPU worker reported for this trial; returns (report, the candidate's result:
    verified or not, whether the cache may keep it), with result None when the worker itself failed."""
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    trial = cand.trial
    try:
        report = ray.get(ref)
    except RayActorError as exc:
        # The worker died (its node lost, or killed as stuck): the trial did nothing wrong; queue it again.
        camp.workers.replace(cand.slot, cand.worker)
        lost = _lost_nodes(camp)
        why = f"GPU node(s) {', '.join(n[:12] for n in lost)} lost" if lost else f"GPU worker lost: {type(exc).__name__}"
        tell_infra(camp, cand, why)
        return None, None, False
    except RayTaskError as exc:   # the worker's own code raised: not the candidate's fault either
        msg = str(exc).strip().splitlines()[-1][:300]
        tell_infra(camp, cand, f"GPU worker error: {msg}")
        return None, None, False
    except ray.exceptions.RayError as exc:
        tell_infra(camp, cand, f"{type(exc).__name__}: {str(exc)[:200]}")
        return None, None, False
    for k in ("node_id", "hostname", "pid", "gpu_ids"):
        trial.set_user_attr(k, report.get(k))
    outcome = report["outcome"]
    if outcome != "result":
        reason = {"crash": f"crash: {report['message']} (an out-of-bounds access or illegal address kills the "
                           f"CUDA context)",
                  "timeout": report["message"],
                  "error": f"error in trial: {report['message']}"}.get(outcome, f"{outcome}: {report['message']}")
        st.tell_infeasible(camp.study, trial, reason, stage="measure")
        count_outcome(camp.tally, "infeasible", None, trial.number)
        # A crash or a hang is this kernel's own: recorded, so that a re-proposal costs no GPU time again
        # (--remeasure tries it anyway). A worker's own error is not.
        return report, {"verified": False, "reason": reason, "tflops": {}, "device_name": None}, \
            outcome in ("crash", "timeout")
    result = report["value"]
    trial.set_user_attr("measure_seconds", round(time.monotonic() - cand.started, 2))
    if result.get("seconds"):
        trial.set_user_attr("stage_seconds", result["seconds"])
    trial.set_user_attr("device_name", result.get("device_name"))
    if result.get("replay_unknown"):
        trial.set_user_attr("replay_unknown", True)
    if result.get("gpu_lock"):   # when this trial held its GPU (time.time() of its host): timed sections never overlap
        trial.set_user_attr("gpu_lock", result["gpu_lock"])
    if not result["verified"]:
        st.tell_infeasible(camp.study, trial, result["reason"], stage="verify", verification=result.get("verification"))
        count_outcome(camp.tally, "infeasible", None, trial.number)
        return report, result, True
    if result.get("early_stop"):
        # Stopped early (earlystop.py): verified, far behind the incumbent at the longest seqlen. Optuna's own
        # meaning of pruned: TPE ranks it below every complete trial (by its probe, reported as step 0).
        trial.set_user_attr("early_stop", result["early_stop"])
        trial.report(float(result["early_stop"]["probe_tflops"]), 0)
        st.tell_feasible(camp.study, trial, None, tflops=result["tflops"], verification=result.get("verification"),
                         backend=camp.backend.kind)
        count_outcome(camp.tally, "complete", None, trial.number)
        return report, result, True
    value = trial_value(result)
    st.tell_feasible(camp.study, trial, value, tflops=result["tflops"], verification=result.get("verification"),
                     backend=camp.backend.kind)
    count_outcome(camp.tally, "complete", value, trial.number)
    return report, result, True


def _lost_nodes(camp: Campaign) -> list[str]:
    from .cluster import alive_nodes

    alive = {n["NodeID"] for n in alive_nodes()}
    return [n for n in camp.pool.node_ids if n not in alive]


def lock_record(report: dict | None) -> dict | None:
    """The GPU lock span a trial reported (acquired and released), or None (killed, or never locked)."""
    value = (report or {}).get("value")
    lock = value.get("gpu_lock") if isinstance(value, dict) else None
    return lock if lock and lock.get("acquired_at") and lock.get("released_at") else None


def held_seconds(report: dict | None) -> float:
    """How long a finished trial held its GPU's lock: its own record, else (killed) as its worker saw it."""
    lock = lock_record(report)
    if lock is not None:
        return max(0.0, float(lock["released_at"]) - float(lock["acquired_at"]))
    return float((report or {}).get("held_s") or 0.0)


def note_span(tally: Tally, report: dict | None) -> None:
    """Keep when a returned trial held its GPU (host clock): the summary's steady-state occupancy."""
    lock = lock_record(report)
    if lock is not None:
        gpu = f"{(report or {}).get('node_id') or ''}/{lock.get('key')}"
        tally.lock_spans.append((gpu, float(lock["acquired_at"]), float(lock["released_at"]),
                                 float(lock.get("waited_s") or 0.0)))
