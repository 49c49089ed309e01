"""The first Hopper step: a paper-style sketch (no warpgroup roles) with wgmma GEMMs.

Every warpgroup loads (cp.async into the 128-byte swizzled GMMA layouts, behind ``fence.proxy.async``
because wgmma reads shared memory through the async proxy) and computes 64 query rows. The FA2-style
compiler (translate/compiler.py) lowers and schedules the program as for sm80; these emitters replace
the ones that differ: the GEMMs (wgmma issued and waited for in place, so the dependency pass's view of
shared-memory reads stays exact), the softmax and masks on the wgmma accumulator layout, the C->A
reshape (registers for RS, a shared tile for SS) and the epilogue's register->shared step (stmatrix).
"""
from __future__ import annotations

import math

from translate import emitters as em
from translate.emitters import INDENT, EmitContext, _gmem_copy, G2S_OPS
from translate.ir import Op
from translate.kernel import TranslationError
from translate.sm90.emit import softmax_template
from translate.sm90.frame import gemm_ops
from translate.sm90.swizzle import k_major_atom



def _mma_of(ctx: EmitContext, name: str) -> str:
    return "pv" if ctx.names.get(name, "").endswith("_pv") else "qk"


def emit_alloc_register(op: Op, ctx: EmitContext) -> list[str]:
    name, cols = op.data["name"], op.data["cols_cpp"]
    mma = "pv" if op.data.get("accumulator") else "qk"
    var = f"acc_{name}"
    ctx.names[name], ctx.layouts[name] = var, "C"
    lines = [f"Tensor {var} = partition_fragment_C(tiled_mma_{mma}, Shape<Int<kBlockM>, Int<{cols}>>{{}});"]
    if op.data.get("accumulator"):
        lines.append(f"clear({var});")
    return lines


def emit_gemm_ss(op: Op, ctx: EmitContext) -> list[str]:
    if op.data["q_in_regs"]:
        raise TranslationError("the wgmma QK^T GEMM reads Q from shared memory; drop the Q register copy", op.line)
    acc = ctx.reg(op.data["result"], op.line)
    kbuf = op.data["k_buffer"]
    slot = ctx.slot_expr(kbuf, ctx.slot_of_read(op, kbuf))
    zero = "true" if op.data["mode"] != "accumulate" else "false"
    lines = [
        "{  // wgmma, issued and waited for here: every warpgroup's 64 rows of Q against the K tile",
        f"{INDENT}Tensor tSrK = thr_qk.partition_fragment_B(make_tensor(make_smem_ptr(smem_k + {slot} * kTileKElems), "
        "SmemLayoutK{}));",
        f"{INDENT}attn_sm90::gemm_issue<{zero}>(tiled_mma_qk, tSrQ, tSrK, {acc});",
        f"{INDENT}warpgroup_wait<0>();",
        f"{INDENT}warpgroup_fence_operand({acc});",
        "}",
    ]
    ctx.layouts[op.data["result"]] = "C"
    if ctx.masked and not ctx.has_mask_stmt:
        lines.append("// ragged last K tile: columns >= seqlen_k get -inf (masked iterations only)")
        lines += _mask_call(acc, ctx.slot_of_read(op, kbuf), causal=False)
    return lines


def _mask_call(acc: str, tile: str, causal: bool) -> list[str]:
    return [f"attn_tl::apply_mask<{'true' if causal else 'false'}>({acc}, tScS, m_block * kBlockM, "
            f"(n_tiles - 1 - ({tile})) * kBlockN, seqlen_k, causal_offset);"]


