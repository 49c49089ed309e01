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
