"""One check shape's verdict (tuner/measure/verify.py and its FP8 checks, tuner/measure/verify_fp8.py)."""
from __future__ import annotations

from dataclasses import dataclass

REL_ERR_BOUND = 1e-2


@dataclass(frozen=True)
class ShapeCheck:
    problem: str
    passed: bool
    max_err: float
    rel_err: float
    bound: float
    torch_lowp_err: float
    reason: str = ""


def bounded(label: str, out, ref, yardstick_err: float, yardstick: str, rel_bound: float) -> ShapeCheck:
    """The gate's two bounds on a written, finite output (tuner/measure/verify.py's module doc): max|out - ref| <= 2 x
    the yardstick's max error (``yardstick`` names it in the reason) + atol (twice the output dtype's rounding of the
    reference), and ||out - ref|| / ||ref|| <= ``rel_bound``. ``ref`` is fp32, of out's shape."""
    if not out.numel():
        return ShapeCheck(label, True, 0.0, 0.0, 0.0, 0.0, "")
    outf = out.float()
    max_err = float((outf - ref).abs().max())
    atol = float(2 * ((ref + 0.3 - 0.3).to(out.dtype).float() - ref).abs().max())
    bound = 2 * yardstick_err + atol
    ref_norm = float(ref.norm())
    rel = float((outf - ref).norm()) / (ref_norm if ref_norm > 0 else 1.0)
    reasons = []
    if max_err > bound:
        reasons.append(f"max error {max_err:.3g} > bound {bound:.3g} (2 x {yardstick} {yardstick_err:.3g} + atol "
                       f"{atol:.3g})")
    if rel > rel_bound:
        reasons.append(f"relative error {rel:.3g} > {rel_bound:.3g}")
    return ShapeCheck(label, not reasons, max_err, rel, bound, yardstick_err, "; ".join(reasons))
