"""The dense benchmark: our kernel against torch SDPA's flash, cuDNN and efficient backends and FlashAttention-4
(where installed, tuner/measure/fa4.py) on the paper grid.

Protocol (docs/benchmarks.md): 16k tokens per shape (batch = 16384 / seqlen), hidden 2048; every backend measured
in this process on the same input tensors; median of many timed runs after warm-up, rotating several input sets so
no run finds its operands in L2; TFLOPS = Problem.flops / time. Every output is cross-checked against SDPA's on the
benchmark inputs themselves.

Our kernel and FA4 take (b, s, h, d); SDPA takes (b, h, s, d): SDPA gets transposed views of the same storage.

FP8 problems (e4m3 inputs, descales of one: tuner/measure/verify_fp8.py for the gate's scales): ours reads the e4m3
tensors (V transposed per call, as the op does) and the baselines, which take no FP8, run the same values in bf16 (a
bf16 copy of an e4m3 value is exact): the bars are what a user gets without FP8. FlashInfer's FP8 prefill
(tuner/measure/flashinfer_fp8.py, where installed) runs the e4m3 tensors themselves: the FP8 a user could pick instead.
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable, Optional, Sequence

from kernel_abi.spec import TORCH_DTYPES, Problem, grid_problems
from tuner.measure import fa4, flashinfer_fp8, timer

SDPA_BASELINES = ("flash", "cudnn", "efficient")
# In this order: our output is cross-checked against the first that ran, so an SDPA backend when one can.
BASELINES = SDPA_BASELINES + ("fa4",)
# FP8 problems also time these on the e4m3 inputs (after the bf16 ones: their output is held to the FP8 bound against
# the first SDPA backend's)
FP8_BASELINES = (flashinfer_fp8.NAME,)


def baseline_names(problem: Problem) -> tuple[str, ...]:
    """The baselines a problem's row has: FP8 problems add the FP8 libraries."""
    return BASELINES + FP8_BASELINES if problem.dtype == "fp8" else BASELINES
DEFAULT_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
# Our output against the first baseline that ran, on the benchmark inputs themselves: a kernel that
# passed verification on small shapes but breaks at grid size (index overflow, grid limits) is caught.
CROSS_CHECK_REL_ERR = 2e-2
# An FP8 kernel rounds P to e4m3 (3 mantissa bits): on random inputs its output sits 2.3-2.5% (relative norm) from the
# fp32 reference in the e4m3-P emulation itself (tuner/measure/verify_fp8.emulate, 256 and 1024 keys, CPU).
FP8_CROSS_CHECK_REL_ERR = 5e-2


def cross_check_bound(problem: Problem) -> float:
    return FP8_CROSS_CHECK_REL_ERR if problem.dtype == "fp8" else CROSS_CHECK_REL_ERR


def tflops(problem: Problem, ms: float) -> float:
    return problem.flops / (ms * 1e-3) / 1e12


def bench_problems(variant: str, head_dim: Optional[int], dtype: str, causal: Optional[bool],
                   seqlens: Sequence[int] = DEFAULT_SEQLENS, heads: Optional[tuple[int, int]] = None) -> list[Problem]:
    """The paper grid: MHA 32 heads at d64 / 16 at d128, GQA 16q/2kv and MQA 16q/1kv at d128, MLA 16 heads
    192/128; causal and not unless one is asked for. ``heads`` (a --model's) replaces the grid's."""
    # heads_for ignores the head dim for mla (always 192/128)
    return grid_problems(variant, 128 if head_dim is None else head_dim, dtype, causal, seqlens=tuple(seqlens),
                         heads=heads)


def torch_dtype(dtype: str):
    import torch

    return getattr(torch, TORCH_DTYPES[dtype])


