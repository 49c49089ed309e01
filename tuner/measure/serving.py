"""Our serving-layout kernel on one benchmark mix (tuner/measure/mixes.toml) against FlashAttention-4's
``flash_attn_varlen_func``, FlashInfer's batch prefill and torch SDPA on the zero-padded batch
(tuner.measure.serving_baselines), each on the same inputs in this process.

Per mix: every backend's first call is untimed (FA4 JIT-compiles per shape) and gives the output; max |ours -
baseline| is taken on it. Our output must agree with SDPA (else the first baseline that ran) within
tuner.measure.dense.CROSS_CHECK_REL_ERR (an FP8 kernel, whose e4m3 inputs the libraries take as the same values in
bf16: FP8_CROSS_CHECK_REL_ERR) or the row is FAILED and not timed; a baseline that disagrees with a
cross-checked kernel is reported, not timed (a library called wrongly would be a fast, meaningless bar).
Timing: tuner.measure.timer.time_ms (triton's do_bench median, which flushes L2 between runs; one input set), ours
and every baseline in TIMING_ROUNDS rounds, ours first in every other round, each the median of its rounds: the
first timing after the untimed calls ran on a GPU that had idled and clocked higher (FA4 618 TFLOPS against 568-574
on 2x(2k on 6k), pages of 16, H100, BENCHMARKS.md 2026-11-27), and a single pass gave it to whichever ran first.
TFLOPS count the visible (query, key) pairs (ServingProblem.flops).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
import zlib
from typing import Callable, Optional, Sequence

from tuner.measure import dense, timer
from tuner.measure.mixes import ServingProblem
from tuner.measure.serving_baselines import BASELINES, Baseline, NotApplicable, Unavailable
from tuner.measure.serving_inputs import baseline_view, make_mix_inputs

# Rounds of ours and the baselines per mix (module doc): three, so that one round's first timing, after idle time,
# is not the median.
TIMING_ROUNDS = 3
CROSS_CHECK_ORDER = ("sdpa", "fa4", "flashinfer")


def problem_row(p: ServingProblem) -> dict:
    row = {"layout": p.layout, "mix": p.name, "bucket": p.bucket, "page_size": p.page_size, "batch": p.batch,
           "total_q": p.total_q, "total_k": p.total_k, "max_seqlen_q": p.max_seqlen_q,
           "max_seqlen_k": p.max_seqlen_k, "variant": p.variant, "heads_q": p.heads_q, "heads_kv": p.heads_kv,
           "d_qk": p.d_qk, "d_v": p.d_v, "causal": p.causal, "dtype": p.dtype, "flops": p.flops}
    if p.window != (-1, -1) or p.softcap or p.sinks:
        row.update(window=list(p.window), softcap=p.softcap, sinks=p.sinks)
    return row


def ours_call(kernel, p: ServingProblem, x) -> Callable[[], object]:
    """Our kernel's call on the mix's inputs (AttentionKernel.varlen or .paged), with the mix's options."""
    descales = x.descales or {}
    options = dense.option_kwargs(p, x.q.device)   # (the seeded sink logits FA4 is given too)
    if p.layout == "paged":   # FP8: the descales, and the mix's longest keys bound the V^T gathered per call
        fp8 = {**descales, "max_seqlen_k": p.max_seqlen_k} if descales else {}
        return lambda: kernel.paged(x.q, x.k_cache, x.v_cache, x.cu_seqlens_q, x.seqused_k, x.page_table,
                                    p.max_seqlen_q, softmax_scale=p.softmax_scale, **fp8, **options)
    return lambda: kernel.varlen(x.q, x.k, x.v, x.cu_seqlens_q, x.cu_seqlens_k, p.max_seqlen_q, p.max_seqlen_k,
                                 softmax_scale=p.softmax_scale, **descales, **options)


def _diffs(out, ref) -> tuple[float, float]:
    """(max |out - ref|, relative L2 error)."""
    d = out.float() - ref.float()
    base = ref.float().norm().item()
    return d.abs().max().item(), (d.norm().item() / base if base else math.inf)


