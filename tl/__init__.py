"""TL, the language in which an LLM describes an attention kernel (spec: ../shared/TL.md).

``parse`` / ``parse_program`` read it, ``format_program`` writes it back, ``check`` applies the rules,
and the reference programs (``tl/sketches``) are the built-in default sketches.
"""
from __future__ import annotations

from pathlib import Path

from tl.checker import check, check_source
from tl.diagnostics import Diagnostic, TLSyntaxError
from tl.parser import ParseResult, parse, parse_program
from tl.printer import format_program

__all__ = ["parse", "parse_program", "format_program", "check", "check_source", "Diagnostic",
           "TLSyntaxError", "ParseResult", "sketch_path", "load_sketch", "VARIANTS"]

VARIANTS = ("mha", "gqa", "mqa", "mla")
_SKETCHES = Path(__file__).resolve().parent / "sketches"


def sketch_path(variant: str, causal: bool) -> Path:
    """The reference TL program of a variant (mha, gqa, mqa, mla), causal or not."""
    key = variant.lower()
    if key not in VARIANTS:
        raise ValueError(f"unknown attention variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    return _SKETCHES / f"{key}_{'causal' if causal else 'noncausal'}.tl"


def load_sketch(variant: str, causal: bool) -> str:
    return sketch_path(variant, causal).read_text(encoding="utf-8")