def make_inputs(problem: Problem, sets: int = 3, seed: int = 0, device: str = "cuda") -> list[tuple]:
    """``sets`` independent (q, k, v) triples in our (b, s, h, d) layout, on ``device``."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    dt = torch_dtype(problem.dtype)
    p = problem

    def randn(*shape):
        if problem.dtype == "fp8":   # (torch draws no e4m3: fp32 rounded)
            return torch.randn(*shape, device=device, dtype=torch.float32, generator=gen).to(dt)
        return torch.randn(*shape, device=device, dtype=dt, generator=gen)

    return [(randn(p.batch, p.seqlen_q, p.heads_q, p.d_qk), randn(p.batch, p.seqlen_k, p.heads_kv, p.d_qk),
             randn(p.batch, p.seqlen_k, p.heads_kv, p.d_v)) for _ in range(max(1, sets))]


def problem_sinks(problem: Problem, device: str = "cuda"):
    """The sink logits of a problem with sinks (one per query head, seeded by the head count, bf16-exact so that
    a library taking them in bf16 sees the same values), else None: ours, FA4 and the reference read the same."""
    if not problem.sinks:
        return None
    import torch

    gen = torch.Generator().manual_seed(1009 + problem.heads_q)
    return (torch.randn(problem.heads_q, generator=gen) * 2).to(torch.bfloat16).float().to(device)


def option_kwargs(problem, device: str = "cuda") -> dict:
    """Our kernel's keyword arguments for a problem's options (kernel_abi.spec; a dense Problem or a serving mix):
    window_size, softcap, sinks (problem_sinks); none for a plain problem."""
    options = {}
    if tuple(problem.window) != (-1, -1):
        options["window_size"] = problem.window
    if problem.softcap:
        options["softcap"] = problem.softcap
    if problem.sinks:
        options["sinks"] = problem_sinks(problem, device)
    return options


def kernel_options(problem: Problem, device: str = "cuda") -> dict:
    """Our kernel's keyword arguments for the problem: its options (option_kwargs) and an FP8 problem's descales
    (ones: the timing does not depend on their values)."""
    options = {}
    if problem.dtype == "fp8":
        import torch

        ones = torch.ones(problem.batch, problem.heads_kv, dtype=torch.float32, device=device)
        options.update(q_descale=ones, k_descale=ones.clone(), v_descale=ones.clone())
    return {**options, **option_kwargs(problem, device)}


def ours_call(kernel, problem: Problem, device: str = "cuda"):
    """``call(q, k, v)`` of our kernel with the problem's options."""
    options = kernel_options(problem, device)
    return (lambda q, k, v: kernel(q, k, v, **options)) if options else kernel


def measure_problem(kernel, problem: Problem, rotate: int = 3, inputs: Optional[Sequence[tuple]] = None, *,
                    timing: Optional[timer.Timing] = None, device: str = "cuda") -> float:
    """Median ms of ``kernel(q, k, v)`` (with the problem's options) on this problem, rotating ``rotate`` input
    sets (``timing.rotate`` when a timing is given)."""
    if inputs is None:
        inputs = make_inputs(problem, timing.rotate if timing is not None else rotate, device=device)
    return timer.time_ms(timer.rotating(ours_call(kernel, problem, inputs[0][0].device), inputs), timing=timing)


def sdpa_call(problem: Problem):
    """torch SDPA's ``call(q, k, v)`` in (b, h, s, d) out; a window as a boolean mask. NotImplementedError for
    soft-capping and sinks, which SDPA has no way to compute."""
    import torch
    import torch.nn.functional as F

    missing = [what for what, on in (("soft-capping", problem.softcap), ("sinks", problem.sinks)) if on]
    if missing:
        raise NotImplementedError(f"torch SDPA has no {' and '.join(missing)}")
    gqa = problem.heads_q != problem.heads_kv
    mask = None
    if problem.window != (-1, -1):
        left, right = problem.effective_window
        diag = torch.arange(problem.seqlen_q)[:, None] + problem.seqlen_k - problem.seqlen_q
        cols = torch.arange(problem.seqlen_k)[None, :]
        mask = torch.ones(problem.seqlen_q, problem.seqlen_k, dtype=torch.bool)
        if left >= 0:
            mask &= cols >= diag - left
        if right >= 0:
            mask &= cols <= diag + right

    def call(q, k, v):
        kwargs = {"enable_gqa": True} if gqa else {}
        if mask is not None:
            kwargs["attn_mask"] = mask.to(q.device)
        else:
            kwargs["is_causal"] = problem.causal
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              scale=problem.softmax_scale, **kwargs)

    return call


def _backend(name: str):
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]


def _baseline(name: str, problem: Problem):
    """(context to run it in, ``call(q, k, v)`` to time, its output -> (b, s, h, d)). FA4 raises
    fa4.Fa4Unavailable here when it is not importable."""
    if name == "fa4":
        return contextlib.nullcontext(), fa4.attention_call(problem, problem_sinks(problem)), (lambda out: out)
    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel(_backend(name)), sdpa_call(problem), (lambda out: out.transpose(1, 2))


