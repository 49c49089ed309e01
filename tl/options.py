"""The options of today's models in TL: a sliding window, soft-capping and attention sinks.

A sketch states them where they happen in the flow:

    Compute GEMM Q_shared, K_shared.T and get S
    Compute Softcap S                                  # S = cap * tanh(S / cap), on the raw scores
    Compute Mask S, Window                             # the causal / ragged mask and the sliding window
    Compute Softmax S with Smax and Ssum
    ...                                                # (the key loop)
    Compute Sink O_register with Smax and Ssum         # once, after the last key tile: the sink joins max and sum
    Compute Divide O_register, Ssum and get new O_register

The sizes (the window's keys left and right, the cap, the sink logits) are run-time values of the kernel; the
statements say that the kernel has them and where in the flow they act. ``option_diagnostics`` reports a
statement in the wrong place; ``with_options`` adds the statements to a reference sketch; ``options_of`` says which
options a sketch states.
"""
from __future__ import annotations

from dataclasses import replace

from tl.ast import Compute, For, If, Program, TensorRef, Warpgroup, walk
from tl.diagnostics import Diagnostic

OPTIONS = ("local", "softcap", "sinks")
WINDOW = "Window"


def _is_window_mask(s) -> bool:
    return isinstance(s, Compute) and s.op_key == "mask" and len(s.args) == 2 and s.args[1].name.lower() == "window"


def _divides_by_sum(s, stats) -> bool:
    """The output's division by the softmax's sum: `Compute Divide O, Ssum`, or in a decode sketch the splits'
    `Compute Combine O, Smax, Ssum` (which divides each row by its merged sum)."""
    if not isinstance(s, Compute):
        return False
    if s.op_key == "divide":
        return len(s.args) == 2 and s.args[1].name == stats[1]
    return s.op_key == "combine" and [a.name for a in s.args[1:3]] == list(stats)


def options_of(program: Program) -> frozenset:
    """The options the sketch states: "local" (a Mask naming the Window), "softcap", "sinks"."""
    found = set()
    for s in walk(program.statements):
        if _is_window_mask(s):
            found.add("local")
        elif isinstance(s, Compute) and s.op_key == "softcap":
            found.add("softcap")
        elif isinstance(s, Compute) and s.op_key == "sink":
            found.add("sinks")
    return frozenset(found)


def _in_order(statements, depth: int = 0):
    """(statement, loop depth) in program order, loop and warpgroup bodies included."""
    for s in statements:
        yield s, depth
        if isinstance(s, For):
            yield from _in_order(s.body, depth + 1)
        elif isinstance(s, (If, Warpgroup)):
            yield from _in_order(s.body, depth)


