"""The per-config part of the warp-specialised Hopper kernel: the GEMMs' wgmma ops and shared-memory operands, the
kernel's types and constants, its signature, the setup of both roles, and each consumer's per-tile start.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from translate import emitters as base
from translate.params_sm90 import consumer_registers, kv_cp_async
from translate.sm90 import swizzle, wgmma_ops
from translate.sm90.emit import CP_ASYNC_PRODUCER_THREADS, Ctx
from translate.sm90.tiles import tile_grid


def gemms(spec, params) -> tuple[tuple[int, str], tuple[int, str]]:
    """(N, A operand) of the kernel's two GEMMs: QK^T (N = block N, A = Q in shared memory) and P.V (N = d_v)."""
    return (params.block_n, "ss"), (spec.d_v, params.pv_operand)


def gemm_ops(spec, params) -> tuple[str, str]:
    """The wgmma op expressions of QK^T (B = K, K-major) and P.V (B = V read MN-major; FP8: V transposed, K-major)."""
    (n_qk, _), (n_pv, pv_operand) = gemms(spec, params)
    if is_fp8(spec):
        return (wgmma_ops.mma_op("fp8", n_qk, "Int<kBlockN>", "Int<kHeadDimQK>", "ss"),
                wgmma_ops.mma_op("fp8", n_pv, "Int<kHeadDimV>", "Int<kBlockN>", pv_operand))
    return (wgmma_ops.mma_op(spec.dtype, n_qk, "Int<kBlockN>", "Int<kHeadDimQK>", "ss"),
            wgmma_ops.mma_op(spec.dtype, n_pv, "Int<kHeadDimV>", "Int<kBlockN>", pv_operand, b_major="MN"))


@dataclass(frozen=True)
class GmmaOperand:
    """What CuTe's partition_fragment_A/B makes of one operand tile in shared memory (a K-major tile of
    128-, 64- or 32-byte swizzle atoms of 8 rows, stacked along the rows first; or V read MN-major), as
    attn_sm90::gmma_operand takes it: the descriptor tensor's layout (C++ type, 16-byte units), the leading
    and stride byte offsets, the layout type (swizzle), and each consumer warpgroup's start (elements).
    The rules were read off CuTe's partitions of every tile of the search spaces (216 shapes) and are
    checked against them by tests/translate/test_gmma_operands.py."""

    layout: str
    leading: int
    stride: int
    layout_type: int
    per_warpgroup: int = 0    # elements from one consumer warpgroup's start to the next's (A operands)


_SWIZZLE = swizzle.LAYOUT_TYPE


def is_fp8(spec) -> bool:
    return spec.dtype == "fp8"


def fp8_chunk(width_bytes: int) -> int:
    """The columns (bytes) of an FP8 tile's swizzle atom and TMA box: the widest of 128, 64 and 32 bytes that divides
    the tile's rows (translate/params_sm90.py keeps FP8 widths multiples of 32: FA3's block N 224 and 160 take the
    32-byte swizzle)."""
    return next(c for c in (128, 64, 32) if width_bytes % c == 0)


def _fp8_k_major(rows: int, width_bytes: int, stages: int | None) -> GmmaOperand:
    """An e4m3 K-major tile of ``rows`` x ``width_bytes``: the same bytes as a 16-bit tile of half the columns,
    so the 16-bit rules apply to that image (a k-block of 32 e4m3 is 32 bytes, as one of 16 halves)."""
    eq, atom = width_bytes // 2, fp8_chunk(width_bytes) // 2
    shape, stride = _k_mode(rows, eq, atom)
    if stages is None:
        return GmmaOperand(f"Layout<Shape<_1, _1, {shape}>, Stride<_0, _0, {stride}>>", 1, atom, _SWIZZLE[atom],
                           per_warpgroup=64 * 2 * atom if rows > 64 else 0)
    return GmmaOperand(f"Layout<Shape<_1, _1, {shape}, Shape<_1, Int<{stages}>>>, Stride<_0, _0, {stride}, "
                       f"Stride<_0, Int<{rows * width_bytes // 16}>>>>", 1, atom, _SWIZZLE[atom])


