"""Emitters of the warp-specialised Hopper kernel: one per op kind, and the blocks they make (the ping-pong turns,
the softmax split around the P·V wait); the per-config types and the kernel frame are in translate.sm90.frame.

Every emitted block starts with the TL line it came from; the synchronisation the dependency pass
placed (waits, stage releases, the deferred rescale) is printed before the op with its reason.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from translate.params_sm90 import PV_WAIT_EIGHTHS
from translate.sm90 import swizzle
from translate.sm90.ir import Cond, Loop, Op
from translate.ir import expr_to_cpp

INDENT = "  "

# Named barrier ids (CUTLASS adds 8; 0 is __syncthreads): the epilogue of each consumer warpgroup, and
# the ping-pong turn of each consumer warpgroup (2 or 3 take turns in a ring).
EPILOGUE_BARRIER = 1
PINGPONG_BARRIER = 5
# The ping-pong schedule's revision, recorded with A/B timings (scripts/param_ab_check.py) so that a table derived
# from them (scripts/bucket_table.py) does not count timings of a ping-pong kernel that no longer exists.
# 1: the turn's stage waits inside the turn; 2 (2026-11-26): the turn's first stage is waited for before it.
PINGPONG_REVISION = 2
# The warp-specialised kernels' revision: bumped when a translator change moves the default kernel's speed (so every
# A/B ratio against it), so that a table derived from A/B records (scripts/bucket_table.py) takes, at each point a
# record of the current revision timed, only those records. 1: before 2026-11-26; 2: the warp-uniform
# warpgroup index (the GMMA descriptors in uniform registers; dense defaults 1.02-1.07x faster, ping-pong unchanged).
KERNEL_REVISION = 2
# The indexed (cp.async) producer's warpgroup: the next tile's number, from thread 0 to the others.
PRODUCER_BARRIER = 4
# The FP8 in-kernel transpose of V (KernelParams.v_transpose "producer"): warps 1-3 of the producer warpgroup, which
# transpose the V tiles the TMA thread stages (attn_sm90::transpose_v_tile), hand each tile over on this barrier (id 0:
# CUTLASS's first free one, no other use in these kernels).
VT_BARRIER = 0
VT_THREADS = 96
VT_WARPS = 3
# Producer threads that copy K/V with cp.async (the whole producer warpgroup, as FA3's paged path): each
# arrives on a stage's full barrier once its own copies landed.
CP_ASYNC_PRODUCER_THREADS = 128


@dataclass
class Ctx:
    spec: object
    params: object
    lowered: object
    stage_holders: dict                      # GEMM op -> True: it holds a pipeline stage until released
    buffer_role: dict                        # TL shared buffer -> q, k, v
    separate_o: bool = False                 # O has its own shared tile (else it reuses Q's)
    varlen: bool = False                     # packed sequences (tl/layout.py): rows found by cu_seqlens
    paged: bool = False                      # keys and values through a page table (tl/layout.py)
    kv_cp_async: bool = False                # K/V copied by the producer warpgroup's threads (else one thread's TMA)
    pack: bool = False                       # pack_gqa: a tile's rows are (token, query head) of one KV head
    vt_producer: bool = False                # FP8: the producer warpgroup transposes V (else the runtime's V^T)
    loop_vars: list = field(default_factory=list)
    gemm_names: dict = field(default_factory=dict)
    # cp.async producer: the page lookups in scope, by tile expression (K's serves V's copy of the same tile)
    page_lookups: dict = field(default_factory=dict)

    @property
    def fp8(self) -> bool:
        """e4m3 inputs, bf16 output (translate/sm90/frame.py fp8_kernel_types)."""
        return getattr(self.spec, "dtype", None) == "fp8"

    @property
    def scale_log2(self) -> str:
        """The exponent scale of the softmax: an FP8 tile's folds its q and k descales (frame.consumer_tile_init)."""
        return "tile_scale_log2" if self.fp8 else "kScaleLog2"

    @property
    def out_element(self) -> str:
        return "ElementO" if self.fp8 else "Element"

    @property
    def top(self) -> str:
        """One past the KV block of iteration 0 (the walk goes down from it): n_tiles, or a local kernel's
        n_block_max (translate/sm90/tiles.py window_bounds)."""
        return "n_block_max" if getattr(self.spec, "local", False) else "n_tiles"

    def gemm_id(self, op: Op) -> str:
        if op not in self.gemm_names:
            self.gemm_names[op] = f"g{op.line}_{len(self.gemm_names)}"
        return self.gemm_names[op]

    def reg_name(self, tensor: str) -> str:
        """The C++ register tensor of a lowered tensor: accumulators acc_X, operand copies rP_X."""
        return f"rP_{tensor}" if tensor in self.lowered.p_tensors else f"acc_{tensor}"

    def expr(self, text: str, line: int) -> str:
        syms = {"N": "n_tiles", "BM": "kBlockM", "BN": "kBlockN", "block_idx": "m_block"}
        for v in self.loop_vars:
            syms[v] = v
        return expr_to_cpp(text, syms, line)


