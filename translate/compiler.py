"""TL program + kernel parameters + GPU profile -> one CuTe C++ kernel (``generate``).

Three passes:
1. analysis: the roles of the tensors (Q, K, V, O) from the dataflow — the score GEMM reads Q and
   K^T from shared memory, the accumulating GEMM reads V, the register->global copy writes O;
2. lowering: each TL statement becomes an op that declares the shared buffers it reads and writes
   (translate/ir.py); a few ops are hoisted (running softmax statistics, Q kept in registers);
3. the dependency pass (translate/schedule.py) places waits and barriers, then one emitter per
   statement kind prints the code (translate/emitters.py) in the program's own order.
"""
from __future__ import annotations

from tl.ast import Allocate, Compute, Copy, For, If, Program, Reshape, walk
from tl.layout import layout_of
from tl.phase import phase_of
from tl.pipelines import has_roles
from tl.printer import format_statement
from translate import emitters as em
from translate.ir import Cond, Loop, Op, Write, expr_eval, expr_symbols
from translate.kernel import PREAMBLE, GeneratedKernel, TranslationError, sketch_hash
from translate.params import KernelParams, validate
from translate.schedule import schedule
from translate.sm90.frame import wgmma_declarations
from translate.sm90.preamble import HOPPER_PREAMBLE
from kernel_abi.spec import KernelSpec, Problem


SCALE_SYMBOLS = ("scale", "softmax_scale", "sm_scale", "scale_factor", "softmax_scale_log2")
ELEMENTWISE_OPS = ("multiply", "divide", "add", "subtract")
KNOWN_OPS = ("GEMM", "Softmax", "Mask", "Multiply", "Divide", "Add", "Subtract")


def generate(program: Program, params: KernelParams, profile, spec: KernelSpec) -> GeneratedKernel:
    """Translate ``program`` for ``spec`` with ``params`` on ``profile``; TranslationError if it cannot.

    A sketch with warpgroup roles becomes a warp-specialised Hopper kernel (translate/sm90); a paper-style
    sketch becomes the FA2-style kernel, with wgmma GEMMs when ``mma_atom`` is SM90_GMMA.
    """
    if phase_of(program) == "decode" or getattr(spec, "phase", "prefill") == "decode":
        from translate.decode.generate import generate_decode
        return generate_decode(program, params, profile, spec)
    warp_specialized = has_roles(program.statements)
    problems = layout_problems(program, spec, warp_specialized)
    problems += validate(params, profile, _representative_problem(spec), warp_specialized=warp_specialized)
    if warp_specialized and spec.dtype == "fp8":   # a sketch that states how V is transposed pins v_transpose
        from tl.vtranspose import v_transpose_of
        from translate.params_sm90 import v_transpose_sketch_reasons

        problems += v_transpose_sketch_reasons(params, v_transpose_of(program))
    if problems:
        raise TranslationError("parameters rejected: " + "; ".join(problems))
    if warp_specialized:
        from translate.sm90 import generate_warp_specialized
        return generate_warp_specialized(program, params, profile, spec)
    return _Compiler(program, params, profile, spec).run()


def layout_problems(program: Program, spec: KernelSpec, warp_specialized: bool) -> list[str]:
    """Why a sketch cannot build ``spec``'s layout: the sketch states one (tl/layout.py), the spec another; or
    packed sequences asked of a kernel without the warp-specialised tile scheduler that walks them."""
    stated = layout_of(program)
    problems = []
    if stated != spec.layout:
        problems.append(f"the sketch states the {stated} layout (the offsets of its global tensors) but the kernel "
                        f"is asked for {spec.layout}")
    if spec.layout != "dense" and not warp_specialized:
        problems.append(f"packed sequences ({spec.layout}) are built by the warp-specialised Hopper kernel, whose "
                        "scheduler walks them: use a sketch with warpgroup roles (tl/sketches/hopper)")
    from tl.vtranspose import v_transpose_of

    v_form = v_transpose_of(program) if warp_specialized else None
    if v_form is not None and spec.dtype != "fp8":
        problems.append(f"the sketch states the {v_form} transpose of V, which FP8 kernels take (8-bit wgmma "
                        f"operands are K-major); a {spec.dtype} kernel reads V as given")
    features = getattr(spec, "features", ())
    if features and not warp_specialized:
        problems.append(f"{', '.join(features)}: built by the warp-specialised Hopper kernels only (a sketch with "
                        "warpgroup roles, tl/sketches/hopper)")
    return problems


