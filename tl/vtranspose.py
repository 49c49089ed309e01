"""How an FP8 sketch's P·V GEMM gets V K-major: the transpose of V in TL.

8-bit wgmma operands are K-major, so the P·V GEMM of an e4m3 kernel reads V transposed, (HeadDim, BN) a tile. A
sketch states who transposes it:

    warpgroup producer                                   # the producer warpgroup transposes each tile it loads
        ...
        for j = 0:N with stages kv_stages
            Copy K (BN, HeadDim) in coordinate [L = j] from global to shared
            Copy V (BN, HeadDim) in coordinate [L = j] from global to shared
            Compute Transpose V_shared and get Vt_shared   # V_shared (BN, HeadDim) -> Vt_shared (HeadDim, BN)
        end
    end
    warpgroup consumer
        ...
        Compute GEMM P, Vt_shared.T and accumulate O_register   # reads the transposed tile K-major

or the caller stores V transposed (the runtime's per-call copy):

    Allocate Vt in global (HeadDim, kv_len) with offset kv_offset
    ...
            Copy Vt (HeadDim, BN) in coordinate [L = j] from global to shared
    ...
        Compute GEMM P, Vt_shared.T and accumulate O_register

A sketch that reads ``V_shared`` as is states neither: the kernel's parameter (translate's
KernelParams.v_transpose) decides, and ``with_v_transpose`` adds the producer's statement to such a sketch (as
``tl.options.with_options`` adds the options'). A sketch that states a form pins the parameter (translate/params_sm90.py
``v_transpose_sketch_reasons``). ``v_transpose_of`` says which form a sketch states; ``transpose_diagnostics`` reports a
transpose in the wrong place, of the wrong tile, or a GEMM that reads the tiles the wrong way.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from tl.ast import Compute, Copy, For, Program, TensorRef, Warpgroup, walk
from tl.diagnostics import Diagnostic

TRANSPOSE = "transpose"


def _is_transpose(s) -> bool:
    return isinstance(s, Compute) and s.op_key == TRANSPOSE


def _blocks(program: Program, role: str) -> list:
    return [s for s in program.statements if isinstance(s, Warpgroup) and s.role == role]


def _pv_gemms(statements):
    """The P·V GEMMs: a register A operand (no level: P) times a shared B operand."""
    for s in walk(statements):
        if isinstance(s, Compute) and s.op_key == "gemm" and len(s.args) == 2 and s.result \
                and s.args[0].level != "shared" and s.args[1].level == "shared":
            yield s


def transposes(program: Program) -> dict[str, Compute]:
    """The producer's transposes: result name (``Vt_shared``) -> the statement."""
    out = {}
    for block in _blocks(program, "producer"):
        for s in walk(block.body):
            if _is_transpose(s) and s.result:
                out.setdefault(s.result, s)
    return out


def v_transpose_of(program: Program) -> Optional[str]:
    """"producer" (the P·V GEMM reads a tile the producer transposes), "runtime" (it reads, K-major, a tile copied
    from a transposed tensor in global memory) or None (it reads V as given: the sketch states no form)."""
    made = transposes(program)
    for block in _blocks(program, "consumer"):
        for g in _pv_gemms(block.body):
            b = g.args[1]
            if b.transposed:
                return "producer" if b.name in made else "runtime"
    return None


