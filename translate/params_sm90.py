"""Validation of Hopper (wgmma) kernel parameters: pure, with every reason a candidate cannot work.

Two schedules: warp-specialised (the sketch has warpgroup roles: a TMA producer warpgroup and 1-3
consumer warpgroups) and the plain one (every warpgroup loads and computes). In both, each consumer
warpgroup owns 64 query rows (block_m = 64 x warpgroups) and holds, per thread, its share of the
fp32 score tile S (64 x block_n over 128 threads), of the output O (64 x d_v) and, for the RS P·V GEMM,
the 16-bit operand copy P.
"""
from __future__ import annotations

from hardware_profiles import Profile
from kernel_abi.abi import TMA_KV
from translate.copies import copy_row_threads
from kernel_abi.spec import Problem

GMMA_BLOCK_M = (64, 128, 192)
PRODUCER_REGS = (24, 32, 40, 56)
# How the warp-specialised producer reads K and V: one thread's TMA boxes, or (a paged cache only:
# search_spaces.feasible.layout_reasons) the whole producer warpgroup's cp.async, row by row through the table.
WS_KV_COPIES = (TMA_KV, "SM80_CP_ASYNC_CACHEGLOBAL")
MAX_WGMMA_N = 256
# Registers a consumer thread needs besides the tiles (addresses, descriptors, loop state, softmax
# statistics): FA4's feasibility model (sm90_config_search.py) keeps 24 of 240 with two consumer
# warpgroups and 32 of 160 with three; its largest feasible hdim-128 tile, 128 x 192 RS, needs 208 of 216.
REGISTER_OVERHEAD = {1: 24, 2: 24, 3: 32}
# FP8 kernels (P packed four e4m3 a register), three consumer warpgroups: 28, from ptxas (nvcc 13.0, sm_90a, MHA d64):
# FA3's FP8 tile 192 x 160 (80 + 32 + 20 + 28 = 160) builds without spills, 192 x 192 (an estimated 180) spills
# 208-224 bytes.
FP8_REGISTER_OVERHEAD = {**REGISTER_OVERHEAD, 3: 28}
# More for an FP8 kernel of a wide O, by head dim: at d256 (O 64 x 256, 128 registers a consumer thread) ptxas (nvcc
# 13.0, sm_90a, MHA) built the 128 x 128 tile (estimate 232) without spills in the dense kernel's 240 consumer registers
# and spilled 32 bytes in a varlen or paged kernel's 232 (their producers keep 32-40): 8 more keeps the estimate
# honest there, and refuses that tile where the budget is 232 (128 x 64 remains: 200). At d192 (O 64 x 192, 96
# registers) 128 x 192 (estimate 240) spilled 32 bytes in the dense kernel's 240; 128 x 160 (220) built clean in 232.
FP8_HEAD_DIM_OVERHEAD = {192: 8, 256: 8}
SETMAXNREG_CAP = 240        # FA3's largest consumer allocation with two consumer warpgroups
PLAIN_THREAD_REGS = 255     # no register reallocation: the compiler's per-thread limit


def kv_cp_async(params) -> bool:
    """The warp-specialised producer copies K and V with cp.async (a paged cache, row by row) instead of TMA."""
    return params.g2s_atom != TMA_KV


def consumer_warpgroups(block_m: int) -> int:
    return block_m // 64


REGISTER_FILE = 65536       # 32-bit registers per SM


