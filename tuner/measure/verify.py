"""The verification gate (docs/design.md): a kernel is correct only if every check shape passes.

Per shape: fresh random inputs (never zeros), the output buffer poisoned with NaN before the launch,
every element written and finite, the inputs unchanged afterwards, and two error bounds against an
fp32 reference (torch math on upcast inputs, GQA heads repeated, causal mask aligned bottom-right):

* FlashAttention's yardstick: max|out - ref| <= 2 * max|torch_lowp - ref| + atol, where torch_lowp
  is the same plain torch implementation run in the kernel's own 16-bit dtype and atol is the
  rounding of the output dtype (FA3's ``fwd_atol``);
* relative error ||out - ref|| / ||ref|| <= 1e-2.

Rows that see no key (causal with seqlen_q > seqlen_k) are defined as zeros, as FlashAttention does.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence

from kernel_abi.spec import KernelSpec, Problem

REL_ERR_BOUND = 1e-2
_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}

# (batch, seqlen_q, seqlen_k): tiny, ragged (not multiples of any tile), sq < sk and sq > sk (causal
# bottom-right; with sq > sk the first rows see no key), several batches, and more query tiles than an
# H100 has SMs (a persistent kernel's CTAs then take several tiles each: 4 x 2500 rows are 160+ tiles
# of 128 or 192 rows at every head count below).
CHECK_SHAPES = ((1, 1, 1), (2, 1, 130), (1, 77, 77), (2, 128, 128), (1, 255, 257), (2, 300, 100),
                (1, 100, 300), (1, 513, 1031), (2, 1024, 1024), (4, 2500, 2500))
CHECK_HEADS = {"mha": (3, 3), "gqa": (8, 2), "mqa": (4, 1), "mla": (2, 2)}


@dataclass(frozen=True)
class ShapeCheck:
    problem: str
    passed: bool
    max_err: float
    rel_err: float
    bound: float
    torch_lowp_err: float
    reason: str = ""


@dataclass(frozen=True)
class VerificationReport:
    passed: bool
    checks: tuple[ShapeCheck, ...]
    reason: str = ""
    seed: int = 0

    def to_dict(self) -> dict:
        return {"passed": self.passed, "reason": self.reason, "seed": self.seed,
                "checks": [asdict(c) for c in self.checks]}


def default_check_problems(spec: KernelSpec, bench_problem: Optional[Problem] = None) -> list[Problem]:
    hq, hkv = CHECK_HEADS[spec.variant]
    out = [Problem(spec.variant, b, hq, hkv, sq, sk, spec.d_qk, spec.d_v, spec.causal, spec.dtype)
           for b, sq, sk in CHECK_SHAPES]
    if bench_problem is not None:
        out.append(bench_problem)
    return out


def reference(q, k, v, causal: bool, dtype=None, chunk_bytes: int = 1 << 29):
    """Plain attention in torch, in ``dtype`` (default fp32 on upcast inputs); rows with no visible key
    are 0. Chunked over query rows so benchmark-sized shapes fit in memory."""
    import torch

    dt = dtype or torch.float32
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    k = k.repeat_interleave(group, dim=2).transpose(1, 2)     # (b, hq, sk, d)
    v = v.repeat_interleave(group, dim=2).transpose(1, 2)
    qt = q.transpose(1, 2)                                    # (b, hq, sq, d)
    scale = 1.0 / math.sqrt(d)
    out = torch.empty((b, hq, sq, v.shape[-1]), dtype=dt, device=q.device)
    rows = max(1, chunk_bytes // max(1, b * hq * sk * 4))
    cols = torch.arange(sk, device=q.device)
    for r0 in range(0, sq, rows):
        r1 = min(sq, r0 + rows)
        s = torch.matmul(qt[:, :, r0:r1], k.transpose(-1, -2)) * scale
        if causal:
            r = torch.arange(r0, r1, device=q.device)[:, None]
            visible = cols[None, :] <= r + (sk - sq)
            s = s.masked_fill(~visible, float("-inf"))
        p = torch.softmax(s.float(), dim=-1).to(dt)
        p = torch.nan_to_num(p, nan=0.0)                      # rows with no visible key -> 0
        out[:, :, r0:r1] = torch.matmul(p, v)
    return out.transpose(1, 2)                                # (b, sq, hq, d_v)


def _inputs(problem: Problem, gen, device):
    import torch

    dt = getattr(torch, _DTYPES[problem.dtype])

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dt)

    q = randn(problem.batch, problem.seqlen_q, problem.heads_q, problem.d_qk)
    k = randn(problem.batch, problem.seqlen_k, problem.heads_kv, problem.d_qk)
    v = randn(problem.batch, problem.seqlen_k, problem.heads_kv, problem.d_v)
    return q, k, v


def check_problem(kernel: Callable, problem: Problem, gen, device: str = "cuda") -> ShapeCheck:
    import torch

    label = problem.label()
    q, k, v = _inputs(problem, gen, device)
    saved = [t.clone() for t in (q, k, v)]
    out = torch.full((problem.batch, problem.seqlen_q, problem.heads_q, problem.d_v), float("nan"),
                     dtype=q.dtype, device=device)

    def fail(reason, max_err=math.nan, rel=math.nan, bound=math.nan, lowp=math.nan):
        return ShapeCheck(label, False, max_err, rel, bound, lowp, reason)

    try:
        result = kernel(q, k, v, out=out)
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
    ref = reference(q, k, v, problem.causal)
    lowp = reference(q, k, v, problem.causal, dtype=q.dtype).float()
    return judge(label, out, ref, lowp, problem.dtype)


def judge(label: str, out, ref, lowp, dtype_name: str) -> ShapeCheck:
    """The two bounds of the module doc on a written, finite output: ``ref`` the fp32 reference, ``lowp``
    the same plain implementation in the kernel's dtype (both float32 tensors of out's shape)."""
    outf = out.float()
    if not out.numel():
        return ShapeCheck(label, True, 0.0, 0.0, 0.0, 0.0, "")
    max_err = float((outf - ref).abs().max())
    lowp_err = float((lowp - ref).abs().max())
    atol = float(2 * ((ref + 0.3 - 0.3).to(out.dtype).float() - ref).abs().max())
    bound = 2 * lowp_err + atol
    ref_norm = float(ref.norm())
    rel = float((outf - ref).norm()) / ref_norm if ref_norm > 0 else float((outf - ref).norm())
    reasons = []
    if max_err > bound:
        reasons.append(f"max error {max_err:.3g} > bound {bound:.3g} (2 x torch {dtype_name} error "
                       f"{lowp_err:.3g} + atol {atol:.3g})")
    if rel > REL_ERR_BOUND:
        reasons.append(f"relative error {rel:.3g} > {REL_ERR_BOUND}")
    return ShapeCheck(label, not reasons, max_err, rel, bound, lowp_err, "; ".join(reasons))


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
        if KernelSpec.of(p) != spec:
            raise ValueError(f"check problem {p.label()} does not match the kernel spec {spec}")
    checks = tuple(check_problem(kernel, p, gen, device) for p in probs)
    bad = [c for c in checks if not c.passed]
    reason = f"{len(bad)} of {len(checks)} shapes failed; first: {bad[0].problem}: {bad[0].reason}" if bad else ""
    return VerificationReport(passed=not bad, checks=checks, reason=reason, seed=seed)
