"""Diagnostics: one error found in a TL program, with the place and a one-line hint how to fix it.

``str(d)`` is the compiler-style ``PATH:LINE:COL: error[CODE]: message`` followed by ``  hint: ...``,
the form an LLM (or a person) repairs a sketch from.
"""
from __future__ import annotations

from dataclasses import dataclass

# Every code the parser and checker emit, with what it means (the CLI and docs list these).
CODES = {
    "syntax": "the line is not a TL statement, or a block is not closed/opened properly",
    "empty-program": "the program has no statements (only blank lines or comments): it is not a kernel",
    "undefined-tensor": "a tensor is used before any Allocate/Copy/result defines it",
    "bad-copy": "a copy between levels that do not exist, or from a level to itself",
    "bad-level": "an Allocate in a memory level that does not exist",
    "bad-operand": "a GEMM operand that is not in shared memory or registers",
    "gemm-layout": "the inner dimensions of a GEMM do not agree (a missing or extra .T)",
    "missing-reshape": "an accumulator (MMA_C) feeds a GEMM as A operand without a Reshape to MMA_A",
    "unknown-op": "a Compute operator that the translator does not know",
    "bad-arity": "a Compute operator with the wrong number of operands or without its result",
    "bad-loop": "a loop or if that is not well formed (empty body, bad bounds)",
    "bad-role": "a warpgroup block that is not well formed, or a statement in the wrong role "
                "(the producer only loads, consumers never load, nothing but global allocations outside the blocks)",
    "unfilled-buffer": "a consumer warpgroup reads a shared buffer that no producer Copy fills (it would wait forever)",
    "bad-pipeline": "a `with stages` loop that fills no shared buffer, or a stage count below one",
    "pipeline-balance": "the consumers read a pipelined buffer a different number of times than the producer fills it",
    "pipeline-smem": "the stages of a pipeline (and the tiles loaded once) need more shared memory than a block has",
    "layout-mixed": "some global tensors are found by cumulative lengths (varlen) and others by dense offsets",
    "layout-offset": "a global tensor offset by the other side's lengths (keys by cu_seqlens_q, queries through the "
                     "page table, ...)",
    "decode-split": "a decode loop over the split's keys that does not run from split_begin to split_end",
    "decode-combine": "split keys whose partial outputs are never combined, or a Combine with no split to merge",
    "mask-kind": "a Mask's second operand is not Window (the sliding window is the only mask it can name)",
    "softcap-order": "a Softcap of a tile no score GEMM writes, or after that tile's Mask or Softmax (it acts on the "
                     "raw scores)",
    "sink-place": "a Sink inside the key loop, before the Softmax it joins, with other running values than the "
                  "Softmax's, or after the output was divided by the sum",
    "transpose-place": "a Transpose of V outside the producer warpgroup's pipelined loop, or before the Copy that "
                       "fills its tile (tl/vtranspose.py)",
    "transpose-operand": "a Transpose of a tile the producer does not load, of K, or whose result no P·V GEMM reads "
                         "as a shared tile",
    "transpose-read": "a P·V GEMM that reads the transposed V without .T (not K-major), or reads V instead of its "
                      "transpose",
    "internal": "the checker itself failed (a bug: please report the input)",
}


@dataclass(frozen=True)
class Diagnostic:
    path: str
    line: int
    col: int
    code: str
    message: str
    hint: str = ""

    def __str__(self) -> str:
        head = f"{self.path}:{self.line}:{self.col}: error[{self.code}]: {self.message}"
        return f"{head}\n  hint: {self.hint}" if self.hint else head


class TLSyntaxError(ValueError):
    """Raised by ``parse_program`` when the text has syntax errors; carries all of them."""

    def __init__(self, diagnostics):
        self.diagnostics = tuple(diagnostics)
        super().__init__("\n".join(str(d) for d in self.diagnostics) or "syntax error")
