"""One emitter per TL statement kind: each turns a lowered op into CuTe C++ lines.

Every emitted block starts with the TL line it came from (``// TL 11: Copy V ...``) and, where the
dependency pass placed synchronisation, the reason for it. ``emit_nodes`` prints loops and ifs and
indents; ``kernel_prologue`` prints the per-config types and the thread/tile setup the statements use.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from translate.ir import Cond, Loop, Op, expr_to_cpp
from translate.kernel import TranslationError
from translate.copies import copy_row_threads

INDENT = "  "

# Roles: the four global tensors of attention, found from the dataflow by the compiler.
ROLE_DIM = {"q": "kHeadDimQK", "k": "kHeadDimQK", "v": "kHeadDimV", "o": "kHeadDimV"}
ROLE_ROWS = {"q": "kBlockM", "k": "kBlockN", "v": "kBlockN", "o": "kBlockM"}


@dataclass
class EmitContext:
    spec: object
    params: object
    roles: dict                      # TL global tensor name -> role (q, k, v, o)
    buffers: dict                    # TL shared buffer name -> role
    stages: dict                     # TL shared buffer name -> ring slots
    cpp_symbols: dict                # TL symbol -> C++ expression
    has_mask_stmt: bool
    score_gemm: Op | None = None
    masked: bool | None = None       # inside the KV loop: masked (True) / unmasked (False) copy
    loop_vars: list = field(default_factory=list)
    names: dict = field(default_factory=dict)     # TL register tensor -> C++ variable
    layouts: dict = field(default_factory=dict)   # TL register tensor -> "C" | "A" | "stat" | "scalar"
    prescaled: set = field(default_factory=set)   # score tensors already multiplied by the softmax scale
    overrides: dict = field(default_factory=dict)  # op kind -> emitter, for another MMA family (sm90/plain.py)

    def expr(self, text: str, line: int) -> str:
        syms = dict(self.cpp_symbols)
        for v in self.loop_vars:
            syms[v] = v
        return expr_to_cpp(text, syms, line)

    def reg(self, name: str, line: int) -> str:
        if name not in self.names:
            raise TranslationError(f"register tensor {name!r} is used before it is allocated or computed", line)
        return self.names[name]

    def slot_of_read(self, op: Op, buffer: str) -> str:
        tile = op.read_tiles.get(buffer, "0")
        if "{var}" in tile:
            if not self.loop_vars:
                raise TranslationError(f"{buffer}: tile depends on a loop outside any loop", op.line)
            tile = tile.format(var=self.loop_vars[-1])
        return tile

    def slot_expr(self, buffer: str, tile_cpp: str) -> str:
        s = self.stages.get(buffer, 1)
        return "0" if s == 1 else f"(({tile_cpp}) % {s})"


def comment(op_or_node) -> str:
    line = getattr(op_or_node.stmt, "line", 0)
    return f"// TL {line}: {op_or_node.tl_text}" if line else f"// {op_or_node.tl_text}"


def sync_lines(op: Op, async_proxy_reads: bool = False) -> list[str]:
    """The waits and barriers the dependency pass placed. With wgmma (``async_proxy_reads``) the tensor
    cores read shared memory through the async proxy: the cp.async data is fenced into it before the barrier."""
    out = []
    if op.wait is not None or op.barrier:
        for r in op.reasons:
            out.append(f"// dependency pass: {r}")
    if op.wait is not None:
        out.append(f"cute::cp_async_wait<{op.wait}>();")
        if async_proxy_reads:
            out.append("cutlass::arch::fence_view_async_shared();  // cp.async writes -> wgmma reads (async proxy)")
    if op.barrier:
        out.append("__syncthreads();")
    return out


# ---- statement emitters -------------------------------------------------------------------------------

def emit_alloc_global(op: Op, ctx: EmitContext) -> list[str]:
    name, role = op.data["name"], op.data["role"]
    r = role
    head = "bidh_kv" if role in ("k", "v") else "bidh"
    rows = "seqlen_q" if role in ("q", "o") else "seqlen_k"
    dim, tile_rows = ROLE_DIM[role], ROLE_ROWS[role]
    gmem_copy = "g2s_thr_v" if role in ("v", "o") else "g2s_thr_qk"
    ptr = f"{r}_ptr"
    lines = [
        f"Tensor m{name} = make_tensor(make_gmem_ptr({ptr} + bidb * {r}_batch_stride + {head} * {r}_head_stride),",
        f"                       make_shape({rows}, Int<{dim}>{{}}), make_stride({r}_row_stride, _1{{}}));",
        f"Tensor g{name} = local_tile(m{name}, Shape<Int<{tile_rows}>, Int<{dim}>>{{}}, make_coord(_, 0));"
        f"  // ({tile_rows}, {dim}, tiles)",
    ]
    if role != "o":
        lines.append(f"Tensor t{name}g{name} = {gmem_copy}.partition_S(g{name});")
        lines.append(f"Tensor t{name}c{name} = {gmem_copy}.partition_S(make_identity_tensor("
                     f"Shape<Int<{tile_rows}>, Int<{dim}>>{{}}));")
    return lines


def emit_alloc_register(op: Op, ctx: EmitContext) -> list[str]:
    name, cols = op.data["name"], op.data["cols_cpp"]
    var = f"acc_{name}"
    ctx.names[name], ctx.layouts[name] = var, "C"
    lines = [f"Tensor {var} = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<{cols}>>{{}});"]
    if op.data.get("accumulator"):
        lines.append(f"clear({var});")
    return lines


def emit_alloc_shared(op: Op, ctx: EmitContext) -> list[str]:
    return [f"// {op.data['name']} lives in the shared-memory plan above (its Copy statements size it)"]


def emit_copy_g2s(op: Op, ctx: EmitContext) -> list[str]:
    buf, role, gname = op.data["buffer"], op.data["role"], op.data["global"]
    tile_cpp = ctx.expr(op.data["tile"], op.line)
    slot = ctx.slot_expr(buf, tile_cpp)
    gmem_copy = "g2s_v" if role == "v" else "g2s_qk"
    layout = {"q": "SmemLayoutQ", "k": "SmemLayoutK", "v": "SmemLayoutV"}[role]
    tile_elems = {"q": "kSmemQElems", "k": "kTileKElems", "v": "kTileVElems"}[role]
    if role == "q":
        index, limit = tile_cpp, f"seqlen_q - ({tile_cpp}) * kBlockM"
        lines = [f"{{  // query tile {tile_cpp}"]
    else:
        index = "n_block"
        limit = "seqlen_k - n_block * kBlockN"
        lines = [f"{{  // tile {tile_cpp} in iteration order = KV block n_tiles - 1 - ({tile_cpp})",
                 f"{INDENT}const int n_block = n_tiles - 1 - ({tile_cpp});"]
    lines += [
        f"{INDENT}Tensor dst = {gmem_copy}.get_thread_slice(tidx).partition_D(",
        f"{INDENT}    make_tensor(make_smem_ptr(smem_{role} + {slot} * {tile_elems}), {layout}{{}}));",
        f"{INDENT}attn_tl::copy_rows_zfill({gmem_copy}, t{gname}g{gname}(_, _, _, {index}), dst, "
        f"t{gname}c{gname}, {limit});",
        "}",
    ]
    if op.async_copy and not op.data.get("fence_outside"):
        lines.append("cute::cp_async_fence();")
    return lines


def emit_load_q_regs(op: Op, ctx: EmitContext) -> list[str]:
    return ["attn_tl::load_fragment(tSrQ, tSsQ, s2r_q, s2r_thr_q);  // Q stays in registers for every KV tile"]


def emit_gemm_ss(op: Op, ctx: EmitContext) -> list[str]:
    res = op.data["result"]
    acc = ctx.reg(res, op.line)
    kbuf = op.data["k_buffer"]
    tile = ctx.slot_of_read(op, kbuf)
    slot = ctx.slot_expr(kbuf, tile)
    a_in_regs = "true" if op.data["q_in_regs"] else "false"
    lines = [
        "{",
        f"{INDENT}Tensor tSsK = s2r_thr_k.partition_S(make_tensor(make_smem_ptr(smem_k + {slot} * kTileKElems), "
        "SmemLayoutK{}));",
    ]
    if op.data["mode"] != "accumulate":
        lines.append(f"{INDENT}clear({acc});")
    lines += [f"{INDENT}attn_tl::gemm_ss<{a_in_regs}>(tiled_mma, {acc}, tSrQ, tSrK, tSsQ, tSsK, s2r_q, s2r_k, "
              "s2r_thr_q, s2r_thr_k);", "}"]
    ctx.layouts[res] = "C"
    if ctx.masked and not ctx.has_mask_stmt:
        # No Mask statement (non-causal sketch): ragged K tiles still need columns >= seqlen_k masked.
        lines.append("// ragged last K tile: columns >= seqlen_k get -inf (masked iterations only)")
        lines += _mask_call(acc, tile, causal=False)
    return lines


def _mask_call(acc: str, tile: str, causal: bool) -> list[str]:
    return [f"attn_tl::apply_mask<{'true' if causal else 'false'}>({acc}, tScS, m_block * kBlockM, "
            f"(n_tiles - 1 - ({tile})) * kBlockN, seqlen_k, causal_offset);"]


def emit_mask(op: Op, ctx: EmitContext) -> list[str]:
    target = op.data["target"]
    acc = ctx.reg(target, op.line)
    if ctx.masked is False:
        return ["// unmasked iterations: every key of this tile is visible to every query row"]
    if ctx.score_gemm is None:
        raise TranslationError("Mask needs a score GEMM (Compute GEMM Q_shared, K_shared.T and get S)", op.line)
    tile = ctx.slot_of_read(ctx.score_gemm, ctx.score_gemm.data["k_buffer"])
    return _mask_call(acc, tile, causal=bool(ctx.spec.causal))


def emit_row_stats(op: Op, ctx: EmitContext) -> list[str]:
    mx, sm = op.data["max"], op.data["sum"]
    ctx.names[mx], ctx.names[sm] = f"stat_{mx}", f"stat_{sm}"
    ctx.layouts[mx] = ctx.layouts[sm] = "stat"
    rows = "2 * (kBlockM / (16 * kNWarps))"
    return [
        f"Tensor stat_{mx} = make_tensor<float>(Shape<Int<{rows}>>{{}});  // running row max (per thread's rows)",
        f"Tensor stat_{sm} = make_tensor<float>(Shape<Int<{rows}>>{{}});  // running row sum, thread-local",
        f"fill(stat_{mx}, -INFINITY);",
        f"clear(stat_{sm});",
    ]


def emit_softmax(op: Op, ctx: EmitContext) -> list[str]:
    s = ctx.reg(op.data["target"], op.line)
    if ctx.layouts.get(op.data["target"]) != "C":
        raise TranslationError(f"Softmax needs {op.data['target']} in the accumulator layout (MMA_C)", op.line)
    acc = ctx.reg(op.data["acc"], op.line)
    mx, sm = ctx.reg(op.data["max"], op.line), ctx.reg(op.data["sum"], op.line)
    scale = "kLog2e" if op.data["target"] in ctx.prescaled else "kScaleLog2"
    return [f"attn_tl::online_softmax({s}, {acc}, {mx}, {sm}, {scale});  "
            f"// rescales {op.data['acc']} by exp2((max_old - max_new) * scale)"]


def emit_reshape(op: Op, ctx: EmitContext) -> list[str]:
    name = op.data["name"]
    src = ctx.reg(name, op.line)
    if ctx.layouts.get(name) != "C":
        raise TranslationError(f"Reshape of {name}: it is not in the accumulator layout MMA_C", op.line)
    var = f"{src}_as_A"
    ctx.names[name], ctx.layouts[name] = var, "A"
    return [
        f"Tensor {src}_lo = attn_tl::convert_type<Element>({src});  // fp32 -> 16-bit operand",
        f"Tensor {var} = make_tensor({src}_lo.data(), attn_tl::acc_to_a_layout<TiledMma>({src}_lo.layout()));",
    ]


def emit_gemm_rs(op: Op, ctx: EmitContext) -> list[str]:
    a_name, res = op.data["a"], op.data["result"]
    a = ctx.reg(a_name, op.line)
    if ctx.layouts.get(a_name) != "A":
        raise TranslationError(
            f"GEMM operand {a_name} is in the accumulator layout (MMA_C); a Reshape to MMA_A must come first",
            op.line)
    acc = ctx.reg(res, op.line)
    vbuf = op.data["v_buffer"]
    slot = ctx.slot_expr(vbuf, ctx.slot_of_read(op, vbuf))
    lines = ["{"]
    lines.append(f"{INDENT}Tensor tOsVt = s2r_thr_v.partition_S(make_tensor(make_smem_ptr(smem_v + {slot} * "
                 "kTileVElems), SmemLayoutVt{}));")
    if op.data["mode"] != "accumulate":
        lines.append(f"{INDENT}clear({acc});")
    lines += [f"{INDENT}attn_tl::gemm_rs(tiled_mma, {acc}, {a}, tOrVt, tOsVt, s2r_v, s2r_thr_v);", "}"]
    return lines


def emit_normalize(op: Op, ctx: EmitContext) -> list[str]:
    acc, sm = ctx.reg(op.data["target"], op.line), ctx.reg(op.data["divisor"], op.line)
    return [f"attn_tl::normalize_rows({acc}, {sm});  // quad-reduces the thread-local sums; no key -> 0"]


def emit_elementwise(op: Op, ctx: EmitContext) -> list[str]:
    src = ctx.reg(op.data["src"], op.line)
    scalar, fn = op.data["scalar_cpp"], op.data["op"]
    sym = {"multiply": "*", "divide": "/", "add": "+", "subtract": "-"}[fn]
    dst_name = op.data["result"]
    lines = []
    if dst_name == op.data["src"]:
        dst = src
    else:
        dst = f"acc_{dst_name}"
        lines.append(f"Tensor {dst} = make_tensor<float>({src}.layout());")
        ctx.names[dst_name], ctx.layouts[dst_name] = dst, ctx.layouts[op.data["src"]]
    if op.data.get("is_softmax_scale"):
        ctx.prescaled.add(dst_name)
    lines.append(f"attn_tl::elementwise({dst}, {src}, [&](float x) {{ return x {sym} ({scalar}); }});")
    return lines


def emit_store_o(op: Op, ctx: EmitContext) -> list[str]:
    acc = ctx.reg(op.data["src"], op.line)
    g = op.data["global"]
    return [
        "{  // registers -> shared (reusing Q's tile) -> 128-bit coalesced global stores",
        f"{INDENT}Tensor rO = attn_tl::convert_type<Element>({acc});",
        f"{INDENT}Tensor sO = make_tensor(make_smem_ptr(smem_q), SmemLayoutO{{}});",
        f"{INDENT}auto r2s = make_tiled_copy_C(Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>{{}}, "
        "tiled_mma);",
        f"{INDENT}auto r2s_thr = r2s.get_thread_slice(tidx);",
        f"{INDENT}cute::copy(r2s, r2s_thr.retile_S(rO), r2s_thr.partition_D(sO));",
        f"{INDENT}__syncthreads();  // the tile is read back by other threads",
        f"{INDENT}Tensor tOsO = s2g_thr_o.partition_S(sO);",
        f"{INDENT}Tensor tOgO = s2g_thr_o.partition_D(g{g}(_, _, m_block));",
        f"{INDENT}Tensor tOrO = make_tensor<Element>(shape(tOgO));",
        f"{INDENT}cute::copy(s2g_o, tOsO, tOrO);",
        f"{INDENT}Tensor tOcO = s2g_thr_o.partition_D(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDimV>>{{}}));",
        f"{INDENT}attn_tl::store_rows(s2g_o, tOrO, tOgO, tOcO, seqlen_q - m_block * kBlockM);",
        "}",
    ]


def emit_early_exit(op: Op, ctx: EmitContext) -> list[str]:
    g = op.data["global"]
    return [
        "if (n_tiles <= 0) {  // causal: no key is visible to any row of this query tile -> O rows are 0",
        f"{INDENT}Tensor tOgO = s2g_thr_o.partition_D(g{g}(_, _, m_block));",
        f"{INDENT}Tensor tOrO = make_tensor<Element>(shape(tOgO));",
        f"{INDENT}clear(tOrO);",
        f"{INDENT}Tensor tOcO = s2g_thr_o.partition_D(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDimV>>{{}}));",
        f"{INDENT}attn_tl::store_rows(s2g_o, tOrO, tOgO, tOcO, seqlen_q - m_block * kBlockM);",
        f"{INDENT}return;",
        "}",
    ]


EMITTERS = {
    "alloc_global": emit_alloc_global,
    "alloc_register": emit_alloc_register,
    "alloc_shared": emit_alloc_shared,
    "copy_g2s": emit_copy_g2s,
    "load_q_regs": emit_load_q_regs,
    "gemm_ss": emit_gemm_ss,
    "gemm_rs": emit_gemm_rs,
    "mask": emit_mask,
    "row_stats": emit_row_stats,
    "softmax": emit_softmax,
    "reshape": emit_reshape,
    "normalize": emit_normalize,
    "elementwise": emit_elementwise,
    "store_o": emit_store_o,
    "early_exit": emit_early_exit,
}


# ---- blocks -----------------------------------------------------------------------------------------

def _indent(lines: list[str], level: int = 1) -> list[str]:
    return [(INDENT * level + ln) if ln else ln for ln in lines]


def emit_nodes(nodes, ctx: EmitContext) -> list[str]:
    out: list[str] = []
    for node in nodes:
        if isinstance(node, Op):
            out.append(comment(node))
            out += sync_lines(node, async_proxy_reads=bool(ctx.overrides))
            out += (ctx.overrides.get(node.kind) or EMITTERS[node.kind])(node, ctx)
        elif isinstance(node, Loop):
            out += _emit_loop(node, ctx)
        elif isinstance(node, Cond):
            out += _emit_cond(node, ctx)
        out.append("") if isinstance(node, (Loop, Cond)) else None
    return out


def _emit_loop(loop: Loop, ctx: EmitContext) -> list[str]:
    start = ctx.expr(loop.start, loop.stmt.line)
    stop = ctx.expr(loop.stop, loop.stmt.line)
    v = loop.var
    out = [comment(loop)]
    ctx.loop_vars.append(v)
    try:
        if not loop.kv_loop:
            out.append(f"for (int {v} = {start}; {v} < {stop}; ++{v}) {{")
            out += _indent(emit_nodes(loop.body, ctx))
            out.append("}")
            return out
        saved = (dict(ctx.names), dict(ctx.layouts), set(ctx.prescaled))
        out += [
            "// KV tiles run last to first (FlashAttention-2's order): the tiles that need a mask (the causal",
            "// diagonal, the ragged end of K) come first, in a separate copy of the body; the rest skip it.",
            "{",
            f"{INDENT}int {v} = {start};",
            "  // masked tiles: causal, the diagonal spans ceil(BM/BN) tiles, one more when it is not tile-aligned;",
            "  // non-causal, only a ragged last K tile",
            f"{INDENT}const bool tile_aligned = seqlen_k % kBlockN == 0 && (seqlen_k - seqlen_q) % kBlockN == 0 "
            "&& kBlockM % kBlockN == 0;",
            f"{INDENT}const int n_masked = kCausal ? (kBlockM + kBlockN - 1) / kBlockN + (tile_aligned ? 0 : 1) "
            f": (seqlen_k % kBlockN != 0 ? 1 : 0);",
            f"{INDENT}#pragma unroll 1",
            f"{INDENT}for (; {v} < min({start} + n_masked, {stop}); ++{v}) {{  // masked iterations",
        ]
        ctx.masked = True
        out += _indent(emit_nodes(loop.body, ctx), 2)
        ctx.names, ctx.layouts, ctx.prescaled = dict(saved[0]), dict(saved[1]), set(saved[2])
        out += [f"{INDENT}}}", f"{INDENT}#pragma unroll 1",
                f"{INDENT}for (; {v} < {stop}; ++{v}) {{  // unmasked iterations"]
        ctx.masked = False
        out += _indent(emit_nodes(loop.body, ctx), 2)
        out += [f"{INDENT}}}", "}"]
        ctx.masked = None
        return out
    finally:
        ctx.loop_vars.pop()


def _emit_cond(cond: Cond, ctx: EmitContext) -> list[str]:
    c = ctx.expr(cond.condition, cond.stmt.line)
    out = [comment(cond), f"if ({c}) {{"]
    out += _indent(emit_nodes(cond.body, ctx))
    n_async = sum(1 for n in cond.body if isinstance(n, Op) and n.async_copy)
    if n_async:
        out += ["} else {",
                f"{INDENT}// commit empty group(s) so that cp_async_wait<N> counts the same on both paths"]
        out += [f"{INDENT}cute::cp_async_fence();"] * n_async
    out.append("}")
    return out


# ---- per-config types and kernel setup -------------------------------------------------------------

MMA_OPS = {
    ("SM80_16x8x16", "fp16"): "SM80_16x8x16_F32F16F16F32_TN",
    ("SM80_16x8x16", "bf16"): "SM80_16x8x16_F32BF16BF16F32_TN",
    ("SM75_16x8x8", "fp16"): "SM75_16x8x8_F32F16F16F32_TN",
}
G2S_OPS = {
    "SM80_CP_ASYNC_CACHEGLOBAL": "SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>",
    "SM80_CP_ASYNC_CACHEALWAYS": "SM80_CP_ASYNC_CACHEALWAYS<cute::uint128_t>",
    "UniversalCopy128": "UniversalCopy<cute::uint128_t>",
}
S2R_OPS = {  # (Q/K operand atom, V^T operand atom: ldmatrix.trans when ldmatrix is chosen)
    "SM75_U32x4_LDSM_N": ("SM75_U32x4_LDSM_N", "SM75_U16x8_LDSM_T"),
    "SM75_U32x2_LDSM_N": ("SM75_U32x2_LDSM_N", "SM75_U16x4_LDSM_T"),
    "UniversalCopy": ("UniversalCopy<Element>", "UniversalCopy<Element>"),
}


def _smem_atom(width: int, swizzle: int) -> str:
    k = 64 if width % 64 == 0 else 32
    base = f"Layout<Shape<_8, Int<{k}>>, Stride<Int<{k}>, _1>>"
    return f"decltype(composition(Swizzle<{swizzle}, 3, 3>{{}}, {base}{{}}))" if swizzle else base


def _gmem_copy(atom: str, width: int) -> str:
    tpr = copy_row_threads(width)
    return (f"decltype(make_tiled_copy(Copy_Atom<{atom}, Element>{{}}, "
            f"Layout<Shape<Int<kNThreads / {tpr}>, Int<{tpr}>>, Stride<Int<{tpr}>, _1>>{{}}, "
            "Layout<Shape<_1, _8>>{}))")


def kernel_types(spec, params, stages_k: int, stages_v: int) -> list[str]:
    """Per-config constants and CuTe types, all inside the kernel's namespace."""
    elem = "cutlass::half_t" if spec.dtype == "fp16" else "cutlass::bfloat16_t"
    try:
        mma = MMA_OPS[(params.mma_atom, spec.dtype)]
    except KeyError:
        raise TranslationError(f"MMA atom {params.mma_atom} has no {spec.dtype} variant") from None
    if params.g2s_atom not in G2S_OPS:
        raise TranslationError(f"unknown global->shared copy atom {params.g2s_atom}")
    if params.s2r_atom not in S2R_OPS:
        raise TranslationError(f"unknown shared->register copy atom {params.s2r_atom}")
    s2r_qk, s2r_v = S2R_OPS[params.s2r_atom]
    return [
        f"using Element = {elem};",
        f"constexpr int kBlockM = {params.block_m};",
        f"constexpr int kBlockN = {params.block_n};",
        f"constexpr int kNWarps = {params.num_warps};",
        "constexpr int kNThreads = kNWarps * 32;",
        f"constexpr int kHeadDimQK = {spec.d_qk};",
        f"constexpr int kHeadDimV = {spec.d_v};",
        f"constexpr bool kCausal = {'true' if spec.causal else 'false'};",
        f"[[maybe_unused]] constexpr float kLog2e = {math.log2(math.e)!r}f;",
        "",
        f"using TiledMma = TiledMMA<MMA_Atom<{mma}>, Layout<Shape<Int<kNWarps>, _1, _1>>,",
        "                          Tile<Int<16 * kNWarps>, _16, _16>>;  // warps along M, 16 rows each",
        f"using SmemAtomQK = {_smem_atom(spec.d_qk, params.swizzle)};",
        f"using SmemAtomV = {_smem_atom(spec.d_v, params.swizzle)};",
        "using SmemLayoutQ = decltype(tile_to_shape(SmemAtomQK{}, Shape<Int<kBlockM>, Int<kHeadDimQK>>{}));",
        "using SmemLayoutK = decltype(tile_to_shape(SmemAtomQK{}, Shape<Int<kBlockN>, Int<kHeadDimQK>>{}));",
        "using SmemLayoutV = decltype(tile_to_shape(SmemAtomV{}, Shape<Int<kBlockN>, Int<kHeadDimV>>{}));",
        "using SmemLayoutVt = decltype(composition(SmemLayoutV{}, make_layout(Shape<Int<kHeadDimV>, Int<kBlockN>>{}, "
        "GenRowMajor{})));  // V read as (HeadDimV, BN)",
        "using SmemLayoutVtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutVt{}));",
        "using SmemLayoutO = decltype(tile_to_shape(SmemAtomV{}, Shape<Int<kBlockM>, Int<kHeadDimV>>{}));",
        f"using S2RAtomQK = Copy_Atom<{s2r_qk}, Element>;",
        f"using S2RAtomV = Copy_Atom<{s2r_v}, Element>;",
        f"using GmemCopyQK = {_gmem_copy(G2S_OPS[params.g2s_atom], spec.d_qk)};",
        f"using GmemCopyV = {_gmem_copy(G2S_OPS[params.g2s_atom], spec.d_v)};",
        f"using GmemCopyO = {_gmem_copy('AutoVectorizingCopyWithAssumedAlignment<128>', spec.d_v)};",
        "constexpr int kSmemQElems = cute::max(int(cosize(SmemLayoutQ{})), int(cosize(SmemLayoutO{})));",
        "constexpr int kTileKElems = int(cosize(SmemLayoutK{}));",
        "constexpr int kTileVElems = int(cosize(SmemLayoutV{}));",
        f"constexpr int kStagesK = {stages_k};",
        f"constexpr int kStagesV = {stages_v};",
        "[[maybe_unused]] constexpr int kSmemBytes = (kSmemQElems + kStagesK * kTileKElems + kStagesV * kTileVElems) * int(sizeof(Element));",
    ]