def emit_mask(op: Op, ctx: EmitContext) -> list[str]:
    acc = ctx.reg(op.data["target"], op.line)
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
    return [
        f"Tensor stat_{mx} = make_tensor<float>(Shape<Int<kStatRows>>{{}});  // running row max (per thread's rows)",
        f"Tensor stat_{sm} = make_tensor_like(stat_{mx});  // running row sum, thread-local",
        f"Tensor stat_{mx}_rescale = make_tensor_like(stat_{mx});",
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
    t = ctx.params.rescale_threshold
    return [f"attn_sm90::softmax_tile{softmax_template(ctx.params)}({s}, {mx}, {sm}, {mx}_rescale, {scale});",
            f"attn_sm90::rescale_rows{'<true>' if t else ''}({acc}, {mx}_rescale);  "
            f"// {op.data['acc']} *= exp2((max_old - max_new) * scale)"]


def emit_reshape(op: Op, ctx: EmitContext) -> list[str]:
    name = op.data["name"]
    src = ctx.reg(name, op.line)
    if ctx.layouts.get(name) != "C":
        raise TranslationError(f"Reshape of {name}: it is not in the accumulator layout MMA_C", op.line)
    var = f"{src}_as_A"
    ctx.names[name], ctx.layouts[name] = var, "A"
    if ctx.params.pv_operand == "ss":
        return [
            "{  // P through shared memory (SS P·V GEMM), visible to the tensor cores' async proxy",
            f"{INDENT}Tensor rP = attn_tl::convert_type<Element>({src});",
            f"{INDENT}cute::copy(r2s_p, r2s_thr_p.retile_S(rP), r2s_thr_p.partition_D(sP));",
            f"{INDENT}cutlass::arch::fence_view_async_shared();",
            f"{INDENT}cutlass::arch::NamedBarrier::sync(128, 1 + tidx / 128);  // this warpgroup's rows",
            "}",
            f"auto& {var} = tOsP;",
        ]
    return [f"Tensor {var} = make_tensor<Element>(attn_sm90::acc_to_a_layout({src}.layout()));",
            f"attn_sm90::convert_into({var}, {src});  // fp32 -> 16-bit A operand of the RS wgmma"]


def emit_gemm_rs(op: Op, ctx: EmitContext) -> list[str]:
    a_name, res = op.data["a"], op.data["result"]
    a = ctx.reg(a_name, op.line)
    if ctx.layouts.get(a_name) != "A":
        raise TranslationError(
            f"GEMM operand {a_name} is in the accumulator layout (MMA_C); a Reshape to MMA_A must come first", op.line)
    acc = ctx.reg(res, op.line)
    vbuf = op.data["v_buffer"]
    slot = ctx.slot_expr(vbuf, ctx.slot_of_read(op, vbuf))
    zero = "true" if op.data["mode"] != "accumulate" else "false"
    return [
        "{",
        f"{INDENT}Tensor tOrV = thr_pv.partition_fragment_B(make_tensor(make_smem_ptr(smem_v + {slot} * kTileVElems), "
        "SmemLayoutVt{}));",
        f"{INDENT}attn_sm90::gemm_issue<{zero}>(tiled_mma_pv, {a}, tOrV, {acc});",
        f"{INDENT}warpgroup_wait<0>();",
        f"{INDENT}warpgroup_fence_operand({acc});",
        "}",
    ]


def emit_normalize(op: Op, ctx: EmitContext) -> list[str]:
    acc, sm = ctx.reg(op.data["target"], op.line), ctx.reg(op.data["divisor"], op.line)
    return [f"attn_sm90::normalize_rows({acc}, {sm});  // quad-reduces the thread-local sums; no key -> 0"]


def emit_store_o(op: Op, ctx: EmitContext) -> list[str]:
    acc = ctx.reg(op.data["src"], op.line)
    g = op.data["global"]
    return [
        "{  // registers -> shared (stmatrix, into Q's tile) -> 128-bit coalesced global stores",
        f"{INDENT}Tensor rO = attn_tl::convert_type<Element>({acc});",
        f"{INDENT}attn_sm90::store_o_tile<kBlockM, kHeadDimV>(rO, smem_q, tidx);  // stmatrix into SmemLayoutO",
        f"{INDENT}Tensor sO = make_tensor(make_smem_ptr(smem_q), SmemLayoutO{{}});",
        f"{INDENT}__syncthreads();  // the tile is read back by other threads",
        f"{INDENT}Tensor tOsO = s2g_thr_o.partition_S(sO);",
        f"{INDENT}Tensor tOgO = s2g_thr_o.partition_D(g{g}(_, _, m_block));",
        f"{INDENT}Tensor tOrO = make_tensor<Element>(shape(tOgO));",
        f"{INDENT}cute::copy(s2g_o, tOsO, tOrO);",
        f"{INDENT}Tensor tOcO = s2g_thr_o.partition_D(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDimV>>{{}}));",
        f"{INDENT}attn_tl::store_rows(s2g_o, tOrO, tOgO, tOcO, seqlen_q - m_block * kBlockM);",
        "}",
    ]


EMITTERS = {
    "alloc_register": emit_alloc_register,
    "gemm_ss": emit_gemm_ss,
    "gemm_rs": emit_gemm_rs,
    "mask": emit_mask,
    "row_stats": emit_row_stats,
    "softmax": emit_softmax,
    "reshape": emit_reshape,
    "normalize": emit_normalize,
    "store_o": emit_store_o,
}


def kernel_types(spec, params, stages_k: int, stages_v: int) -> list[str]:
    elem = "cutlass::half_t" if spec.dtype == "fp16" else "cutlass::bfloat16_t"
    qk_op, pv_op = gemm_ops(spec, params)
    return [
        f"using Element = {elem};",
        f"constexpr int kBlockM = {params.block_m};",
        f"constexpr int kBlockN = {params.block_n};",
        f"constexpr int kWarpgroups = {params.block_m // 64};  // each loads and computes 64 query rows",
        "constexpr int kNThreads = 128 * kWarpgroups;",
        f"constexpr int kHeadDimQK = {spec.d_qk};",
        f"constexpr int kHeadDimV = {spec.d_v};",
        f"constexpr bool kCausal = {'true' if spec.causal else 'false'};",
        f"[[maybe_unused]] constexpr float kLog2e = {math.log2(math.e)!r}f;",
        "",
        f"using TiledMmaQK = decltype(make_tiled_mma({qk_op}, Layout<Shape<Int<kWarpgroups>, _1, _1>>{{}}));",
        f"using TiledMmaPV = decltype(make_tiled_mma({pv_op}, Layout<Shape<Int<kWarpgroups>, _1, _1>>{{}}));",
        "using SmemLayoutQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, "
        "Shape<Int<kBlockM>, Int<kHeadDimQK>>{}));",
        "using SmemLayoutK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, "
        "Shape<Int<kBlockN>, Int<kHeadDimQK>>{}));",
        "using SmemLayoutV = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, "
        "Shape<Int<kBlockN>, Int<kHeadDimV>>{}));",
        "// V as stored (BN, HeadDimV) read as (HeadDimV, BN): the same bytes, MN-major for the P·V GEMM",
        "using SmemLayoutVt = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Element>{}, "
        "Shape<Int<kHeadDimV>, Int<kBlockN>>{}, Step<_2, _1>{}));",
        "using SmemLayoutO = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, "
        "Shape<Int<kBlockM>, Int<kHeadDimV>>{}));",
        f"using SmemLayoutP = decltype(tile_to_shape({k_major_atom(params.block_n)}{{}}, "
        "Shape<Int<kBlockM>, Int<kBlockN>>{}));",
        f"using GmemCopyQK = {_gmem_copy(G2S_OPS[params.g2s_atom], spec.d_qk)};",
        f"using GmemCopyV = {_gmem_copy(G2S_OPS[params.g2s_atom], spec.d_v)};",
        f"using GmemCopyO = {_gmem_copy('AutoVectorizingCopyWithAssumedAlignment<128>', spec.d_v)};",
        "constexpr int kSmemQElems = kBlockM * cute::max(kHeadDimQK, kHeadDimV);  // Q, then O",
        "constexpr int kTileKElems = kBlockN * kHeadDimQK;",
        "constexpr int kTileVElems = kBlockN * kHeadDimV;",
        f"constexpr int kStagesK = {stages_k};",
        f"constexpr int kStagesV = {stages_v};",
        "constexpr int kStatRows = decltype(size<0>(attn_sm90::rowcol_layout(decltype(partition_fragment_C("
        "TiledMmaQK{}, Shape<Int<kBlockM>, Int<kBlockN>>{}))::layout_type{})))::value;",
    ]


def kernel_setup(params) -> list[str]:
    lines = [
        "extern __shared__ __align__(1024) char attn_smem[];",
        "const int tidx = threadIdx.x;",
        *em.scale_setup(),
        "// causal: the heaviest query tiles (most keys) are scheduled first",
        "const int m_block = kCausal ? int(gridDim.x - 1 - blockIdx.x) : int(blockIdx.x);",
        "const int bidh = blockIdx.y;",
        "const int bidb = blockIdx.z;",
        "const int bidh_kv = bidh / group;  // GQA/MQA: KV head = query head // group",
        "const int causal_offset = seqlen_k - seqlen_q;  // bottom-right: row r sees key c iff c <= r + offset",
        "int n_tiles = (seqlen_k + kBlockN - 1) / kBlockN;  // TL N: KV tiles this query tile visits",
        "if (kCausal) { n_tiles = min(n_tiles, ((m_block + 1) * kBlockM + causal_offset + kBlockN - 1) / kBlockN); }",
        "",
        "// shared-memory plan: Q (reused for O) | K ring | V ring | P (SS only); 1024-byte aligned tiles",
        "Element* smem_q = reinterpret_cast<Element*>(attn_smem);",
        "Element* smem_k = smem_q + kSmemQElems;",
        "Element* smem_v = smem_k + kStagesK * kTileKElems;",
        "[[maybe_unused]] Element* smem_p = smem_v + kStagesV * kTileVElems;",
        "",
        "TiledMmaQK tiled_mma_qk;",
        "TiledMmaPV tiled_mma_pv;",
        "auto thr_qk = tiled_mma_qk.get_thread_slice(tidx);",
        "auto thr_pv = tiled_mma_pv.get_thread_slice(tidx);",
        "GmemCopyQK g2s_qk;",
        "auto g2s_thr_qk = g2s_qk.get_thread_slice(tidx);",
        "GmemCopyV g2s_v;",
        "auto g2s_thr_v = g2s_v.get_thread_slice(tidx);",
        "GmemCopyO s2g_o;",
        "auto s2g_thr_o = s2g_o.get_thread_slice(tidx);",
        "Tensor sQ = make_tensor(make_smem_ptr(smem_q), SmemLayoutQ{});",
        "Tensor tSrQ = thr_qk.partition_fragment_A(sQ);   // GMMA descriptors, not registers",
        "Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));  // (row, col)",
    ]
    if params.pv_operand == "ss":
        lines += ["Tensor sP = make_tensor(make_smem_ptr(smem_p), SmemLayoutP{});",
                  "Tensor tOsP = thr_pv.partition_fragment_A(sP);",
                  "auto r2s_p = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, tiled_mma_qk);",
                  "auto r2s_thr_p = r2s_p.get_thread_slice(tidx);"]
    return lines


def smem_bytes(params, spec, stages_k: int, stages_v: int) -> int:
    q = params.block_m * max(spec.d_qk, spec.d_v)
    p = params.block_m * params.block_n if params.pv_operand == "ss" else 0
    return (q + stages_k * params.block_n * spec.d_qk + stages_v * params.block_n * spec.d_v + p) * 2