def _indent(lines: list[str], level: int = 1) -> list[str]:
    return [(INDENT * level + ln) if ln else ln for ln in lines]


def comment(node) -> str:
    line = getattr(node.stmt, "line", 0)
    return f"// TL {line}: {node.tl_text}" if line else f"// {node.tl_text}"


# ---- producer -----------------------------------------------------------------------------------------

def _box_args(dim: str, d: int, rows: str) -> str:
    """A 16-bit tile's TMA box template arguments: its boxes a row, ``rows``, and their columns where not 64 (the 64-byte
    swizzle's 32 where 64 do not divide the head dim: swizzle.chunk)."""
    cols = swizzle.chunk(d)
    return f"{dim} / 64, {rows}" if cols == 64 else f"{dim} / {cols}, {rows}, {cols}"


def emit_tma_copy(op: Op, ctx: Ctx) -> list[str]:
    role = op.data["role"]
    q_row, k_row = ("q_row0 + m_block * kBlockM", "k_row0 + n_block * kBlockN") if ctx.varlen else \
        ("m_block * kBlockM", "n_block * kBlockN")
    if role == "q":
        # packed heads: Q's map is (d, heads, seqlen, batch) and its box the tile's heads x its tokens
        at = "bidh * pack, m_block * tile_tokens, bidb" if ctx.pack else f"{q_row}, bidh, bidb"
        chunks = "kHeadDimQK / kChunkQK, kBlockM, kChunkQK" if ctx.fp8 else _box_args("kHeadDimQK", ctx.spec.d_qk,
                                                                                       "kBlockM")
        lines = ["attn_sm90::FullBarrier::arrive_and_expect_tx(q_full, kTileQBytes);  // with the tile's number",
                 f"attn_sm90::tma_load_tile<{chunks}>(&tma_q, q_full, smem_q, {at});"
                 + ("  // heads fastest" if ctx.pack else "")]
        if ctx.kv_cp_async:   # the whole warpgroup runs the producer: Q is still one thread's TMA
            return ["if (tidx == 0) {  // one thread loads Q"] + _indent(lines) + ["}"]
        return lines
    tile = ctx.expr(op.data["tile"], op.line)
    x = role   # k or v
    dim = "kHeadDimQK" if x == "k" else "kHeadDimV"
    boxes = _box_args(dim, ctx.spec.d_qk if x == "k" else ctx.spec.d_v, "kBlockN")
    if ctx.kv_cp_async and ctx.fp8 and x == "v":   # V^T from the runtime's packed copy: still one thread's TMA
        return ["if (tidx == 0) {  // one thread loads V^T (TMA); the warpgroup copies K"] + \
            _indent(_tma_kv_block(x, INDENT + _fp8_load(x, k_row, ctx), tile, ctx)) + ["}"]
    if ctx.kv_cp_async:
        lookup = ctx.page_lookups.get(tile)
        lines = []
        if lookup is None:   # the first copy of this tile in scope reads the table (before its wait); the next reuses it
            lookup = ctx.page_lookups[tile] = f"tile_pages_{len(ctx.page_lookups)}"
            lines.append(f"const attn_sm90::PagedGroup {lookup} = attn_sm90::paged_group_rows<kBlockN>(({ctx.top} - 1 - "
                         f"({tile})) * kBlockN, seqlen_k, pages, page_size, page_shift, tidx);  // tile {tile}'s pages, "
                         "read before the stage's wait (K's and V's)")
        # an FP8 kernel's e4m3 K rows: the 16-bit rows of half the columns, the same bytes in the same places
        copy, note = ("cp_async_load_paged_8bit", "  // e4m3 rows as the 16-bit rows of half the columns") if ctx.fp8 \
            else ("cp_async_load_paged", "")
        return lines + [
            "{",
            f"{INDENT}const int slot = {x}_write % kStages;",
            f"{INDENT}const int n_block = {ctx.top} - 1 - ({tile});  // tile {tile} in iteration order: last KV block first",
            f"{INDENT}const int64_t rows_at = attn_sm90::paged_group_offset({lookup}, {x}_batch_stride, "
            f"{x}_row_stride);",
            f"{INDENT}attn_sm90::wait_barrier(&{x}_empty[slot], ((({x}_write / kStages) & 1) ^ 1));"
            "  // the consumers handed the stage back",
            f"{INDENT}++{x}_write;",
            f"{INDENT}attn_sm90::{copy}<{dim}, kBlockN>(smem_{x} + slot * "
            f"kTile{x.upper()}Elems, {x}_ptr + bidh_kv * {x}_head_stride, rows_at, {x}_row_stride, "
            "n_block * kBlockN, seqlen_k, tidx);" + note,
            f"{INDENT}attn_sm90::cp_async_arrive(&{x}_full[slot]);  // this thread's part of the stage, once it landed",
            "}",
        ]
    if ctx.vt_producer and x == "v":
        return _staged_v_load(op, ctx, tile, k_row)
    if ctx.fp8:   # TMA (K by cp.async above: a paged kernel's g2s_atom SM80_CP_ASYNC_CACHEGLOBAL)
        load = INDENT + _fp8_load(x, k_row, ctx)
    elif ctx.paged:
        load = (f"{INDENT}attn_sm90::tma_load_paged<{boxes}>(&tma_{x}, &{x}_full[slot], "
                f"smem_{x} + slot * kTile{x.upper()}Elems, n_block * kBlockN, seqlen_k, bidh_kv, pages, page_size);")
    else:
        load = (f"{INDENT}attn_sm90::tma_load_tile<{boxes}>(&tma_{x}, &{x}_full[slot], "
                f"smem_{x} + slot * kTile{x.upper()}Elems, {k_row}, bidh_kv, bidb);")
    return _tma_kv_block(x, load, tile, ctx)


