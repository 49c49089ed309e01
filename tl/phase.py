"""The phase a sketch states: prefill, or decode (a few query tokens per sequence against a long KV cache).

A decode sketch splits each sequence's keys across thread blocks (FlashDecoding): its key loop runs over one
split's range and the partial results are merged after it.

    Allocate Q in global (q_rows, HeadDim) with offset q_offset      q_rows: seqlen_q x the query heads of one
    ...                                                                KV group, packed into the tile's rows
    for j = split_begin:split_end with stages kv_stages            the keys of this block's split
        ...
    end
    Compute Combine O_register, Smax, Ssum and get new O_register   merge the splits by their log-sum-exps

Queries and outputs of a decode call are dense (batch, seqlen_q, heads, dim), as ``flash_attn_with_kvcache``
takes them, while keys and values may be found through a page table: a decode sketch may mix the two.
"""
from __future__ import annotations

from tl.ast import Compute, For, Program, walk
from tl.diagnostics import Diagnostic
from tl.expr import ExprError, free_symbols

PHASES = ("prefill", "decode")
SPLIT_BOUNDS = ("split_begin", "split_end")


def _symbols(text: str) -> set[str]:
    try:
        return set(free_symbols(text))
    except ExprError:
        return set()


def split_loops(program: Program) -> list[For]:
    """The loops over one split's keys: bounds that name split_begin / split_end."""
    return [s for s in walk(program.statements) if isinstance(s, For)
            and (_symbols(s.start) | _symbols(s.stop)) & set(SPLIT_BOUNDS)]


def combines(program: Program) -> list[Compute]:
    return [s for s in walk(program.statements) if isinstance(s, Compute) and s.op_key == "combine"]


def phase_of(program: Program) -> str:
    """decode when the sketch loops over a split of the keys, else prefill."""
    return "decode" if split_loops(program) else "prefill"


def phase_diagnostics(program: Program, path: str) -> list[Diagnostic]:
    """``decode-combine``: a split loop whose partial results are never combined, a Combine in a sketch that
    splits nothing, or a Combine inside the split loop; ``decode-split``: a split loop that does not run from
    split_begin to split_end."""
    loops, merges = split_loops(program), combines(program)
    out = []
    for loop in loops:
        if loop.start.strip() != "split_begin" or loop.stop.strip() != "split_end":
            out.append(Diagnostic(path, loop.line, loop.col, "decode-split",
                                  f"the split loop runs {loop.start}:{loop.stop}",
                                  "a decode block takes the keys of its split: write `for j = split_begin:split_end`"))
        inner = [s for s in walk(loop.body) if isinstance(s, Compute) and s.op_key == "combine"]
        for s in inner:
            out.append(Diagnostic(path, s.line, s.col, "decode-combine",
                                  "Combine inside the split loop merges partial results before they exist",
                                  "move `Compute Combine ...` after the loop's `end`"))
    if loops and not merges:
        loop = loops[0]
        out.append(Diagnostic(path, loop.line, loop.col, "decode-combine",
                              "the keys are split across blocks but the partial outputs are never combined",
                              "after the loop write `Compute Combine O_register, Smax, Ssum and get new O_register`"))
    if merges and not loops:
        s = merges[0]
        out.append(Diagnostic(path, s.line, s.col, "decode-combine",
                              "Combine merges the splits of a decode kernel, but no loop runs over a split",
                              "loop over the split's keys: `for j = split_begin:split_end with stages kv_stages`, "
                              "or drop the Combine"))
    return out