def _k_mode(rows: int, cols: int, width: int) -> tuple[str, str]:
    """The k-blocks (16 columns) of a K-major tile of ``width``-column atoms: within an atom 32 bytes apart,
    from atom to atom a whole column of atoms (``rows`` x ``width`` elements) apart."""
    in_atom, atoms, atom_stride = width // 16, cols // width, rows * width // 8
    if atoms == 1:
        return f"_{in_atom}", "_2"
    if in_atom == 1:
        return f"Int<{atoms}>", f"Int<{atom_stride}>"
    return f"Shape<Int<{in_atom}>, Int<{atoms}>>", f"Stride<_2, Int<{atom_stride}>>"


def gmma_operand(which: str, spec, params, stages: int) -> GmmaOperand:
    """Q (A), K (B), V (B, MN-major) or P (A, SS P·V) of a warp-specialised kernel (smem_layouts())."""
    bm, bn = params.block_m, params.block_n
    if is_fp8(spec):   # Q (A), K (B) and V transposed (B): all K-major
        if which == "q":
            return _fp8_k_major(bm, spec.d_qk, None)
        if which == "k":
            return _fp8_k_major(bn, spec.d_qk, stages)
        if which == "v":
            return _fp8_k_major(spec.d_v, bn, stages)
        raise ValueError(f"no FP8 GMMA operand {which!r} (P stays in registers)")
    if which in ("q", "p"):
        cols = spec.d_qk if which == "q" else bn
        width = swizzle.chunk(spec.d_qk) if which == "q" else swizzle.atom_width(bn)
        shape, stride = _k_mode(bm, cols, width)
        # one consumer warpgroup: no offset at all (a term in wg, zero but not known to be, costs registers)
        return GmmaOperand(f"Layout<Shape<_1, _1, {shape}>, Stride<_0, _0, {stride}>>", 1, width,
                           _SWIZZLE[width], per_warpgroup=64 * width if bm > 64 else 0)
    stage = f"Shape<_1, Int<{stages}>>"
    if which == "k":
        width = swizzle.chunk(spec.d_qk)
        shape, stride = _k_mode(bn, spec.d_qk, width)
        return GmmaOperand(f"Layout<Shape<_1, _1, {shape}, {stage}>, Stride<_0, _0, {stride}, "
                           f"Stride<_0, Int<{bn * spec.d_qk // 8}>>>>", 1, width, _SWIZZLE[width])
    if which == "v":   # (HeadDimV, BN) MN-major: w-column chunks of V's rows BN x w / 8 units apart, k-blocks 16 rows
        width = swizzle.chunk(spec.d_v)
        return GmmaOperand(f"Layout<Shape<_1, _1, Int<{bn // 16}>, {stage}>, Stride<_0, _0, _{2 * width}, "
                           f"Stride<_0, Int<{bn * spec.d_v // 8}>>>>", bn * width // 8 if spec.d_v > width else 0,
                           width, _SWIZZLE[width])
    raise ValueError(f"no GMMA operand {which!r}")


def gmma_operand_line(name: str, smem: str, op: GmmaOperand) -> str:
    """The operand's descriptors from its shared tile: a consumer warpgroup's A rows start ``wg`` x
    ``per_warpgroup`` elements in. ``wg`` is warp-uniform (consumer_setup), so ptxas keeps the descriptors in
    uniform registers; from the thread index (CuTe's per-thread slice) it kept them in ordinary registers and moved
    each into a uniform one before its wgmma (2 R2UR a wgmma): the dense defaults ran 2-6% slower (H100, paired
    rounds, BENCHMARKS.md 2026-11-26)."""
    start = f"{smem} + wg * {op.per_warpgroup}" if op.per_warpgroup else smem
    return (f"Tensor {name} = attn_sm90::gmma_operand<{op.layout}, {op.leading}, {op.stride}, {op.layout_type}>"
            f"({start});")