def _tma_kv_block(x: str, load: str, tile: str, ctx: Ctx) -> list[str]:
    """A K or V tile by one thread's TMA: wait for the stage, count it, expect its bytes, ``load``."""
    return [
        "{",
        f"{INDENT}const int slot = {x}_write % kStages;",
        f"{INDENT}attn_sm90::wait_barrier(&{x}_empty[slot], ((({x}_write / kStages) & 1) ^ 1));"
        "  // the consumers handed the stage back",
        f"{INDENT}++{x}_write;",
        f"{INDENT}attn_sm90::FullBarrier::arrive_and_expect_tx(&{x}_full[slot], kTile{x.upper()}Bytes);",
        f"{INDENT}const int n_block = {ctx.top} - 1 - ({tile});  // tile {tile} in iteration order: last KV block first",
        load,
        "}",
    ]


def _staged_v_load(op: Op, ctx: Ctx, tile: str, k_row: str) -> list[str]:
    """The FP8 in-kernel transpose's V copy: V as given (keys x d_v bytes, boxes of kChunkVs bytes, as K's) into the
    staging slot of the V ring's stage, behind its own full/empty pair (vs_full: the bytes landed; vs_empty: the
    transposer read them). The V^T slot's barriers (v_full, v_empty) are the transposer's and the consumers'."""
    if ctx.paged:
        load = ("attn_sm90::tma_load_paged<kHeadDimV / kChunkVs, kBlockN, kChunkVs>(&tma_v, &vs_full[slot], "
                "smem_vs + slot * kTileVElems, n_block * kBlockN, seqlen_k, bidh_kv, pages, page_size);")
    else:
        load = (f"attn_sm90::tma_load_tile<kHeadDimV / kChunkVs, kBlockN, kChunkVs>(&tma_v, &vs_full[slot], "
                f"smem_vs + slot * kTileVElems, {k_row}, bidh_kv, bidb);")
    return [
        "{",
        f"{INDENT}const int slot = v_write % kStages;",
        f"{INDENT}attn_sm90::wait_barrier(&vs_empty[slot], (((v_write / kStages) & 1) ^ 1));"
        "  // the transposer has read the staging slot",
        f"{INDENT}++v_write;",
        f"{INDENT}attn_sm90::FullBarrier::arrive_and_expect_tx(&vs_full[slot], kTileVBytes);",
        f"{INDENT}const int n_block = {ctx.top} - 1 - ({tile});  // tile {tile} in iteration order: last KV block first",
        f"{INDENT}{load}  // V as given: the transposer makes V^T",
        "}",
    ]