def measure_baselines(problem: Problem, inputs: Optional[Sequence[tuple]] = None, *, rotate: int = 3,
                      errors: Optional[dict] = None, outputs: Optional[dict] = None,
                      timing: Optional[timer.Timing] = None, device: str = "cuda") -> dict[str, Optional[float]]:
    """TFLOPS of torch SDPA's flash, cuDNN and efficient backends and of FA4; None where a backend cannot
    run the shape or is not installed (the reason goes to ``errors[name]``). ``outputs[name]`` receives
    each backend's output on the first input set, in (b, s, h, d), for cross-checks.

    Each backend's first call is untimed: it pays first-use costs (FA4 JIT-compiles per shape, 1-4 s).
    FA4's output must agree with the first SDPA backend that ran, as ours must (CROSS_CHECK_REL_ERR): a
    library called wrongly would otherwise be a fast, meaningless bar."""
    if inputs is None:
        inputs = make_inputs(problem, timing.rotate if timing is not None else rotate, device=device)
    fp8_problem, fp8_inputs = problem, inputs
    if problem.dtype == "fp8":   # the 16-bit baselines take the same values in bf16
        import dataclasses

        import torch

        inputs = [tuple(t.to(torch.bfloat16) for t in x) for x in inputs]
        problem = dataclasses.replace(problem, dtype="bf16")
    result: dict[str, Optional[float]] = {}
    ref = None   # (name, output) of the first SDPA backend that ran
    for name in BASELINES:
        try:
            context, call, to_ours = _baseline(name, problem)
            with context:
                out = to_ours(call(*inputs[0]))
                timer.sync()
                if name == "fa4" and ref is not None:
                    rel = rel_err(out, ref[1])
                    if not rel <= CROSS_CHECK_REL_ERR:   # also NaN
                        raise ValueError(f"output differs from torch SDPA {ref[0]} on the benchmark inputs "
                                         f"(rel err {rel:.3g} > {CROSS_CHECK_REL_ERR})")
                if ref is None and name in SDPA_BASELINES:
                    ref = (name, out)
                if outputs is not None:
                    outputs[name] = out
                result[name] = tflops(problem, timer.time_ms(timer.rotating(call, inputs), timing=timing))
        except Exception as exc:  # noqa: BLE001 - "cannot run this shape" comes in many exception types
            result[name] = None
            if errors is not None:
                errors[name] = timer.first_line(exc)
    if fp8_problem.dtype == "fp8":
        result.update(_fp8_baselines(fp8_problem, fp8_inputs, ref, errors, outputs, timing))
    return result


def _fp8_baselines(problem: Problem, inputs, ref, errors, outputs, timing) -> dict[str, Optional[float]]:
    """FlashInfer's FP8 prefill on the e4m3 inputs (folded untimed per input set), its output held to the FP8 bound
    against ``ref`` (the first SDPA backend's (name, output) on the same values, or None)."""
    result: dict[str, Optional[float]] = {}
    name = flashinfer_fp8.NAME
    try:
        call = flashinfer_fp8.dense_call(problem, device=inputs[0][0].device)
        folded = [flashinfer_fp8.fold(*x) for x in inputs]
        out = flashinfer_fp8.unfold(call(*folded[0]), problem.batch)
        timer.sync()
        if ref is not None:
            rel = rel_err(out, ref[1])
            if not rel <= FP8_CROSS_CHECK_REL_ERR:   # also NaN
                raise ValueError(f"output differs from torch SDPA {ref[0]} on the benchmark inputs (rel err {rel:.3g}"
                                 f" > {FP8_CROSS_CHECK_REL_ERR})")
        if outputs is not None:
            outputs[name] = out
        result[name] = tflops(problem, timer.time_ms(timer.rotating(call, folded), timing=timing))
    except Exception as exc:  # noqa: BLE001 - not installed, no FA3 backend, a shape it refuses: a reason, not a crash
        result[name] = None
        if errors is not None:
            errors[name] = timer.first_line(exc)
    return result


def rel_err(out, ref) -> float:
    diff = (out.float() - ref.float()).norm().item()
    base = ref.float().norm().item()
    return diff / base if base else math.inf