def wgmma_declarations(spec, params) -> list[str]:
    """What the kernel must declare before its namespace: the wgmma ops of extended N it uses."""
    return wgmma_ops.declarations(spec.dtype, gemms(spec, params))


def accumulator_layouts() -> list[str]:
    """The fp32 accumulators' layouts (S: kBlockM x kBlockN, O: kBlockM x kHeadDimV over each thread of a consumer
    warpgroup): the type CuTe's partition_fragment_C gives (per 8-column group two neighbouring columns of two rows,
    one MMA along M and N), written out: its partition algebra cost 0.2-0.3 CPU s of nvcc per kernel (GQA d128
    causal default, 3.56-3.72 -> 3.35-3.39 s in 3 interleaved pairs, nvcc 13.0, 2 cores; BENCHMARKS.md, nvcc
    cost per kernel), the SASS is the same (18 kernels compared), and tests/translate/test_gmma_operands.py checks the types
    against CuTe's."""
    return [f"using AccLayout{t} = Layout<Shape<Shape<_2, _2, Int<{n} / 8>>, _1, _1>, Stride<Stride<_1, _2, _4>, _0, _0>>;"
            f"  // {what}" for t, n, what in (("S", "kBlockN", "scores"), ("O", "kHeadDimV", "output"))]


def _shape_constants(spec, params, stages: int) -> list[str]:
    """The constants every warp-specialised kernel declares after its element types: tile, warpgroups, stages,
    thread counts, mask, register split (and the cp.async producer's arrivals)."""
    return [
        f"constexpr int kBlockM = {params.block_m};",
        f"constexpr int kBlockN = {params.block_n};",
        f"constexpr int kHeadDimQK = {spec.d_qk};",
        f"constexpr int kHeadDimV = {spec.d_v};",
        f"constexpr int kConsumerWGs = {params.block_m // 64};  // one warpgroup per 64 query rows",
        f"constexpr int kStages = {stages};",
        "constexpr int kNThreads = 128 * (kConsumerWGs + 1);  // warpgroup 0 produces",
        "constexpr int kConsumerThreads = 128 * kConsumerWGs;",
        f"constexpr bool kCausal = {'true' if spec.causal else 'false'};",
        f"[[maybe_unused]] constexpr float kLog2e = {math.log2(math.e)!r}f;",
        f"constexpr int kProducerRegs = {params.producer_regs};",
        *([f"constexpr int kKVFullArrivals = {CP_ASYNC_PRODUCER_THREADS};  // per "
           + ("K stage: every producer thread (cp.async; V^T by TMA)" if is_fp8(spec)
              else "K/V stage: every producer thread (cp.async)")] if kv_cp_async(params) else []),
        f"constexpr int kConsumerRegs = {consumer_registers(params)};",
    ]