def _representative_problem(spec: KernelSpec) -> Problem:
    heads_kv = {"mha": 8, "mla": 8, "gqa": 2, "mqa": 1}[spec.variant]
    return Problem(spec.variant, 1, 8, heads_kv, 1024, 1024, spec.d_qk, spec.d_v, spec.causal, spec.dtype)


def stmt_text(st) -> str:
    """One-line rendering of a TL statement for the comments of the emitted code."""
    if isinstance(st, For):
        return f"for {st.var} = {st.start}:{st.stop}"
    if isinstance(st, If):
        return f"if {st.condition}"
    return format_statement(st)


class _Compiler:
    def __init__(self, program: Program, params: KernelParams, profile, spec: KernelSpec):
        self.program, self.params, self.profile, self.spec = program, params, profile, spec
        self.async_copies = params.g2s_atom.startswith("SM80_CP_ASYNC")
        self.num_env = {"BM": params.block_m, "BN": params.block_n, "HeadDim": spec.d_qk,
                        "HeadDimQK": spec.d_qk, "HeadDimV": spec.d_v, "block_idx": 0,
                        "seq_len": 1 << 20, "kv_len": 1 << 20, "seqlen_q": 1 << 20, "seqlen_k": 1 << 20}
        self.cpp_symbols = {"BM": "kBlockM", "BN": "kBlockN", "HeadDim": "kHeadDimQK", "HeadDimQK": "kHeadDimQK",
                            "HeadDimV": "kHeadDimV", "seq_len": "seqlen_q", "kv_len": "seqlen_k",
                            "seqlen_q": "seqlen_q", "seqlen_k": "seqlen_k", "N": "n_tiles", "block_idx": "m_block"}

    # ---- pass 1: roles --------------------------------------------------------------------------------
    def analyse(self) -> None:
        stmts = list(walk(self.program.statements))
        self.globals = {s.name: s for s in stmts if isinstance(s, Allocate) and s.level == "global"}
        self.registers = {s.name for s in stmts if isinstance(s, Allocate) and s.level == "register"}
        self.roles: dict[str, str] = {}
        self.score_gemm = self.pv_gemm = self.store = None
        for s in stmts:
            if isinstance(s, Compute) and s.op_key == "gemm":
                if len(s.args) != 2 or not s.result:
                    raise TranslationError("GEMM needs two operands and a result (and get R / and accumulate R)", s.line)
                a, b = s.args
                if a.level == "shared" and b.level == "shared":
                    if self.score_gemm is not None:
                        raise TranslationError("only one score GEMM (Q_shared, K_shared.T) is supported", s.line)
                    if not b.transposed:
                        raise TranslationError(
                            f"GEMM layout error: {b.name} is stored (BN, HeadDim); the score GEMM needs {b.name}.T",
                            s.line)
                    self.score_gemm = s
                    self._role(a.base, "q", s.line)
                    self._role(b.base, "k", s.line)
                elif a.level == "shared" or a.name in self.globals:
                    raise TranslationError(f"GEMM operand {a.name}: unsupported operand placement", s.line)
                else:
                    if b.level != "shared":
                        raise TranslationError(f"GEMM operand {b.name} must be in shared memory (copy it first)", s.line)
                    if b.transposed:
                        raise TranslationError(
                            f"GEMM layout error: {b.name} is (BN, HeadDimV) and multiplies P (BM, BN) as is; "
                            f"drop the .T", s.line)
                    if self.pv_gemm is not None:
                        raise TranslationError("only one accumulating GEMM (P, V_shared) is supported", s.line)
                    self.pv_gemm = s
                    self._role(b.base, "v", s.line)
            elif isinstance(s, Copy) and s.src == "register" and s.dst == "global":
                self.store = s
                self._role(s.tensor.base, "o", s.line)
        if self.score_gemm is None:
            raise TranslationError("no score GEMM found (Compute GEMM Q_shared, K_shared.T and get S)")
        if self.pv_gemm is None:
            raise TranslationError("no output GEMM found (Compute GEMM S, V_shared and accumulate O_register)")
        if self.store is None:
            raise TranslationError("the output is never written back (Copy O_register from register to global)")
        for name, role in self.roles.items():
            if name not in self.globals:
                raise TranslationError(f"{name} is used as {role.upper()} but never allocated in global memory "
                                       f"(Allocate {name} in global ...)", self.score_gemm.line)
        self.buffer_role = {f"{n}_shared": r for n, r in self.roles.items() if r != "o"}
        self.q_buffer = next(b for b, r in self.buffer_role.items() if r == "q")
        self.k_buffer = next(b for b, r in self.buffer_role.items() if r == "k")
        self.v_buffer = next(b for b, r in self.buffer_role.items() if r == "v")
        self.has_mask = any(isinstance(s, Compute) and s.op_key == "mask" for s in stmts)
        if self.spec.causal and not self.has_mask:
            raise TranslationError("a causal kernel needs `Compute Mask S` after the score GEMM; the sketch has none")
        self.explicit_q_regs = any(isinstance(s, Copy) and s.src == "shared" and s.dst == "register"
                                   for s in stmts)
        self.q_in_regs = self.params.q_in_regs or self.explicit_q_regs

    def _role(self, name: str, role: str, line: int) -> None:
        if self.roles.get(name, role) != role:
            raise TranslationError(f"{name} plays two roles ({self.roles[name]} and {role})", line)
        self.roles[name] = role

    # ---- pass 2: lowering -----------------------------------------------------------------------------
    def lower(self, stmts, loop_var: str | None) -> list:
        out = []
        for s in stmts:
            text = stmt_text(s)
            if isinstance(s, For):
                self._check_symbols(s.start, s.line, s.var)
                self._check_symbols(s.stop, s.line, s.var)
                kv = any(x is self.score_gemm for x in walk(s.body))
                out.append(Loop(s.var, s.start, s.stop, self.lower(s.body, s.var), s, text, kv_loop=kv))
            elif isinstance(s, If):
                self._check_symbols(s.condition, s.line, loop_var)
                out.append(Cond(s.condition, self.lower(s.body, loop_var), s, text))
            elif isinstance(s, Allocate):
                out.append(self._lower_allocate(s, text))
            elif isinstance(s, Copy):
                out.append(self._lower_copy(s, text, loop_var))
            elif isinstance(s, Compute):
                out.append(self._lower_compute(s, text))
            elif isinstance(s, Reshape):
                if s.name not in self.registers and s.name != self.score_gemm.result:
                    raise TranslationError(f"Reshape of unknown register tensor {s.name!r}", s.line)
                if (s.src_layout[:1], s.dst_layout[:1]) != (("MMA_C",), ("MMA_A",)):
                    raise TranslationError("only the accumulator->operand reshape (MMA_C ... to MMA_A ...) is "
                                           "supported", s.line)
                out.append(Op("reshape", s, text, data={"name": s.name}))
            else:
                raise TranslationError(f"unsupported statement {type(s).__name__}", getattr(s, "line", 0))
        return out

    def _check_symbols(self, text: str, line: int, loop_var: str | None) -> None:
        known = set(self.cpp_symbols) | ({loop_var} if loop_var else set())
        for sym in expr_symbols(text, line):
            if sym not in known:
                raise TranslationError(f"unresolved symbol {sym!r} in {text!r} (known: {', '.join(sorted(known))})",
                                       line)

    def _eval_shape(self, dims, line: int) -> list[int]:
        out = []
        for d in dims:
            for sym in expr_symbols(d, line):
                if sym not in self.num_env:
                    raise TranslationError(f"unresolved symbol {sym!r} in shape ({', '.join(dims)})", line)
            out.append(expr_eval(d, self.num_env, line))
        return out

    def _lower_allocate(self, s: Allocate, text: str) -> Op:
        if s.level == "global":
            role = self.roles.get(s.name)
            if role is None:
                return Op("alloc_shared", s, text, data={"name": f"{s.name} (not used by the attention dataflow)"})
            rows, cols = self._eval_shape(s.shape, s.line)[-2:] if len(s.shape) >= 2 else (0, 0)
            want = self.spec.d_qk if role in ("q", "k") else self.spec.d_v
            if cols != want:
                raise TranslationError(f"{s.name} ({role.upper()}) has head dim {want} for this kernel "
                                       f"but is allocated with {cols} columns", s.line)
            return Op("alloc_global", s, text, data={"name": s.name, "role": role})
        if s.level == "register":
            if len(s.shape) != 2:
                raise TranslationError(f"register tensor {s.name} must be 2-D (BM, cols)", s.line)
            rows, cols = self._eval_shape(s.shape, s.line)
            if rows != self.params.block_m:
                raise TranslationError(f"register tensor {s.name} must have BM rows, got {rows}", s.line)
            if s.name == self.pv_gemm.result:
                if cols != self.spec.d_v:
                    raise TranslationError(f"{s.name} accumulates P·V: it needs HeadDimV = {self.spec.d_v} "
                                           f"columns, got {cols}", s.line)
                cols_cpp = "kHeadDimV"
            elif cols == self.params.block_n:
                cols_cpp = "kBlockN"
            else:
                raise TranslationError(f"register tensor {s.name} ({rows}, {cols}) matches no GEMM result", s.line)
            accumulate = s.name == self.pv_gemm.result
            return Op("alloc_register", s, text, data={"name": s.name, "cols_cpp": cols_cpp, "accumulator": accumulate})
        return Op("alloc_shared", s, text, data={"name": s.name})

    def _lower_copy(self, s: Copy, text: str, loop_var: str | None) -> Op:
        pair = (s.src, s.dst)
        if pair == ("global", "shared"):
            base = s.tensor.base
            role = self.roles.get(base)
            if role not in ("q", "k", "v"):
                raise TranslationError(f"{base} is copied to shared memory but no GEMM reads {base}_shared", s.line)
            if s.shape:
                rows, cols = self._eval_shape(s.shape, s.line)
                want_rows = self.params.block_m if role == "q" else self.params.block_n
                want_cols = self.spec.d_qk if role in ("q", "k") else self.spec.d_v
                if (rows, cols) != (want_rows, want_cols):
                    raise TranslationError(
                        f"{base} tiles are ({'BM' if role == 'q' else 'BN'}, "
                        f"{'HeadDimQK' if role != 'v' else 'HeadDimV'}) = ({want_rows}, {want_cols}) "
                        f"for this kernel, the statement says ({rows}, {cols})", s.line)
            if s.coordinate:
                tile = s.coordinate[0][1]
            else:
                tile = "block_idx" if role == "q" else (loop_var or "0")
            self._check_symbols(tile, s.line, loop_var)
            if role == "q" and expr_symbols(tile, s.line) - {"block_idx"}:
                raise TranslationError("the Q tile must be addressed by block_idx", s.line)
            return Op("copy_g2s", s, text, writes=(Write(f"{base}_shared", tile),), async_copy=self.async_copies,
                      data={"buffer": f"{base}_shared", "role": role, "global": base, "tile": tile})
        if pair == ("shared", "register"):
            if self.roles.get(s.tensor.base) != "q":
                raise TranslationError("only Q can be kept in registers; K and V are loaded inside the GEMMs", s.line)
            return Op("load_q_regs", s, text, reads=(self.q_buffer,))
        if pair == ("register", "global"):
            src = s.tensor.name
            if src != self.pv_gemm.result:
                raise TranslationError(f"only the output accumulator ({self.pv_gemm.result}) can be written back",
                                       s.line)
            return Op("store_o", s, text, writes=(Write(self.q_buffer, "0"),),
                      data={"src": src, "global": s.tensor.base, "reads_back": True})
        raise TranslationError(f"Copy from {s.src} to {s.dst} is not supported (supported: global->shared, "
                               "shared->register for Q, register->global for the output)", s.line)

    def _lower_compute(self, s: Compute, text: str) -> Op:
        key = s.op_key
        if key == "gemm":
            if s is self.score_gemm:
                reads = (self.k_buffer,) if self.q_in_regs else (self.q_buffer, self.k_buffer)
                return Op("gemm_ss", s, text, reads=reads,
                          data={"result": s.result, "mode": s.mode, "k_buffer": self.k_buffer,
                                "q_in_regs": self.q_in_regs})
            return Op("gemm_rs", s, text, reads=(self.v_buffer,),
                      data={"a": s.args[0].name, "result": s.result, "mode": s.mode, "v_buffer": self.v_buffer})
        if key == "softmax":
            target = s.args[0].name
            mx, sm = (list(s.with_) + [f"{target}_max", f"{target}_sum"])[:2] if s.with_ else \
                (f"{target}_max", f"{target}_sum")
            self.stats = (mx, sm)
            return Op("softmax", s, text, data={"target": target, "acc": self.pv_gemm.result, "max": mx, "sum": sm})
        if key == "mask":
            return Op("mask", s, text, data={"target": s.args[0].name})
        if key in ELEMENTWISE_OPS:
            if len(s.args) != 2:
                raise TranslationError(f"Compute {s.op} needs two operands", s.line)
            a, b = s.args
            result = s.result or a.name
            stats = getattr(self, "stats", (None, None))
            if key == "divide" and b.name == stats[1]:
                if result != a.name:
                    raise TranslationError("the normalised output must replace its accumulator (and get new O)",
                                           s.line)
                return Op("normalize", s, text, data={"target": a.name, "divisor": b.name})
            scalar, is_scale = self._scalar(b.name, s.line)
            if key == "multiply" and a.name == self.score_gemm.result and not is_scale:
                raise TranslationError("scores may only be multiplied by the softmax scale", s.line)
            return Op("elementwise", s, text, data={"src": a.name, "result": result, "op": key,
                                                      "scalar_cpp": scalar, "is_softmax_scale": is_scale})
        raise TranslationError(f"unknown operator {s.op!r}; the translator knows: {', '.join(KNOWN_OPS)}", s.line)

    def _scalar(self, name: str, line: int) -> tuple[str, bool]:
        try:
            return f"{float(name)!r}f", False
        except ValueError:
            pass
        if name in SCALE_SYMBOLS:
            return "kSoftmaxScale", True
        if name in self.cpp_symbols:
            return f"float({self.cpp_symbols[name]})", False
        raise TranslationError(f"unresolved symbol {name!r}: not a tensor, a number, or the softmax scale "
                               f"({', '.join(SCALE_SYMBOLS)})", line)

    # ---- hoisting and assembly --------------------------------------------------------------------------
    def hoist(self, nodes: list) -> list:
        def contains(node, pred) -> bool:
            if isinstance(node, Op):
                return pred(node)
            return any(contains(n, pred) for n in node.body)

        out = []
        stats_done = qregs_done = exit_done = False
        for node in nodes:
            if self.spec.causal and not exit_done and not (isinstance(node, Op) and node.kind in
                                                           ("alloc_global", "alloc_shared")):
                out.append(Op("early_exit", None, "causal early exit (derived from the mask: no TL line of its own)",
                              data={"global": self.store.tensor.base}))
                exit_done = True
            if not stats_done and contains(node, lambda o: o.kind == "softmax"):
                sm = next(o for o in _ops([node]) if o.kind == "softmax")
                out.append(Op("row_stats", sm.stmt, sm.tl_text + "  (running statistics, hoisted out of the loop)",
                              data={"max": sm.data["max"], "sum": sm.data["sum"]}))
                stats_done = True
            if self.params.q_in_regs and not self.explicit_q_regs and not qregs_done and \
                    contains(node, lambda o: o.kind == "gemm_ss"):
                g = next(o for o in _ops([node]) if o.kind == "gemm_ss")
                out.append(Op("load_q_regs", g.stmt, g.tl_text + "  (Q operand loaded to registers once: q_in_regs)",
                              reads=(self.q_buffer,)))
                qregs_done = True
            out.append(node)
        return out

    def run(self) -> GeneratedKernel:
        self.analyse()
        nodes = self.hoist(self.lower(self.program.statements, None))
        in_loop = {w.buffer for n in nodes if isinstance(n, Loop) for o in _ops(n.body) for w in o.writes}
        stages = {b: (self.params.kv_stages if b in in_loop and b != self.q_buffer else 1)
                  for b in self.buffer_role}
        schedule(nodes, stages, dict(self.num_env))
        gmma = self.params.is_gmma
        if gmma:
            from translate.sm90 import plain
        ctx = em.EmitContext(spec=self.spec, params=self.params, roles=self.roles, buffers=self.buffer_role,
                             stages=stages, cpp_symbols=self.cpp_symbols, has_mask_stmt=self.has_mask,
                             score_gemm=next(o for o in _ops(nodes) if o.kind == "gemm_ss"),
                             overrides=plain.EMITTERS if gmma else {})
        statements = em.emit_nodes(nodes, ctx)
        name = f"attn_{self.spec.label()}_{self.params.key()}_t{sketch_hash(self.program)}"
        sk, sv = stages[self.k_buffer], stages[self.v_buffer]
        header = [f"// kernel {name}",
                  f"// spec: {self.spec}", f"// params: {self.params}",
                  f"// target: {self.profile.name} ({self.profile.nvcc_arch})", "// TL program:"]
        header += [f"//   {i + 1:2d}  {ln}" for i, ln in enumerate(_program_lines(self.program.statements))]
        declared = wgmma_declarations(self.spec, self.params) if gmma else []
        body_lines = header + declared + [f"namespace {name}_ns {{", "using namespace cute;", ""]
        types = plain.kernel_types(self.spec, self.params, sk, sv) if gmma else \
            em.kernel_types(self.spec, self.params, sk, sv)
        setup = plain.kernel_setup(self.params) if gmma else em.kernel_setup()
        body_lines += types + [""]
        body_lines += em.kernel_signature(name)
        body_lines += em._indent(setup + [""] + statements)
        body_lines += ["}", "", f"}}  // namespace {name}_ns", ""]
        d_qk, d_v, p = self.spec.d_qk, self.spec.d_v, self.params
        if gmma:
            smem = plain.smem_bytes(p, self.spec, sk, sv)
            threads, preamble = 128 * (p.block_m // 64), HOPPER_PREAMBLE
        else:
            smem = (max(p.block_m * d_qk, p.block_m * d_v) + sk * p.block_n * d_qk + sv * p.block_n * d_v) * 2
            threads, preamble = p.num_threads, PREAMBLE
        return GeneratedKernel(name=name, preamble=preamble, body="\n".join(body_lines),
                               num_threads=threads, smem_bytes=smem, block_m=p.block_m, block_n=p.block_n,
                               spec=self.spec, params=p)


def _ops(nodes):
    from translate.ir import iter_ops
    return iter_ops(nodes)


def _program_lines(stmts, depth: int = 0) -> list[str]:
    out = []
    for s in stmts:
        out.append("    " * depth + stmt_text(s))
        if isinstance(s, (For, If)):
            out += _program_lines(s.body, depth + 1)
            out.append("    " * depth + "end")
    return out