def transpose_diagnostics(program: Program, path: str) -> list[Diagnostic]:
    """transpose-place: a Transpose outside the producer warpgroup, outside its pipelined loop, or before the Copy of
    the tile it transposes. transpose-operand: a Transpose of a tile the producer does not copy, of K (the score
    GEMM's operand), or whose result is no shared tile a P·V GEMM reads. transpose-read: a P·V GEMM that reads the
    transposed tile without .T (it is (HeadDim, BN); the GEMM reads it K-major), or reads the tile the sketch
    transposes instead of the transpose."""
    out: list[Diagnostic] = []
    producers = _blocks(program, "producer")
    in_producer = {id(s) for block in producers for s in walk(block.body)}
    in_loop: dict[int, For] = {}
    for block in producers:
        for s in walk(block.body):
            if isinstance(s, For) and s.stages is not None:
                for c in walk(s.body):
                    in_loop[id(c)] = s
    score_b = {g.args[1].name for g in walk(program.statements) if isinstance(g, Compute) and g.op_key == "gemm"
               and len(g.args) == 2 and g.args[0].level == "shared"}
    pv_reads = {g.args[1].name: g for block in _blocks(program, "consumer") for g in _pv_gemms(block.body)}
    for s in walk(program.statements):
        if not _is_transpose(s):
            continue
        src = s.args[0] if s.args else TensorRef("?")
        if id(s) not in in_producer:
            out.append(Diagnostic(path, s.line, s.col, "transpose-place",
                                  "a Transpose outside the producer warpgroup: the consumers read V^T tiles, the "
                                  "producer makes them from the tiles it loads",
                                  "move `Compute Transpose V_shared and get Vt_shared` into the producer's pipelined "
                                  "loop, right after `Copy V ... from global to shared`"))
            continue
        loop = in_loop.get(id(s))
        if loop is None:
            out.append(Diagnostic(path, s.line, s.col, "transpose-place",
                                  "a Transpose outside the producer's pipelined loop: each V tile of the ring is "
                                  "transposed once, after its copy",
                                  "put it in the `for j = 0:N with stages ...` loop, after the Copy of V"))
            continue
        copies = [c for c in walk(loop.body) if isinstance(c, Copy) and c.src == "global" and c.dst == "shared"]
        copied = {f"{c.tensor.base}_shared": c for c in copies}
        if src.name not in copied:
            out.append(Diagnostic(path, s.line, src.col or s.col, "transpose-operand",
                                  f"Transpose {src.name}: the producer's loop copies no such tile (it transposes "
                                  "the V tile it loads)",
                                  "write `Compute Transpose V_shared and get Vt_shared` after `Copy V (BN, HeadDim) "
                                  "... from global to shared`"))
            continue
        if src.transposed or src.name in score_b:
            out.append(Diagnostic(path, s.line, src.col or s.col, "transpose-operand",
                                  f"Transpose {src.name}{'.T' if src.transposed else ''}: only V (the P·V GEMM's "
                                  "tile, as loaded) is transposed; the score GEMM reads K as is (K_shared.T is "
                                  "already K-major)",
                                  "transpose the V tile: `Compute Transpose V_shared and get Vt_shared`"))
            continue
        body = list(walk(loop.body))
        if body.index(s) < body.index(copied[src.name]):
            out.append(Diagnostic(path, s.line, s.col, "transpose-place",
                                  f"Transpose {src.name} before the Copy that fills it in this iteration",
                                  f"move the Transpose after `Copy {src.base} ... from global to shared`"))
        if not s.result or TensorRef(s.result).level != "shared":
            out.append(Diagnostic(path, s.line, s.col, "transpose-operand",
                                  f"the transpose of {src.name} goes to a shared tile the consumers read: name it "
                                  f"`..._shared`, got {s.result!r}",
                                  f"write `Compute Transpose {src.name} and get {src.base}t_shared`"))
            continue
        reader = pv_reads.get(s.result)
        if reader is None:
            out.append(Diagnostic(path, s.line, s.col, "transpose-operand",
                                  f"no P·V GEMM reads {s.result}: the transpose is V's, for the P·V GEMM",
                                  f"write `Compute GEMM P, {s.result}.T and accumulate O_register`"))
        elif not reader.args[1].transposed:
            b = reader.args[1]
            out.append(Diagnostic(path, reader.line, b.col or reader.col, "transpose-read",
                                  f"{s.result} is V transposed, (HeadDim, BN): the P·V GEMM reads it K-major as "
                                  f"{s.result}.T",
                                  f"write `Compute GEMM {reader.args[0].name}, {s.result}.T and accumulate "
                                  f"{reader.result}`"))
        if src.name in pv_reads:
            g = pv_reads[src.name]
            out.append(Diagnostic(path, g.line, g.args[1].col or g.col, "transpose-read",
                                  f"the P·V GEMM reads {src.name}, which the producer transposes into {s.result}: "
                                  "it would read V in the wrong major order",
                                  f"read the transposed tile: `Compute GEMM {g.args[0].name}, {s.result}.T ...`"))
    return out


def with_v_transpose(program: Program, form: str) -> Program:
    """A sketch with ``form``'s statements, where it states none (v_transpose_of is None): "producer" adds
    `Compute Transpose V_shared and get Vt_shared` after the Copy of V in the producer's pipelined loop and makes the
    P·V GEMMs read `Vt_shared.T`; "runtime" leaves the sketch as it is (the caller's V^T is the default reading of a
    sketch that states nothing: its kernel's source stays as it was). A sketch that states a form is returned as is."""
    if form not in ("producer", "runtime"):
        raise ValueError(f"unknown V transpose {form!r} (producer or runtime)")
    if form == "runtime" or v_transpose_of(program) is not None:
        return program
    pv = [g for block in _blocks(program, "consumer") for g in _pv_gemms(block.body)]
    if not pv:
        return program
    v = pv[0].args[1]
    vt = f"{v.base}t_shared"

    def producer(statements):
        out = []
        for s in statements:
            if isinstance(s, For) and s.stages is not None:
                body = []
                for c in s.body:
                    body.append(c)
                    if isinstance(c, Copy) and c.src == "global" and c.dst == "shared" and \
                            f"{c.tensor.base}_shared" == v.name:
                        body.append(Compute("Transpose", (TensorRef(v.name, line=c.line),), result=vt, mode="get",
                                            line=c.line, col=c.col))
                s = replace(s, body=type(s.body)(body))
            out.append(s)
        return out

    def consumer(statements):
        out = []
        for s in statements:
            if hasattr(s, "body") and not isinstance(s, Compute):
                s = replace(s, body=type(s.body)(consumer(s.body)))
            elif isinstance(s, Compute) and s.op_key == "gemm" and len(s.args) == 2 and s.args[1].name == v.name \
                    and s.args[0].level != "shared":
                b = s.args[1]
                s = replace(s, args=(s.args[0], TensorRef(vt, True, line=b.line, col=b.col)))
            out.append(s)
        return out

    statements = []
    for s in program.statements:
        if isinstance(s, Warpgroup) and s.role == "producer":
            s = replace(s, body=type(s.body)(producer(s.body)))
        elif isinstance(s, Warpgroup) and s.role == "consumer":
            s = replace(s, body=type(s.body)(consumer(s.body)))
        statements.append(s)
    return replace(program, statements=type(program.statements)(statements))