def kernel_setup() -> list[str]:
    return [
        "extern __shared__ __align__(128) char attn_smem[];",
        "const int tidx = threadIdx.x;",
        *scale_setup(),
        "// causal: the heaviest query tiles (most keys) are scheduled first",
        "const int m_block = kCausal ? int(gridDim.x - 1 - blockIdx.x) : int(blockIdx.x);",
        "const int bidh = blockIdx.y;",
        "const int bidb = blockIdx.z;",
        "const int bidh_kv = bidh / group;  // GQA/MQA: KV head = query head // group",
        "const int causal_offset = seqlen_k - seqlen_q;  // bottom-right: row r sees key c iff c <= r + offset",
        "int n_tiles = (seqlen_k + kBlockN - 1) / kBlockN;  // TL N: KV tiles this query tile visits",
        "if (kCausal) { n_tiles = min(n_tiles, ((m_block + 1) * kBlockM + causal_offset + kBlockN - 1) / kBlockN); }",
        "",
        "// shared-memory plan: Q (reused for O) | K ring | V ring",
        "Element* smem_q = reinterpret_cast<Element*>(attn_smem);",
        "Element* smem_k = smem_q + kSmemQElems;",
        "Element* smem_v = smem_k + kStagesK * kTileKElems;",
        "",
        "TiledMma tiled_mma;",
        "auto thr_mma = tiled_mma.get_thread_slice(tidx);",
        "auto s2r_q = make_tiled_copy_A(S2RAtomQK{}, tiled_mma);",
        "auto s2r_thr_q = s2r_q.get_thread_slice(tidx);",
        "auto s2r_k = make_tiled_copy_B(S2RAtomQK{}, tiled_mma);",
        "auto s2r_thr_k = s2r_k.get_thread_slice(tidx);",
        "auto s2r_v = make_tiled_copy_B(S2RAtomV{}, tiled_mma);",
        "auto s2r_thr_v = s2r_v.get_thread_slice(tidx);",
        "GmemCopyQK g2s_qk;",
        "auto g2s_thr_qk = g2s_qk.get_thread_slice(tidx);",
        "GmemCopyV g2s_v;",
        "auto g2s_thr_v = g2s_v.get_thread_slice(tidx);",
        "GmemCopyO s2g_o;",
        "auto s2g_thr_o = s2g_o.get_thread_slice(tidx);",
        "",
        "Tensor sQ = make_tensor(make_smem_ptr(smem_q), SmemLayoutQ{});",
        "Tensor tSsQ = s2r_thr_q.partition_S(sQ);",
        "Tensor tSrQ = thr_mma.partition_fragment_A(sQ);",
        "Tensor tSrK = thr_mma.partition_fragment_B(make_tensor(make_smem_ptr(smem_k), SmemLayoutK{}));",
        "Tensor tOrVt = thr_mma.partition_fragment_B(make_tensor(make_smem_ptr(smem_v), SmemLayoutVtNoSwizzle{}));",
        "Tensor tScS = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));  // (row, col)",
    ]


