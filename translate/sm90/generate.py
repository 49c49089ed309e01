"""A warp-specialised TL program + parameters -> one Hopper kernel (``GeneratedKernel``).

Warpgroup 0 runs the producer block: one thread issues the TMA loads (Q once, then K and V tile by tile
into a ring of ``kStages`` stages, each behind a full/empty mbarrier pair) after giving most of its
registers back (setmaxnreg); with a paged cache and g2s_atom cp.async, the whole warpgroup copies K and V
row by row through the page table and thread 0 keeps Q, the tile numbers and the hand-over. Warpgroups 1..W
run the consumer block with the registers the producer gave up: wgmma GEMMs issued asynchronously, the waits
the dependency pass placed, the online softmax on the accumulator layout, and an epilogue through shared
memory and a TMA store.
"""
from __future__ import annotations


from kernel_abi.spec import fp8_layout_errors
from tl.ast import Program
from translate.kernel import GeneratedKernel, TranslationError, sketch_hash
from tl.vtranspose import v_transpose_of, with_v_transpose
from translate.params_sm90 import kv_cp_async, v_transpose_sketch_reasons, vt_staging_bytes
from translate.sm90 import emit as em
from translate.sm90 import frame, swizzle
from translate.sm90 import tiles
from translate.sm90.ir import Op
from translate.sm90.lower import WsLowering, stmt_text
from translate.sm90.preamble import HOPPER_PREAMBLE
from translate.sm90.schedule import schedule_consumer


# The arguments after the sm80 ones (translate/kernel.py KERNEL_ARGS): the tile grid's extents, then the
# TMA descriptors, by value.
EXTRA_ARGS = (("heads_q", "i32"), ("batch", "i32"), ("tile_counter", "ptr"), ("tma_q", "tensormap:q"),
              ("tma_k", "tensormap:k"), ("tma_v", "tensormap:v"), ("tma_o", "tensormap:o"))
# Packed sequences (tl/layout.py): the cumulative lengths (int32, batch + 1) and the keys used per sequence
# (int32, batch; null: all of cu_seqlens_k's), before the descriptors; seqlen_q/seqlen_k then carry the
# longest sequence's lengths and batch the number of sequences.
VARLEN_ARGS = (("cu_seqlens_q", "ptr"), ("cu_seqlens_k", "ptr"), ("seqused_k", "ptr"))
# A paged cache (tl/layout.py): the table (int32, batch x its row stride), the page size; cu_seqlens_k is null
# then and seqused_k gives each sequence's keys.
PAGED_ARGS = (("page_table", "ptr"), ("page_table_stride", "i64"), ("page_size", "i32"))


# Packed query heads (pack_gqa): the query heads a tile holds, after the tile counter.
PACK_ARGS = (("pack", "i32"),)
# The options of kernel_abi.spec a kernel is built with, before the descriptors: the window's sizes (keys left and
# right of the diagonal, -1: open), the soft-cap's prescale (softmax scale / cap; softmax_scale_log2 then carries
# cap * log2(e)), the sinks (fp32, one logit per query head).
OPTION_ARGS = {"local": (("window_left", "i32"), ("window_right", "i32")), "softcap": (("softcap_prescale", "f32"),),
               "sinks": (("sinks", "ptr"),)}


# An FP8 kernel's descales (fp32, (batch, KV heads) contiguous; null: 1), after the options: FlashAttention-3's
# q_descale, k_descale, v_descale.
FP8_ARGS = (("q_descale", "ptr"), ("k_descale", "ptr"), ("v_descale", "ptr"))


def option_args(spec) -> tuple:
    options = tuple(a for option in spec.features for a in OPTION_ARGS[option]) if hasattr(spec, "features") else ()
    return options + (FP8_ARGS if getattr(spec, "dtype", None) == "fp8" else ())


def extra_args(layout: str, pack: bool = False, options: tuple = ()) -> tuple:
    if layout == "dense":
        head = EXTRA_ARGS[:3] + (PACK_ARGS if pack else ())
    else:
        head = EXTRA_ARGS[:3] + VARLEN_ARGS + (PAGED_ARGS if layout == "paged" else ())
    return head + tuple(options) + EXTRA_ARGS[3:]