def launch_registers(threads: int) -> int:
    """Registers per thread at launch under __launch_bounds__(threads, 1): the file shared out, in steps of 8."""
    return min(PLAIN_THREAD_REGS, REGISTER_FILE // threads // 8 * 8)


def consumer_registers(params) -> int:
    """setmaxnreg of the consumers. setmaxnreg only moves registers within what the CTA got at launch (384
    threads x 168 = 64512 with two consumer warpgroups, not the whole 65536): the producer gives back down
    to its share and the consumers split the rest. A consumer share past that pool never completes its
    allocation, and the kernel hangs (the H100 campaign of 2026-11-23: every 2-warpgroup kernel with a
    32-register producer and 240 for the consumers)."""
    wgs = consumer_warpgroups(params.block_m)
    if wgs <= 1:
        return PLAIN_THREAD_REGS
    threads = 128 * (wgs + 1)
    pool_per_thread = launch_registers(threads) * threads // 128
    return min(SETMAXNREG_CAP, (pool_per_thread - params.producer_regs) // wgs // 8 * 8)


def tile_registers(params, problem: Problem) -> int:
    """32-bit registers per consumer thread for S, O and (RS) P (FA4's model: fp32 accumulators of the
    warpgroup's 64 rows over 128 threads, P half of S), plus the overhead."""
    s = params.block_n // 2
    o = problem.d_v // 2
    p = params.block_n // (8 if problem.dtype == "fp8" else 4) if params.pv_operand == "rs" else 0
    return s + o + p + register_overhead(params, problem)


def register_overhead(params, problem: Problem) -> int:
    """A consumer thread's registers besides the tiles (REGISTER_OVERHEAD; FP8_REGISTER_OVERHEAD for e4m3, with
    FP8_HEAD_DIM_OVERHEAD's more at a wide head dim)."""
    if problem.dtype != "fp8":
        return REGISTER_OVERHEAD.get(consumer_warpgroups(params.block_m), 32)
    return FP8_REGISTER_OVERHEAD.get(consumer_warpgroups(params.block_m), 32) + \
        FP8_HEAD_DIM_OVERHEAD.get(problem.d_v, 0)


def smem_bytes(params, problem: Problem, warp_specialized: bool) -> int:
    barriers = (2 + 4 * params.kv_stages) * 8 + 16 if warp_specialized else 0
    if problem.dtype == "fp8":   # 1-byte Q, K, V and a bf16 output tile (translate/sm90/generate.py smem_bytes_ws)
        q = params.block_m * (problem.d_qk + 2 * problem.d_v)
        return q + params.kv_stages * params.block_n * (problem.d_qk + problem.d_v) + barriers + \
            vt_staging_bytes(params, problem.d_v)
    q = params.block_m * max(problem.d_qk, problem.d_v)
    kv = params.kv_stages * params.block_n * (problem.d_qk + problem.d_v)
    p = params.block_m * params.block_n if params.pv_operand == "ss" else 0
    return (q + kv + p) * 2 + barriers


# FP8 (e4m3) kernels: 8-bit wgmma operands are K-major only, so V comes transposed (batch, heads, d, seqlen) and its
# tile is (d, block N) with the keys along 64- or 128-byte swizzled rows; the P.V GEMM's k-blocks are 32 keys.
# P is rounded to e4m3 in registers (RS): the largest P of a row is 2^8 (attn_sm90::softmax_tile's kMaxOffset, FA3's),
# e4m3's largest finite value being 448. The conditional rescale lets a row's P grow 2^threshold past its running max,
# so an FP8 kernel with a threshold offsets P by 8 - threshold (translate/sm90/frame.py fp8_max_offset): P still peaks
# at 2^8, but a settled row's P tops out at 2^(8 - threshold), so its small P reach e4m3's subnormals (below 2^-6)
# sooner. Thresholds 0 and 2 only: at 4 the d128 kernel failed the FP8 gate on an H200 (max error 3.96 against the
# bound 3.7), 2 passed and timed x0.95-1.00 against 0 at d128 and d64, 2k-16k (BENCHMARKS.md, "FP8 kernels with the
# conditional rescale"), as the warp vote that skips the output's multiply alone cost 3-5% at threshold 0 (same file,
# FP8 dense prefill, "tried, not kept": the branch splits the block where ptxas interleaves the FMULs with the MUFU
# stream). 0 is the default; the search decides.
FP8_RESCALE_THRESHOLDS = (0, 2)
# Block N of an FP8 kernel: multiples of 64 among CuTe's base wgmma N, and FA3's FP8 tiles (hopper/tile_size.h: 224 at
# head dim 128, 160 at 64), whose QK^T wgmma translate/sm90/wgmma_ops.py declares and whose V^T rows take 32-byte boxes.
FP8_BLOCK_N = (64, 128, 160, 192, 224, 256)
# The key order of an FP8 kernel's transposed V (KernelParams.vt_key_order): as the keys come, or in the order of P's
# accumulator within 16 keys (P then converts without shuffles).
VT_KEY_ORDERS = ("natural", "accumulator")


# Who transposes an FP8 kernel's V (KernelParams.v_transpose): the runtime's per-call copy V^T, or the producer
# warpgroup, whose warps 1-3 transpose each V tile the TMA thread loads as given into the V^T tile the consumers read.
V_TRANSPOSES = ("runtime", "producer")
# The producer warpgroup's registers (setmaxnreg) with the in-kernel transpose, by consumer warpgroups. ptxas (nvcc
# 13.0, sm_90a) builds the transposer (4 ldmatrix.trans words, 4 permuted words, two swizzled addresses, the ring's
# counters) without local memory from 32 registers with three consumer warpgroups (d64 192 x 64/128/160, both key
# orders, dense, varlen and paged; 54 dense GQA tiles of 2 and 3 stages checked) and from 40 with two (at 32, 4 of 22
# such tiles spilled 4-20 bytes); 24 spills.
# With two consumer warpgroups 40 costs the consumers nothing: their share of the launch's 168 registers a thread
# rounds to 232 from 32 and from 40 alike (consumer_registers). tests/translate/test_fp8_vt_producer.py checks the SASS.
VT_PRODUCER_REGS = 32
VT_PRODUCER_REGS_BY_WGS = {2: 40}


def vt_producer_regs(params) -> int:
    """The producer_regs the in-kernel transpose needs for these parameters' consumer warpgroups."""
    return VT_PRODUCER_REGS_BY_WGS.get(consumer_warpgroups(params.block_m), VT_PRODUCER_REGS)


def vt_staging_bytes(params, d_v: int, stages: int | None = None) -> int:
    """Shared memory the in-kernel transpose adds: a staging V tile (block N x d_v bytes, as TMA loads it) beside
    each V^T stage (``stages``, else the parameters' kv_stages), and a full/empty mbarrier pair per staging slot."""
    if getattr(params, "v_transpose", "runtime") != "producer":
        return 0
    stages = params.kv_stages if stages is None else stages
    return stages * (params.block_n * d_v + 16) + 8   # (+ the tile's V tile count and keys)


def v_transpose_reasons(params, problem: Problem, warp_specialized: bool) -> list[str]:
    """Why this kernel cannot take its v_transpose: the in-kernel transpose is an FP8 kernel's (a 16-bit kernel reads
    V as given), runs in the warp-specialised producer warpgroup, and needs that warpgroup's registers."""
    v_transpose = getattr(params, "v_transpose", "runtime")
    if v_transpose not in V_TRANSPOSES:
        return [f"v_transpose {v_transpose!r} must be one of {', '.join(V_TRANSPOSES)}"]
    if v_transpose == "runtime":
        return []
    errors = []
    if problem.dtype != "fp8":
        errors.append(f"v_transpose {v_transpose!r} transposes an FP8 kernel's V (8-bit wgmma operands are K-major); "
                      "a 16-bit kernel reads V as given (keep 'runtime')")
    if not warp_specialized:
        errors.append("v_transpose 'producer' runs in the producer warpgroup: a warp-specialised sketch")
    need = vt_producer_regs(params)
    if params.producer_regs < need:
        errors.append(f"v_transpose 'producer': producer_regs {params.producer_regs} < {need}, the registers the "
                      f"producer warpgroup's transposer (ldmatrix.trans, byte permutes, stmatrix) needs without "
                      f"spilling with {consumer_warpgroups(params.block_m)} consumer warpgroup(s)")
    if problem.d_v % 32 or params.block_n % 16:
        errors.append(f"v_transpose 'producer' transposes 16 keys x 32 columns a step: block_n {params.block_n} must "
                      f"be a multiple of 16 and d_v {problem.d_v} of 32")
    return errors


def v_transpose_sketch_reasons(params, stated: str | None) -> list[str]:
    """A sketch that states how V is transposed (tl/vtranspose.py: a producer `Compute Transpose V_shared and get
    Vt_shared`, or the caller's V^T copied from global) pins v_transpose; an unstated sketch takes the parameter."""
    v_transpose = getattr(params, "v_transpose", "runtime")
    if stated is None or stated == v_transpose:
        return []
    return [f"the sketch states the {stated} transpose of V ("
            + ("`Compute Transpose V_shared and get Vt_shared` in the producer" if stated == "producer"
               else "the caller's V^T copied from global") + f") but v_transpose is {v_transpose!r}: the sketch "
            f"pins v_transpose {stated!r}"]


def fp8_reasons(params, warp_specialized: bool) -> list[str]:
    """Why these parameters cannot make an FP8 kernel."""
    errors = []
    if not warp_specialized:
        errors.append("fp8 kernels are warp-specialised (a TMA producer warpgroup): the plain schedule copies "
                      "16-bit tiles")
    if params.pv_operand != "rs":
        errors.append("fp8 kernels keep P in registers (pv_operand rs): P is rounded to e4m3 there")
    if params.block_n not in FP8_BLOCK_N:
        errors.append(f"fp8 block_n {params.block_n} must be one of {FP8_BLOCK_N}: V's transposed tile has block_n "
                      "keys a row in swizzle atoms of 32 bytes or more, and the QK^T op of each N is declared")
    if params.rescale_threshold not in FP8_RESCALE_THRESHOLDS:
        errors.append(f"fp8 rescale_threshold {params.rescale_threshold} must be one of {FP8_RESCALE_THRESHOLDS}: P is "
                      "offset by 8 - threshold to peak at 2^8 (e4m3 ends at 448), and at 4 a settled row's small P "
                      "fall into e4m3's subnormals (the FP8 gate failed)")
    if params.pack_gqa:
        errors.append("pack_gqa is not built for fp8 kernels")
    if kv_cp_async(params) and getattr(params, "v_transpose", "runtime") != "runtime":
        errors.append(f"fp8 kernels with v_transpose {params.v_transpose!r} load K and V with TMA (g2s_atom SM90_TMA): "
                      "warps 1-3 of the producer warpgroup transpose the staged V tiles, so the warpgroup cannot copy "
                      "K with cp.async (the FP8 cp.async producer copies K and leaves V^T to TMA: v_transpose "
                      "'runtime')")
    return errors


# An FP8 kernel's K and V: TMA, or (a paged cache, v_transpose "runtime": search_spaces.feasible.layout_reasons, the
# translator) the producer warpgroup's cp.async for K, the e4m3 rows as the 16-bit rows of half the columns
# (attn_sm90_copy.cuh cp_async_load_paged_8bit), while one thread still loads V^T from the runtime's packed copy by TMA.
def fp8_cp_async_reasons(params, problem: Problem) -> list[str]:
    """Why the cp.async producer cannot copy this FP8 kernel's K: it copies the e4m3 rows as the 16-bit rows of half
    the columns (attn_sm90_copy.cuh cp_async_load_paged_8bit), whose copies take 32- or 64-column blocks of the 64- or
    128-byte swizzle; a 96-byte row is three 32-byte atoms (fp8_chunk), which no 16-bit copy writes (TMA K does)."""
    if not kv_cp_async(params) or problem.d_qk % 64 == 0:
        return []
    return [f"fp8 head dim {problem.d_qk}: the cp.async producer copies e4m3 K rows as 16-bit rows of 32- or "
            "64-column swizzle blocks (head dim a multiple of 64); load K with TMA (g2s_atom SM90_TMA)"]


# pack_gqa: a tile's rows are (token, query head) pairs of one KV head, heads fastest. Each consumer warpgroup stores
# its 64 rows as one TMA box of (group heads x 64 / group tokens), so the group must divide 64; a kernel built with it
# runs a call whose group does not one query head a tile (the unpacked walk: tuner/serving/launch/plan.py heads_per_tile).
PACK_ROWS = 64


def pack_gqa_reasons(params, problem: Problem) -> list[str]:
    """Why this problem cannot take a kernel that packs the query heads of a KV head into its tile's rows."""
    if not params.pack_gqa:
        return []
    if problem.group < 2:
        return [f"pack_gqa packs the query heads that share a KV head into a tile's rows; {problem.variant} has "
                f"group {problem.group} (GQA or MQA only)"]
    if PACK_ROWS % problem.group:
        return [f"pack_gqa: group {problem.group} (heads_q {problem.heads_q} / heads_kv {problem.heads_kv}) must "
                f"divide {PACK_ROWS}: a consumer warpgroup's {PACK_ROWS} rows are whole tokens of the group's heads "
                "(the kernel would run this group one query head a tile, unpacked)"]
    return []


# The softmax's conditional rescale (attn_sm90.cuh softmax_tile): 0 = every tile; FA4 keeps a row's max until it
# grows by 8 log2 units (P <= 256).
RESCALE_THRESHOLDS = (0, 2, 4, 8)
# Exponentials of every 8 a row's softmax takes on the FMA pipe (attn_sm90.cuh exp2_poly): at most half, past
# which the 8 FP32 instructions an exponential costs outweigh the MUFU time they free.
EXP2_POLY_SHARES = (0, 1, 2, 3, 4)
# Where a consumer waits for its P.V GEMM before converting the next P (KernelParams.pv_wait; emit.py
# emit_softmax_split): after the whole softmax; once the row maxima are known ("mid", FA4's source order); or after a
# quarter or half of the exponentials (where ptxas put FA4's wait: after 12 of 64 MUFU.EX2 a thread at d64). The
# split values map to the eighths of a row's exponentials computed before the wait (the rest after it).
PV_WAIT_EIGHTHS = {"mid": 0, "quarter": 2, "half": 4}
PV_WAITS = ("after", *PV_WAIT_EIGHTHS)


def head_dim_reasons(d: int, warp_specialized: bool, fp8: bool = False) -> list[str]:
    """Why a head dim cannot make the tiles of a Hopper kernel. The warp-specialised kernel's 16-bit tiles are rows of
    64-column atoms of the 128-byte swizzle, or of 32-column atoms of the 64-byte swizzle where 64 do not divide the
    head dim (96: three 32-column TMA boxes a row, as FlashAttention-3 lays d96 out); the plain schedule has the
    128-byte layouts only; an FP8 kernel's e4m3 rows take 128-, 64- or 32-byte atoms (d96: three 32-byte atoms)."""
    if fp8:
        if d % 32:
            return [f"head dim {d} must be a multiple of 32 for fp8 kernels: e4m3 rows of 128-, 64- or 32-byte swizzle "
                    "atoms (translate/sm90/frame.py fp8_chunk), a QK^T k-block of 32 bytes"]
        return []
    if not warp_specialized:
        if d % 64:
            return [f"head dim {d} must be a multiple of 64 for the plain wgmma schedule (no warpgroup roles): "
                    "128-byte swizzled tiles, 64-column copies (the warp-specialised 16-bit kernels take multiples "
                    "of 32)"]
        return []
    if d % 32:
        return [f"head dim {d} must be a multiple of 32: the tiles are rows of 64-column (128-byte swizzle) or 32-column "
                "(64-byte swizzle) GMMA atoms, read and written in TMA boxes as wide"]
    return []


def validate_sm90(params, profile: Profile, problem: Problem, warp_specialized: bool) -> list[str]:
    errors: list[str] = []
    if not params.is_gmma:
        return ["a warp-specialised sketch needs wgmma: mma_atom SM90_GMMA (on an sm90 GPU)"]
    if profile.sm < 90 or "SM90_GMMA" not in profile.mma_atoms:
        return [f"wgmma (mma_atom SM90_GMMA) needs an sm_90a GPU; {profile.name} is sm{profile.sm}"]
    if problem.dtype not in profile.dtypes:
        errors.append(f"{profile.name} has no {problem.dtype} tensor cores")
    if problem.dtype == "fp8":
        errors += fp8_reasons(params, warp_specialized) + fp8_cp_async_reasons(params, problem)
    errors += v_transpose_reasons(params, problem, warp_specialized)
    if params.vt_key_order not in VT_KEY_ORDERS:
        errors.append(f"vt_key_order {params.vt_key_order!r} must be one of {', '.join(VT_KEY_ORDERS)}")
    elif params.vt_key_order != "natural" and problem.dtype != "fp8":
        errors.append(f"vt_key_order {params.vt_key_order!r} orders the transposed V of FP8 kernels: a 16-bit kernel "
                      "reads V as given")
    if params.rescale_threshold not in RESCALE_THRESHOLDS:
        errors.append(f"rescale_threshold {params.rescale_threshold} must be one of {RESCALE_THRESHOLDS}: 0 rescales "
                      "every tile; up to 8 log2 units of growth keep P within bf16/fp16 and the sums exact in fp32")
    if params.exp2_poly not in EXP2_POLY_SHARES:
        errors.append(f"exp2_poly {params.exp2_poly} must be one of {EXP2_POLY_SHARES}: the exponentials of every 8 "
                      "that the FMA pipe's polynomial takes from MUFU.EX2, at most half of them")
    if params.pv_wait not in PV_WAITS:
        errors.append(f"pv_wait {params.pv_wait!r} must be one of {', '.join(PV_WAITS)}: after the whole softmax, "
                      "once its row maxima are known, or after a quarter or half of its exponentials")
    elif params.pv_wait != "after" and params.pv_operand != "rs":
        errors.append(f"pv_wait {params.pv_wait!r} moves the wait before P's conversion into registers: it needs "
                      "pv_operand rs")
    if params.block_m not in GMMA_BLOCK_M:
        errors.append(f"block_m {params.block_m} must be 64 x consumer warpgroups (64, 128 or 192): a warpgroup's "
                      "wgmma covers 64 rows")
    elif params.num_warps != params.block_m // 16:
        errors.append(f"num_warps {params.num_warps} must be block_m / 16 = {params.block_m // 16} "
                      "(four warps per 64-row warpgroup)")
    if params.block_n % 16 or not 16 <= params.block_n <= MAX_WGMMA_N:
        errors.append(f"block_n {params.block_n} must be a multiple of 16 in 16..{MAX_WGMMA_N} (wgmma N; the P·V "
                      "GEMM steps over it in k-blocks of 16)")
    for d in sorted({problem.d_qk, problem.d_v}):
        errors += head_dim_reasons(d, warp_specialized, problem.dtype == "fp8")
    if not 1 <= params.kv_stages <= 4:
        errors.append(f"kv_stages must be 1..4, got {params.kv_stages}")
    if params.q_in_regs:
        errors.append("q_in_regs does not apply: the wgmma QK^T GEMM reads Q from shared memory (FA3: register "
                      "bandwidth is the bottleneck)")
    if (params.s2r_atom, params.swizzle) != ("SM75_U32x4_LDSM_N", 3):
        errors.append("s2r_atom and swizzle do not apply to wgmma kernels (GMMA descriptors read 128-byte swizzled "
                      "shared memory directly): keep SM75_U32x4_LDSM_N and 3")
    if params.pv_operand not in ("rs", "ss"):
        errors.append(f"pv_operand must be rs or ss, got {params.pv_operand!r}")
    if warp_specialized:
        if params.g2s_atom not in WS_KV_COPIES:
            errors.append(f"the warp-specialised producer loads K/V with TMA (g2s_atom SM90_TMA) or, from a paged "
                          f"cache, with cp.async (SM80_CP_ASYNC_CACHEGLOBAL), not {params.g2s_atom}")
        elif kv_cp_async(params):
            for d in sorted({problem.d_qk, problem.d_v}):
                if d % 64 == 0 and 32 % (d // 8):
                    errors.append(f"head dim {d}: the cp.async producer copies whole rows a warp at a time (32 lanes "
                                  "of 16 bytes: head dim 64, 128 or 256)")
        if params.producer_regs not in PRODUCER_REGS:
            errors.append(f"producer_regs must be one of {PRODUCER_REGS}, got {params.producer_regs}")
        if params.pingpong and params.block_m < 128:
            errors.append("ping-pong takes turns between two or three consumer warpgroups: block_m 128 or 192")
        errors += pack_gqa_reasons(params, problem)
        budget = consumer_registers(params)
        where = f"the consumers' {budget} (setmaxnreg after the producer keeps {params.producer_regs})"
    else:
        if params.g2s_atom not in ("SM80_CP_ASYNC_CACHEGLOBAL", "SM80_CP_ASYNC_CACHEALWAYS"):
            errors.append(f"g2s_atom {params.g2s_atom}: without warpgroup roles every warpgroup loads with cp.async "
                          "(TMA loads come with the warp-specialised producer)")
        if params.pingpong or params.producer_regs != 24 or params.persistent or params.pack_gqa:
            errors.append("pingpong, producer_regs, persistent and pack_gqa apply to warp-specialised sketches "
                          "(warpgroup roles) only")
        # Every warpgroup copies with cp.async: a step covers threads / copy_row_threads rows, which must
        # divide the tiles (else the last step writes past the tile: the H100 campaign of 2026-11-23 saw
        # illegal addresses and wrong results from 128x112 and 192x128 plain kernels).
        threads = params.block_m // 64 * 128
        for rows in sorted({threads // copy_row_threads(d) for d in (problem.d_qk, problem.d_v)}):
            for name, tile in (("block_m", params.block_m), ("block_n", params.block_n)):
                if tile > 0 and tile % rows:
                    errors.append(f"{name} {tile} must be a multiple of {rows}: {threads} threads copy {rows} "
                                  "rows a step with cp.async")
        budget = PLAIN_THREAD_REGS
        where = f"the {budget} a thread can hold"
    if params.block_m in GMMA_BLOCK_M and params.block_n % 16 == 0:
        need = tile_registers(params, problem)
        if need > budget:
            errors.append(f"a consumer thread needs about {need} registers (S 64x{params.block_n}, O 64x{problem.d_v}"
                          f"{', P' if params.pv_operand == 'rs' else ''} over 128 threads + "
                          f"{register_overhead(params, problem)}) "
                          f"but has {where}")
    smem = smem_bytes(params, problem, warp_specialized)
    if smem > profile.smem_per_block_bytes:
        errors.append(f"shared memory {smem // 1024} KB (Q {params.block_m}x{max(problem.d_qk, problem.d_v)} + "
                      f"{params.kv_stages} stage(s) of K/V {params.block_n}x({problem.d_qk}+{problem.d_v})"
                      f"{' + P' if params.pv_operand == 'ss' else ''}"
                      f"{' + V staging for the in-kernel transpose' if vt_staging_bytes(params, problem.d_v) else ''}) "
                      f"exceeds the {profile.smem_per_block_kb} KB "
                      f"per-block limit of {profile.name}")
    return errors
