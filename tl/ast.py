"""The TL abstract syntax tree: frozen dataclasses, one per statement form of docs/tl.md.

Source positions (``line``, ``col``, 1-based) are carried for diagnostics but excluded from equality,
so that ``parse(print(p)) == p`` holds although the printer re-lays the text out.

Expressions (shapes, coordinates, loop bounds, if-conditions) are kept as normalised source text
(single spaces around binary operators removed: see ``tl.expr.normalize``); ``tl.expr`` parses them
into trees when a consumer needs their meaning.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Union

LEVELS = ("global", "shared", "register")
Level = Literal["global", "shared", "register"]


@dataclass(frozen=True)
class TensorRef:
    """A tensor operand: ``K_shared.T`` is TensorRef(name="K_shared", transposed=True)."""

    name: str
    transposed: bool = False
    line: int = field(default=0, compare=False)
    col: int = field(default=0, compare=False)

    @property
    def base(self) -> str:
        """The tensor the name refers to: ``K`` for ``K_shared`` and ``K_register``."""
        for level in ("shared", "register"):
            if self.name.endswith("_" + level) and len(self.name) > len(level) + 1:
                return self.name[: -len(level) - 1]
        return self.name

    @property
    def level(self) -> Optional[str]:
        """The level named by the suffix, or None for a plain name."""
        for level in ("shared", "register"):
            if self.name.endswith("_" + level) and len(self.name) > len(level) + 1:
                return level
        return None


@dataclass(frozen=True)
class Allocate:
    """``Allocate NAME in LEVEL (d0, d1, ...) [with offset EXPR]``."""

    name: str
    level: str
    shape: tuple[str, ...]
    offset: Optional[str] = None
    line: int = field(default=0, compare=False)
    col: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Copy:
    """``Copy X [(shape)] [in coordinate [AXIS = EXPR, ...]] from SRC to DST``."""

    tensor: TensorRef
    src: str
    dst: str
    shape: Optional[tuple[str, ...]] = None
    coordinate: Optional[tuple[tuple[str, str], ...]] = None
    line: int = field(default=0, compare=False)
    col: int = field(default=0, compare=False)


ResultMode = Literal["get", "get new", "accumulate"]


@dataclass(frozen=True)
class Compute:
    """``Compute OP a, b [and get [new] R | and accumulate R] [with X and Y]``.

    ``op`` keeps the spelling of the source (``GEMM``, ``Softmax``, ``Mask``...); compare ops
    case-insensitively with ``op_key``. Operands are TensorRefs; scalars (``x``, ``scale``) are plain
    TensorRefs too, the checker decides which names are tensors.
    """

    op: str
    args: tuple[TensorRef, ...]
    result: Optional[str] = None
    mode: Optional[ResultMode] = None
    with_: tuple[str, ...] = ()
    line: int = field(default=0, compare=False)
    col: int = field(default=0, compare=False)

    @property
    def op_key(self) -> str:
        return self.op.lower()


@dataclass(frozen=True)
class Reshape:
    """``Reshape NAME from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N_new) [and get P]``.

    Without ``and get`` the tensor changes layout in place (the paper's form); with it, ``result``
    names the reshaped copy and NAME keeps its accumulator layout, so that a software-pipelined
    sketch can compute the next score tile into NAME while the operand copy P is still being read.
    """

    name: str
    src_layout: tuple[str, ...]
    dst_layout: tuple[str, ...]
    result: Optional[str] = None
    line: int = field(default=0, compare=False)
    col: int = field(default=0, compare=False)


@dataclass(frozen=True)
class For:
    """``for VAR = START:STOP [with stages S] ... end`` (style "end") or ``for VAR in START:STOP [with
    stages S]:`` (style "python").

    ``stages`` makes the loop a pipeline: the shared buffers it fills are rings of S slots, each handed
    from the filling warpgroup to its readers and back through barriers (Hopper sketches); S is a
    number or a symbol the search resolves (``kv_stages``).
    """

    var: str
    start: str
    stop: str
    body: tuple["Statement", ...]
    style: Literal["end", "python"] = "end"
    stages: Optional[str] = None
    line: int = field(default=0, compare=False)
    col: int = field(default=0, compare=False)


@dataclass(frozen=True)
class If:
    """``if COND ... end``."""

    condition: str
    body: tuple["Statement", ...]
    line: int = field(default=0, compare=False)
    col: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Warpgroup:
    """``warpgroup ROLE ... end``: the statements run by the warpgroups of one role (Hopper sketches).

    ``producer``: one warpgroup that only copies tiles from global to shared memory; ``consumer``: the
    warpgroups that compute on them. The two bodies run concurrently; what the producer fills, the
    consumers read, in the order the producer fills it.
    """

    role: str
    body: tuple["Statement", ...]
    style: Literal["end", "python"] = "end"
    line: int = field(default=0, compare=False)
    col: int = field(default=0, compare=False)


ROLES = ("producer", "consumer")

Statement = Union[Allocate, Copy, Compute, Reshape, For, If, Warpgroup]


@dataclass(frozen=True)
class Program:
    statements: tuple[Statement, ...]


def walk(statements):
    """Yield every statement in source order, descending into loop and if bodies."""
    for stmt in statements:
        yield stmt
        if isinstance(stmt, (For, If, Warpgroup)):
            yield from walk(stmt.body)


def is_block(stmt) -> bool:
    return isinstance(stmt, (For, If, Warpgroup))