def option_diagnostics(program: Program, path: str) -> list[Diagnostic]:
    """mask-kind: a Mask's second operand is not Window. softcap-order: Softcap of a tile no GEMM wrote, or after the
    tile's Mask or Softmax (soft-capping acts on the raw scores). sink-place: a Sink inside a loop (it acts once, after
    the last key tile), before any Softmax, with other running values than the Softmax's, or after the output was
    divided by the sum."""
    out: list[Diagnostic] = []
    gemm_written: set[str] = set()        # score tiles a GEMM wrote and nothing has masked or softmaxed since
    scores: set[str] = set()
    stats: tuple | None = None
    divided: set[str] = set()
    for s, depth in _in_order(program.statements):
        if not isinstance(s, Compute):
            continue
        key = s.op_key
        target = s.args[0].name if s.args else ""
        if key == "gemm" and s.result and len(s.args) == 2 and s.args[1].transposed:
            gemm_written.add(s.result)
            scores.add(s.result)
        elif key == "mask":
            if len(s.args) == 2 and s.args[1].name.lower() != "window":
                out.append(Diagnostic(path, s.line, s.args[1].col or s.col, "mask-kind",
                                      f"a Mask's second operand names the sliding window, got {s.args[1].name!r}",
                                      f"write `Compute Mask {target}, {WINDOW}` (or `Compute Mask {target}`)"))
            gemm_written.discard(target)
        elif key == "softmax":
            gemm_written.discard(target)
            stats = tuple(s.with_) or None
        elif key == "softcap":
            if target not in scores:
                out.append(Diagnostic(path, s.line, s.col, "softcap-order",
                                      f"Softcap {target}: no score GEMM (Q, K.T) writes {target}",
                                      "soft-cap the score tile right after `Compute GEMM Q_shared, K_shared.T and get S`"))
            elif target not in gemm_written:
                out.append(Diagnostic(path, s.line, s.col, "softcap-order",
                                      f"Softcap {target} after its Mask or Softmax: soft-capping acts on the raw scores",
                                      f"move `Compute Softcap {target}` before the Mask and the Softmax of {target}"))
        elif key == "sink":
            where = None
            if depth:
                where = ("a Sink inside a loop: the sink joins each row's softmax once, after the last key tile",
                         "move `Compute Sink` after the key loop, before the division by the sum")
            elif stats is None:
                where = ("a Sink before any `Compute Softmax ... with Smax and Ssum`: it joins that softmax",
                         "put the Sink after the key loop, naming the Softmax's running max and sum")
            elif tuple(s.with_) != stats:
                where = (f"Sink with {' and '.join(s.with_) or 'nothing'}: the Softmax keeps {' and '.join(stats)}",
                         f"write `Compute Sink {target} with {' and '.join(stats)}`")
            elif target in divided:
                where = (f"Sink after {target} was divided by the sum: the sink changes the sum it is divided by",
                         f"move `Compute Sink` before `Compute Divide {target}, ...`")
            if where:
                out.append(Diagnostic(path, s.line, s.col, "sink-place", *where))
        elif stats and _divides_by_sum(s, stats):
            divided.add(s.result or target)
            divided.add(target)
    return out


def with_options(program: Program, local: bool = False, softcap: bool = False, sinks: bool = False) -> Program:
    """A sketch with the options' statements added where they act (the module doc): before the Mask (else the
    Softmax) of each score tile a Softcap; every Mask names the Window, and a tile without a Mask gets one; before
    the division of the output by the softmax's sum a Sink. A sketch that states an option already keeps it."""
    stated = options_of(program)

    def rewrite(statements):
        out = []
        for s in statements:
            if isinstance(s, (For, If, Warpgroup)):
                out.append(replace(s, body=tuple(rewrite(s.body))) if isinstance(s.body, tuple)
                           else replace(s, body=rewrite(s.body)))
                continue
            if isinstance(s, Compute) and s.op_key in ("mask", "softmax") and s.args:
                tile = s.args[0]
                before_first = s.op_key == "mask" or not masked.get(tile.name)
                if softcap and "softcap" not in stated and before_first and not capped.get(tile.name):
                    out.append(Compute("Softcap", (TensorRef(tile.name, line=s.line),), line=s.line, col=s.col))
                    capped[tile.name] = True
                if s.op_key == "mask":
                    masked[tile.name] = True
                    if local and not _is_window_mask(s):
                        s = replace(s, args=(s.args[0], TensorRef(WINDOW, line=s.line)))
                elif local and "local" not in stated and not masked.get(tile.name):
                    out.append(Compute("Mask", (TensorRef(tile.name, line=s.line), TensorRef(WINDOW, line=s.line)),
                                       line=s.line, col=s.col))
                if s.op_key == "softmax":
                    masked[tile.name] = capped[tile.name] = False   # the next GEMM into the tile starts over
                    stats[0] = tuple(s.with_)
            if sinks and "sinks" not in stated and stats[0] and _divides_by_sum(s, stats[0]):
                out.append(Compute("Sink", (s.args[0],), with_=stats[0], line=s.line, col=s.col))
            out.append(s)
        return out

    masked: dict = {}
    capped: dict = {}
    stats: list = [None]
    return replace(program, statements=type(program.statements)(rewrite(program.statements)))
