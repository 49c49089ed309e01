"""The TL checker: the rules of docs/tl.md over a parsed program, every error reported.

One pass in source order (the order is the schedule): a definition inside a loop or an ``if`` body
counts for every later statement, a use textually before any definition is an error. Each tensor
carries its level, its shape (when Allocate/Copy give one) and its register layout, which is how
the two failure modes of the paper are caught: a GEMM whose inner dimensions disagree
(``gemm-layout``) and an accumulator (MMA_C) that reaches a GEMM's A operand without a ``Reshape``
to MMA_A (``missing-reshape``), also through Softmax, Mask or elementwise operations.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from tl.ast import LEVELS, Allocate, Compute, Copy, For, If, Program, Reshape, TensorRef, Warpgroup, walk
from tl.diagnostics import Diagnostic
from tl.layout import layout_diagnostics
from tl.phase import phase_diagnostics
from tl.options import option_diagnostics
from tl.vtranspose import transpose_diagnostics
from tl.pipelines import CheckLimits, pipeline_diagnostics, producer_fills, role_diagnostics

__all__ = ["OpSpec", "KNOWN_OPS", "CheckLimits", "check", "check_source"]


@dataclass(frozen=True)
class OpSpec:
    """What the translator knows of an operator: operand count and how its result relates to them."""

    name: str
    min_args: int
    max_args: int
    kind: str  # "gemm", "elementwise", "reduce", "softmax", "mask", "fill"
    needs_result: bool = False
    takes_with: bool = False


# The one table of known operators (keys are lower case; ``Compute`` spelling is case-insensitive).
KNOWN_OPS: dict[str, OpSpec] = {spec.name.lower(): spec for spec in (
    OpSpec("GEMM", 2, 2, "gemm", needs_result=True),
    OpSpec("Add", 2, 2, "elementwise"),
    OpSpec("Subtract", 2, 2, "elementwise"),
    OpSpec("Multiply", 2, 2, "elementwise"),
    OpSpec("Divide", 2, 2, "elementwise"),
    OpSpec("Softmax", 1, 1, "softmax", takes_with=True),
    OpSpec("Mask", 1, 2, "mask"),               # Mask S [, Window]: the causal / ragged mask, and a sliding window
    # the options of today's models (tl/options.py): soft-capping of the raw scores, sinks joining each row's softmax
    OpSpec("Softcap", 1, 1, "softcap"),
    OpSpec("Sink", 1, 1, "sink", takes_with=True),
    OpSpec("Exp", 1, 1, "elementwise"),
    OpSpec("Exp2", 1, 1, "elementwise"),
    OpSpec("Log", 1, 1, "elementwise"),
    OpSpec("Scale", 1, 2, "elementwise"),
    OpSpec("Convert", 1, 2, "elementwise"),
    OpSpec("Cast", 1, 2, "elementwise"),
    OpSpec("Max", 1, 2, "reduce"),
    OpSpec("Min", 1, 2, "reduce"),
    OpSpec("Sum", 1, 2, "reduce"),
    OpSpec("Fill", 1, 2, "fill"),
    OpSpec("Zero", 1, 1, "fill"),
    # decode (tl/phase.py): merge the splits' partial outputs by their row maxima and sums
    OpSpec("Combine", 1, 3, "elementwise"),
    # FP8 (tl/vtranspose.py): the producer warpgroup transposes the V tile it loaded, (BN, HeadDim) -> (HeadDim, BN)
    OpSpec("Transpose", 1, 1, "transpose", needs_result=True),
)}

RESHAPE_EXAMPLE = "(MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N_new)"


@dataclass
class _Tensor:
    level: Optional[str]
    shape: Optional[tuple[str, ...]] = None
    layout: Optional[str] = None  # "C" accumulator, "A"/"B" operand layouts, None: not from a GEMM
    c_line: int = 0  # the GEMM that put it in the accumulator layout
    last_write: int = 0


def _is_number(name: str) -> bool:
    return name[:1].isdigit()


def _matrix(shape: Optional[tuple[str, ...]], transposed: bool) -> Optional[tuple[str, str]]:
    """(rows, cols) of an operand from its last two dimensions; None when unknown."""
    if not shape or len(shape) < 2:
        return None
    rows, cols = shape[-2], shape[-1]
    return (cols, rows) if transposed else (rows, cols)


def _spell(ref: TensorRef, transposed: bool) -> str:
    return ref.name + (".T" if transposed else "")


class _Checker:
    def __init__(self, program: Program, path: str, limits: Optional[CheckLimits] = None):
        self.program, self.path, self.limits = program, path, limits
        self.env: dict[str, _Tensor] = {}
        self.diags: list[Diagnostic] = []
        stmts = list(walk(program.statements))
        # Code-stage programs Allocate their global tensors; sketch-stage ones copy kernel inputs
        # straight from global, so there a first copy from global introduces the input.
        self.implicit_inputs = not any(isinstance(s, Allocate) and s.level == "global" for s in stmts)
        self.first_def: dict[str, int] = {}
        self.tensor_like: set[str] = set()
        for s in stmts:
            for name in self._defined_by(s):
                self.first_def.setdefault(name, s.line)
            if isinstance(s, Copy):
                self.tensor_like |= {s.tensor.name, s.tensor.base}
            if isinstance(s, Compute) and s.op_key == "gemm":
                self.tensor_like |= {a.name for a in s.args}
        self.tensor_like |= set(self.first_def)
        # Warp-specialised sketches: the producer and consumer blocks run concurrently, so what the
        # producer fills is there for the consumers wherever the blocks stand in the text.
        self.producer_fills = producer_fills(program.statements)
        self.role: Optional[str] = None

    @staticmethod
    def _defined_by(s) -> list[str]:
        if isinstance(s, Allocate):
            return [s.name] + ([f"{s.name}_{s.level}"] if s.level in ("shared", "register") else [])
        if isinstance(s, Copy):
            base = s.tensor.base
            return [base if s.dst == "global" else f"{base}_{s.dst}"]
        if isinstance(s, Compute):
            return ([s.result] if s.result else []) + list(s.with_)
        if isinstance(s, Reshape) and s.result:
            return [s.result]
        return []

    def error(self, line: int, col: int, code: str, message: str, hint: str = "") -> None:
        self.diags.append(Diagnostic(self.path, line, col, code, message, hint))

    # -- name resolution ----------------------------------------------------------------------------
    def resolve_at(self, base: str, level: str) -> Optional[_Tensor]:
        if level != "global" and f"{base}_{level}" in self.env:
            return self.env[f"{base}_{level}"]
        entry = self.env.get(base)
        return entry if entry is not None and entry.level == level else None

    def resolve(self, ref: TensorRef) -> Optional[_Tensor]:
        if ref.name in self.env:
            return self.env[ref.name]
        return self.resolve_at(ref.base, ref.level) if ref.level else None

    def undefined(self, ref: TensorRef, line: int, context: str) -> None:
        later = self.first_def.get(ref.name)
        when = (f"it is first defined at line {later}, after this use" if later and later >= line
                else "nothing defines it")
        if ref.level:
            hint = f"copy {ref.base} to {ref.level} first, e.g. `Copy {ref.base} from global to {ref.level}`" \
                if ref.level == "shared" else \
                f"copy {ref.base} to registers first, e.g. `Copy {ref.base} from shared to register`"
        else:
            hint = (f"define {ref.name} before this line: `Allocate {ref.name} in register (...)`, "
                    f"a Copy, or a Compute `and get {ref.name}`")
        self.error(line, ref.col or 1, "undefined-tensor", f"{context} {ref.name!r} is used before it is defined ({when})", hint)

    def define(self, name: str, entry: _Tensor, line: int) -> None:
        entry.last_write = line
        self.env[name] = entry

    # -- statements ---------------------------------------------------------------------------------
    def run(self) -> list[Diagnostic]:
        self.block(self.program.statements)
        role_diagnostics(self.program.statements, self.error)
        pipeline_diagnostics(self.program.statements, self.error, self.limits)
        self.diags += option_diagnostics(self.program, self.path)
        self.diags += transpose_diagnostics(self.program, self.path)
        self.diags += layout_diagnostics(self.program, self.path)
        self.diags += phase_diagnostics(self.program, self.path)
        return self.diags

    def block(self, statements) -> None:
        for stmt in statements:
            if isinstance(stmt, Allocate):
                self.allocate(stmt)
            elif isinstance(stmt, Copy):
                self.copy(stmt)
            elif isinstance(stmt, Compute):
                self.compute(stmt)
            elif isinstance(stmt, Reshape):
                self.reshape(stmt)
            elif isinstance(stmt, For):
                if not stmt.body:
                    self.error(stmt.line, stmt.col, "bad-loop", f"the body of 'for {stmt.var}' is empty",
                               "put the statements of the loop between the 'for' line and its 'end'")
                self.block(stmt.body)
            elif isinstance(stmt, If):
                if not stmt.body:
                    self.error(stmt.line, stmt.col, "bad-loop", f"the body of 'if {stmt.condition}' is empty",
                               "remove the empty if, or put its statements before its 'end'")
                self.block(stmt.body)
            elif isinstance(stmt, Warpgroup):
                if stmt.role == "consumer":
                    for name, fill in self.producer_fills.items():
                        if name not in self.env:
                            self.define(name, _Tensor("shared", fill.shape or None), fill.line)
                self.role = stmt.role
                self.block(stmt.body)
                self.role = None

    def allocate(self, s: Allocate) -> None:
        level = s.level
        if level not in LEVELS:
            self.error(s.line, s.col, "bad-level", f"{level!r} is not a memory level",
                       "allocate in global, shared or register")
            level = None
        suffix = TensorRef(s.name).level
        if level is not None and suffix is not None and suffix != level:
            self.error(s.line, s.col, "bad-level", f"{s.name!r} is named for {suffix} but allocated in {level}",
                       f"write `Allocate {s.name} in {suffix} ...` or rename the tensor")
        entry = _Tensor(level, s.shape or None)
        self.define(s.name, entry, s.line)
        if level in ("shared", "register") and suffix is None:
            self.env[f"{s.name}_{level}"] = entry

    def copy(self, s: Copy) -> None:
        ref = s.tensor
        bad = False  # the source side cannot be read
        for side, level in (("source", s.src), ("destination", s.dst)):
            if level not in LEVELS:
                self.error(s.line, s.col, "bad-copy", f"the copy {side} {level!r} is not a memory level",
                           "copies go between global, shared and register")
                bad = bad or side == "source"
        if s.src in LEVELS and s.src == s.dst:
            self.error(s.line, s.col, "bad-copy", f"a copy from {s.src} to itself",
                       "a Copy moves a tile between two different levels (global, shared, register)")
            bad = True
        if ref.level and s.src in LEVELS and ref.level != s.src:
            self.error(s.line, ref.col or s.col, "bad-copy",
                       f"{ref.name!r} lives in {ref.level}, but the copy reads it from {s.src}",
                       f"write `from {ref.level} to ...`, or copy {ref.base} instead")
            bad = True
        source = None
        if s.src in LEVELS and not bad:
            source = self.resolve(ref) if ref.level else self.resolve_at(ref.name, s.src)
            if source is None and s.src == "global" and not ref.level and self.implicit_inputs:
                source = _Tensor("global", None)
                self.define(ref.name, source, s.line)
            if source is None:
                where = f"in {s.src}" if s.src != "global" else "in global memory"
                self.undefined(ref if ref.level or s.src == "global" else TensorRef(f"{ref.name}_{s.src}", col=ref.col),
                               s.line, f"the copy source ({where})")
        if s.dst not in LEVELS:
            return
        base = ref.base
        # A copy out of global moves a tile whose shape only the copy itself can give; between
        # shared and registers the tile keeps its shape.
        shape = s.shape or (source.shape if source and s.src != "global" else None)
        if s.dst == "global":
            target = self.env.get(base)
            if target is not None and target.level == "global":
                target.last_write = s.line
                return
            self.define(base, _Tensor("global", shape), s.line)
        else:
            self.define(f"{base}_{s.dst}", _Tensor(s.dst, shape), s.line)

    def operand(self, ref: TensorRef, line: int, is_gemm: bool) -> Optional[_Tensor]:
        """The tensor an operand names; None for a scalar or an undefined name (reported)."""
        if _is_number(ref.name):
            if is_gemm:
                self.error(line, ref.col or 1, "bad-operand", f"a GEMM operand must be a tensor, not {ref.name}",
                           "use a tensor in shared memory or registers")
            return None
        entry = self.resolve(ref)
        if entry is None and self.role == "consumer" and ref.level == "shared":
            return None   # reported as unfilled-buffer: the producer is what should fill it
        if entry is None and (is_gemm or ref.level or ref.name in self.tensor_like):
            self.undefined(ref, line, "tensor")
        return entry

    def compute(self, s: Compute) -> None:
        spec = KNOWN_OPS.get(s.op_key)
        if spec is None:
            known = ", ".join(o.name for o in KNOWN_OPS.values())
            self.error(s.line, s.col, "unknown-op", f"unknown operator {s.op!r}", f"known operators: {known}")
        else:
            n = len(s.args)
            if not spec.min_args <= n <= spec.max_args:
                want = str(spec.min_args) if spec.min_args == spec.max_args else f"{spec.min_args} or {spec.max_args}"
                self.error(s.line, s.col, "bad-arity", f"{spec.name} takes {want} operand(s), got {n}",
                           "e.g. `Compute GEMM A, B and get S`" if spec.kind == "gemm" else f"write `Compute {spec.name}` with {want} operand(s)")
            if spec.needs_result and s.result is None:
                self.error(s.line, s.col, "bad-arity", f"{spec.name} has no result",
                           "end it with `and get S` or `and accumulate O_register`")
            if s.with_ and not spec.takes_with:
                self.error(s.line, s.col, "bad-arity", f"{spec.name} takes no `with` clause",
                           "only Softmax (and Sink, after it) keep running state: `Compute Softmax S with Smax and "
                           "Ssum`")
            if spec.takes_with and len(s.with_) not in ((0, 2) if spec.kind == "softmax" else (2,)):
                self.error(s.line, s.col, "bad-arity",
                           f"{spec.name} takes two running values (row max and row sum), got {len(s.with_)}",
                           f"write `Compute {spec.name} {s.args[0].name if s.args else 'S'} with Smax and Ssum`")
        is_gemm = spec is not None and spec.kind == "gemm"
        entries = [self.operand(ref, s.line, is_gemm) for ref in s.args]
        if is_gemm and len(s.args) == 2:
            self.gemm(s, entries)
            return
        if spec is not None and spec.kind == "gemm":
            return
        tensors = [e for e in entries if e is not None]
        first = tensors[0] if tensors else None
        layout = next((e.layout for e in tensors if e.layout == "C"), first.layout if first else None)
        c_line = next((e.c_line for e in tensors if e.layout == "C"), 0)
        if spec is not None and spec.kind == "reduce" and len(s.args) == 1:
            layout, shape = None, None
        elif spec is not None and spec.kind == "transpose":   # (BN, HeadDim) -> (HeadDim, BN), a shared tile
            layout = None
            shape = tuple(reversed(first.shape)) if first and first.shape else None
        else:
            shape = first.shape if first else None
        if s.result is not None:
            existing = self.env.get(s.result)
            if existing is not None:
                existing.layout, existing.c_line, existing.last_write = layout, c_line, s.line
                existing.shape = existing.shape or shape
            else:
                self.define(s.result, _Tensor(first.level if first else "register", shape, layout, c_line), s.line)
        elif first is not None:
            first.last_write = s.line  # in place: Softmax S, Mask S
        for name in s.with_:
            if name in self.env:
                self.env[name].last_write = s.line
            else:
                self.define(name, _Tensor("register"), s.line)

    def gemm(self, s: Compute, entries: list[Optional[_Tensor]]) -> None:
        (a_ref, b_ref), (a, b) = s.args, entries
        for ref, entry in ((a_ref, a), (b_ref, b)):
            if entry is not None and entry.level == "global":
                self.error(s.line, ref.col or s.col, "bad-operand",
                           f"GEMM operand {ref.name!r} is in global memory; a GEMM reads shared memory or registers",
                           f"copy it to shared first: `Copy {ref.base} from global to shared`, then use {ref.base}_shared")
        if a is not None and a.layout == "C":
            after = f"after line {a.last_write} (its last write) and " if a.last_write else ""
            self.error(s.line, a_ref.col or s.col, "missing-reshape",
                       f"{a_ref.name!r} is in the accumulator layout (MMA_C) of the GEMM at line {a.c_line}, "
                       f"but this GEMM reads it as its A operand (MMA_A)",
                       f"insert `Reshape {a_ref.name} from {RESHAPE_EXAMPLE}` {after}before this GEMM")
        ma = _matrix(a.shape if a else None, a_ref.transposed)
        mb = _matrix(b.shape if b else None, b_ref.transposed)
        out_shape = None
        if ma and mb:
            if ma[1] != mb[0]:
                self.error(s.line, b_ref.col or s.col, "gemm-layout",
                           f"inner dimensions disagree: {_spell(a_ref, a_ref.transposed)} is ({ma[0]}, {ma[1]}) and "
                           f"{_spell(b_ref, b_ref.transposed)} is ({mb[0]}, {mb[1]}); {ma[1]} != {mb[0]}",
                           self.layout_hint(a_ref, b_ref, a.shape, b.shape))
            else:
                out_shape = (ma[0], mb[1])
        result = self.env.get(s.result) if s.result else None
        if s.result is None:
            return
        if result is not None and out_shape and result.shape and len(result.shape) == 2 and tuple(result.shape) != out_shape:
            self.error(s.line, s.col, "gemm-layout",
                       f"the GEMM gives a ({out_shape[0]}, {out_shape[1]}) tile but {s.result!r} is "
                       f"({', '.join(result.shape)})",
                       "make the result's shape the rows of A by the columns of B")
        if result is None:
            result = _Tensor("register", out_shape)
            self.env[s.result] = result
        result.shape = result.shape or out_shape
        result.layout, result.c_line, result.last_write = "C", s.line, s.line

    @staticmethod
    def layout_hint(a_ref: TensorRef, b_ref: TensorRef, a_shape, b_shape) -> str:
        fixes = []
        for flip_a, flip_b in ((False, True), (True, False), (True, True)):
            ma = _matrix(a_shape, a_ref.transposed ^ flip_a)
            mb = _matrix(b_shape, b_ref.transposed ^ flip_b)
            if ma[1] == mb[0]:
                fixes.append(f"write `Compute GEMM {_spell(a_ref, a_ref.transposed ^ flip_a)}, "
                             f"{_spell(b_ref, b_ref.transposed ^ flip_b)} ...`")
        if fixes and not b_ref.transposed and fixes[0].endswith(f"{b_ref.name}.T ...`"):
            return (f"{b_ref.base} is stored ({', '.join(b_shape)}); {fixes[0]}: .T reads it transposed")
        if fixes:
            return fixes[0]
        return "the columns of the first operand must equal the rows of the second"

    def reshape(self, s: Reshape) -> None:
        entry = self.resolve(TensorRef(s.name))
        if entry is None:
            self.undefined(TensorRef(s.name, col=s.col), s.line, "the reshaped tensor")
            return
        if s.result:   # `and get P`: a reshaped copy; the source keeps its layout
            entry = _Tensor(entry.level, entry.shape)
            self.define(s.result, entry, s.line)
        target = s.dst_layout[0].upper() if s.dst_layout else ""
        for layout in ("A", "B", "C"):
            if target.startswith(f"MMA_{layout}"):
                entry.layout = layout
                break
        else:
            entry.layout = None


def check(program: Program, path: str = "<string>", limits: Optional[CheckLimits] = None) -> list[Diagnostic]:
    """Every error in a parsed program, in source order; never raises. ``limits`` (the GPU's shared
    memory and the symbols' values) enables the checks that need them (``pipeline-smem``)."""
    if not program.statements:
        return [Diagnostic(path, 1, 1, "empty-program", "the program has no statements: a sketch with nothing in "
                           "it is not a kernel",
                           "write the kernel's flow (copies, GEMMs, softmax, the output's store), or start from "
                           "a reference sketch: tl/sketches/mha_causal.tl")]
    try:
        diags = _Checker(program, path, limits).run()
    except Exception as exc:  # a checker bug must not become a traceback for the user
        return [Diagnostic(path, 1, 1, "internal", f"checker failure: {exc!r}", "please report this input")]
    return sorted(diags, key=lambda d: (d.line, d.col))


# Errors that concern one line alone; they stay true when other lines had syntax errors.
_LOCAL_CODES = frozenset({"bad-copy", "bad-level", "unknown-op", "bad-arity", "bad-pipeline"})


def check_source(text: str, path: str = "<string>",
                 limits: Optional[CheckLimits] = None) -> tuple[Optional[Program], list[Diagnostic]]:
    """Parse and check: (program, diagnostics), every error in line order. With syntax errors the
    program is None; the lines that did parse are still checked for errors local to one line
    (a bad copy level, an unknown operator...), but not for undefined tensors or layouts, which
    the missing lines could explain."""
    from tl.parser import parse

    result = parse(text, path)
    if result.program is None:
        extra = []
        if result.recovered is not None:
            extra = [d for d in check(result.recovered, path) if d.code in _LOCAL_CODES]
        return None, sorted([*result.diagnostics, *extra], key=lambda d: (d.line, d.col))
    return result.program, check(result.program, path, limits)
