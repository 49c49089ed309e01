"""Warp-specialised TL programs -> the producer's and the consumers' ops (translate/sm90/ir.py).

Roles of the tensors come from the consumer's dataflow: a GEMM of two shared operands (the second
read ``.T``) is a score GEMM, reading Q and K; a GEMM whose A operand is a register tile reads V; the
register -> global copy writes O. The producer may only fill those buffers: Q once (its tile is
``block_idx``), K and V in a ``with stages`` loop, in tile order (the consumers take tiles from the ring
in the order they were filled and number them by that order, which is what the causal mask needs).

Register tensors are tracked by physical copy: ``Reshape S ... and get P`` makes the operand copy P
(16-bit, A layout), ``Reshape S ...`` in place makes a copy that the name S stands for until a GEMM
writes S again.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tl.ast import Allocate, Compute, Copy, For, If, Program, Reshape, Warpgroup, walk
from tl.expr import ExprError, evaluate
from tl.printer import format_statement
from tl.vtranspose import TRANSPOSE, transposes, v_transpose_of
from translate.kernel import TranslationError
from translate.sm90.ir import Cond, Loop, Op

ELEMENTWISE = ("multiply", "divide", "add", "subtract")
SCALE_SYMBOLS = ("scale", "softmax_scale", "sm_scale", "scale_factor")
ORDER_CHECK_TILE_COUNTS = (1, 2, 5)


def stmt_text(st) -> str:
    if isinstance(st, For):
        return f"for {st.var} = {st.start}:{st.stop}" + (f" with stages {st.stages}" if st.stages else "")
    if isinstance(st, If):
        return f"if {st.condition}"
    if isinstance(st, Warpgroup):
        return f"warpgroup {st.role}"
    return format_statement(st)


@dataclass
class Lowered:
    producer: list
    consumer: list
    roles: dict                       # global tensor name -> q, k, v, o
    stages: int
    stages_text: str                  # the TL's spelling (a number, or the symbol it resolved)
    pv_acc: str                       # physical name of the output accumulator
    score_accs: set = field(default_factory=set)
    p_tensors: set = field(default_factory=set)   # physical names of operand (A-layout) copies
    has_mask: bool = False
    # how the sketch states V's transpose (tl/vtranspose.py): "producer", "runtime" (V^T copied from global) or None
    v_form: str | None = None


class WsLowering:
    def __init__(self, program: Program, params, spec):
        self.program, self.params, self.spec = program, params, spec

    # ---- analysis ------------------------------------------------------------------------------------
    def _blocks(self) -> tuple[Warpgroup, Warpgroup]:
        blocks = {s.role: s for s in self.program.statements if isinstance(s, Warpgroup)}
        if set(blocks) != {"producer", "consumer"}:
            raise TranslationError("a warp-specialised sketch needs one `warpgroup producer` and one "
                                   "`warpgroup consumer` block (tune check explains what is missing)")
        for s in self.program.statements:
            if not isinstance(s, Warpgroup) and not (isinstance(s, Allocate) and s.level == "global"):
                raise TranslationError("only `Allocate ... in global` may stand outside the warpgroup blocks", s.line)
        return blocks["producer"], blocks["consumer"]

    def analyse(self) -> None:
        self.producer_block, self.consumer_block = self._blocks()
        self.globals = {s.name: s for s in self.program.statements if isinstance(s, Allocate)}
        self.roles: dict[str, str] = {}
        self.v_form = v_transpose_of(self.program)
        self.transposed = transposes(self.program)   # Vt_shared -> the producer's Transpose of V_shared
        gemms = [s for s in walk(self.consumer_block.body) if isinstance(s, Compute) and s.op_key == "gemm"]
        if not gemms:
            raise TranslationError("the consumer has no GEMM")
        for g in gemms:
            if len(g.args) != 2 or not g.result:
                raise TranslationError("GEMM needs two operands and a result (and get R / and accumulate R)", g.line)
            a, b = g.args
            if a.level == "shared" and b.level == "shared":
                if not b.transposed:
                    raise TranslationError(f"GEMM layout error: {b.name} is stored (BN, HeadDim); the score GEMM "
                                           f"needs {b.name}.T", g.line)
                self._role(a.base, "q", g.line)
                self._role(b.base, "k", g.line)
            elif b.level == "shared" and a.level != "shared":
                made = self.transposed.get(b.name)
                if made is not None:   # the producer's transpose of V (tl/vtranspose.py): V's role is the source's
                    if not b.transposed:
                        raise TranslationError(f"{b.name} is V transposed, (HeadDimV, BN): read it K-major as "
                                               f"{b.name}.T", g.line)
                    self._role(made.args[0].base, "v", g.line)
                    continue
                if any(t.args and t.args[0].name == b.name for t in self.transposed.values()):
                    raise TranslationError(f"the P·V GEMM reads {b.name}, which the producer transposes: read the "
                                           "transposed tile (`... .T`)", g.line)
                if b.transposed and self.spec.dtype != "fp8":
                    raise TranslationError(f"GEMM layout error: {b.name} is (BN, HeadDimV) and multiplies P as is; "
                                           "drop the .T", g.line)
                self._role(b.base, "v", g.line)
            else:
                raise TranslationError(f"GEMM {a.name}, {b.name}: the second operand must be in shared memory", g.line)
        stores = [s for s in walk(self.consumer_block.body) if isinstance(s, Copy) and s.src == "register"
                  and s.dst == "global"]
        if len(stores) != 1:
            raise TranslationError("the consumer must write the output back once (Copy O_register from register "
                                   "to global)")
        self._role(stores[0].tensor.base, "o", stores[0].line)
        for name, role in self.roles.items():
            if name not in self.globals:
                raise TranslationError(f"{name} is used as {role.upper()} but never allocated in global memory")
        for role in ("q", "k", "v"):
            if role not in self.roles.values():
                raise TranslationError(f"no GEMM reads the {role.upper()} tile")
        self.buffer_role = {f"{n}_shared": r for n, r in self.roles.items() if r != "o"}
        self.pv_results = {g.result for g in gemms if g.args[0].level != "shared"}
        self.score_results = {g.result for g in gemms if g.args[0].level == "shared"}
        if len(self.pv_results) != 1:
            raise TranslationError("every P·V GEMM must accumulate into the same output tile")
        if self.pv_results & self.score_results:
            raise TranslationError("the score GEMM and the P·V GEMM need different result tiles")
        if stores[0].tensor.name not in self.pv_results:
            raise TranslationError(f"only the output accumulator ({next(iter(self.pv_results))}) can be written "
                                   "back", stores[0].line)
        computes = [s for s in walk(self.consumer_block.body) if isinstance(s, Compute)]
        masks = [s for s in computes if s.op_key == "mask"]
        self.has_mask = bool(masks)
        if self.spec.causal and not self.has_mask:
            raise TranslationError("a causal kernel needs `Compute Mask S` after the score GEMM; the sketch has none")
        self._check_options(masks, computes)

    def _check_options(self, masks: list, computes: list) -> None:
        """The spec's options (kernel_abi.spec: local, softcap, sinks) and the sketch's statements agree: a window
        is masked by `Compute Mask S, Window`, the scores soft-capped by `Compute Softcap S`, the sinks joined by
        `Compute Sink O with Smax and Ssum`; a statement for an option the spec lacks is an error too."""
        windowed = [m for m in masks if len(m.args) == 2 and m.args[1].name.lower() == "window"]
        other = [m for m in masks if len(m.args) == 2 and m.args[1].name.lower() != "window"]
        if other:
            raise TranslationError(f"`Compute Mask {other[0].args[0].name}, {other[0].args[1].name}`: the second operand "
                                   "of a Mask can only be Window (the sliding window)", other[0].line)
        wants = {"local": ("a sliding window", windowed, "Compute Mask S, Window"),
                 "softcap": ("soft-capping", [c for c in computes if c.op_key == "softcap"], "Compute Softcap S"),
                 "sinks": ("attention sinks", [c for c in computes if c.op_key == "sink"],
                           "Compute Sink O_register with Smax and Ssum")}
        for option, (what, found, statement) in wants.items():
            if getattr(self.spec, option, False) and not found:
                raise TranslationError(f"the kernel spec has {what}; the sketch states none (`{statement}`)")
            if found and not getattr(self.spec, option, False):
                raise TranslationError(f"the sketch states {what} but the kernel spec has none (build it for a "
                                       f"spec with {option})", found[0].line)
        if self.spec.local and len(windowed) != len(masks):
            raise TranslationError("a local kernel masks every score tile by its window: write `, Window` on every "
                                   "Mask", next(m for m in masks if m not in windowed).line)

    def _role(self, name: str, role: str, line: int) -> None:
        if self.roles.get(name, role) != role:
            raise TranslationError(f"{name} plays two roles ({self.roles[name]} and {role})", line)
        self.roles[name] = role

    # ---- producer ------------------------------------------------------------------------------------
    def lower_producer(self) -> tuple[list, int, str]:
        out: list = []
        stages = None
        seen_roles: list[str] = []
        for s in self.producer_block.body:
            if isinstance(s, Copy):
                role = self._producer_copy_role(s)
                if role != "q":
                    raise TranslationError(f"{s.tensor.base} tiles must be loaded in the pipelined loop "
                                           "(`for j = 0:N with stages S`)", s.line)
                tile = s.coordinate[0][1] if s.coordinate else "block_idx"
                if tile != "block_idx":
                    raise TranslationError("the Q tile must be addressed by block_idx", s.line)
                seen_roles.append(role)
                out.append(Op("tma_copy", s, stmt_text(s), data={"role": "q", "buffer": f"{s.tensor.base}_shared"}))
            elif isinstance(s, For) and s.stages is not None:
                if stages is not None:
                    raise TranslationError("the producer has one pipelined loop", s.line)
                stages = self._stages(s)
                body = []
                for c in s.body:
                    if isinstance(c, Compute) and c.op_key == TRANSPOSE:
                        body.append(self._transpose(c, body))
                        continue
                    if not isinstance(c, Copy):
                        raise TranslationError("the pipelined loop holds only the K and V copies (and V's "
                                               "transpose)", c.line)
                    role = self._producer_copy_role(c)
                    if role == "q":
                        raise TranslationError("Q is loaded once, outside the pipelined loop", c.line)
                    tile = c.coordinate[0][1] if c.coordinate else s.var
                    seen_roles.append(role)
                    body.append(Op("tma_copy", c, stmt_text(c),
                                   data={"role": role, "buffer": f"{c.tensor.base}_shared", "tile": tile}))
                self._check_tile_order(s)
                out.append(Loop(s.var, s.start, s.stop, body, s, stmt_text(s)))
            else:
                raise TranslationError("the producer holds the Q copy and one pipelined loop of K/V copies",
                                       getattr(s, "line", 0))
        for role in ("q", "k", "v"):
            if seen_roles.count(role) != 1:
                raise TranslationError(f"the producer must load {role.upper()} exactly once per tile "
                                       f"(found {seen_roles.count(role)} copies)")
        if stages is None:
            raise TranslationError("the producer has no pipelined loop (`for j = 0:N with stages kv_stages`)")
        return out, stages

    def _transpose(self, c: Compute, body: list) -> Op:
        """The producer's `Compute Transpose V_shared and get Vt_shared`, after the copy of V in the same loop."""
        src = c.args[0].name if c.args else ""
        if not any(op.data.get("buffer") == src and op.data.get("role") == "v" for op in body):
            raise TranslationError(f"Transpose {src}: it transposes the V tile copied before it in this loop", c.line)
        return Op("transpose_v", c, stmt_text(c), data={"src": src, "dst": c.result})

    def _producer_copy_role(self, s: Copy) -> str:
        if (s.src, s.dst) != ("global", "shared"):
            raise TranslationError("the producer only copies from global to shared memory", s.line)
        role = self.roles.get(s.tensor.base)
        if role not in ("q", "k", "v"):
            raise TranslationError(f"{s.tensor.base} is loaded but no consumer GEMM reads it", s.line)
        if s.shape:
            want_rows = "BM" if role == "q" else "BN"
            rows = self._num(s.shape[0], s.line)
            cols = self._num(s.shape[-1], s.line)
            want = (self.params.block_m if role == "q" else self.params.block_n,
                    self.spec.d_v if role == "v" else self.spec.d_qk)
            names = (want_rows, 'HeadDimV' if role == 'v' else 'HeadDimQK')
            if role == "v" and self.v_form == "runtime":   # the caller's V^T: (HeadDimV, BN) tiles
                want, names = want[::-1], names[::-1]
            if (rows, cols) != want:
                raise TranslationError(f"{s.tensor.base} tiles are ({names[0]}, {names[1]}) = {want} for this kernel, "
                                       f"the statement says ({rows}, {cols})", s.line)
        return role

    def _num(self, text: str, line: int) -> int:
        env = {"BM": self.params.block_m, "BN": self.params.block_n, "HeadDim": self.spec.d_qk,
               "HeadDimQK": self.spec.d_qk, "HeadDimV": self.spec.d_v}
        try:
            return int(evaluate(text, env))
        except (ExprError, TypeError, ValueError):
            raise TranslationError(f"cannot evaluate {text!r} (known: {', '.join(env)})", line) from None

    def _stages(self, loop: For) -> int:
        text = loop.stages
        if text.isdigit():
            return int(text)
        if text in ("kv_stages", "stages", "STAGES", "KV_STAGES"):
            return self.params.kv_stages
        raise TranslationError(f"unknown stage count {text!r}: write a number or kv_stages (the searched value)",
                               loop.line)

    def _check_tile_order(self, loop: For) -> None:
        for c in loop.body:
            if not isinstance(c, Copy):
                continue
            tile = c.coordinate[0][1] if c.coordinate else loop.var
            for n in ORDER_CHECK_TILE_COUNTS:
                try:
                    start, stop = int(evaluate(loop.start, {"N": n})), int(evaluate(loop.stop, {"N": n}))
                    tiles = [int(evaluate(tile, {"N": n, loop.var: j})) for j in range(start, stop)]
                except (ExprError, TypeError, ValueError):
                    raise TranslationError(f"cannot evaluate the loop bounds or the tile {tile!r} "
                                           "(they may use N and the loop variable)", c.line) from None
                if tiles != list(range(n)):
                    raise TranslationError(f"the producer must load tiles 0..N-1 in order; with N = {n} this loop "
                                           f"loads {tiles}", c.line)

    # ---- consumer ------------------------------------------------------------------------------------
    def lower_consumer(self) -> list:
        self.phys: dict[str, str] = {}        # TL register name -> physical tensor it denotes now
        self.layout: dict[str, str] = {}      # physical tensor -> "C" | "A"
        self.score_accs: set[str] = set()
        self.p_tensors: set[str] = set()
        self.masked: set[str] = set()          # score tiles masked since their GEMM (Softcap must come first)
        self.loop_depth = 0
        return self._consumer_block(self.consumer_block.body)

    def _consumer_block(self, stmts) -> list:
        out = []
        for s in stmts:
            text = stmt_text(s)
            if isinstance(s, For):
                if s.stages is not None:
                    raise TranslationError("stages belong on the producer's loop", s.line)
                self.loop_depth += 1
                body = self._consumer_block(s.body)
                self.loop_depth -= 1
                out.append(Loop(s.var, s.start, s.stop, body, s, text))
            elif isinstance(s, If):
                out.append(Cond(s.condition, self._consumer_block(s.body), s, text))
            elif isinstance(s, Allocate):
                out.append(self._allocate(s, text))
            elif isinstance(s, Compute):
                out += self._compute(s, text)
            elif isinstance(s, Reshape):
                out.append(self._reshape(s, text))
            elif isinstance(s, Copy):
                if (s.src, s.dst) != ("register", "global"):
                    raise TranslationError("consumers only write the output back (Copy O_register from register "
                                           "to global)", s.line)
                acc = self._phys(s.tensor.name, s.line)
                out.append(Op("store_o", s, text, reads=(acc,), data={"src": acc, "global": s.tensor.base}))
            else:
                raise TranslationError(f"unsupported statement {type(s).__name__} in the consumer", s.line)
        return out

    def _phys(self, name: str, line: int) -> str:
        if name not in self.phys:
            raise TranslationError(f"register tensor {name!r} is used before it is allocated or computed", line)
        return self.phys[name]

    def _allocate(self, s: Allocate, text: str) -> Op:
        if s.level != "register":
            raise TranslationError("consumers allocate register tiles only", s.line)
        if len(s.shape) != 2 or self._num(s.shape[0], s.line) != self.params.block_m:
            raise TranslationError(f"register tensor {s.name} must be (BM, cols)", s.line)
        cols = self._num(s.shape[1], s.line)
        if s.name in self.pv_results:
            if cols != self.spec.d_v:
                raise TranslationError(f"{s.name} accumulates P·V: it needs HeadDimV = {self.spec.d_v} columns", s.line)
            mma = "pv"
        elif s.name in self.score_results:
            if cols != self.params.block_n:
                raise TranslationError(f"{s.name} holds scores: it needs BN = {self.params.block_n} columns", s.line)
            mma = "qk"
            self.score_accs.add(s.name)
        else:
            raise TranslationError(f"register tensor {s.name} is the result of no GEMM", s.line)
        self.phys[s.name] = s.name
        self.layout[s.name] = "C"
        return Op("alloc_acc", s, text, writes=(s.name,), data={"name": s.name, "mma": mma, "clear": mma == "pv"})

    def _compute(self, s: Compute, text: str) -> list:
        key = s.op_key
        if key == "gemm":
            a, b = s.args
            result = s.result
            if result not in self.phys:
                raise TranslationError(f"allocate {result} before the GEMM that writes it", s.line)
            if a.level == "shared":
                self.phys[result] = result
                self.layout[result] = "C"
                return [Op("gemm", s, text, writes=(result,), reads=(result,) if s.mode == "accumulate" else (),
                           data={"mma": "qk", "a": a.name, "b": b.name, "result": result,
                                 "zero_init": s.mode != "accumulate", "buffers": (a.name, b.name)})]
            p = self._phys(a.name, s.line)
            if self.layout.get(p) != "A":
                raise TranslationError(f"{a.name} is in the accumulator layout; reshape it to the operand layout "
                                       f"(Reshape {a.name} from (MMA_C, ...) to (MMA_A, ...)) first", s.line)
            acc = self._phys(result, s.line)
            # the producer's transpose of V fills the V ring's stages (its V^T tile stands for the V_shared it was made of)
            buffer = self.transposed[b.name].args[0].name if b.name in self.transposed else b.name
            return [Op("gemm", s, text, writes=(acc,), reads=(p, acc) if s.mode == "accumulate" else (p,),
                       data={"mma": "pv", "a": p, "b": buffer, "result": acc, "zero_init": s.mode != "accumulate",
                             "buffers": (buffer,)})]
        if key == "mask":
            acc = self._score(s.args[0].name, s.line)
            self.masked.add(acc)
            return [Op("mask", s, text, reads=(acc,), writes=(acc,),
                       data={"target": acc, "causal": True, "window": len(s.args) == 2})]
        if key == "softcap":   # on the raw scores: before the tile's mask and softmax
            acc = self._score(s.args[0].name, s.line)
            if acc in self.masked:
                raise TranslationError(f"Softcap {s.args[0].name} after its Mask: soft-capping applies to the raw "
                                       "scores (put it right after the score GEMM)", s.line)
            return [Op("softcap", s, text, reads=(acc,), writes=(acc,), data={"target": acc})]
        if key == "sink":
            if self.loop_depth:
                raise TranslationError("the sink joins each row's softmax once, after the last key tile: put "
                                       "`Compute Sink` after the loop", s.line)
            target = self._phys(s.args[0].name, s.line)
            stats = getattr(self, "stats", None)
            if stats is None or tuple(s.with_) != tuple(stats):
                raise TranslationError(f"Sink needs the softmax's running max and sum: `Compute Sink {s.args[0].name} "
                                       f"with {' and '.join(stats or ('Smax', 'Ssum'))}`", s.line)
            if target != next(iter(self.pv_results)):
                raise TranslationError("Sink rescales the output accumulator: its operand is the P·V result", s.line)
            return [Op("sink", s, text, reads=(target,), writes=(target,),
                       data={"target": target, "max": stats[0], "sum": stats[1]})]
        if key == "softmax":
            acc = self._score(s.args[0].name, s.line)
            self.masked.discard(acc)   # the next GEMM into it starts a new tile
            names = (list(s.with_) + [f"{acc}_max", f"{acc}_sum"])[:2]
            self.stats = tuple(names)
            ops = []
            if not self.has_mask:   # ragged last K tile: columns >= seqlen_k get -inf before the softmax
                ops.append(Op("mask", s, text + "  (ragged K tile: columns past seqlen_k, derived)",
                              reads=(acc,), writes=(acc,), data={"target": acc, "causal": False}))
            ops.append(Op("softmax", s, text, reads=(acc,), writes=(acc,),
                          data={"target": acc, "max": names[0], "sum": names[1], "acc": next(iter(self.pv_results))}))
            return ops
        if key in ELEMENTWISE:
            a, b = s.args
            target = self._phys(a.name, s.line)
            stats = getattr(self, "stats", (None, None))
            if key == "divide" and b.name == stats[1]:
                if (s.result or a.name) != a.name:
                    raise TranslationError("the normalised output must replace its accumulator (and get new O)", s.line)
                return [Op("normalize", s, text, reads=(target,), writes=(target,),
                           data={"target": target, "divisor": b.name})]
            if key == "multiply" and b.name in SCALE_SYMBOLS and target in self.score_accs:
                raise TranslationError("the Hopper kernels fold the softmax scale into the exponent; drop the "
                                       "explicit Multiply by the scale", s.line)
            raise TranslationError(f"Compute {s.op} {a.name}, {b.name} is not supported in a consumer warpgroup "
                                   "(supported: Mask, Softmax, Divide by the softmax sum)", s.line)
        raise TranslationError(f"unknown operator {s.op!r} in the consumer (known: GEMM, Softcap, Mask, Softmax, "
                               "Sink, Divide)",
                               s.line)

    def _score(self, name: str, line: int) -> str:
        acc = self._phys(name, line)
        if acc not in self.score_accs or self.layout.get(acc) != "C":
            raise TranslationError(f"{name} is not a score tile in the accumulator layout here", line)
        return acc

    def _reshape(self, s: Reshape, text: str) -> Op:
        if (s.src_layout[:1], s.dst_layout[:1]) != (("MMA_C",), ("MMA_A",)):
            raise TranslationError("only the accumulator->operand reshape (MMA_C ... to MMA_A ...) is supported",
                                   s.line)
        src = self._score(s.name, s.line)
        dst = f"{s.result}" if s.result else f"{s.name}_A"
        self.phys[s.result or s.name] = dst
        self.layout[dst] = "A"
        self.p_tensors.add(dst)
        return Op("reshape", s, text, reads=(src,), writes=(dst,), data={"src": src, "dst": dst})

    def run(self) -> Lowered:
        self.analyse()
        producer, stages = self.lower_producer()
        consumer = self.lower_consumer()
        return Lowered(producer, consumer, self.roles, stages, str(stages), next(iter(self.pv_results)),
                       set(self.score_accs), set(self.p_tensors), self.has_mask, self.v_form)
