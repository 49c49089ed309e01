"""The lowered form of a TL program that the dependency pass schedules and the emitters print.

A TL statement becomes one ``Op`` (or a ``Loop``/``Cond`` holding ops); the compiler adds a few
synthetic ops (a hoisted register load of Q, the running softmax statistics) that carry the TL line
they serve. Each op declares which shared-memory buffers it reads and writes; that is all the
dependency pass (translate/schedule.py) needs to place cp.async waits and barriers.

TL expressions (tile coordinates, loop bounds, if-conditions) are parsed here with Python's ``ast``
module: they are small integer expressions over symbols.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from translate.kernel import TranslationError


# ---- expressions ------------------------------------------------------------------------------------

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "/", ast.Mod: "%"}
_CMPOPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


def _parse(text: str, line: int) -> ast.expr:
    try:
        return ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise TranslationError(f"cannot read the expression {text!r}", line) from None


def expr_symbols(text: str, line: int = 0) -> set[str]:
    return {n.id for n in ast.walk(_parse(text, line)) if isinstance(n, ast.Name)}


def expr_to_cpp(text: str, symbols: dict[str, str], line: int) -> str:
    """TL integer expression -> C++ text; every symbol must be in ``symbols`` (TL name -> C++)."""

    def go(node: ast.expr) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return str(node.value)
        if isinstance(node, ast.Name):
            if node.id not in symbols:
                known = ", ".join(sorted(symbols))
                raise TranslationError(f"unresolved symbol {node.id!r} (known here: {known})", line)
            return symbols[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return f"({go(node.left)} {_BINOPS[type(node.op)]} {go(node.right)})"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return f"(-{go(node.operand)})"
        if isinstance(node, ast.Compare) and all(type(o) in _CMPOPS for o in node.ops):
            parts, left = [], go(node.left)
            for op, comp in zip(node.ops, node.comparators):
                right = go(comp)
                parts.append(f"({left} {_CMPOPS[type(op)]} {right})")
                left = right
            return " && ".join(parts)
        if isinstance(node, ast.BoolOp):
            joiner = " && " if isinstance(node.op, ast.And) else " || "
            return "(" + joiner.join(go(v) for v in node.values) + ")"
        raise TranslationError(f"unsupported expression {ast.unparse(node)!r}", line)

    return go(_parse(text, line))


def expr_eval(text: str, env: dict[str, int], line: int) -> int:
    """Evaluate a TL integer expression (C semantics for / on non-negative ints)."""

    def go(node: ast.expr) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise TranslationError(f"unresolved symbol {node.id!r}", line)
            return env[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            a, b = go(node.left), go(node.right)
            op = type(node.op)
            if op is ast.Add:
                return a + b
            if op is ast.Sub:
                return a - b
            if op is ast.Mult:
                return a * b
            if op in (ast.Div, ast.FloorDiv):
                return int(a / b)
            return a % b
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -go(node.operand)
        if isinstance(node, ast.Compare):
            left = go(node.left)
            for op, comp in zip(node.ops, node.comparators):
                right = go(comp)
                if not {ast.Lt: left < right, ast.LtE: left <= right, ast.Gt: left > right,
                        ast.GtE: left >= right, ast.Eq: left == right, ast.NotEq: left != right}[type(op)]:
                    return False
                left = right
            return True
        if isinstance(node, ast.BoolOp):
            vals = [go(v) for v in node.values]
            return all(vals) if isinstance(node.op, ast.And) else any(vals)
        raise TranslationError(f"unsupported expression {ast.unparse(node)!r}", line)

    return go(_parse(text, line))


# ---- ops ----------------------------------------------------------------------------------------------

@dataclass
class Write:
    """A write of a shared buffer; ``tile`` is the TL tile coordinate (iteration order) for ring slots."""

    buffer: str
    tile: Optional[str] = None


@dataclass
class Op:
    kind: str                       # emitter key: alloc_global, copy_g2s, gemm_ss, softmax, ...
    stmt: Any                       # the TL statement it came from (line + text for the comment)
    tl_text: str
    reads: tuple[str, ...] = ()     # shared buffers read
    writes: tuple[Write, ...] = ()  # shared buffers written
    async_copy: bool = False        # a cp.async copy: commits one group
    data: dict = field(default_factory=dict)
    # Filled by the dependency pass:
    wait: Optional[int] = None      # cp_async_wait<wait>() before the op
    barrier: bool = False           # __syncthreads() before the op
    reasons: list = field(default_factory=list)
    read_tiles: dict = field(default_factory=dict)   # buffer -> C++ expression of the tile read

    @property
    def line(self) -> int:
        return getattr(self.stmt, "line", 0)


@dataclass
class Loop:
    var: str
    start: str
    stop: str
    body: list
    stmt: Any
    tl_text: str
    kv_loop: bool = False           # iterates KV tiles: masked iterations peeled, causal bound


@dataclass
class Cond:
    condition: str
    body: list
    stmt: Any
    tl_text: str


Node = Union[Op, Loop, Cond]


def iter_ops(nodes):
    for n in nodes:
        if isinstance(n, Op):
            yield n
        else:
            yield from iter_ops(n.body)