def generate_warp_specialized(program: Program, params, profile, spec) -> GeneratedKernel:
    program = _with_v_transpose(program, params, spec)
    lowered = WsLowering(program, params, spec).run()
    if params.block_m % 64 or not 1 <= params.block_m // 64 <= 3:
        raise TranslationError(f"block_m {params.block_m} must be 64, 128 or 192 (64 rows per consumer warpgroup)")
    consumer = lowered.consumer + [Op("drain", None, "end of the consumer warpgroups")]
    pipelined = {b for b, r in WsLowering_buffer_roles(lowered).items() if r in ("k", "v")}
    fp8 = spec.dtype == "fp8"
    if fp8 and fp8_layout_errors(spec.layout):
        raise TranslationError(fp8_layout_errors(spec.layout)[0])
    if lowered.v_form is not None and not fp8:
        raise TranslationError(f"the sketch states the {lowered.v_form} transpose of V, which FP8 kernels take (8-bit "
                               f"wgmma operands are K-major); a {spec.dtype} kernel reads V as given")
    vt_reasons = v_transpose_sketch_reasons(params, lowered.v_form if fp8 else None)
    if vt_reasons:
        raise TranslationError(vt_reasons[0])
    vt = frame.vt_producer(spec, params)
    # (FP8: O, bf16, always has its own tile: a Q row of 1 byte a column is not an O row)
    separate_o = fp8 or smem_bytes_ws(params, spec, lowered.stages, True) <= profile.smem_per_block_bytes
    fenced = set(lowered.score_accs) | (set(lowered.p_tensors) if params.pv_operand == "rs" else set())
    holders = schedule_consumer(consumer, lowered.pv_acc, pipelined, q_buffers=_q_buffers(lowered),
                                early_q_release=separate_o, tensors=fenced)
    pingpong = bool(params.pingpong)
    if pingpong and params.block_m < 128:
        raise TranslationError("ping-pong takes turns between two or three consumer warpgroups (block_m 128 or 192)")
    varlen, paged = spec.layout in ("varlen", "paged"), spec.layout == "paged"
    cp_async = kv_cp_async(params)
    # packed sequences, longest first (attn_sm90::order_sequences): the order's room, where the tiles leave it
    ordered = varlen and params.longest_first and \
        smem_bytes_ws(params, spec, lowered.stages, separate_o, True) <= profile.smem_per_block_bytes
    if cp_async and not paged:
        raise TranslationError(f"g2s_atom {params.g2s_atom}: the warp-specialised producer copies K/V with cp.async "
                               f"only from a paged cache (layout paged); the {spec.layout} layout loads them with TMA "
                               "(g2s_atom SM90_TMA)")
    if cp_async and vt:
        raise TranslationError("v_transpose 'producer' transposes V in warps 1-3 of the producer warpgroup: its K/V "
                               "come by TMA (g2s_atom SM90_TMA), not by the whole warpgroup's cp.async")
    pack = bool(params.pack_gqa)
    local = bool(getattr(spec, "local", False))
    if pack and spec.layout != "dense":
        raise TranslationError(f"pack_gqa packs the query heads of a KV head into the rows of a dense tile; the "
                               f"{spec.layout} layout finds its rows by sequence (one query head a tile)")
    ctx = em.Ctx(spec=spec, params=params, lowered=lowered, stage_holders=holders,
                 buffer_role=WsLowering_buffer_roles(lowered), separate_o=separate_o, varlen=varlen, paged=paged,
                 kv_cp_async=cp_async, pack=pack, vt_producer=vt)
    # the sketch is part of the kernel: two schedules with the same parameters are two kernels
    name = f"attn_{spec.label()}_{params.key()}_ws{sketch_hash(program)}"

    producer_lines = em.emit_nodes(lowered.producer, ctx, pingpong=False)
    consumer_once = frame.consumer_setup(params, lowered, holders, ctx)
    per_tile = frame.consumer_tile_init(lowered, pingpong, fp8, varlen)
    body = em.emit_nodes(consumer, ctx, pingpong)
    if pingpong:   # warpgroup 0 takes the turn the last warpgroup gives after its last GEMMs: the barrier ends balanced
        at = next((k for k, ln in enumerate(body) if "registers -> shared" in ln), len(body))
        body[at:at] = [f"if (wg == 0) {{ cutlass::arch::NamedBarrier::sync(2 * 128, {em.PINGPONG_BARRIER}); }}"
                       "  // ping-pong: the last turn"]

    wgs = params.block_m // 64
    use_setmaxnreg = wgs > 1     # 256 threads already get 255 registers each
    I = em.INDENT
    # The producer hands out the tiles: the first is blockIdx.x; a persistent CTA takes the next from a
    # global counter (dynamic: a CTA that finished early takes more), published to the consumers in
    # shared memory with the tile's Q (q_full). A number >= num_tiles tells them to stop.
    # With cp.async K/V the whole producer warpgroup runs this loop (every thread copies its share of each
    # K/V tile); thread 0 alone takes tile numbers, loads Q and talks to the consumers, and hands each tile
    # number to the other producer threads through shared memory (two slots: a slot is written again only after
    # every producer thread passed the next tile's barrier, so after it read the slot).
    one = "if (tidx == 0) " if cp_async else ""
    if not params.persistent:
        next_tile = ["tile = num_tiles;  // one tile per CTA"]
    elif cp_async:
        next_tile = ["if (tidx == 0) { producer_tile[q_iter & 1] = atomicAdd(tile_counter, 1) + int(gridDim.x); }"
                     "  // the next free tile",
                     f"cutlass::arch::NamedBarrier::sync({em.CP_ASYNC_PRODUCER_THREADS}, {em.PRODUCER_BARRIER});"
                     "  // ... for every producer thread",
                     "tile = producer_tile[q_iter & 1];"]
    else:
        next_tile = ["tile = atomicAdd(tile_counter, 1) + int(gridDim.x);  // the next free tile"]
    if varlen:   # the producer finds the tile's sequence and hands its lengths over with the tile number
        hand_out = [
            f"{I}attn_sm90::VarlenTile vt;",
            f"{I}if (tile >= num_tiles || !attn_sm90::varlen_tile(tile, cursor, cu_seqlens_q, cu_seqlens_k, seqused_k, "
            f"batch, heads_q, kBlockM, kCausal, vt{', order' if ordered else ''})) {{ tile = attn_sm90::kNoTile; }}"
            "  // num_tiles: from the longest",
            f"{I}{one}{{ *tile_slot = tile; *tile_info = vt; }}" if cp_async else f"{I}*tile_slot = tile;",
            *([] if cp_async else [f"{I}*tile_info = vt;"]),
            f"{I}if (tile == attn_sm90::kNoTile) {{ {one}attn_sm90::FullBarrier::arrive(q_full); break; }}  // no more",
            *em._indent(tiles.tile_setup(True, "vt", local=local), 1),
            *([f"{I}const int* pages = page_table + vt.seq * page_table_stride;  // the sequence's pages"]
              if paged else [])]
    else:
        hand_out = [
            f"{I}*tile_slot = tile;",
            f"{I}if (tile >= num_tiles) {{ attn_sm90::FullBarrier::arrive(q_full); break; }}  // no more: tell them",
            *em._indent(tiles.tile_setup(pack=pack, local=local) + [tiles.DECODED_COORDS], 1)]
    producer = [
        "int tile = blockIdx.x;",
        *(["attn_sm90::VarlenCursor cursor;  // the sequence this CTA's tiles have reached"] if varlen else []),
        "for (;;) {",
        f"{I}attn_sm90::wait_barrier(q_empty, (q_iter & 1) ^ 1);  // the consumers are done with the last Q",
        *hand_out,
        *([f"{I}vt_info[0] = n_tiles; vt_info[1] = seqlen_k;  // for the transposer: its V tiles, the keys they end at"]
          if vt else []),
        f"{I}if (n_tiles <= 0) {{ {one}attn_sm90::FullBarrier::arrive(q_full); }} else {{",
        *em._indent(producer_lines, 2),
        f"{I}}}",
        f"{I}++q_iter;",
        *em._indent(next_tile),
        "}",
    ]
    if params.persistent:   # the last CTA to finish with the counter resets it for the next launch
        producer += [f"{one}if (atomicAdd(tile_counter + 1, 1) == int(gridDim.x) - 1) {{ tile_counter[0] = 0; "
                     "tile_counter[1] = 0; }"]
    if varlen:
        # `>= num_tiles`, not `== kNoTile`: compared with a constant, ptxas kept the consumers to the launch's
        # 168 registers after setmaxnreg (344 bytes of spills; nvcc 13.0, checked in tests/translate)
        take = [f"{I}if (*tile_slot >= num_tiles) {{ break; }}  // kNoTile: no tile left",
                f"{I}const attn_sm90::VarlenTile vt = *tile_info;  // the sequence's lengths, from the producer",
                *em._indent(tiles.tile_setup(True, "vt", local=local) + tiles.varlen_masking(local)
                            + tiles.zero_tile(True))]
    else:
        take = [f"{I}const int tile = *tile_slot;",
                f"{I}if (tile >= num_tiles) {{ break; }}",
                *em._indent(tiles.tile_setup(pack=pack, decoded=True, local=local) + tiles.tile_masking(pack, local)
                            + tiles.zero_tile(pack=pack))]
    consumer_loop = [
        "for (;;) {",
        f"{I}attn_sm90::wait_barrier(q_full, q_iter & 1);  // this tile's number (and its Q) arrived",
        *take,
        *em._indent(per_tile + body + ["++q_iter;"]),
        "}",
    ]
    order_lines = [
        f"{I}const bool ordered = batch <= attn_sm90::kMaxOrderedSeqs;  // (else the order given)",
        f"{I}if (ordered) {{ attn_sm90::order_sequences<128>(seq_order, seq_keys, cu_seqlens_k, seqused_k, batch, "
        f"tidx, {em.PRODUCER_BARRIER}); }}",
        f"{I}const int* order = ordered ? seq_order : nullptr;  // the sequences, most keys first",
    ] if ordered else []
    transposer = transposer_loop() if vt else []
    kernel = [
        "if (tidx < 128) {  // producer warpgroup",
        *([f"{I}cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();"] if use_setmaxnreg else []),
        *order_lines,
        (f"{I}{{  // the whole warpgroup: every thread copies K/V with cp.async; thread 0 loads Q (TMA)" if cp_async
         else f"{I}if (tidx == 0) {{  // one thread issues every TMA load"),
        f"{I * 2}int k_write = 0, v_write = 0, q_iter = 0;  // tiles put into each ring so far; tiles handed out",
        *([f"{I * 2}const int page_shift = attn_sm90::page_shift_of(page_size);  // a page lookup's shift (-1: divide)"]
          if cp_async else []),
        *em._indent(producer, 2),
        *([f"{I}}} else if (tidx >= 32) {{  // warps 1-3: V's transpose (the TL Transpose), tile after tile of the ring"]
          + em._indent(transposer, 2) if vt else []),
        f"{I}}}",
        "} else {  // consumer warpgroups",
        *([f"{I}cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();"] if use_setmaxnreg else []),
        *em._indent(consumer_once + ["int q_iter = 0;  // tiles taken"] + consumer_loop),
        "}",
    ]
    header = [f"// kernel {name}", f"// spec: {spec}", f"// params: {params}",
              f"// target: {profile.name} ({profile.nvcc_arch}); warp-specialised, {wgs} consumer warpgroup(s), "
              f"{lowered.stages} stage(s), P·V {params.pv_operand.upper()}" + (", ping-pong" if pingpong else "")
              + (", query heads packed" if pack else ""),
              "// TL program:"]
    header += [f"//   {ln}" for ln in _program_lines(program.statements)]
    body_lines = header + frame.wgmma_declarations(spec, params) + [f"namespace {name}_ns {{", "using namespace cute;", ""]
    body_lines += frame.kernel_types(spec, params, lowered.stages, separate_o) + [""]
    body_lines += frame.kernel_signature(name, varlen, paged, pack, option_args(spec), fp8)
    setup = frame.kernel_setup(params, pack, fp8, vt)
    if varlen:   # the tile's lengths travel beside its number (smem_bytes_ws reserves the room)
        setup.append("attn_sm90::VarlenTile* tile_info = reinterpret_cast<attn_sm90::VarlenTile*>(tile_slot + 2);")
    if cp_async:   # after the VarlenTile (7 ints from tile_slot + 2), within smem_bytes_ws's 48 bytes
        setup.append("[[maybe_unused]] int* producer_tile = tile_slot + 10;  // the next tile, for the producer threads")
    if ordered:    # then the sequence order and its scratch (smem_bytes_ws's ORDER_BYTES)
        setup += ["int* seq_order = tile_slot + 12;  // order[rank] = sequence (attn_sm90::order_sequences)",
                  "int* seq_keys = seq_order + attn_sm90::kMaxOrderedSeqs;"]
    body_lines += em._indent(setup + [""] + kernel)
    body_lines += ["}", "", f"}}  // namespace {name}_ns", ""]
    smem = smem_bytes_ws(params, spec, lowered.stages, separate_o, ordered)
    return GeneratedKernel(name=name, preamble=HOPPER_PREAMBLE, body="\n".join(body_lines),
                           num_threads=128 * (wgs + 1), smem_bytes=smem, block_m=params.block_m,
                           block_n=params.block_n, spec=spec, params=params,
                           extra_args=extra_args(spec.layout, pack, option_args(spec)),
                           tensor_maps=tensor_map_boxes(params, spec),
                           grid="persistent" if params.persistent else "tiles")


