"""The library baselines of a study (SDPA's backends and FA4, the serving or decode baselines): measured once per
study by a GPU worker while the first kernels compile, and kept in the study's attributes."""
from __future__ import annotations

from .state import Campaign


def start_baselines(camp: Campaign):
    """The library baselines, measured once per study by a GPU worker while the first kernels compile:
    returns the call in flight, or None when the study has them already."""
    cached = camp.study.user_attrs.get("baselines")
    if cached:
        camp.baselines, camp.device_name = cached["baselines"], cached["device_name"]
        camp.baseline_errors = cached.get("errors") or {}   # (studies from before the errors were kept: none)
        return None
    return camp.workers.submit_baselines(camp.problems, camp.options.timing(), camp.options.trial_timeout)


def finish_baselines(camp: Campaign, ref, wait_s: float = 0.0) -> None:
    """Take the baselines' result; they are context, not the campaign's goal: a failure is a warning."""
    import ray

    try:
        report = ray.get(ref, timeout=wait_s or None)
    except Exception as exc:  # noqa: BLE001 - worker lost, or not done within wait_s
        camp.console.print(f"[yellow]{camp.label}: baselines could not be measured: {type(exc).__name__}: {exc}[/]")
        return
    if report["outcome"] != "result":
        camp.console.print(f"[yellow]{camp.label}: baselines could not be measured: {report['outcome']}: "
                           f"{report['message']}[/]")
        return
    result = report["value"]
    camp.baselines, camp.device_name = result["baselines"], result["device_name"]
    camp.baseline_errors = result.get("errors") or {}
    by_reason: dict[tuple, list] = {}     # one line per library and reason (FA4 not installed: not one per seqlen)
    for seqlen, errs in camp.baseline_errors.items():
        for lib, msg in errs.items():
            by_reason.setdefault((lib, msg), []).append(seqlen)
    for (lib, msg), seqlens in by_reason.items():
        camp.console.print(f"baseline {lib} at seqlen {', '.join(seqlens)} cannot run: {msg}", markup=False)
    camp.study.set_user_attr("baselines", {"baselines": camp.baselines, "device_name": camp.device_name,
                                           "errors": camp.baseline_errors})