def sdpa_rel_err(kernel, problem: Problem, qkv) -> float:
    """Relative error of ``kernel`` (with the problem's options) against torch SDPA (whichever backend torch
    picks) on one input set, or against the fp32 reference where SDPA cannot compute the problem (soft-capping,
    sinks); NaN when our output is not finite."""
    import torch

    out = ours_call(kernel, problem, qkv[0].device)(*qkv)
    timer.sync()
    if not bool(torch.isfinite(out.float()).all()):
        return float("nan")
    if problem.softcap or problem.sinks:
        return reference_rel_err(out, problem, qkv)
    if problem.dtype == "fp8":   # SDPA on the same values in bf16
        import dataclasses

        bf16 = [t.to(torch.bfloat16) for t in qkv]
        return rel_err(out, sdpa_call(dataclasses.replace(problem, dtype="bf16"))(*bf16).transpose(1, 2))
    return rel_err(out, sdpa_call(problem)(*qkv).transpose(1, 2))


def reference_rel_err(out, problem: Problem, qkv, rows: int = 256) -> float:
    """Relative error of ``out`` on the last ``rows`` query rows of the first sequence against the fp32 reference
    (those rows see the whole sequence's keys, as bottom-right alignment puts them)."""
    from tuner.measure.verify import reference

    q, k, v = qkv
    n = min(rows, problem.seqlen_q)
    ref = reference(q[:1, problem.seqlen_q - n:], k[:1], v[:1], problem.causal, window=problem.window,
                    softcap=problem.softcap, sinks=problem_sinks(problem, q.device), scale=problem.softmax_scale)
    return rel_err(out[:1, problem.seqlen_q - n:], ref)


def bench_rows(kernel, problems: Sequence[Problem], *, verified: bool = True, verify_reason: str = "",
               rotate: int = 3, with_baselines: bool = True, on_row: Optional[Callable[[dict], None]] = None
               ) -> list[dict]:
    """One dict per problem: TFLOPS of ours (None unless ``verified`` and the run checks out), of each
    baseline, and the ratios. ``kernel`` may be None (baselines only)."""
    import torch

    rows = []
    for problem in problems:
        row = problem_row(problem)
        inputs = make_inputs(problem, rotate)
        errors: dict[str, str] = {}
        outputs: dict = {}
        baselines = measure_baselines(problem, inputs, errors=errors, outputs=outputs) if with_baselines else {}
        row.update({name: _round(baselines.get(name)) for name in baseline_names(problem)})
        raw = dict(baselines)
        row.update({f"{name}_err": msg for name, msg in errors.items()})
        row["ours"] = None
        if kernel is None:
            row["status"] = "no kernel"
        elif not verified:
            row["status"] = "FAILED"
            row["reason"] = verify_reason or "verification failed"
        else:
            try:
                out = ours_call(kernel, problem, inputs[0][0].device)(*inputs[0])
                timer.sync()
                ref = next((n for n in BASELINES if n in outputs), None)
                if ref is not None:
                    row["cross_check_rel_err"] = rel_err(out, outputs[ref])
                    row["cross_check_against"] = ref
                else:   # no library computes the problem (soft-capping, sinks without FA4): the fp32 reference
                    ref = "reference"
                    row["cross_check_rel_err"] = reference_rel_err(out, problem, inputs[0])
                    row["cross_check_against"] = ref
                bad = (not torch.isfinite(out).all().item()) or \
                    row.get("cross_check_rel_err", 0.0) > cross_check_bound(problem)
                if bad:
                    against = {"fa4": "FA4", "reference": "the fp32 reference"}.get(ref, f"SDPA {ref}")
                    row["status"] = "FAILED"
                    row["reason"] = ("output is not finite" if ref is None else
                                     f"output differs from {against} on the benchmark inputs "
                                     f"(rel err {row['cross_check_rel_err']:.3g}) or is not finite")
                else:
                    ms = measure_problem(kernel, problem, inputs=inputs)
                    raw["ours"] = tflops(problem, ms)
                    row.update(ours=_round(raw["ours"]), ours_ms=round(ms, 5), status="ok")
            except Exception as exc:  # noqa: BLE001 - a launch failure is a result for this row
                row["status"] = "error"
                row["reason"] = timer.first_line(exc)
        for name in baseline_names(problem):
            ours, base = raw.get("ours"), raw.get(name)
            row[f"ours/{name}"] = round(ours / base, 3) if ours is not None and base else None
        del inputs, outputs
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def problem_row(problem: Problem) -> dict:
    return {"variant": problem.variant, "batch": problem.batch, "heads_q": problem.heads_q,
            "heads_kv": problem.heads_kv, "seqlen": problem.seqlen_q, "d_qk": problem.d_qk, "d_v": problem.d_v,
            "causal": problem.causal, "dtype": problem.dtype, "flops": problem.flops}


def _round(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(x, 2)
