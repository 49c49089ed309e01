"""The timed part of a GPU trial, one skeleton for every layout and phase: the verification gate, then each benchmark
problem in turn (its inputs, a cross-check of our output on them, an early-stop probe, the timing).

What differs between a dense, a serving and a decode trial is a ``TrialKind``:

* ``dense`` (tuner.measure.dense): the paper grid's shapes, keyed by key length; the gate is tuner.measure.verify;
  at benchmark size our output must agree with torch SDPA's on the same inputs (index overflow and grid limits
  show only at size); ``timing.rotate`` input sets rotated.
* ``serving`` (tuner.measure.serving): the mixes of a varlen or paged layout, keyed by name; the gate is
  tuner.measure.verify_varlen over length mixes (a paged kernel at the campaign's own page size, the one it will be
  exported for); inputs seeded by the mix, so that every trial and the baselines see the same.
* ``decode`` (tuner.measure.decode): one decode call per bucket, keyed by its name; the gate is
  tuner.measure.verify_decode; at benchmark size the first and last sequence are checked against an fp32 reference
  (the largest page and row offsets are what the small verification shapes never reach); one input set (a decode
  call reads far more than the L2, and the timer flushes it anyway).

The same kinds serve the re-timing of a bucket's contenders (tuner/campaign/retime.py): shared inputs, each
contender cross-checked on them, then timed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

from tuner.measure import timer
from tuner.measure.dense import FP8_CROSS_CHECK_REL_ERR

# At benchmark size our output must agree with the reference within this relative error (`tune bench`'s bound).
BENCH_CROSS_CHECK_REL_ERR = 2e-2


def cross_check_bound(problem) -> float:
    """The bound of a problem's cross-check at benchmark size (a trial's and a re-timing's): BENCH_CROSS_CHECK_REL_ERR,
    or for an FP8 kernel dense.FP8_CROSS_CHECK_REL_ERR (its P is rounded to e4m3: that constant says how far that
    alone moves the output)."""
    return FP8_CROSS_CHECK_REL_ERR if getattr(problem, "dtype", None) == "fp8" else BENCH_CROSS_CHECK_REL_ERR


@dataclass(frozen=True)
class TrialKind:
    """How one kind of trial verifies, makes inputs, cross-checks, times and keys its problems."""

    name: str
    verify: Callable            # (kernel, spec, problems, device) -> report with .passed, .reason, .to_dict()
    inputs: Callable            # (problem, timing, device) -> the inputs every contender of the problem shares
    time_ms: Callable           # (kernel, problem, inputs, timing) -> median ms
    key: Callable               # problem -> its key in the trial's result
    tflops: Callable            # (problem, ms) -> TFLOPS
    baselines: Callable         # (problem, timing, device, errors) -> {library: TFLOPS or None}
    baseline_names: tuple
    cross_check: Optional[Callable] = None   # (kernel, problem, inputs) -> relative error; None: the gate suffices
    against: Callable = lambda problem: "the reference"   # what the cross-check compares with, for its message
    digits: int = 2             # TFLOPS are rounded to this many digits


def failure(device_name: str, reason: str, verification: dict | None = None) -> dict:
    """A trial's result when the candidate failed: no TFLOPS, the reason."""
    return {"verified": False, "reason": reason, "tflops": {}, "device_name": device_name,
            "verification": verification or {"passed": False, "reason": reason}}