def fp8_kernel_types(spec, params, stages: int) -> list[str]:
    """An FP8 kernel's types: e4m3 Q, K and V (transposed), a bf16 output tile of its own after Q's."""
    qk_op, pv_op = gemm_ops(spec, params)
    return [
        "using Element = cutlass::float_e4m3_t;",
        "using ElementO = cutlass::bfloat16_t;  // e4m3 in, bf16 out",
        *_shape_constants(spec, params, stages),
        f"constexpr int kChunkQK = {fp8_chunk(spec.d_qk)};  // columns of a Q/K TMA box and swizzle atom (bytes)",
        f"constexpr int kChunkV = {fp8_chunk(params.block_n)};  // keys of a transposed-V box and atom",
        *([f"constexpr int kPackedVtAlign = {PACKED_VT_ALIGN};  // keys: where a packed sequence's V^T starts"]
          if packs_vt(spec) else []),
        f"constexpr int kMaxOffset = {fp8_max_offset(params)};  // P peaks at 2^8: 2^kMaxOffset past its running max, "
        "which may lag by the rescale threshold (attn_sm90::softmax_tile)",
        f"constexpr int kMaxChains = {fp8_max_chains(spec.d_qk)};  // independent FMNMX chains of a row's maximum "
        "(attn_tl::update_row_max)",
        "",
        f"using TiledMmaQK = decltype(make_tiled_mma({qk_op}, Layout<Shape<Int<kConsumerWGs>, _1, _1>>{{}}));",
        f"using TiledMmaPV = decltype(make_tiled_mma({pv_op}, Layout<Shape<Int<kConsumerWGs>, _1, _1>>{{}}));",
        *accumulator_layouts(),
        "// shared tiles in bytes: Q | O (bf16, its own: another warpgroup may still read its Q rows) | K stages |",
        "// V^T stages (kHeadDimV x kBlockN)",
        "constexpr int kTileQElems = kBlockM * kHeadDimQK + kBlockM * kHeadDimV * int(sizeof(ElementO));",
        "constexpr int kTileKElems = kBlockN * kHeadDimQK;",
        "constexpr int kTileVElems = kBlockN * kHeadDimV;",
        "constexpr int kTileQBytes = kBlockM * kHeadDimQK;",
        "constexpr int kTileKBytes = kTileKElems;",
        "constexpr int kTileVBytes = kTileVElems;",
        *(["// the in-kernel transpose: a staging V tile (kBlockN x kHeadDimV, as loaded) per stage after the V^T stages",
           f"constexpr int kChunkVs = {fp8_chunk(spec.d_v)};  // columns of a staged V box and swizzle atom (bytes)",
           f"constexpr bool kVtAccumulatorOrder = {'true' if params.vt_key_order == 'accumulator' else 'false'};"
           "  // V^T's keys in P's accumulator order",
           "constexpr int kBarrierOffset = kTileQElems + kStages * (kTileKElems + 2 * kTileVElems);"]
          if vt_producer(spec, params) else
          ["constexpr int kBarrierOffset = kTileQElems + kStages * (kTileKElems + kTileVElems);"]),
    ]


def vt_producer(spec, params) -> bool:
    """An FP8 kernel whose producer warpgroup transposes V (KernelParams.v_transpose "producer")."""
    return is_fp8(spec) and getattr(params, "v_transpose", "runtime") == "producer"


# A packed sequence's keys start at a multiple of this in the transposed V (attn_sm90::packed_vt_key0): TMA boxes start
# 16-byte aligned in their innermost dimension. The runtime reads it from the kernel's tensor map ("seq_align").
PACKED_VT_ALIGN = 16


def packs_vt(spec) -> bool:
    """An FP8 kernel of packed sequences reads each sequence's V^T from an aligned key of one packed V^T (varlen; paged,
    whose pages the runtime gathers into the same layout)."""
    return is_fp8(spec) and spec.layout in ("varlen", "paged")
FP8_MAX_OFFSET = 8   # FA3's: P's row maximum 2^8 < 448 (e4m3's largest finite), fewer small P in e4m3's subnormals


def fp8_max_offset(params) -> int:
    """kMaxOffset of an FP8 kernel: FP8_MAX_OFFSET less its rescale threshold, since a row's P may then exceed 2^offset
    by 2^threshold before its max moves (translate/params_sm90.py FP8_RESCALE_THRESHOLDS)."""
    return FP8_MAX_OFFSET - params.rescale_threshold


# FMNMX chains of a row's maximum in an FP8 kernel, by head dim. Measured on an H200 (5 interleaved rounds, one process;
# BENCHMARKS.md, FP8 dense prefill): at head dim 64 two chains ran 5-9% faster than one at 8k-16k keys (non-causal 16k
# 635.5 against 584.0 TFLOPS; causal 613.3 against 582.4), four 0-7% and eight slower; at 128 one chain was fastest
# (two to eight 1-3% slower). 96, 192 and 256 are not measured yet: 96 takes d64's two (its 192-row tile is d64's, and
# its GEMMs per score, 1.5x d64's, leave the softmax's latency as exposed), 192 and 256 d128's one (1.5x and twice
# d128's GEMM per score).
FP8_MAX_CHAINS = {64: 2, 96: 2, 128: 1, 192: 1, 256: 1}


