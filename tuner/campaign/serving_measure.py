"""A GPU trial of a serving layout (issue 14): the verification gate over length mixes, then every serving mix
of the campaign (tuner/mixes.py) timed; and the library baselines on the same inputs.

Verification: ``tuner.verify_varlen`` (lengths 0/1/127/128/129, one long among short, chunked prefill,
seqused_k, NaN-poisoned output); a paged kernel gets the paged check mixes at the campaign's own page size
(shuffled tables, NaN spare pages), the one it will be exported for. Benchmark inputs: packed q/k/v, or the
keys and values spread over a paged cache by a shuffled table; a trial's kernel and the baselines see the
same inputs (one seed per mix). Baselines: tuner.mix_baselines (FA4's ``flash_attn_varlen_func``,
FlashInfer's prefill where installed, torch SDPA on the zero-padded batch), as `tune bench --layout` runs them.
"""
from __future__ import annotations

import dataclasses
import time as _time
import zlib


def serving_baselines() -> tuple[str, ...]:
    from tuner.mix_baselines import BASELINES

    return tuple(b.name for b in BASELINES)


def check_mixes(spec, page_size: int | None):
    from tuner.verify_varlen import CHECK_MIXES, CHECK_PAGED_MIXES

    if spec.layout != "paged":
        return CHECK_MIXES
    return tuple(dataclasses.replace(m, page_size=page_size) for m in CHECK_PAGED_MIXES)


def mix_seed(problem) -> int:
    return zlib.crc32(problem.name.encode()) % (2 ** 31)


def make_inputs(problem, sets: int, device: str) -> list:
    """``sets`` input sets of one mix (tuner.mix_inputs.MixInputs: packed, and paged through a shuffled
    table), seeded by the mix: every trial and the baselines see the same."""
    from tuner.mix_inputs import make_mix_inputs

    return [make_mix_inputs(problem, device, seed=mix_seed(problem) + i) for i in range(max(1, sets))]


def ours_call(kernel, problem):
    scale = problem.softmax_scale
    if problem.layout == "paged":
        return lambda x: kernel.paged(x.q, x.k_cache, x.v_cache, x.cu_seqlens_q, x.seqused_k, x.page_table,
                                      problem.max_seqlen_q, softmax_scale=scale)
    return lambda x: kernel.varlen(x.q, x.k, x.v, x.cu_seqlens_q, x.cu_seqlens_k, problem.max_seqlen_q,
                                   problem.max_seqlen_k, softmax_scale=scale)


def time_sets(call, sets, timing) -> float:
    """Median ms of ``call`` rotating over the sets (tuner.bench's timer)."""
    import itertools

    from tuner import bench

    cycle = itertools.cycle(sets)
    call(sets[0])   # the first call of a shape may compile (FA4's JIT) or allocate: not timed
    return bench.time_ms(lambda: call(next(cycle)), timing=timing)


def tflops(problem, ms: float) -> float:
    return problem.flops / (ms * 1e-3) / 1e12


def verify_and_bench(kernel, payload: dict, device: str, name: str, timing, seconds: dict, failure,
                     early_stop_decide) -> dict:
    """The timed part of a serving trial (under the GPU lock), as backends._verify_and_bench for dense ones."""
    from tuner import bench
    from tuner.verify_varlen import verify_varlen

    spec, problems = payload["spec"], list(payload["problems"])
    page_size = problems[0].page_size if problems else None
    t1 = _time.perf_counter()
    try:
        report = verify_varlen(kernel, spec, mixes=check_mixes(spec, page_size), device=device)
    except Exception as exc:  # noqa: BLE001 - anything else still ends this trial only
        return failure(name, f"verification could not run: {type(exc).__name__}: {str(exc)[:200]}")
    t2 = _time.perf_counter()
    seconds["verify"] = round(t2 - t1, 3)
    verification = report.to_dict()
    if not report.passed:
        return failure(name, f"verification failed: {report.reason}", verification)
    plan = payload.get("early_stop")
    if plan:
        problems.sort(key=lambda p: p.key != str(plan["seqlen"]))
    measured: dict[str, float] = {}
    for problem in problems:
        try:
            sets = make_inputs(problem, timing.rotate, device)
            call = ours_call(kernel, problem)
            if plan and problem.key == str(plan["seqlen"]):
                probe_ms = time_sets(call, sets, bench.Timing(**plan["probe"]))
                stopped = early_stop_decide(plan, tflops(problem, probe_ms))
                if stopped is not None:
                    seconds["bench"] = round(_time.perf_counter() - t2, 3)
                    return {"verified": True, "reason": None, "tflops": {problem.key: stopped["probe_tflops"]},
                            "device_name": name, "verification": verification, "seconds": seconds,
                            "early_stop": stopped}
            ms = time_sets(call, sets, timing)
        except Exception as exc:  # noqa: BLE001 - a launch failure or fault at benchmark size
            return failure(name, f"benchmark of {problem.label()} failed: {type(exc).__name__}: {str(exc)[:200]}",
                           verification)
        measured[problem.key] = round(tflops(problem, ms), 2)
        del sets
    seconds["bench"] = round(_time.perf_counter() - t2, 3)
    return {"verified": True, "reason": None, "tflops": {p.key: measured[p.key] for p in payload["problems"]},
            "device_name": name, "verification": verification, "seconds": seconds}


def measure_baselines(problem, timing, device: str, errors: dict) -> dict:
    """{library: TFLOPS or None} (tuner.mix_baselines: FA4's flash_attn_varlen_func, FlashInfer's prefill, torch
    SDPA on the padded batch) on the mix's first input set; ``errors`` gets the reason of each None."""
    from tuner import bench
    from tuner.mix_baselines import BASELINES, Unavailable

    x = make_inputs(problem, 1, device)[0]
    row: dict = {}
    for lib in BASELINES:
        try:
            prepared = lib.prepare(problem, x)
            prepared.call()   # a first call may compile (FA4's JIT, FlashInfer's) or allocate: not timed
            row[lib.name] = round(tflops(problem, bench.time_ms(prepared.call, timing=timing)), 2)
        except Unavailable as exc:
            row[lib.name], errors[lib.name] = None, str(exc)
        except Exception as exc:  # noqa: BLE001 - a baseline that cannot run has a reason, not a number
            row[lib.name], errors[lib.name] = None, f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    return row