def mix_row(kernel, problem: ServingProblem, *, baselines: Sequence[Baseline] = BASELINES,
            device: str = "cuda", clock: Optional[Callable] = None, twin=None) -> dict:
    """One mix: ours and each baseline, TFLOPS, max |ours - baseline|, ratios (module doc: the protocol). ``twin``: an
    FP8 kernel's 16-bit counterpart (our bf16 default of the spec), timed in the same rounds on the same values in bf16
    (``ours_bf16`` and ``ours/ours_bf16``; its output held to the FP8 cross-check bound against ours)."""
    import torch

    clock = clock or timer.time_ms
    row, raw, rel = problem_row(problem), {}, {}
    x = make_mix_inputs(problem, device)
    ours = ours_call(kernel, problem, x)
    theirs_problem, theirs_x = baseline_view(problem, x)   # FP8: the libraries run the same values in bf16
    bound = dense.cross_check_bound(problem)
    try:
        out = ours()
        timer.sync()
        finite = bool(torch.isfinite(out).all().item())
    except Exception as exc:  # noqa: BLE001 - a launch failure is this row's result
        out, finite = None, False
        row.update(status="error", reason=timer.first_line(exc))
    prepared = {}
    for b in baselines:
        try:
            prep = b.prepare(theirs_problem, theirs_x)
            theirs = prep.packed(prep.call())
            timer.sync()
            if prep.note:
                row[f"{b.name}_note"] = prep.note
            if out is not None:
                row[f"{b.name}_max_abs_diff"], rel[b.name] = _diffs(out, theirs)
            prepared[b.name] = prep
            del theirs
        except (Unavailable, NotApplicable) as exc:
            row[f"{b.name}_err"] = str(exc)
        except Exception as exc:  # noqa: BLE001 - "cannot run this mix" comes in many exception types
            row[f"{b.name}_err"] = f"{type(exc).__name__}: {timer.first_line(exc)}"
    ref = next((n for n in CROSS_CHECK_ORDER if n in rel), None)
    if out is not None:
        if not finite or (ref is not None and not rel[ref] <= bound):
            row.update(status="FAILED", reason="output is not finite" if not finite else
                       f"output differs from {ref} on the benchmark inputs (rel err {rel[ref]:.3g})")
        else:
            row["cross_check_against"] = ref
            for name, r in rel.items():   # a cross-checked kernel disagreeing with a library: the library's call
                if name != ref and not r <= bound:
                    prepared.pop(name)
                    row[f"{name}_err"] = f"output differs from ours and {ref} (rel err {r:.3g}); not timed"
    calls = {name: prep.call for name, prep in prepared.items()}
    if "status" not in row:
        calls["ours"] = ours
        if twin is not None:
            _add_twin(row, calls, twin, theirs_problem, theirs_x, out, bound)
    times = {name: [] for name in calls}
    # timer.alternating_rounds' order (ours first in the even rounds, last in the odd ones), with this row's clock
    # and a baseline that fails dropped from the rounds (ours failing raises, as a single timing did)
    for r in range(TIMING_ROUNDS):
        for name in (list(reversed(calls)) if r % 2 == 0 else list(calls)):
            if name not in calls:
                continue
            try:
                times[name].append(clock(calls[name]))
            except Exception as exc:  # noqa: BLE001
                if name == "ours":
                    raise
                row[f"{name}_err"] = f"{type(exc).__name__}: {timer.first_line(exc)}"
                calls.pop(name)
    for name in calls:
        raw[name] = problem.flops / (statistics.median(times[name]) * 1e-3) / 1e12
    if "ours_bf16" in raw:
        row["ours_bf16"] = _round(raw["ours_bf16"])
        row["ours/ours_bf16"] = round(raw["ours"] / raw["ours_bf16"], 3)
    if "status" not in row:
        row.update(ours_ms=round(statistics.median(times["ours"]), 5), status="ok")
    row["ours"] = _round(raw.get("ours"))
    for b in baselines:
        row[b.name] = _round(raw.get(b.name))
        row[f"ours/{b.name}"] = round(raw["ours"] / raw[b.name], 3) if "ours" in raw and raw.get(b.name) else None
    return row