def fp8_max_chains(head_dim: int) -> int:
    """FMNMX chains of a row's maximum in an FP8 kernel (FP8_MAX_CHAINS)."""
    return FP8_MAX_CHAINS[head_dim]


def smem_layouts(params, spec) -> list[str]:
    """CuTe's layouts of the shared tiles, which gmma_operand() and attn_sm90::store_o_tile compute without: the
    host checks (tests/translate) compare against them; a kernel declares SmemLayoutP alone, for an SS P·V's
    register-to-shared copy of P. Each alias instantiates tile_to_shape: the five cost ~0.3 CPU s of cicc per
    kernel (MHA d128 / d64 defaults, 4.8 -> 4.5 s, nvcc 13.0, 2 cores, BENCHMARKS.md, nvcc cost per kernel)."""
    qk, v = swizzle.k_major_atom(swizzle.chunk(spec.d_qk)), swizzle.k_major_atom(swizzle.chunk(spec.d_v))
    return [
        "// K-major, swizzled tiles: the image TMA boxes of 64 columns x rows write, chunk after chunk (128-byte "
        "swizzle; 32 columns and the 64-byte swizzle where 64 do not divide the head dim)",
        f"using SmemLayoutQ = decltype(tile_to_shape({qk}{{}}, Shape<Int<kBlockM>, Int<kHeadDimQK>>{{}}));",
        f"using SmemLayoutK = decltype(tile_to_shape({qk}{{}}, Shape<Int<kBlockN>, Int<kHeadDimQK>, Int<kStages>>{{}}));",
        "// V as stored (BN, HeadDimV) read as (HeadDimV, BN): the same bytes, MN-major for the P·V GEMM",
        f"using SmemLayoutVt = decltype(tile_to_shape({swizzle.mn_major_atom(swizzle.chunk(spec.d_v))}{{}}, "
        "Shape<Int<kHeadDimV>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{}));",
        f"using SmemLayoutO = decltype(tile_to_shape({v}{{}}, Shape<Int<kBlockM>, Int<kHeadDimV>>{{}}));",
        _smem_layout_p(params),
    ]


def _smem_layout_p(params) -> str:
    return (f"using SmemLayoutP = decltype(tile_to_shape({swizzle.k_major_atom(params.block_n)}{{}}, "
            "Shape<Int<kBlockM>, Int<kBlockN>>{}));")


def kernel_types(spec, params, stages: int, separate_o: bool, layouts: bool = False) -> list[str]:
    """The kernel's constants and types; ``layouts``: with all of smem_layouts() (the host checks' view), else
    SmemLayoutP alone where an SS P·V uses it."""
    if is_fp8(spec):
        return fp8_kernel_types(spec, params, stages)
    elem = "cutlass::half_t" if spec.dtype == "fp16" else "cutlass::bfloat16_t"
    qk_op, pv_op = gemm_ops(spec, params)
    lines = [
        f"using Element = {elem};",
        *_shape_constants(spec, params, stages),
        "",
        f"using TiledMmaQK = decltype(make_tiled_mma({qk_op}, Layout<Shape<Int<kConsumerWGs>, _1, _1>>{{}}));",
        f"using TiledMmaPV = decltype(make_tiled_mma({pv_op}, Layout<Shape<Int<kConsumerWGs>, _1, _1>>{{}}));",
        *accumulator_layouts(),
        *(smem_layouts(params, spec) if layouts else [_smem_layout_p(params)] if params.pv_operand == "ss" else []),
        "constexpr int kTileQElems = kBlockM * cute::max(kHeadDimQK, kHeadDimV);",
        "constexpr int kTileKElems = kBlockN * kHeadDimQK;",
        "constexpr int kTileVElems = kBlockN * kHeadDimV;",
        f"constexpr int kTilePElems = {'kBlockM * kBlockN' if params.pv_operand == 'ss' else '0'};",
        "constexpr int kTileQBytes = kBlockM * kHeadDimQK * int(sizeof(Element));",
        "constexpr int kTileKBytes = kTileKElems * int(sizeof(Element));",
        "constexpr int kTileVBytes = kTileVElems * int(sizeof(Element));",
        f"constexpr int kTileOElems = {'kBlockM * kHeadDimV' if separate_o else '0'};"
        f"  // {'its own tile: Q goes back to the producer before the epilogue' if separate_o else 'O reuses Q'}",
        "constexpr int kBarrierOffset = (kTileQElems + kStages * (kTileKElems + kTileVElems) + kTilePElems + "
        "kTileOElems) * int(sizeof(Element));",
    ]
    return lines


