"""The TL printer: ``Program`` -> canonical TL text, with ``parse(format_program(p)).program == p``.

Keywords are written as in docs/tl.md (``Allocate``, ``Copy``, ``Compute``, ``Reshape``, ``for``,
``if``, ``end``), bodies indented by four spaces; python-style loops keep their style.
"""
from __future__ import annotations

from tl.ast import Allocate, Compute, Copy, For, If, Program, Reshape, TensorRef, Warpgroup

INDENT = "    "


def _ref(ref: TensorRef) -> str:
    return ref.name + (".T" if ref.transposed else "")


def _tuple(items) -> str:
    return "(" + ", ".join(items) + ")"


def format_statement(stmt) -> str:
    """One simple statement on one line (blocks: see ``format_program``)."""
    if isinstance(stmt, Allocate):
        text = f"Allocate {stmt.name} in {stmt.level}"
        if stmt.shape:
            text += " " + _tuple(stmt.shape)
        if stmt.offset is not None:
            text += f" with offset {stmt.offset}"
        return text
    if isinstance(stmt, Copy):
        text = f"Copy {_ref(stmt.tensor)}"
        if stmt.shape is not None:
            text += " " + _tuple(stmt.shape)
        if stmt.coordinate is not None:
            text += " in coordinate [" + ", ".join(f"{axis} = {value}" for axis, value in stmt.coordinate) + "]"
        return text + f" from {stmt.src} to {stmt.dst}"
    if isinstance(stmt, Compute):
        text = f"Compute {stmt.op}"
        if stmt.args:
            text += " " + ", ".join(_ref(a) for a in stmt.args)
        if stmt.result is not None:
            text += f" and {stmt.mode or 'get'} {stmt.result}"
        if stmt.with_:
            text += " with " + " and ".join(stmt.with_)
        return text
    if isinstance(stmt, Reshape):
        text = f"Reshape {stmt.name} from {_tuple(stmt.src_layout)} to {_tuple(stmt.dst_layout)}"
        return text + (f" and get {stmt.result}" if stmt.result else "")
    raise TypeError(f"not a simple TL statement: {stmt!r}")


def _lines(statements, depth: int):
    pad = INDENT * depth
    for stmt in statements:
        if isinstance(stmt, For):
            stages = f" with stages {stmt.stages}" if stmt.stages is not None else ""
            if stmt.style == "python":
                yield f"{pad}for {stmt.var} in {stmt.start}:{stmt.stop}{stages}:"
                yield from _lines(stmt.body, depth + 1)
            else:
                yield f"{pad}for {stmt.var} = {stmt.start}:{stmt.stop}{stages}"
                yield from _lines(stmt.body, depth + 1)
                yield f"{pad}end"
        elif isinstance(stmt, Warpgroup):
            if stmt.style == "python":
                yield f"{pad}warpgroup {stmt.role}:"
                yield from _lines(stmt.body, depth + 1)
            else:
                yield f"{pad}warpgroup {stmt.role}"
                yield from _lines(stmt.body, depth + 1)
                yield f"{pad}end"
        elif isinstance(stmt, If):
            yield f"{pad}if {stmt.condition}"
            yield from _lines(stmt.body, depth + 1)
            yield f"{pad}end"
        else:
            yield pad + format_statement(stmt)


def format_program(program: Program) -> str:
    """Canonical text of a program, ending with a newline."""
    return "".join(line + "\n" for line in _lines(program.statements, 0))
