"""TL, the language in which an LLM describes an attention kernel (spec: docs/tl.md).

``parse`` / ``parse_program`` read it, ``format_program`` writes it back, ``check`` applies the rules,
and the reference programs (``tl/sketches``) are the built-in default sketches.
"""
from __future__ import annotations

from pathlib import Path

from tl.checker import CheckLimits, check, check_source
from tl.diagnostics import Diagnostic, TLSyntaxError
from tl.layout import LAYOUTS, layout_of, with_layout
from tl.parser import ParseResult, parse, parse_program
from tl.printer import format_program

__all__ = ["parse", "parse_program", "format_program", "check", "check_source", "CheckLimits", "Diagnostic",
           "TLSyntaxError", "ParseResult", "sketch_path", "load_sketch", "VARIANTS", "SCHEDULES", "SCHEDULE_BASE",
           "schedule_base", "schedule_variants", "LAYOUTS", "layout_of", "with_layout", "DECODE_SCHEDULES",
           "decode_sketch_path"]

VARIANTS = ("mha", "gqa", "mqa", "mla")
_SKETCHES = Path(__file__).resolve().parent / "sketches"

# The reference schedules, each a set of sketches (variant x causal): the paper's FlashAttention-2 flow,
# and the Hopper warp-specialised flows with and without the next score GEMM issued before the softmax.
SCHEDULES = {
    "fa2": "{v}_{c}.tl",
    "fa2_late_prefetch": "late_prefetch/{v}_{c}.tl",
    "ws_overlap": "hopper/{v}_{c}.tl",
    "ws_serial": "hopper/{v}_{c}_serial.tl",
}
# A schedule variant belongs to a reference schedule (what the search space's conditions and the translator's
# choice of emitters see): the same flow with its statements in another order.
SCHEDULE_BASE = {"fa2_late_prefetch": "fa2"}


def schedule_base(schedule: str) -> str:
    return SCHEDULE_BASE.get(schedule, schedule)


def schedule_variants(base: str) -> tuple[str, ...]:
    """The built-in sketch sets of a reference schedule: itself first, then its variants."""
    return (base,) + tuple(name for name, b in SCHEDULE_BASE.items() if b == base)


def sketch_path(variant: str, causal: bool, schedule: str = "fa2") -> Path:
    """The reference TL program of a variant (mha, gqa, mqa, mla), causal or not, for a schedule."""
    key = variant.lower()
    if key not in VARIANTS:
        raise ValueError(f"unknown attention variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}")
    return _SKETCHES / SCHEDULES[schedule].format(v=key, c="causal" if causal else "noncausal")


def load_sketch(variant: str, causal: bool, schedule: str = "fa2", layout: str = "dense") -> str:
    """The reference program's text, in ``layout`` (tl.layout: the offsets of its global tensors)."""
    if schedule in DECODE_SCHEDULES:
        return decode_sketch_path(variant, schedule, layout).read_text(encoding="utf-8")
    return with_layout(sketch_path(variant, causal, schedule).read_text(encoding="utf-8"), layout)


# The decode sketches (tl/phase.py), per cache layout (paged or dense): one file serves causal and not (its
# Mask is the seqlen_q > 1 diagonal) and MHA/MQA as GQA with groups of h or 1; MLA (absorbed, V inside the
# latent K rows) has its own. ``decode`` issues a tile's gathers before its GEMMs, ``decode_late`` after them.
DECODE_SCHEDULES = {
    "decode": "decode/{f}_{layout}.tl",
    "decode_late": "decode/late/{f}_{layout}.tl",
}
DECODE_LAYOUTS = ("paged", "dense")


def decode_sketch_path(variant: str, schedule: str = "decode", layout: str = "paged") -> Path:
    key = variant.lower()
    if key not in VARIANTS:
        raise ValueError(f"unknown attention variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    if schedule not in DECODE_SCHEDULES:
        raise ValueError(f"unknown decode schedule {schedule!r}; expected one of {', '.join(DECODE_SCHEDULES)}")
    if layout not in DECODE_LAYOUTS:
        raise ValueError(f"a decode kernel reads a paged or a dense cache, not {layout!r}")
    path = _SKETCHES / DECODE_SCHEDULES[schedule].format(f="mla" if key == "mla" else "gqa", layout=layout)
    if not path.is_file():
        raise ValueError(f"no {schedule} sketch for {key} over a {layout} cache ({path.name})")
    return path