def emit_transpose_v(op: Op, ctx: Ctx) -> list[str]:
    """The producer's `Compute Transpose V_shared and get Vt_shared`: warps 1-3 of the producer warpgroup run it, in
    their own loop over the V ring (generate.py transposer_loop), as each staged tile lands."""
    return [f"// {op.data['dst']} = {op.data['src']} transposed: by warps 1-3 of this warpgroup (the transposer loop), "
            "once the staged tile lands"]


def _fp8_load(x: str, k_row: str, ctx: Ctx) -> str:
    """An FP8 kernel's K or V tile: K in boxes of kChunkQK bytes (a paged cache's within its pages, as the 16-bit TMA
    producer reads them), V transposed (keys along the rows). Packed sequences (varlen, and paged: the runtime gathers
    the pages' V into the same packed V^T) hold each sequence's keys from an aligned key (attn_sm90::packed_vt_key0;
    cu_seqlens_k gives the sequences' first keys, for a paged call the running sum of seqused_k)."""
    if x == "k":
        if ctx.paged:
            return ("attn_sm90::tma_load_paged<kHeadDimQK / kChunkQK, kBlockN, kChunkQK>(&tma_k, &k_full[slot], "
                    "smem_k + slot * kTileKElems, n_block * kBlockN, seqlen_k, bidh_kv, pages, page_size);")
        return (f"attn_sm90::tma_load_tile<kHeadDimQK / kChunkQK, kBlockN, kChunkQK>(&tma_k, &k_full[slot], "
                f"smem_k + slot * kTileKElems, {k_row}, bidh_kv, bidb);")
    vt_key = "attn_sm90::packed_vt_key0<kPackedVtAlign>(k_row0, vt.seq) + n_block * kBlockN" if ctx.varlen else k_row
    return (f"attn_sm90::tma_load_vt<kBlockN / kChunkV, kHeadDimV, kChunkV>(&tma_v, &v_full[slot], "
            f"smem_v + slot * kTileVElems, {vt_key}, bidh_kv, bidb);")


# ---- consumer -----------------------------------------------------------------------------------------

def emit_alloc_acc(op: Op, ctx: Ctx) -> list[str]:
    name, mma = op.data["name"], op.data["mma"]
    lines = [f"Tensor acc_{name} = make_tensor<float>(AccLayout{'S' if mma == 'qk' else 'O'}{{}});"
             "  // partition_fragment_C's type (frame.accumulator_layouts)"]
    if op.data["clear"]:
        lines.append(f"clear(acc_{name});")
    if mma == "qk":
        lines.append(f"int tile_{name} = 0;  // the K tile (iteration order) the latest GEMM into {name} read")
    return lines


def gemm_stage_wait(op: Op, ctx: Ctx) -> list[str]:
    """The wait for the K or V stage a GEMM reads (its slot chosen from the ring's count)."""
    g = ctx.gemm_id(op)
    if op.data["mma"] == "qk":
        return [f"{g}_slot = k_read % kStages;",
                f"attn_sm90::wait_barrier(&k_full[{g}_slot], (k_read / kStages) & 1);  // the K tile landed"]
    return [f"{g}_slot = v_read % kStages;",
            f"attn_sm90::wait_barrier(&v_full[{g}_slot], (v_read / kStages) & 1);  // the V tile landed"]


def emit_gemm(op: Op, ctx: Ctx, stage_waited: bool = False) -> list[str]:
    """A GEMM batch: the wait for its stage (unless ``stage_waited``: the caller emitted gemm_stage_wait before),
    the issue, and its pending flag."""
    g = ctx.gemm_id(op)
    mma, zero = op.data["mma"], "true" if op.data["zero_init"] else "false"
    lines = ["{"] + ([] if stage_waited else [INDENT + line for line in gemm_stage_wait(op, ctx)])
    if mma == "qk":
        x, res = "k", op.data["result"]
        lines += [
            f"{INDENT}tile_{res} = k_read++ - k_tile0;  // numbered within this tile",
            f"{INDENT}attn_sm90::gemm_issue<{zero}>(tiled_mma_qk, tSrQ, tSrK(_, _, _, {g}_slot), acc_{res});",
        ]
    else:
        x = "v"
        a = "tOsP" if ctx.params.pv_operand == "ss" else f"rP_{op.data['a']}"
        lines += [
            f"{INDENT}++v_read;",
            f"{INDENT}attn_sm90::gemm_issue<{zero}>(tiled_mma_pv, {a}, tOrV(_, _, _, {g}_slot), acc_{op.data['result']});",
        ]
    lines.append(f"{INDENT}{g}_pending = true;  // stage {x}[{g}_slot] is read until this batch completes")
    lines.append("}")
    return lines


