"""The rules of Hopper sketches: warpgroup roles and pipelined loops (``warpgroup``, ``with stages``).

Pure functions over the AST, called by the checker (``tl/checker.py``):

* ``role_diagnostics``: who runs what. In a sketch with warpgroup blocks the producer only copies
  tiles from global to shared memory, the consumers compute and never load, nothing but global
  allocations stands outside a block, and every shared buffer a consumer reads is one the producer
  fills (``unfilled-buffer``).
* ``pipeline_diagnostics``: a ``with stages S`` loop must fill shared buffers; the consumers must read
  each pipelined buffer exactly as often as the producer fills it, for every tile count N (else one
  side waits forever: ``pipeline-balance``); and with ``CheckLimits`` (the GPU's shared memory and
  the tile sizes), the stages must fit (``pipeline-smem``).

The balance is checked by running the loops for a few values of N, so sketches with peeled first
iterations (``for i = 1:N`` after a first GEMM) are judged by what they do, not by their shape.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

from tl.ast import ROLES, Allocate, Compute, Copy, For, If, TensorRef, Warpgroup, walk
from tl.expr import ExprError, evaluate

Error = Callable[..., None]   # error(line, col, code, message, hint)

BALANCE_TILE_COUNTS = (1, 2, 3, 7)   # N values the loops are run with
_MAX_SIM_STEPS = 10_000


@dataclass(frozen=True)
class CheckLimits:
    """What the checker may know of the target: shared memory per block and the values of the
    sketch's symbols (BM, BN, HeadDim, kv_stages...). Checks that need an unknown symbol are skipped."""

    smem_bytes: int
    symbols: Mapping[str, int] = field(default_factory=dict)
    element_bytes: int = 2


def has_roles(statements) -> bool:
    return any(isinstance(s, Warpgroup) for s in walk(statements))


def _blocks(statements, role: str) -> list[Warpgroup]:
    return [s for s in walk(statements) if isinstance(s, Warpgroup) and s.role == role]


def _is_transpose(s) -> bool:
    return isinstance(s, Compute) and s.op_key == "transpose"


def _transpose_fill(s: Compute, shapes: dict) -> Copy:
    """A producer's `Compute Transpose V_shared and get Vt_shared` (tl/vtranspose.py) as the fill of Vt_shared: a
    shared tile of V's shape reversed."""
    src = shapes.get(s.args[0].name) if s.args else None
    return Copy(TensorRef(TensorRef(s.result).base), "shared", "shared",
                shape=tuple(reversed(src)) if src else None, line=s.line, col=s.col)


def producer_fills(statements) -> dict[str, Copy]:
    """Shared buffers the producer fills (``K_shared``; a transpose's ``Vt_shared``) -> the first Copy that fills it."""
    out: dict[str, Copy] = {}
    for block in _blocks(statements, "producer"):
        for s in walk(block.body):
            if isinstance(s, Copy) and s.src == "global" and s.dst == "shared":
                out.setdefault(f"{s.tensor.base}_shared", s)
            elif _is_transpose(s) and s.result:
                out.setdefault(s.result, _transpose_fill(s, {k: c.shape for k, c in out.items()}))
    return out


def _gemm_reads(statements):
    for s in walk(statements):
        if isinstance(s, Compute) and s.op_key == "gemm":
            for ref in s.args:
                if ref.level == "shared":
                    yield s, ref


# ---- roles ----------------------------------------------------------------------------------------