_CPP_ARG = {"i32": "const int {}", "f32": "const float {}", "ptr": "const float* __restrict__ {}"}


def kernel_signature(name: str, varlen: bool = False, paged: bool = False, pack: bool = False,
                     options: tuple = (), fp8: bool = False) -> list[str]:
    args = base.kernel_arguments(out_element="ElementO" if fp8 else "Element") + \
        ["const int heads_q", "const int batch", "int* __restrict__ tile_counter"]
    if pack:   # the query heads a tile holds: the group where it divides 64, else 1 (tuner/serving/launch/plan.py)
        args.append("const int pack")
    if varlen:
        args += ["const int* __restrict__ cu_seqlens_q", "const int* __restrict__ cu_seqlens_k",
                 "const int* __restrict__ seqused_k"]
    if paged:
        args += ["const int* __restrict__ page_table", "const int64_t page_table_stride", "const int page_size"]
    # (translate/sm90/generate.py OPTION_ARGS, then an FP8 kernel's FP8_ARGS)
    args += [_CPP_ARG[kind].format(arg) for arg, kind in options]
    args += [f"const __grid_constant__ CUtensorMap tma_{r}" for r in "qkvo"]
    return base.kernel_signature(name, args)


def kernel_setup(params, pack: bool = False, fp8: bool = False, vt: bool = False) -> list[str]:
    """What every thread does once: the tile count, the shared-memory plan and the mbarriers. ``vt``: the in-kernel
    transpose's staging tiles and their barriers, and the transposer's hand-back of each tile's number (q_empty)."""
    kv_arrivals = "kKVFullArrivals" if kv_cp_async(params) else "1"   # (a TMA kernel's source as it always was)
    # an FP8 kernel's cp.async producer copies K only: V^T is still one thread's TMA (one arrival and its bytes)
    v_arrivals = "1" if fp8 and kv_cp_async(params) else kv_arrivals
    if vt:
        staging = ["Element* smem_vs = smem_v + kStages * kTileVElems;  // staged V tiles, as loaded (transposer's input)"]
        slot = ["uint64_t* vs_full = v_empty + kStages;  // a staged V tile landed",
                "uint64_t* vs_empty = vs_full + kStages;  // the transposer has read it",
                "int* vt_info = reinterpret_cast<int*>(vs_empty + kStages);  // the tile's V tiles and keys, for the "
                "transposer",
                "int* tile_slot = vt_info + 2;  // the tile the producer hands out next"]
        q_empty_count = "kConsumerWGs + 1);  // and the transposer, once it read the tile's number"
        vs_init = ["    attn_sm90::FullBarrier::init(&vs_full[s], 1);",
                   "    attn_sm90::EmptyBarrier::init(&vs_empty[s], 1);  // one transposer thread hands back"]
    else:
        staging, vs_init = [], []
        slot = ["int* tile_slot = reinterpret_cast<int*>(v_empty + kStages);  // the tile the producer hands out next"]
        q_empty_count = "kConsumerWGs);"
    return [
        "extern __shared__ __align__(1024) char attn_smem[];",
        "const int tidx = threadIdx.x;",
        *base.scale_setup(),
        *tile_grid(pack),
        "const int causal_offset = seqlen_k - seqlen_q;  // bottom-right: row r sees key c iff c <= r + offset",
        "",
        "// shared-memory plan: Q | K stages | V stages | P (SS only) | O (when it fits) | mbarriers",
        "Element* smem_q = reinterpret_cast<Element*>(attn_smem);",
        "Element* smem_k = smem_q + kTileQElems;",
        "Element* smem_v = smem_k + kStages * kTileKElems;",
        *staging,
        *_smem_p_and_o(fp8),
        "uint64_t* q_full = reinterpret_cast<uint64_t*>(attn_smem + kBarrierOffset);  // Q and its tile number",
        "uint64_t* q_empty = q_full + 1;",
        "uint64_t* k_full = q_empty + 1;",
        "uint64_t* k_empty = k_full + kStages;",
        "uint64_t* v_full = k_empty + kStages;",
        "uint64_t* v_empty = v_full + kStages;",
        *slot,
        "if (tidx == 0) {",
        "  attn_sm90::FullBarrier::init(q_full, 1);",
        f"  attn_sm90::EmptyBarrier::init(q_empty, {q_empty_count}",
        "  for (int s = 0; s < kStages; ++s) {",
        f"    attn_sm90::FullBarrier::init(&k_full[s], {kv_arrivals});",
        f"    attn_sm90::FullBarrier::init(&v_full[s], {v_arrivals});"
        + ("  // V^T: one thread's TMA" if v_arrivals != kv_arrivals else ""),
        "    attn_sm90::EmptyBarrier::init(&k_empty[s], kConsumerWGs);  // one thread per consumer warpgroup hands back",
        "    attn_sm90::EmptyBarrier::init(&v_empty[s], kConsumerWGs);",
        *vs_init,
        "  }",
        "  cutlass::arch::fence_barrier_init();",
        "}",
        "__syncthreads();",
    ]