def emit_mask(op: Op, ctx: Ctx) -> list[str]:
    t = op.data["target"]
    if op.data.get("window"):   # a local kernel: the tiles at both ends of the walk, by the window's sizes
        return [f"if (tile_{t} < n_masked || tile_{t} >= n_tiles - n_masked_left) {{  // the window's edge tiles",
                f"{INDENT}attn_sm90::apply_mask_window(acc_{t}, tScS, m_block * kBlockM, (n_block_max - 1 - tile_{t}) "
                f"* kBlockN, seqlen_k, causal_offset, wl, wr{', pack' if ctx.pack else ''});",
                "}"]
    causal = "kCausal" if op.data["causal"] else "false"
    if ctx.pack:   # a row's token is its tile row / pack (rows are token x pack + head)
        return [f"if (tile_{t} < n_masked) {{  // the diagonal / ragged tiles come first",
                f"{INDENT}attn_sm90::apply_mask_packed<{causal}>(acc_{t}, tScS, m_block * kBlockM, "
                f"(n_tiles - 1 - tile_{t}) * kBlockN, seqlen_k, causal_offset, pack);",
                "}"]
    return [f"if (tile_{t} < n_masked) {{  // the diagonal / ragged tiles come first",
            f"{INDENT}attn_tl::apply_mask<{causal}>(acc_{t}, tScS, m_block * kBlockM, "
            f"(n_tiles - 1 - tile_{t}) * kBlockN, seqlen_k, causal_offset);",
            "}"]


def emit_softcap(op: Op, ctx: Ctx) -> list[str]:
    return [f"attn_sm90::softcap_tile(acc_{op.data['target']}, softcap_prescale);  // softcap * tanh(S / softcap): "
            "the cap is in kScaleLog2"]


def emit_sink(op: Op, ctx: Ctx) -> list[str]:
    head0 = "bidh * pack" if ctx.pack else "bidh"
    return [f"attn_sm90::add_sink(acc_{op.data['target']}, {op.data['max']}, {op.data['sum']}, tScS, sinks, {head0}, "
            f"{'pack' if ctx.pack else '1'}, {ctx.scale_log2}, mma_tidx);  // the sink joins each row's max and sum"]


def emit_softmax(op: Op, ctx: Ctx) -> list[str]:
    t = op.data["target"]
    return [f"attn_sm90::softmax_tile{softmax_template(ctx.params, ctx.fp8)}(acc_{t}, {op.data['max']}, "
            f"{op.data['sum']}, rescale_o, {ctx.scale_log2});  // O's rescale is deferred to its next use"]


def softmax_template(params, fp8: bool = False) -> str:
    """softmax_tile's template arguments: none (every tile rescales, MUFU for every exponential: the source as it
    always was), <threshold>, or <threshold, exponentials of every 8 by the FMA pipe's polynomial>; an FP8 kernel's
    third, P's offset (kMaxOffset, 8 less the threshold: translate/sm90/frame.py fp8_max_offset)."""
    if fp8:
        return f"<{params.rescale_threshold}, {params.exp2_poly}, kMaxOffset, kMaxChains>"
    if params.exp2_poly:
        return f"<{params.rescale_threshold}, {params.exp2_poly}>"
    return f"<{params.rescale_threshold}>" if params.rescale_threshold else ""


def _skip_unit(params) -> str:
    return "<true>" if params.rescale_threshold else ""