def _add_twin(row: dict, calls: dict, twin, problem: ServingProblem, x, out, bound: float) -> None:
    """The twin's call among this row's timed ones, once its first output agrees with ours (else the reason)."""
    call = ours_call(twin, problem, x)
    try:
        theirs = call()
        timer.sync()
        _, rel = _diffs(out, theirs)
    except Exception as exc:  # noqa: BLE001 - the twin's failure is this column's, not the row's
        row["ours_bf16_err"] = f"{type(exc).__name__}: {timer.first_line(exc)}"
        return
    if not rel <= bound:
        row["ours_bf16_err"] = f"its output differs from ours (rel err {rel:.3g}); not timed"
        return
    calls["ours_bf16"] = call


def mix_rows(kernel, problems: Sequence[ServingProblem], *, on_row: Optional[Callable[[dict], None]] = None,
             **kwargs) -> list[dict]:
    rows = []
    for problem in problems:
        rows.append(mix_row(kernel, problem, **kwargs))
        _empty_cache()
        if on_row is not None:
            on_row(rows[-1])
    return rows


def _round(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(x, 2)


def _empty_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()

# -- a campaign trial's pieces (tuner/measure/trial.py) -------------------------------------------------------


def baseline_names() -> tuple[str, ...]:
    return tuple(b.name for b in BASELINES)


def check_mixes(spec, page_size: int | None):
    from tuner.measure.verify_varlen import CHECK_MIXES, CHECK_PAGED_MIXES

    if spec.layout != "paged":
        return CHECK_MIXES
    return tuple(dataclasses.replace(m, page_size=page_size) for m in CHECK_PAGED_MIXES)


def mix_seed(problem) -> int:
    return zlib.crc32(problem.name.encode()) % (2 ** 31)


def seeded_inputs(problem, sets: int, device: str) -> list:
    """``sets`` input sets of one mix (tuner.measure.serving_inputs.MixInputs: packed, and paged through a shuffled
    table), seeded by the mix: every trial and the baselines see the same."""
    return [make_mix_inputs(problem, device, seed=mix_seed(problem) + i) for i in range(max(1, sets))]


def time_sets(kernel, problem, sets, timing) -> float:
    """Median ms of our kernel on ``problem``, rotating over the input sets (tuner.measure.timer)."""
    calls = [ours_call(kernel, problem, x) for x in sets]
    cycle = itertools.cycle(calls)
    calls[0]()   # the first call of a shape may allocate: not timed
    return timer.time_ms(lambda: next(cycle)(), timing=timing)


def tflops(problem, ms: float) -> float:
    return problem.flops / (ms * 1e-3) / 1e12


def measure_baselines(problem, timing, device: str, errors: dict) -> dict:
    """{library: TFLOPS or None} (tuner.measure.serving_baselines: FA4's flash_attn_varlen_func, FlashInfer's prefill, torch
    SDPA on the padded batch) on the mix's first input set; ``errors`` gets the reason of each None."""
    problem, x = baseline_view(problem, seeded_inputs(problem, 1, device)[0])
    row: dict = {}
    for lib in BASELINES:
        try:
            prepared = lib.prepare(problem, x)
            prepared.call()   # a first call may compile (FA4's JIT, FlashInfer's) or allocate: not timed
            row[lib.name] = round(tflops(problem, timer.time_ms(prepared.call, timing=timing)), 2)
        except (Unavailable, NotApplicable) as exc:
            row[lib.name], errors[lib.name] = None, str(exc)
        except Exception as exc:  # noqa: BLE001 - a baseline that cannot run has a reason, not a number
            row[lib.name], errors[lib.name] = None, f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    return row