def _smem_p_and_o(fp8: bool) -> list[str]:
    """Where P (SS only) and O live; an FP8 kernel has no P tile and its bf16 O follows Q's bytes within kTileQElems
    (1024-byte aligned: 64 rows of 64 or 128 bytes)."""
    if fp8:
        return ["ElementO* smem_o = reinterpret_cast<ElementO*>(smem_q + kBlockM * kHeadDimQK);  // bf16 O"]
    return ["[[maybe_unused]] Element* smem_p = smem_v + kStages * kTileVElems;",
            "[[maybe_unused]] Element* smem_o = kTileOElems ? smem_p + kTilePElems : smem_q;"]


def consumer_setup(params, lowered, holders, ctx: Ctx) -> list[str]:
    lines = [
        "const int mma_tidx = tidx - 128;",
        # warp-uniform (a shuffle from lane 0): what depends on it (the descriptors) stays in uniform registers
        "const int wg = cutlass::canonical_warp_group_idx() - 1;  // consumer warpgroup: query rows [64 wg, 64 wg + 64)",
        "TiledMmaQK tiled_mma_qk;",
        "TiledMmaPV tiled_mma_pv;",
        "auto thr_qk = tiled_mma_qk.get_thread_slice(mma_tidx);",
        "auto thr_pv = tiled_mma_pv.get_thread_slice(mma_tidx);",
        "// GMMA descriptors of the shared tiles (CuTe's partition_fragment_A/B: attn_sm90::gmma_operand)",
        gmma_operand_line("tSrQ", "smem_q", gmma_operand("q", ctx.spec, params, ctx.lowered.stages)),
        gmma_operand_line("tSrK", "smem_k", gmma_operand("k", ctx.spec, params, ctx.lowered.stages)) + "  // (MMA, N, K, stage)",
        gmma_operand_line("tOrV", "smem_v", gmma_operand("v", ctx.spec, params, ctx.lowered.stages)) + "  // (MMA, N, K, stage)",
        "Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));  // (row, col)",
        "int k_read = 0, v_read = 0;  // tiles taken from each ring so far (across this CTA's tiles)",
        "const bool never = seqlen_k < 0;  // false, unknown to the compiler: see attn_sm90::ordering_point",
    ]
    score = sorted(lowered.score_accs)[0]
    lines.append("Tensor rescale_o = make_tensor<float>(Shape<Int<decltype(size<0>(attn_sm90::rowcol_layout("
                 "AccLayoutS{})))::value>>{});")
    stats = sorted({(o.data["max"], o.data["sum"]) for o in _all_ops(lowered.consumer) if o.kind == "softmax"})
    for mx, sm in stats:
        lines += [f"Tensor {mx} = make_tensor_like(rescale_o);", f"Tensor {sm} = make_tensor_like(rescale_o);"]
    del score
    if params.pv_operand == "ss":
        lines += ["Tensor sP = make_tensor(make_smem_ptr(smem_p), SmemLayoutP{});",
                  gmma_operand_line("tOsP", "smem_p", gmma_operand("p", ctx.spec, params, ctx.lowered.stages))
                  + "  // P as GMMA descriptors",
                  # (stmatrix: four 8x8 matrices an instruction; CuTe's element-wise copy kept a 64-bit smem pointer per
                  # element and spilled them, 760 bytes at FA4's d96 192 x 144 tile and 1100 at FA3's d64 192 x 192)
                  "auto r2s_p = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, tiled_mma_qk);",
                  "auto r2s_thr_p = r2s_p.get_thread_slice(mma_tidx);"]
    elif is_fp8(ctx.spec):   # e4m3 A operand: 16 values a thread per 32-column k-block
        if params.vt_key_order == "natural":
            lines.append("const attn_sm90::Fp8PLanes p_lanes = attn_sm90::fp8_p_lanes(mma_tidx % 32);"
                         "  // P's exchange within each quad")
        for p in sorted(lowered.p_tensors):
            lines.append(f"Tensor rP_{p} = make_tensor<Element>(Shape<_16, _1, Int<kBlockN / 32>>{{}});")
    else:
        for p in sorted(lowered.p_tensors):
            lines.append(f"Tensor rP_{p} = make_tensor<Element>(attn_sm90::acc_to_a_layout("
                         "AccLayoutS{}));")
    for g in sorted(holders, key=lambda o: o.line):
        gid = ctx.gemm_id(g)
        lines.append(f"int {gid}_slot = 0; bool {gid}_pending = false;  // TL {g.line}: the stage its batch reads")
    return lines


