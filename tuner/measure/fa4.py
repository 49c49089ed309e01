"""FlashAttention-4 (the flash-attn-4 wheel's ``flash_attn.cute``) as a library baseline, when installed.

``flash_attn_func(q, k, v, causal=..., softmax_scale=...)`` takes our (b, s, h, d) layout as it is, GQA/MQA
as fewer KV heads, and MLA's q/k 192 / v 128 on Hopper; depending on its version it returns the output
or (output, lse). Its first call per shape JIT-compiles the kernel (CuTe DSL, 1-4 s): whoever times it
makes one untimed call first (tuner.measure.dense.measure_baselines does).

Where ``flash_attn.cute`` cannot be imported the baseline has no number and a reason that starts with
NOT_INSTALLED, never a crash and never a 0.
"""
from __future__ import annotations

from typing import Callable

MODULE = "flash_attn.cute"
DISTRIBUTION = "flash-attn-4"
NOT_INSTALLED = "not installed"


class Fa4Unavailable(RuntimeError):
    """``flash_attn.cute`` is not importable here; the message starts with NOT_INSTALLED."""


def is_not_installed(reason) -> bool:
    """Whether a baseline's error reason says that its library is not installed."""
    return isinstance(reason, str) and reason.startswith(NOT_INSTALLED)


def _import(name: str):
    try:
        import flash_attn.cute as module
    except Exception as exc:  # noqa: BLE001 - missing, or a broken install that fails at import (DSL, CUDA libs)
        text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise Fa4Unavailable(f"{NOT_INSTALLED}: {MODULE} is not importable ({type(exc).__name__}: {text})") from None
    func = getattr(module, name, None)
    if func is None:   # an FA4 version without it
        raise Fa4Unavailable(f"{NOT_INSTALLED}: {MODULE} has no {name}")
    return func


def _flash_attn_func():
    return _import("flash_attn_func")


def varlen_func():
    """FA4's ``flash_attn_varlen_func`` (packed sequences; a paged cache through ``page_table``); raises
    Fa4Unavailable when it is not importable."""
    return _import("flash_attn_varlen_func")


def status() -> dict:
    """``{"installed": True, "version": V}`` (V None when no package metadata says it), or
    ``{"installed": False, "reason": R}``: what `tune bench --json` records."""
    try:
        _flash_attn_func()
    except Fa4Unavailable as exc:
        return {"installed": False, "reason": str(exc)}
    from importlib import metadata

    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        version = None
    return {"installed": True, "version": version}


def option_kwargs(problem, sinks=None) -> dict:
    """FA4's keywords for a problem's window and cap (a kernel_abi.spec.Problem or a serving mix) and ``sinks`` (one
    logit per query head, given as ``learnable_sink`` in bf16); none for a plain problem."""
    options = {}
    if tuple(getattr(problem, "window", (-1, -1))) != (-1, -1):   # FA4: None leaves a side open
        options["window_size"] = tuple(None if w < 0 else w for w in problem.window)
    if getattr(problem, "softcap", 0.0):
        options["softcap"] = problem.softcap
    if sinks is not None:
        import torch

        options["learnable_sink"] = sinks.to(torch.bfloat16)
    return options


def attention_call(problem, sinks=None) -> Callable:
    """``call(q, k, v) -> out`` in (b, s, h, d) for ``problem`` (a kernel_abi.spec.Problem), its window, cap and
    ``sinks`` (one logit per query head, given to FA4 as ``learnable_sink`` in bf16) as FA4 takes them; raises
    Fa4Unavailable when FA4 is not importable."""
    func = _flash_attn_func()
    options = option_kwargs(problem, sinks)

    def call(q, k, v):
        out = func(q, k, v, causal=problem.causal, softmax_scale=problem.softmax_scale, **options)
        return out[0] if isinstance(out, (tuple, list)) else out

    return call