def role_diagnostics(statements, error: Error) -> None:
    if not has_roles(statements):
        return
    _nesting(statements, error, inside=None)
    for role in ROLES:
        if not _blocks(statements, role):
            other = "consumer" if role == "producer" else "producer"
            error(1, 1, "bad-role", f"the sketch has a {other} warpgroup but no {role}",
                  "a warp-specialised sketch has one `warpgroup producer` block that loads tiles and one "
                  "`warpgroup consumer` block that computes")
    if len(_blocks(statements, "producer")) > 1:
        extra = _blocks(statements, "producer")[1]
        error(extra.line, extra.col, "bad-role", "only one producer warpgroup block is supported",
              "put every load in one `warpgroup producer ... end` block")
    for s in statements:
        if isinstance(s, Warpgroup) or (isinstance(s, Allocate) and s.level == "global"):
            continue
        error(s.line, s.col, "bad-role", "this statement runs in no warpgroup",
              "in a warp-specialised sketch only `Allocate ... in global` stands outside the warpgroup blocks; "
              "move it into the producer (loads) or the consumer (everything else)")
    for block in _blocks(statements, "producer"):
        for s in walk(block.body):
            if isinstance(s, (For, If)) or (isinstance(s, Copy) and s.src == "global" and s.dst == "shared") \
                    or _is_transpose(s):   # (a transpose's place: tl/vtranspose.py)
                continue
            error(s.line, s.col, "bad-role", "the producer warpgroup only copies tiles from global to shared memory",
                  "move this statement into the `warpgroup consumer` block")
    fills = producer_fills(statements)
    for block in _blocks(statements, "consumer"):
        for s in walk(block.body):
            if isinstance(s, Copy) and s.src == "global":
                error(s.line, s.col, "bad-role", f"a consumer warpgroup loads {s.tensor.base} from global memory",
                      "move the load into the `warpgroup producer` block; consumers read what it fills")
        for gemm, ref in _gemm_reads(block.body):
            if ref.name not in fills:
                error(gemm.line, ref.col or gemm.col, "unfilled-buffer",
                      f"the consumer reads {ref.name} but no producer Copy fills it: it would wait forever",
                      f"add `Copy {ref.base} (...) in coordinate [L = ...] from global to shared` to the producer")


def _nesting(statements, error: Error, inside: Optional[str]) -> None:
    for s in statements:
        if isinstance(s, Warpgroup):
            if s.role not in ROLES:
                error(s.line, s.col, "bad-role", f"unknown warpgroup role {s.role!r}",
                      "the roles are `producer` (loads tiles) and `consumer` (computes)")
            if inside is not None:
                error(s.line, s.col, "bad-role", f"a warpgroup block inside the {inside} block",
                      "warpgroup blocks stand at the top level of the sketch, one after the other")
            if not s.body:
                error(s.line, s.col, "bad-role", f"the {s.role} warpgroup block is empty",
                      "put the role's statements between `warpgroup ...` and its `end`")
            _nesting(s.body, error, s.role)
        elif isinstance(s, (For, If)):
            _nesting(s.body, error, inside)


# ---- pipelines ------------------------------------------------------------------------------------

def _fills_in(loop: For) -> list[Copy]:
    """The loop's fills of shared buffers: its copies from global, and its transposes' tiles."""
    out: list[Copy] = []
    for s in walk(loop.body):
        if isinstance(s, Copy) and s.src == "global" and s.dst == "shared":
            out.append(s)
        elif _is_transpose(s) and s.result:
            out.append(_transpose_fill(s, {f"{c.tensor.base}_shared": c.shape for c in out}))
    return out


def pipeline_diagnostics(statements, error: Error, limits: Optional[CheckLimits] = None) -> None:
    loops = [s for s in walk(statements) if isinstance(s, For) and s.stages is not None]
    for loop in loops:
        if loop.stages.isdigit():
            if int(loop.stages) < 1:
                error(loop.line, loop.col, "bad-pipeline", f"a pipeline needs at least one stage, got {loop.stages}",
                      "write `with stages 2` (or a symbol the search sets, e.g. `with stages kv_stages`)")
        if not _fills_in(loop):
            error(loop.line, loop.col, "bad-pipeline",
                  f"'for {loop.var}' declares stages but fills no shared buffer",
                  "put `with stages S` on the loop that copies the K and V tiles into shared memory")
        elif limits is not None:
            _smem_fit(statements, loop, error, limits)
    if has_roles(statements):
        _balance(statements, error, {f"{c.tensor.base}_shared" for loop in loops for c in _fills_in(loop)})


