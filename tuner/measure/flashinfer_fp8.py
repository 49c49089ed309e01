"""FlashInfer's FP8 prefill as the dense FP8 benchmark's baseline: the e4m3 path a user could pick instead of ours.

FlashInfer's batch prefill wrappers cast e4m3 inputs to fp16 (0.5.x: "needs f16 input"); its single-request prefill
(``single_prefill_with_kv_cache`` with the FA3 backend on sm90) runs e4m3 Q, K, V with per-head scales and a bf16
output. A dense problem's batch folds into the heads of that one request: sequence b's query head h is the folded
head b x heads_q + h, and FlashInfer's GQA map (query head i reads KV head i // group) sends it to b x heads_kv + h //
group, sequence b's own KV head, so every (sequence, head) attends its own keys under its own causal mask, as in the
unfolded problem. The folded copies are made untimed, once per input set.

Where FlashInfer is not importable the baseline has no number and a reason that starts with NOT_INSTALLED.
"""
from __future__ import annotations

from typing import Callable

from kernel_abi.spec import Problem
from tuner.measure.fa4 import NOT_INSTALLED
from tuner.measure.timer import first_line

NAME = "flashinfer_fp8"


def library_status() -> dict:
    """``{"installed": True, "version": V}`` or ``{"installed": False, "reason": R}``: what a `tune bench --json`
    record says of FlashInfer."""
    try:
        import flashinfer
    except Exception as exc:  # noqa: BLE001 - missing, or a broken install that fails at import
        return {"installed": False, "reason": f"{type(exc).__name__}: {first_line(exc)}"}
    return {"installed": True, "version": getattr(flashinfer, "__version__", None)}


class FlashInferFp8Unavailable(RuntimeError):
    """FlashInfer's FP8 prefill cannot run here; the message says why (NOT_INSTALLED first when it is missing)."""


def fold(q, k, v):
    """(b, s, h, d) e4m3 tensors -> FlashInfer's one request (s, b x h, d), contiguous."""
    def one(t):
        b, s, h, d = t.shape
        return t.permute(1, 0, 2, 3).reshape(s, b * h, d).contiguous()

    return one(q), one(k), one(v)


def unfold(out, batch: int):
    """FlashInfer's (s, b x h, d) output -> (b, s, h, d)."""
    s, bh, d = out.shape
    return out.reshape(s, batch, bh // batch, d).permute(1, 0, 2, 3)


def dense_call(problem: Problem, descales: dict | None = None, device: str = "cuda") -> Callable:
    """``call(q, k, v)`` on folded e4m3 tensors -> FlashInfer's (s, b x h, d) bf16 output; ``descales`` ((batch, KV
    heads) fp32 q/k/v descales as ours take them; None: ones) become FlashInfer's per-head scales."""
    if problem.dtype != "fp8":
        raise ValueError(f"{NAME} times FP8 problems, got {problem.dtype}")
    try:
        import flashinfer
    except Exception as exc:  # noqa: BLE001 - missing, or a broken install that fails at import
        raise FlashInferFp8Unavailable(f"{NOT_INSTALLED}: flashinfer is not importable ({type(exc).__name__})") \
            from None
    import torch

    b, group = problem.batch, problem.group

    def per_head(name: str, heads: int, repeat: int):
        given = (descales or {}).get(name)
        if given is None:
            return torch.ones(b * heads, dtype=torch.float32, device=device)
        return given.to(device=device, dtype=torch.float32).repeat_interleave(repeat, dim=1).reshape(-1).contiguous()

    scale_q = per_head("q_descale", problem.heads_q, group)
    scale_k = per_head("k_descale", problem.heads_kv, 1)
    scale_v = per_head("v_descale", problem.heads_kv, 1)

    def call(q, k, v):
        return flashinfer.single_prefill_with_kv_cache(
            q, k, v, scale_q=scale_q, scale_k=scale_k, scale_v=scale_v, o_dtype=torch.bfloat16,
            causal=problem.causal, sm_scale=problem.softmax_scale, backend="fa3")

    return call