def consumer_tile_init(lowered, pingpong: bool, fp8: bool = False, varlen: bool = False) -> list[str]:
    """Per tile: fresh softmax statistics (the accumulators are cleared by their Allocate statements),
    the ring position where this tile's K tiles start, the ping-pong opening; an FP8 kernel's descales of the
    tile's (batch, KV head): q's and k's fold into the exponent scale, v's into the final division (packed
    sequences: the batch is the tile's sequence)."""
    stats = sorted({(o.data["max"], o.data["sum"]) for o in _all_ops(lowered.consumer) if o.kind == "softmax"})
    lines = [ln for mx, sm in stats for ln in (f"fill({mx}, -INFINITY);", f"fill({sm}, 0.f);")]
    if fp8:
        lines += [f"const int descale_at = {'vt.seq' if varlen else 'bidb'} * (heads_q / group) + bidh_kv;"
                  "  // descales are (batch, KV heads)",
                  "const float tile_scale_log2 = kScaleLog2 * (q_descale ? __ldg(q_descale + descale_at) : 1.f) *"
                  " (k_descale ? __ldg(k_descale + descale_at) : 1.f);",
                  "const float out_descale = v_descale ? __ldg(v_descale + descale_at) : 1.f;"]
    lines.append("const int k_tile0 = k_read;  // this tile's first K tile in the ring's count")
    if pingpong:
        lines.append("bool pp_first = true;  // warpgroup 0 issues this tile's first GEMMs without waiting")
    return lines


def _all_ops(nodes):
    from translate.sm90.ir import iter_ops
    return iter_ops(nodes)