def emit_reshape(op: Op, ctx: Ctx) -> list[str]:
    src, dst = op.data["src"], op.data["dst"]
    if ctx.fp8 and ctx.params.vt_key_order == "accumulator":
        return [f"attn_sm90::convert_p_fp8_in_place(rP_{dst}, acc_{src});  // accumulator -> e4m3 A operand "
                "(V^T's keys in its order)"]
    if ctx.fp8:
        return [f"attn_sm90::convert_p_fp8(rP_{dst}, acc_{src}, p_lanes);  // accumulator -> e4m3 A operand (RS P·V)"]
    if ctx.params.pv_operand == "ss":
        return [
            "{  // P through shared memory (SS P·V GEMM): 16-bit copy, visible to the tensor cores' async proxy",
            f"{INDENT}Tensor rP = attn_tl::convert_type<Element>(acc_{src});",
            f"{INDENT}cute::copy(r2s_p, r2s_thr_p.retile_S(rP), r2s_thr_p.partition_D(sP));",
            f"{INDENT}cutlass::arch::fence_view_async_shared();",
            f"{INDENT}cutlass::arch::NamedBarrier::sync(128, {EPILOGUE_BARRIER} + wg);  // this warpgroup's rows",
            "}",
        ]
    return [f"attn_sm90::convert_into(rP_{dst}, acc_{src});  // accumulator -> 16-bit A operand (RS P·V GEMM)"]


def emit_normalize(op: Op, ctx: Ctx) -> list[str]:
    if ctx.fp8:
        return [f"attn_sm90::normalize_rows(acc_{op.data['target']}, {op.data['divisor']}, out_descale);"
                "  // v's descale with the division"]
    return [f"attn_sm90::normalize_rows(acc_{op.data['target']}, {op.data['divisor']});"]


def emit_store_o(op: Op, ctx: Ctx) -> list[str]:
    if ctx.varlen:
        return _store_o_varlen(op, ctx)
    acc = op.data["src"]
    # packed heads: O's map is (d, heads, seqlen, batch); a warpgroup's 64 rows are 64 / pack tokens of the tile's heads
    at = ("bidh * pack, m_block * tile_tokens + wg * (64 / pack), bidb" if ctx.pack
          else "m_block * kBlockM + wg * 64, bidh, bidb")
    release_q = ["if (mma_tidx % 128 == 0) { attn_sm90::EmptyBarrier::arrive(q_empty); }"
                 "  // Q's buffer to the producer (next tile)"]
    lines = ["{  // registers -> shared (stmatrix) -> TMA store of this warpgroup's rows (rows past seqlen_q are clipped)"]
    if ctx.separate_o:
        if not op.data.get("q_released"):
            lines += _indent(release_q)
        lines += _indent([
            "if (mma_tidx % 128 == 0) { tma_store_wait<0>(); }  // the previous tile's store has read O's tile",
            f"cutlass::arch::NamedBarrier::sync(128, {EPILOGUE_BARRIER} + wg);"])
    lines += _indent([
        f"Tensor rO = attn_tl::convert_type<{ctx.out_element}>(acc_{acc});",
        "attn_sm90::store_o_tile<kBlockM, kHeadDimV>(rO, smem_o, mma_tidx);  // stmatrix into SmemLayoutO",
        "cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read by the TMA unit",
        f"cutlass::arch::NamedBarrier::sync(128, {EPILOGUE_BARRIER} + wg);",
        "if (mma_tidx % 128 == 0) {",
        f"{INDENT}attn_sm90::tma_store_rows<{_box_args('kHeadDimV', ctx.spec.d_v, 'kBlockM')}>(&tma_o, smem_o + wg * 64 "
        f"* {swizzle.chunk(ctx.spec.d_v)}, {at});",
    ])
    if not ctx.separate_o:   # O sits in Q's tile: Q goes back only once the store has read it
        lines += _indent([f"{INDENT}tma_store_wait<0>();", "}"] + release_q)
    else:                    # the read is waited for before the next tile's epilogue writes O's tile again
        lines += _indent(["}"])
    lines.append("}")
    return lines