def _eval(text: str, env: Mapping[str, int]) -> Optional[int]:
    try:
        value = evaluate(text, env)
    except (ExprError, TypeError, ZeroDivisionError):
        return None
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _smem_fit(statements, loop: For, error: Error, limits: CheckLimits) -> None:
    stages = _eval(loop.stages, limits.symbols)
    if stages is None:
        return
    ring = {f"{c.tensor.base}": c for c in _fills_in(loop)}
    once = {s.tensor.base: s for s in walk(statements) if isinstance(s, Copy) and s.src == "global"
            and s.dst == "shared" and s.tensor.base not in ring}
    parts, total = [], 0
    for copies, count in ((once, 1), (ring, stages)):
        for base, c in copies.items():
            dims = [_eval(d, limits.symbols) for d in (c.shape or ())]
            if not dims or any(d is None for d in dims):
                return
            size = 1
            for d in dims:
                size *= d
            total += count * size * limits.element_bytes
            parts.append(f"{'' if count == 1 else f'{count} x '}{base} {'x'.join(map(str, dims))}")
    if total > limits.smem_bytes:
        error(loop.line, loop.col, "pipeline-smem",
              f"the pipeline needs {total // 1024} KB of shared memory ({' + '.join(parts)}) but a block has "
              f"{limits.smem_bytes // 1024} KB", "use fewer stages or smaller tiles (BN)")


class _Unknown(Exception):
    """A bound or condition the simulation cannot evaluate: the balance check is skipped."""


def _balance(statements, error: Error, pipelined: set[str]) -> None:
    if not pipelined:
        return
    first_read: dict[str, tuple[int, int]] = {}
    for block in _blocks(statements, "consumer"):
        for gemm, ref in _gemm_reads(block.body):
            first_read.setdefault(ref.name, (gemm.line, ref.col or gemm.col))
    for n in BALANCE_TILE_COUNTS:
        fills: dict[str, int] = {}
        reads: dict[str, int] = {}
        try:
            for block in _blocks(statements, "producer"):
                _count(block.body, {"N": n}, fills, reads, [0])
            for block in _blocks(statements, "consumer"):
                _count(block.body, {"N": n}, fills, reads, [0])
        except _Unknown:
            return
        for buf in sorted(pipelined):
            if fills.get(buf, 0) != reads.get(buf, 0) and buf in first_read:
                line, col = first_read[buf]
                error(line, col, "pipeline-balance",
                      f"with N = {n} tile(s) the producer fills {buf} {_times(fills.get(buf, 0))} but the "
                      f"consumers read it {_times(reads.get(buf, 0))}: one side would wait forever",
                      "each consumer GEMM on a pipelined buffer takes the next tile; read every tile the producer "
                      "loads exactly once (a peeled first GEMM goes with a loop from 1)")
                return


def _times(k: int) -> str:
    return {0: "never", 1: "once", 2: "twice"}.get(k, f"{k} times")


def _count(statements, env: dict, fills: dict, reads: dict, steps: list) -> None:
    for s in statements:
        steps[0] += 1
        if steps[0] > _MAX_SIM_STEPS:
            raise _Unknown()
        if isinstance(s, Copy) and s.src == "global" and s.dst == "shared":
            key = f"{s.tensor.base}_shared"
            fills[key] = fills.get(key, 0) + 1
        elif _is_transpose(s) and s.result:
            fills[s.result] = fills.get(s.result, 0) + 1
        elif isinstance(s, Compute) and s.op_key == "gemm":
            for ref in s.args:
                if ref.level == "shared":
                    reads[ref.name] = reads.get(ref.name, 0) + 1
        elif isinstance(s, For):
            start, stop = _eval(s.start, env), _eval(s.stop, env)
            if start is None or stop is None:
                raise _Unknown()
            for value in range(start, stop):
                _count(s.body, {**env, s.var: value}, fills, reads, steps)
        elif isinstance(s, If):
            try:
                taken = bool(evaluate(s.condition, env))
            except (ExprError, TypeError, ZeroDivisionError):
                raise _Unknown() from None
            if taken:
                _count(s.body, env, fills, reads, steps)
        elif isinstance(s, Warpgroup):
            _count(s.body, env, fills, reads, steps)