def run_trial(kind: TrialKind, kernel, payload: dict, device: str, name: str, timing: timer.Timing, seconds: dict,
              early_stop_decide: Callable) -> dict:
    """The timed part of a trial (under the GPU lock); adds its stages to ``seconds``. Any failure of the candidate
    is a result with a reason, never a raise."""
    spec, problems = payload["spec"], list(payload["problems"])
    t1 = time.perf_counter()
    try:
        report = kind.verify(kernel, spec, problems, device)
    except Exception as exc:  # noqa: BLE001 - the gates catch kernel faults per shape; anything else ends this trial
        return failure(name, f"verification could not run: {type(exc).__name__}: {timer.first_line(exc)}")
    t2 = time.perf_counter()
    seconds["verify"] = round(t2 - t1, 3)
    verification = report.to_dict()
    if not report.passed:
        return failure(name, f"verification failed: {report.reason}", verification)
    plan = payload.get("early_stop")
    if plan:   # the problem the plan names first: its short probe may stop the trial (tuner/campaign/earlystop.py)
        problems.sort(key=lambda p: kind.key(p) != str(plan["seqlen"]))
    cross: dict[str, float] = {}
    measured: dict[str, float] = {}

    def record_cross() -> None:
        if kind.cross_check is not None:
            verification["bench_cross_check"] = cross

    for problem in problems:
        key = kind.key(problem)
        try:
            inputs = kind.inputs(problem, timing, device)
            if kind.cross_check is not None:
                rel = cross[key] = kind.cross_check(kernel, problem, inputs)
                bound = cross_check_bound(problem)
                if not rel <= bound:   # also NaN
                    verification.update(passed=False, bench_cross_check=cross)
                    return failure(name, f"wrong result at the benchmark shape {problem.label()}: relative error "
                                         f"{rel:.3g} against {kind.against(problem)} > {bound}",
                                   verification)
            if plan and key == str(plan["seqlen"]):
                probe_ms = kind.time_ms(kernel, problem, inputs, timer.Timing(**plan["probe"]))
                stopped = early_stop_decide(plan, kind.tflops(problem, probe_ms))
                if stopped is not None:
                    seconds["bench"] = round(time.perf_counter() - t2, 3)
                    record_cross()
                    return {"verified": True, "reason": None, "tflops": {key: stopped["probe_tflops"]},
                            "device_name": name, "verification": verification, "seconds": seconds,
                            "early_stop": stopped}
            ms = kind.time_ms(kernel, problem, inputs, timing)
        except Exception as exc:  # noqa: BLE001 - a launch failure or fault at benchmark size
            if kind.cross_check is not None:
                verification.update(passed=False, bench_cross_check=cross)
            return failure(name, f"benchmark of {problem.label()} failed: {type(exc).__name__}: "
                                 f"{timer.first_line(exc)}", verification)
        measured[key] = round(kind.tflops(problem, ms), kind.digits)
        del inputs
    seconds["bench"] = round(time.perf_counter() - t2, 3)
    record_cross()
    return {"verified": True, "reason": None, "tflops": {kind.key(p): measured[kind.key(p)] for p in payload["problems"]},
            "device_name": name, "verification": verification, "seconds": seconds}


# -- the three kinds ---------------------------------------------------------------------------------------------


def _dense() -> TrialKind:
    from tuner.measure import dense, verify

    def inputs(problem, timing, device):
        return dense.make_inputs(problem, timing.rotate, seed=problem.seqlen_k, device=device)

    def time_ms(kernel, problem, inputs, timing):
        return dense.measure_problem(kernel, problem, inputs=inputs, timing=timing)

    return TrialKind("dense", verify=lambda kernel, spec, problems, device: verify.verify(kernel, spec, device=device),
                     inputs=inputs, time_ms=time_ms, key=lambda p: str(p.seqlen_k), tflops=dense.tflops,
                     baselines=lambda p, timing, device, errors: dense.measure_baselines(
                         p, timing=timing, device=device, errors=errors),
                     baseline_names=dense.BASELINES, cross_check=lambda kernel, p, x: dense.sdpa_rel_err(kernel, p, x[0]),
                     against=lambda p: "the fp32 reference" if p.softcap or p.sinks else "torch SDPA")


def _serving() -> TrialKind:
    from tuner.measure import serving
    from tuner.measure.verify_varlen import verify_varlen

    def verify(kernel, spec, problems, device):
        page_size = problems[0].page_size if problems else None
        return verify_varlen(kernel, spec, mixes=serving.check_mixes(spec, page_size), device=device)

    return TrialKind("serving", verify=verify,
                     inputs=lambda p, timing, device: serving.seeded_inputs(p, timing.rotate, device),
                     time_ms=lambda kernel, p, sets, timing: serving.time_sets(kernel, p, sets, timing),
                     key=lambda p: p.key, tflops=serving.tflops, baselines=serving.measure_baselines,
                     baseline_names=serving.baseline_names())


def _decode() -> TrialKind:
    from tuner.measure import decode
    from tuner.measure.verify_decode import verify_decode

    def verify(kernel, spec, problems, device):
        page_size = (problems[0].page_size if problems else 0) or 16
        return verify_decode(kernel, spec, page_size=page_size, device=device)

    def time_ms(kernel, problem, x, timing):
        return timer.time_ms(decode.ours_call(kernel, problem, x), timing=timing)

    return TrialKind("decode", verify=verify, inputs=lambda p, timing, device: decode.problem_inputs(p, device),
                     time_ms=time_ms, key=lambda p: p.key, tflops=decode.problem_tflops,
                     baselines=decode.measure_baselines, baseline_names=decode.BASELINES,
                     cross_check=lambda kernel, p, x: decode.cross_check(decode.ours_call(kernel, p, x)(), x, p),
                     against=lambda p: "the fp32 reference", digits=3)


def trial_kind(spec) -> TrialKind:
    """The kind of trial a kernel spec's kernels run: decode for the decode phase, serving for varlen and paged
    prefill, else dense."""
    if getattr(spec, "phase", "prefill") == "decode":
        return _decode()
    if getattr(spec, "layout", "dense") != "dense":
        return _serving()
    return _dense()


def problem_kind(problem) -> TrialKind:
    """The kind of trial a benchmark problem belongs to: a DecodeProblem's (its phase), a ServingProblem's (it has a
    layout), else a dense Problem's."""
    if getattr(problem, "phase", "prefill") == "decode":
        return _decode()
    return _serving() if hasattr(problem, "layout") else _dense()