def kernel_arguments(out_element: str = "Element") -> list[str]:
    """The C++ parameters of KERNEL_ARGS (translate/kernel.py), in order (an FP8 kernel's output is ElementO)."""
    args = ["const Element* __restrict__ q_ptr", "const Element* __restrict__ k_ptr",
            "const Element* __restrict__ v_ptr", f"{out_element}* __restrict__ o_ptr",
            "const int seqlen_q", "const int seqlen_k", "const int group"]
    for r in "qkvo":
        args += [f"const int64_t {r}_batch_stride", f"const int64_t {r}_row_stride", f"const int64_t {r}_head_stride"]
    return args + ["const float softmax_scale_log2"]


def kernel_signature(name: str, args: list[str] | None = None) -> list[str]:
    args = kernel_arguments() if args is None else args
    lines = [f'extern "C" __global__ void __launch_bounds__(kNThreads, 1) {name}(']
    for i, a in enumerate(args):
        lines.append(f"    {a}{',' if i < len(args) - 1 else ') {'}")
    return lines


def scale_setup() -> list[str]:
    """The softmax scale is a launch argument (any positive scale: a model's own, DeepSeek's MLA scaling),
    read once per thread; the kernel's constant-folded form cost nothing measurable over it (an FFMA takes
    the register as readily as an immediate)."""
    return ["const float kScaleLog2 = softmax_scale_log2;  // log2(e) * softmax scale, folded into exp2",
            "[[maybe_unused]] const float kSoftmaxScale = softmax_scale_log2 * (1.f / kLog2e);"]
