"""The verification gate (docs/design.md): a kernel is correct only if every check shape passes.

Per shape: fresh random inputs (never zeros), the output buffer poisoned with NaN before the launch,
every element written and finite, the inputs unchanged afterwards, and two error bounds against an
fp32 reference (torch math on upcast inputs, GQA heads repeated, causal mask aligned bottom-right):

* FlashAttention's yardstick: max|out - ref| <= 2 * max|torch_lowp - ref| + atol, where torch_lowp
  is the same plain torch implementation run in the kernel's own 16-bit dtype and atol is the
  rounding of the output dtype (FA3's ``fwd_atol``);
* relative error ||out - ref|| / ||ref|| <= 1e-2.

Rows that see no key (causal with seqlen_q > seqlen_k) are defined as zeros, as FlashAttention does.
FP8 kernels (e4m3 inputs with descales) are checked against the same reference on the dequantised inputs with a
yardstick of their own: tuner/measure/verify_fp8.py.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, replace
from typing import Callable, Optional, Sequence

from kernel_abi.spec import KernelSpec, Problem
from tuner.measure.reference import reference, reference_lse  # noqa: F401 (the gate's reference, used here and by callers)
from tuner.measure.shape_check import REL_ERR_BOUND, ShapeCheck, bounded

_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}

# (batch, seqlen_q, seqlen_k): tiny, ragged (not multiples of any tile), sq < sk and sq > sk (causal
# bottom-right; with sq > sk the first rows see no key), several batches, and more query tiles than an
# H100 has SMs (a persistent kernel's CTAs then take several tiles each: 4 x 2500 rows are 160+ tiles
# of 128 or 192 rows at every head count below).
CHECK_SHAPES = ((1, 1, 1), (2, 1, 130), (1, 77, 77), (2, 128, 128), (1, 255, 257), (2, 300, 100),
                (1, 100, 300), (1, 513, 1031), (2, 1024, 1024), (4, 2500, 2500))
CHECK_HEADS = {"mha": (3, 3), "gqa": (8, 2), "mqa": (4, 1), "mla": (2, 2)}


@dataclass(frozen=True)
class VerificationReport:
    passed: bool
    checks: tuple[ShapeCheck, ...]
    reason: str = ""
    seed: int = 0

    def to_dict(self) -> dict:
        return {"passed": self.passed, "reason": self.reason, "seed": self.seed,
                "checks": [asdict(c) for c in self.checks]}


# A kernel built with an option of kernel_abi.spec is checked at the sizes where its tile arithmetic turns: windows
# of 0 and 1 keys, 63-65 and 127-129 (a 64- or 128-key tile +- 1), one longer than every sequence, on the left, the
# right and both (a causal kernel's right side is 0); caps of 1 and 50; sink logits of +-30 beside small ones.
CAUSAL_WINDOWS = ((0, 0), (1, 0), (63, 0), (64, 0), (65, 0), (127, 0), (128, 0), (129, 0), (5000, 0), (-1, 0))
WINDOWS = ((0, 0), (1, 1), (63, -1), (-1, 65), (127, 128), (129, 1), (64, 64), (-1, 0), (5000, 5000), (0, -1))
SOFTCAPS = (1.0, 50.0)


def default_check_problems(spec: KernelSpec, bench_problem: Optional[Problem] = None) -> list[Problem]:
    hq, hkv = CHECK_HEADS[spec.variant]
    windows = (CAUSAL_WINDOWS if spec.causal else WINDOWS) if getattr(spec, "local", False) else ((-1, -1),)
    caps = SOFTCAPS if getattr(spec, "softcap", False) else (0.0,)
    sinks = bool(getattr(spec, "sinks", False))
    out = [Problem(spec.variant, b, hq, hkv, sq, sk, spec.d_qk, spec.d_v, spec.causal, spec.dtype,
                   window=windows[i % len(windows)], softcap=caps[i % len(caps)], sinks=sinks)
           for i, (b, sq, sk) in enumerate(CHECK_SHAPES)]
    if len(windows) > len(CHECK_SHAPES) // 2:   # every window once more, on a ragged shape of its own
        out += [Problem(spec.variant, 1, hq, hkv, 200 + 37 * i, 333, spec.d_qk, spec.d_v, spec.causal, spec.dtype,
                        window=w, softcap=caps[(i + 1) % len(caps)], sinks=sinks) for i, w in enumerate(windows)]
    if bench_problem is not None:
        out.append(bench_problem)
    return out


def spec_serves(spec: KernelSpec, problem: Problem) -> bool:
    """Whether a kernel of ``spec`` computes ``problem``: the same variant, dims, mask and dtype; a window only on
    a local kernel (which also runs without one); a cap and sinks exactly where the kernel has them."""
    of = KernelSpec.of(problem)
    plain = dict(local=False, softcap=False, sinks=False)
    return (replace(of, **plain, layout=spec.layout, phase=spec.phase) == replace(spec, **plain)
            and (not of.local or spec.local) and of.softcap == spec.softcap and of.sinks == spec.sinks)


def sink_logits(heads_q: int, gen, device):
    """One logit per query head: the first two +30 and -30 (a sink that swamps the row, one that vanishes), the
    others of order one."""
    import torch

    logits = torch.randn(heads_q, generator=gen, device=device, dtype=torch.float32) * 2
    logits[0] = 30.0
    if heads_q > 1:
        logits[1] = -30.0
    return logits


def _inputs(problem: Problem, gen, device):
    import torch

    dt = getattr(torch, _DTYPES[problem.dtype])

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dt)

    q = randn(problem.batch, problem.seqlen_q, problem.heads_q, problem.d_qk)
    k = randn(problem.batch, problem.seqlen_k, problem.heads_kv, problem.d_qk)
    v = randn(problem.batch, problem.seqlen_k, problem.heads_kv, problem.d_v)
    return q, k, v


def check_problem(kernel: Callable, problem: Problem, gen, device: str = "cuda", index: int = 0) -> ShapeCheck:
    import torch

    if problem.dtype == "fp8":   # e4m3 inputs with descales, against the e4m3-P emulation's bound
        from tuner.measure import verify_fp8

        return verify_fp8.check_problem(kernel, problem, gen, device, index)
    label = problem.label()
    q, k, v = _inputs(problem, gen, device)
    saved = [t.clone() for t in (q, k, v)]
    out = torch.full((problem.batch, problem.seqlen_q, problem.heads_q, problem.d_v), float("nan"),
                     dtype=q.dtype, device=device)

    def fail(reason, max_err=math.nan, rel=math.nan, bound=math.nan, lowp=math.nan):
        return ShapeCheck(label, False, max_err, rel, bound, lowp, reason)

    options = {}
    if problem.window != (-1, -1):
        options["window_size"] = problem.window
    if problem.softcap:
        options["softcap"] = problem.softcap
    sinks = sink_logits(problem.heads_q, gen, device) if problem.sinks else None
    if sinks is not None:
        options["sinks"] = sinks
    try:
        result = kernel(q, k, v, out=out, **options)
        torch.cuda.synchronize()
    except Exception as exc:   # a faulting kernel is a failed check, not a crash of the caller
        return fail(f"kernel raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    if result is not None and result.data_ptr() != out.data_ptr():
        return fail("the kernel did not write into the output buffer it was given")
    if not all(torch.equal(a, b) for a, b in zip((q, k, v), saved)):
        return fail("the kernel modified its inputs")
    finite = torch.isfinite(out)
    if not bool(finite.all()):
        n_bad = int((~finite).sum())
        return fail(f"{n_bad} of {out.numel()} output elements are NaN/Inf (unwritten or overflowed)")
    ref_options = {"window": problem.window, "softcap": problem.softcap, "sinks": sinks}
    ref = reference(q, k, v, problem.causal, **ref_options)
    lowp = reference(q, k, v, problem.causal, dtype=q.dtype, **ref_options).float()
    return judge(label, out, ref, lowp, problem.dtype)


def judge(label: str, out, ref, lowp, dtype_name: str) -> ShapeCheck:
    """The two bounds of the module doc on a written, finite output: ``ref`` the fp32 reference, ``lowp``
    the same plain implementation in the kernel's dtype (both float32 tensors of out's shape)."""
    lowp_err = float((lowp - ref).abs().max()) if out.numel() else 0.0
    return bounded(label, out, ref, lowp_err, f"torch {dtype_name} error", REL_ERR_BOUND)


def verify(kernel: Callable, spec: KernelSpec, problems: Optional[Sequence[Problem]] = None,
           seed: Optional[int] = None, device: str = "cuda") -> VerificationReport:
    """Run every check shape; the report fails at the first bad shape's reason (all shapes still run)."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("verify needs a CUDA GPU")
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    probs = list(problems) if problems is not None else default_check_problems(spec)
    for p in probs:
        if not spec_serves(spec, p):
            raise ValueError(f"check problem {p.label()} does not match the kernel spec {spec}")
    checks = tuple(check_problem(kernel, p, gen, device, i) for i, p in enumerate(probs))
    bad = [c for c in checks if not c.passed]
    reason = f"{len(bad)} of {len(checks)} shapes failed; first: {bad[0].problem}: {bad[0].reason}" if bad else ""
    return VerificationReport(passed=not bad, checks=checks, reason=reason, seed=seed)