def _with_v_transpose(program: Program, params, spec) -> Program:
    """An FP8 kernel with the in-kernel transpose of V built from a sketch that states no transpose: the sketch gets
    the producer's `Compute Transpose V_shared and get Vt_shared` (tl/vtranspose.py with_v_transpose), so that the
    kernel's TL program (its header, its name's hash) says what it does. Every other kernel's sketch is left as is."""
    if spec.dtype == "fp8" and getattr(params, "v_transpose", "runtime") == "producer" and v_transpose_of(program) is None:
        return with_v_transpose(program, "producer")
    return program


def transposer_loop() -> list[str]:
    """Warps 1-3 of the producer warpgroup (the in-kernel transpose of an FP8 kernel's V): per tile the producer hands
    out (q_full; its number, and in vt_info its K tile count and its sequence's keys), one transpose per K tile of the
    tile, in the V ring's order: wait for the staged tile (vs_full) and for the consumers to hand the V^T slot back
    (v_empty), then (a tile short of block N keys: its rows past them zeroed) ldmatrix.trans / prmt / stmatrix
    (attn_sm90::transpose_v_tile), fence.proxy.async (generic-proxy stores that the wgmma's async proxy reads, and that
    TMA writes over in the staging slot next), a named barrier of the 96 threads, and one thread hands V^T over
    (v_full) and the staging slot back (vs_empty). The transposer also arrives on q_empty once it read a tile's number,
    so that the producer does not hand out the next one before. (The count and keys come from the producer, not from
    the tile's coordinates as the consumers find them: that walk held registers across the loop, and ptxas spilled
    some at the producer's 32.)"""
    I = em.INDENT
    return [
        "int vt_iter = 0, vt_read = 0;  // tiles taken; V tiles transposed (the ring's count)",
        "for (;;) {",
        f"{I}attn_sm90::wait_barrier(q_full, vt_iter & 1);  // the next tile's number arrived",
        f"{I}if (*tile_slot >= num_tiles) {{ break; }}  // no tile left",
        f"{I}const int n_tiles = vt_info[0], vt_keys = vt_info[1];  // the tile's V tiles; its sequence's keys",
        f"{I}cutlass::arch::NamedBarrier::sync({em.VT_THREADS}, {em.VT_BARRIER});  // every transposer thread read them",
        f"{I}if (tidx == 32) {{ attn_sm90::EmptyBarrier::arrive(q_empty); }}  // the producer may hand out the next",
        f"{I}for (int t = 0; t < n_tiles; ++t, ++vt_read) {{",
        f"{I * 2}const int slot = vt_read % kStages;",
        f"{I * 2}attn_sm90::wait_barrier(&vs_full[slot], (vt_read / kStages) & 1);  // the staged V tile landed",
        f"{I * 2}attn_sm90::wait_barrier(&v_empty[slot], ((vt_read / kStages) & 1) ^ 1);"
        "  // the consumers handed the V^T slot back",
        f"{I * 2}attn_sm90::transpose_v_tile<kBlockN, kHeadDimV, kChunkVs, kChunkV, kVtAccumulatorOrder, {em.VT_WARPS}, "
        f"{em.VT_BARRIER}>(reinterpret_cast<uint8_t*>(smem_vs + slot * kTileVElems), "
        "reinterpret_cast<uint8_t*>(smem_v + slot * kTileVElems), vt_keys - (n_tiles - 1 - t) * kBlockN, tidx - 32);"
        "  // zeros past the sequence's keys",
        f"{I * 2}cutlass::arch::fence_view_async_shared();  // generic-proxy stores, read by the wgmma (async proxy)",
        f"{I * 2}cutlass::arch::NamedBarrier::sync({em.VT_THREADS}, {em.VT_BARRIER});  // the whole tile is written",
        f"{I * 2}if (tidx == 32) {{",
        f"{I * 3}attn_sm90::FullBarrier::arrive(&v_full[slot]);  // V^T to the consumers",
        f"{I * 3}attn_sm90::EmptyBarrier::arrive(&vs_empty[slot]);  // the staging slot back to the TMA thread",
        f"{I * 2}}}",
        f"{I}}}",
        f"{I}++vt_iter;",
        "}",
    ]