def _store_o_varlen(op: Op, ctx: Ctx) -> list[str]:
    """Packed sequences: through shared memory as for the TMA store, then 16-byte stores of the rows that
    belong to this tile's sequence (the TMA unit clips only at the packed tensor's end)."""
    release_q = ["if (mma_tidx % 128 == 0) { attn_sm90::EmptyBarrier::arrive(q_empty); }"
                 "  // Q's buffer to the producer (next tile)"]
    lines = ["{  // registers -> shared (stmatrix) -> global, rows past this sequence's end skipped"]
    if ctx.separate_o:
        if not op.data.get("q_released"):
            lines += _indent(release_q)
        lines += _indent([f"cutlass::arch::NamedBarrier::sync(128, {EPILOGUE_BARRIER} + wg);"
                          "  // the previous tile's rows have been read out of O's tile"])
    lines += _indent([
        f"Tensor rO = attn_tl::convert_type<{ctx.out_element}>(acc_{op.data['src']});",
        "attn_sm90::store_o_tile<kBlockM, kHeadDimV>(rO, smem_o, mma_tidx);  // stmatrix into SmemLayoutO",
        f"cutlass::arch::NamedBarrier::sync(128, {EPILOGUE_BARRIER} + wg);",
        "attn_sm90::store_rows_predicated<kHeadDimV, kBlockM>(smem_o, o_ptr + int64_t(q_row0) * o_row_stride + "
        "bidh * o_head_stride, o_row_stride, wg * 64, m_block * kBlockM + wg * 64, seqlen_q, mma_tidx % 128);",
    ])
    if not ctx.separate_o:   # O sits in Q's tile: Q goes back once every row has been read out
        lines += _indent([f"cutlass::arch::NamedBarrier::sync(128, {EPILOGUE_BARRIER} + wg);"] + release_q)
    lines.append("}")
    return lines


def emit_drain(op: Op, ctx: Ctx) -> list[str]:
    return ["// consumer done: every GEMM finished and every stage handed back"]


EMITTERS = {
    "tma_copy": emit_tma_copy,
    "transpose_v": emit_transpose_v,
    "alloc_acc": emit_alloc_acc,
    "gemm": emit_gemm,
    "mask": emit_mask,
    "softcap": emit_softcap,
    "sink": emit_sink,
    "softmax": emit_softmax,
    "reshape": emit_reshape,
    "normalize": emit_normalize,
    "store_o": emit_store_o,
    "drain": emit_drain,
}


def sync_lines(op: Op, ctx: Ctx, deferred: bool = False) -> list[str]:
    """The wait, stage releases and (unless ``deferred``: the caller emits them after the op) output rescales that
    go before ``op``."""
    out = []
    if op.wait is not None:
        out += [f"// dependency pass: {r}" for r in op.reasons]
        out += [f"warpgroup_fence_operand({ctx.reg_name(t)});" for t in op.data.get("fence_before", ())]
        if op.data.get("fence_before"):   # work on registers precedes this wait: keep it there
            out.append("attn_sm90::ordering_point(never);")
        out.append(f"warpgroup_wait<{op.wait}>();")
        out += [f"warpgroup_fence_operand({ctx.reg_name(t)});" for t in op.data.get("fence_after", ())]
    for g in op.releases:
        gid = ctx.gemm_id(g)
        buf = "k" if g.data["mma"] == "qk" else "v"
        out.append(f"if ({gid}_pending) {{ attn_sm90::release_stage(&{buf}_empty[{gid}_slot], mma_tidx); "
                   f"{gid}_pending = false; }}  // stage back to the producer (TL {g.line})")
    if not deferred:
        out += rescale_lines(op, ctx)
    if op.data.get("release_q"):
        out.append("if (mma_tidx % 128 == 0) { attn_sm90::EmptyBarrier::arrive(q_empty); }"
                   "  // no GEMM reads Q any more in this tile: the producer may load the next tile's")
    return out


def softmax_wait_split(op: Op, nxt, ctx: Ctx) -> bool:
    """pv_wait "mid" / "quarter" / "half": a softmax followed by P's conversion (RS) that must first wait for the
    P.V GEMM in flight."""
    return (ctx.params.pv_wait in PV_WAIT_EIGHTHS and op.kind == "softmax" and ctx.params.pv_operand == "rs"
            and isinstance(nxt, Op) and nxt.kind == "reshape" and nxt.wait is not None)


