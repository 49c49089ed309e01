"""Kernels of one dense problem timed side by side with cuDNN and FA4: paired rounds on the same rotating inputs.

The A/B tools (scripts/param_ab_check.py: parameter changes against the defaults; scripts/table_ab.py: one bucket
table's kernels against another's) time here, so that their numbers follow one protocol: every round times each
kernel once, in an order rotated every round (clock and power drift fall on all alike), then cuDNN (through torch's
SDPA) and FA4 (when importable), with the confirm rule's do_bench windows. GPU only; torch imported lazily.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional


def rotated(roles: list[str], rnd: int) -> list[str]:
    """The order of round ``rnd``: the roles rotated by one each round, so none is always first."""
    k = rnd % len(roles) if roles else 0
    return roles[k:] + roles[:k]


_TOLD: set[str] = set()


def fa4_call(problem) -> Optional[Callable]:
    """FA4's ``call(q, k, v)`` for the problem, or None when it is not importable or cannot run it (each reason is
    printed once: the FA4 column stays empty)."""
    from tuner.measure import dense, fa4, timer

    try:
        call = fa4.attention_call(problem)
        inputs = dense.make_inputs(problem, 1)
        call(*inputs[0])
        timer.sync()
        return call
    except Exception as exc:  # noqa: BLE001 - not installed, or not this shape
        reason = timer.first_line(exc)
        if reason not in _TOLD:
            _TOLD.add(reason)
            print(f"FA4: {reason}", flush=True)
        return None


def fp8_calls(problem, kernels: dict, sets: int, device: str = "cuda") -> dict[str, Callable]:
    """{role: call} of FP8 kernels over ``sets`` rotating e4m3 input sets of the problem with their descales (the
    FP8 gate's inputs, tuner.measure.verify_fp8.inputs; the runtime's per-call V^T copy timed with each call)."""
    import torch

    from tuner.measure import timer, verify_fp8

    gen = torch.Generator(device=device).manual_seed(0)
    inputs = [verify_fp8.inputs(problem, gen, device, near_max=False) for _ in range(max(1, sets))]
    return {role: timer.rotating(lambda q, k, v, scales, kernel=kernel: kernel(q, k, v, **scales), inputs)
            for role, kernel in kernels.items()}


def paired_point(problem, kernels: dict, rounds: int, timing) -> dict[str, list[float]]:
    """{role: [ms of each round]} of every kernel in ``kernels`` ({role: loaded kernel}), "cudnn" and "fa4" (empty
    when FA4 cannot run the problem) on ``problem``, ``rounds`` paired rounds. An FP8 problem's kernels read e4m3
    inputs with descales (fp8_calls); cuDNN and FA4 time its shapes in bf16."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tuner.measure import dense, timer

    roles = list(kernels)
    fp8 = problem.dtype == "fp8"
    if fp8:   # e4m3 inputs with their descales; the libraries time the same shapes in bf16
        calls = fp8_calls(problem, kernels, timing.rotate)
        problem = dataclasses.replace(problem, dtype="bf16")
    inputs = dense.make_inputs(problem, timing.rotate)
    if not fp8:
        calls = {role: timer.rotating(kernels[role], inputs) for role in roles}
    sdpa = timer.rotating(dense.sdpa_call(problem), inputs)
    fa4 = fa4_call(problem)
    fa4 = timer.rotating(fa4, inputs) if fa4 is not None else None
    ms: dict[str, list[float]] = {role: [] for role in [*roles, "cudnn", "fa4"]}
    for rnd in range(rounds):
        for role in rotated(roles, rnd):
            ms[role].append(timer.time_ms(calls[role], timing=timing))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            ms["cudnn"].append(timer.time_ms(sdpa, timing=timing))
        if fa4 is not None:
            ms["fa4"].append(timer.time_ms(fa4, timing=timing))
    del inputs, calls, sdpa, fa4
    torch.cuda.empty_cache()
    return ms