def _q_buffers(lowered) -> set:
    return {f"{n}_shared" for n, r in lowered.roles.items() if r == "q"}


def WsLowering_buffer_roles(lowered) -> dict:
    return {f"{n}_shared": r for n, r in lowered.roles.items() if r != "o"}


ORDER_BYTES = 2 * 4 * 128   # attn_sm90::kMaxOrderedSeqs ranks and keys (int32)


def smem_bytes_ws(params, spec, stages: int, separate_o: bool, ordered: bool = False) -> int:
    """Q + stages x (K + V) + P (SS only) + O (its own tile, else in Q's) + the mbarriers, as laid out."""
    info = 32 if spec.layout != "dense" else 0   # a varlen tile's lengths (attn_sm90::VarlenTile), 8-byte aligned
    order = ORDER_BYTES if ordered else 0
    if spec.dtype == "fp8":   # bytes: Q, O (bf16), K and V stages, no P tile (+ the in-kernel transpose's staging)
        staging = vt_staging_bytes(params, spec.d_v, stages)
        return params.block_m * (spec.d_qk + 2 * spec.d_v) + stages * params.block_n * (spec.d_qk + spec.d_v) + \
            (2 + 4 * stages) * 8 + 16 + info + order + staging
    q = params.block_m * max(spec.d_qk, spec.d_v)
    kv = stages * params.block_n * (spec.d_qk + spec.d_v)
    p = params.block_m * params.block_n if params.pv_operand == "ss" else 0
    o = params.block_m * spec.d_v if separate_o else 0
    return (q + kv + p + o) * 2 + (2 + 4 * stages) * 8 + 16 + info + order   # + the tile number


