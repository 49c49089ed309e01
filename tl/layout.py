"""How a kernel finds the rows of its global tensors: the layout a sketch states, minimally, in the
offsets of its global ``Allocate`` statements.

    Allocate Q in global (seq_len, HeadDim) with offset q_offset        dense: (batch, seqlen, heads, dim)
    Allocate Q in global (seq_len, HeadDim) with offset cu_seqlens_q    varlen: sequence b's rows start at
    Allocate K in global (kv_len, HeadDim) with offset cu_seqlens_k         cu_seqlens_q[b] / cu_seqlens_k[b]
                                                                            of packed (total, heads, dim)
    Allocate K in global (kv_len, HeadDim) with offset page_table       paged: key row r of sequence b is row
                                                                            r % page_size of page
                                                                            page_table[b][r / page_size] of
                                                                            (pages, page_size, heads, dim)

Query-side tensors (``seq_len`` rows: Q and O) are found by ``cu_seqlens_q`` in both serving layouts;
key-side ones (``kv_len`` rows: K and V) by ``cu_seqlens_k`` (varlen) or through ``page_table`` (paged). A
kernel has one layout for all of them. Every other offset (or none) is the dense layout, so the paper's
sketches are dense unchanged.
"""
from __future__ import annotations

import re

from tl.ast import Allocate, Program
from tl.diagnostics import Diagnostic
from tl.expr import ExprError, free_symbols
from tl.phase import phase_of

LAYOUTS = ("dense", "varlen", "paged")
VARLEN_OFFSETS = ("cu_seqlens_q", "cu_seqlens_k", "page_table")
_QUERY_ROWS = ("seq_len", "seqlen_q", "seqlen")
_KEY_ROWS = ("kv_len", "seqlen_k")


def _globals(program: Program) -> list[Allocate]:
    return [s for s in program.statements if isinstance(s, Allocate) and s.level == "global"]


def _varlen_name(stmt: Allocate) -> str | None:
    if not stmt.offset:
        return None
    try:
        names = free_symbols(stmt.offset)
    except ExprError:
        return None
    found = [n for n in VARLEN_OFFSETS if n in names]
    return found[0] if found else None


def layout_of(program: Program) -> str:
    """The program's layout: paged when keys are found through a page table, varlen when a global tensor is
    offset by cumulative lengths, else dense (a decode sketch's queries are always dense: tl/phase.py)."""
    names = {_varlen_name(s) for s in _globals(program)}
    return "paged" if "page_table" in names else "varlen" if names - {None} else "dense"


def layout_diagnostics(program: Program, path: str) -> list[Diagnostic]:
    """``layout-mixed``: some global tensors by cumulative lengths, others not; ``layout-offset``: a tensor
    offset by the other side's lengths (keys by cu_seqlens_q, queries by cu_seqlens_k)."""
    allocs = _globals(program)
    varlen = {s.name: _varlen_name(s) for s in allocs}
    if phase_of(program) == "decode":
        return _decode_layout(allocs, varlen, path)
    out = []
    if any(varlen.values()):
        for s in allocs:
            if varlen[s.name] is None:
                out.append(Diagnostic(path, s.line, s.col, "layout-mixed",
                                      f"{s.name} is found by a dense offset while "
                                      f"{', '.join(n for n, v in varlen.items() if v)} by cumulative lengths: "
                                      "a kernel has one layout",
                                      f"write `with offset {_expected(s) or 'cu_seqlens_q'}` on {s.name} too, or "
                                      "dense offsets on every global tensor"))
    paged = "page_table" in varlen.values()
    for s in allocs:
        want = _expected(s, paged)
        if varlen[s.name] and want and varlen[s.name] != want:
            if varlen[s.name] == "page_table":
                hint = ("a page table holds keys and values: queries and outputs (seq_len rows) are packed, "
                        "write `with offset cu_seqlens_q`")
            else:
                hint = (f"query-side tensors (seq_len rows: Q, O) start at cu_seqlens_q, key-side ones (kv_len "
                        f"rows: K, V) at {'page_table' if paged else 'cu_seqlens_k'}: write `with offset {want}`")
            out.append(Diagnostic(path, s.line, s.col, "layout-offset",
                                  f"{s.name} has {s.shape[0]} rows but is offset by {varlen[s.name]}", hint))
    return out


def _expected(stmt: Allocate, paged: bool = False) -> str | None:
    rows = stmt.shape[0] if stmt.shape else ""
    if rows in _QUERY_ROWS:
        return "cu_seqlens_q"
    if rows in _KEY_ROWS:
        return "page_table" if paged else "cu_seqlens_k"
    return None


_DENSE_OFFSET = re.compile(r"^(Allocate\s+\w+\s+in\s+global\s+\((\w+)[^)]*\)\s+with\s+offset\s+)(\w+)\s*$",
                           re.IGNORECASE | re.MULTILINE)


def with_layout(text: str, layout: str) -> str:
    """A reference sketch rewritten to ``layout``: the offsets of its global Allocates (the only lines a
    layout changes). ValueError for an unknown layout."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of: {', '.join(LAYOUTS)}")
    if layout == "dense":
        return text

    keys = "page_table" if layout == "paged" else "cu_seqlens_k"

    def serving(m: re.Match) -> str:
        return m.group(1) + (keys if m.group(2) in _KEY_ROWS else "cu_seqlens_q")

    return _DENSE_OFFSET.sub(serving, text)


def _decode_layout(allocs: list[Allocate], found: dict, path: str) -> list[Diagnostic]:
    """A decode kernel (tl/phase.py) takes dense queries (batch, seqlen_q, heads, dim), as flash_attn_with_kvcache
    does, and keys either dense (a cache per sequence) or through a page table."""
    out = []
    for s in allocs:
        by = found[s.name]
        if by is None:
            continue
        if _expected(s) == "cu_seqlens_q":
            out.append(Diagnostic(path, s.line, s.col, "layout-offset",
                                  f"{s.name} of a decode kernel is offset by {by}",
                                  "decode queries and outputs are dense (batch, seqlen_q, heads, dim): write "
                                  "`with offset q_offset`"))
        elif by != "page_table":
            out.append(Diagnostic(path, s.line, s.col, "layout-offset",
                                  f"{s.name} of a decode kernel is offset by {by}",
                                  "a decode kernel reads its cache densely per sequence or through a page table: "
                                  "write `with offset kv_offset` or `with offset page_table`"))
    return out