def emit_softmax_split(softmax: Op, reshape: Op, ctx: Ctx) -> list[str]:
    """The softmax in two halves around the conversion's wait for the P.V GEMM (FA4's order): maxima and scaled
    scores, with "quarter" / "half" that share of the exponentials too, then the wait (kept there by the ordering
    point), then the other exponentials, P's conversion and the output's deferred rescale in one basic block (the
    rescale's skip is a branch: last), so that ptxas interleaves the conversion with the MUFU stream."""
    t, p = softmax.data["target"], ctx.params
    before = PV_WAIT_EIGHTHS[p.pv_wait]
    out = [comment(softmax)] + sync_lines(softmax, ctx)
    scores = f"<{p.rescale_threshold}, kMaxOffset, kMaxChains>" if ctx.fp8 else \
        (f"<{p.rescale_threshold}>" if p.rescale_threshold else "")
    out.append(f"attn_sm90::softmax_scores{scores}(acc_{t}, "
               f"{softmax.data['max']}, rescale_o, {ctx.scale_log2});  // maxima first; the exponentials after the wait")
    if before:
        out.append(f"attn_sm90::softmax_exp<{p.exp2_poly}, 0, {before}>(acc_{t}, {softmax.data['sum']}, rescale_o);"
                   f"  // {before} eighths of the exponentials overlap the P.V GEMM")
    out += [comment(reshape)] + sync_lines(reshape, ctx, deferred=True)
    rest = f"<{p.exp2_poly}, {before}, 8>" if before else (f"<{p.exp2_poly}>" if p.exp2_poly else "")
    out.append(f"attn_sm90::softmax_exp{rest}(acc_{t}, {softmax.data['sum']}, rescale_o);")
    out += EMITTERS["reshape"](reshape, ctx)
    return out + rescale_lines(reshape, ctx)


def rescale_lines(op: Op, ctx: Ctx) -> list[str]:
    return [f"attn_sm90::rescale_rows{_skip_unit(ctx.params)}(acc_{acc}, rescale_o);  // the softmax's deferred factor"
            for acc in op.rescale]


# ---- blocks ---------------------------------------------------------------------------------------------

def _scoped(nodes, ctx: Ctx, pingpong: bool) -> list[str]:
    """A C++ block's nodes: what is declared in it (the page lookups) is out of scope after it."""
    outer = dict(ctx.page_lookups)
    lines = emit_nodes(nodes, ctx, pingpong)
    ctx.page_lookups = outer
    return lines


def emit_nodes(nodes, ctx: Ctx, pingpong: bool) -> list[str]:
    out: list[str] = []
    k = 0
    while k < len(nodes):
        node = nodes[k]
        if isinstance(node, Op) and node.kind == "gemm" and pingpong:
            # a run of GEMM issues is one turn on the tensor cores: the other warpgroup's softmax runs meanwhile
            run = [node]
            while k + len(run) < len(nodes) and isinstance(nodes[k + len(run)], Op) \
                    and nodes[k + len(run)].kind == "gemm" and nodes[k + len(run)].wait is None \
                    and not nodes[k + len(run)].rescale and not nodes[k + len(run)].releases:
                run.append(nodes[k + len(run)])
            out.append(comment(node))
            out += sync_lines(node, ctx)
            # the turn's first stage is waited for before the turn is taken (FA4's order): the wait for a late K tile
            # overlaps the previous warpgroup's turn instead of holding this one with the tensor cores idle
            out += gemm_stage_wait(node, ctx)
            out.append(f"if (wg != 0 || !pp_first) {{ cutlass::arch::NamedBarrier::sync(2 * 128, {PINGPONG_BARRIER} + wg); }}"
                       "  // ping-pong: our turn to issue GEMMs (warpgroup 0 opens each tile)")
            out.append("pp_first = false;")
            for i, g in enumerate(run):
                if i:
                    out.append(comment(g))
                out += emit_gemm(g, ctx, stage_waited=(i == 0))
            out.append(f"cutlass::arch::NamedBarrier::arrive(2 * 128, {PINGPONG_BARRIER} + (wg + 1) % kConsumerWGs);"
                       "  // the next warpgroup's turn")
            k += len(run)
            continue
        if isinstance(node, Op) and k + 1 < len(nodes) and softmax_wait_split(node, nodes[k + 1], ctx):
            out += emit_softmax_split(node, nodes[k + 1], ctx)
            k += 2
            continue
        if isinstance(node, Op):
            out.append(comment(node))
            out += sync_lines(node, ctx)
            out += EMITTERS[node.kind](node, ctx)
        elif isinstance(node, Loop):
            start, stop = ctx.expr(node.start, node.stmt.line), ctx.expr(node.stop, node.stmt.line)
            out += [comment(node), "#pragma unroll 1", f"for (int {node.var} = {start}; {node.var} < {stop}; ++{node.var}) {{"]
            ctx.loop_vars.append(node.var)
            out += _indent(_scoped(node.body, ctx, pingpong))
            ctx.loop_vars.pop()
            out.append("}")
        elif isinstance(node, Cond):
            out += [comment(node), f"if ({ctx.expr(node.condition, node.stmt.line)}) {{"]
            out += _indent(_scoped(node.body, ctx, pingpong))
            out.append("}")
        k += 1
    return out