def tensor_map_boxes(params, spec) -> dict:
    """What the host encodes per tensor (runtime.py): a 4-D map (head dim, seqlen, heads, batch) of the
    (batch, seqlen, heads, dim) tensor, 128-byte swizzle, a box of 64 columns x ``rows`` (``cols`` 32, the 64-byte
    swizzle, where 64 do not divide the head dim). ``heads_first``
    (pack_gqa's Q and O): the map is (head dim, heads, seqlen, batch) and the box's ``rows`` are the tile's
    heads x rows / heads tokens, heads fastest (the call's ``pack``: tuner/serving/launch/plan.py)."""
    if spec.dtype == "fp8":   # e4m3 boxes of kChunkQK / kChunkV bytes; V transposed (b, h, d, s): keys x d_v rows
        qk = frame.fp8_chunk(spec.d_qk)
        # O is bf16, stored as a 16-bit kernel's (store_o_tile, tma_store_rows): 32-column boxes at d96
        o = {"rows": 64, "dim": "d_v", **({"cols": 32} if swizzle.chunk(spec.d_v) == 32 else {})}
        if frame.vt_producer(spec, params):   # V as given, in boxes as K's: the kernel transposes it (no runtime copy)
            return {"q": {"rows": params.block_m, "dim": "d_qk", "cols": qk},
                    "k": {"rows": params.block_n, "dim": "d_qk", "cols": qk},
                    "v": {"rows": params.block_n, "dim": "d_v", "cols": frame.fp8_chunk(spec.d_v)},
                    "o": o}
        return {"q": {"rows": params.block_m, "dim": "d_qk", "cols": qk},
                "k": {"rows": params.block_n, "dim": "d_qk", "cols": qk},
                "v": {"rows": spec.d_v, "dim": "d_v", "cols": frame.fp8_chunk(params.block_n), "transposed": True,
                      **({"seq_align": frame.PACKED_VT_ALIGN} if frame.packs_vt(spec) else {}),
                      **({"key_order": params.vt_key_order} if params.vt_key_order != "natural" else {})},
                "o": o}
    packed = {"heads_first": True} if params.pack_gqa else {}
    # a head dim that 64 does not divide: boxes of 32 columns, 64-byte swizzle (translate/sm90/swizzle.py)
    qk = {"cols": 32} if swizzle.chunk(spec.d_qk) == 32 else {}
    v = {"cols": 32} if swizzle.chunk(spec.d_v) == 32 else {}
    return {"q": {"rows": params.block_m, "dim": "d_qk", **qk, **packed}, "k": {"rows": params.block_n, "dim": "d_qk", **qk},
            "v": {"rows": params.block_n, "dim": "d_v", **v}, "o": {"rows": 64, "dim": "d_v", **v, **packed}}


def _program_lines(stmts, depth: int = 0) -> list[str]:
    out = []
    for s in stmts:
        out.append("    " * depth + stmt_text(s))
        body = getattr(s, "body", None)
        if body is not None:
            out += _program_lines(body, depth + 1)
            out.append("    " * depth + "end")
    return out
