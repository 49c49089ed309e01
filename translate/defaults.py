"""The default candidate of a GPU profile for a kernel spec: FlashAttention's own choices (their tile_size_fwd functions).

Seeds are tried in order of preference; the first that ``validate`` accepts for the profile wins, so a
profile with less shared memory (sm75: 64 KB, L40S: 99 KB) falls through to smaller tiles.

On Hopper (sm90) the default schedule is the warp-specialised one (``ws_overlap`` sketches) with
FA4's tiles per head dim (``_tile_size_fwd_sm90``: d64 192x128, d128 128x128, d192/128 128x128, d192 128x112,
d256 128x80; RS P, two stages; d96 takes d128's, see _hopper_seeds); persistent, because the H100 runs of 2026-11-22 (BENCHMARKS.md) measured it ahead of one
CTA per tile at 1k-4k for both causal (with its dynamic tile counter) and non-causal shapes.
"""
from __future__ import annotations

from hardware_profiles import Profile
from translate.params import KernelParams, validate
from kernel_abi.spec import KernelSpec, Problem, heads_for


def _seeds(profile: Profile, spec: KernelSpec) -> list[tuple[int, int, int]]:
    """(block_m, block_n, warps) in order of preference."""
    d = max(spec.d_qk, spec.d_v)
    if profile.sm < 80:
        # 64 KB per SM is also the block limit: tiles at exactly 64 KB leave no room for a second
        # block or any static shared memory, and the m16n8k8 atom needs twice the MMA registers.
        if d > 128:
            return [(64, 32, 4), (64, 16, 4)]
        if d > 64:
            return [(64, 64, 4), (64, 32, 4)]
        return [(128, 64, 4), (64, 64, 4)]
    if d > 128:  # MLA 192/128: FA2 hd192 is 128x64x8
        return [(128, 64, 8), (64, 64, 4), (64, 32, 4)]
    if d > 64:   # hd128: A100/H100 128x64x4; sm86/89 128x32x4 (non-causal) or 64x64x4 (causal)
        if profile.sm in (86, 89):
            return [(64, 64, 4) if spec.causal else (128, 32, 4), (64, 64, 4), (64, 32, 4)]
        return [(128, 64, 4), (64, 64, 4), (64, 32, 4)]
    return [(128, 128, 4), (128, 64, 4), (64, 64, 4)]   # hd64 (and below)


HOPPER_SCHEDULE = "ws_overlap"


def default_schedule(profile: Profile) -> str:
    """The reference sketch set a profile builds by default: Hopper's own schedule on sm90."""
    return HOPPER_SCHEDULE if "SM90_GMMA" in profile.mma_atoms else "fa2"


# The varlen producer walks the sequences' lengths per tile (attn_sm90::varlen_tile): in 24 registers ptxas
# spilled 32 bytes of it (nvcc 13.0, gqa d128 128x128), in 32 none; the paged one also looks pages up (16
# bytes spilled in 32, none in 40). Two consumer warpgroups keep 232 registers either way.
SERVING_PRODUCER_REGS = {"varlen": 32, "paged": 40}
# An FP8 kernel's producer at head dim 192 (three 64-byte TMA boxes a row): the varlen producer of 128 x 160 spilled
# 20 bytes in 32 registers (80 in 24), none in 40 (nvcc 13.0, sm_90a); its consumers' 232 still hold the tile.
FP8_SERVING_PRODUCER_REGS = {192: {"varlen": 40}}
# The cp.async producer (every producer thread copies K/V rows, attn_sm90_copy.cuh cp_async_load_paged) holds its
# rows' cache offsets and swizzle: gqa d128 128x128 spilled 116 bytes in 40 registers, 20 in 56 (a few values
# once a tile, outside the copies; nvcc 13.0).
CP_ASYNC_PRODUCER_REGS = 56
# A paged kernel's default K/V copy is the cp.async producer: on the H100 (llama3-8b heads, 128 x 128,
# BENCHMARKS.md 2026-11-24) it ran 0.91-1.15x FA4 with pages of 16, where TMA boxes of 16 rows
# ran 0.43-0.75x; with pages of 128 TMA leads it by 1-11% (0.90-1.10x FA4 against 0.83-1.09x). Pages of 16 are
# vLLM's default, and cp.async reads any multiple of 8; a campaign searches both (hopper_kv_copy).


# An FP8 paged kernel's K comes by the cp.async producer (translate/params_sm90.py: the e4m3 rows as 16-bit rows of half
# the columns, V^T still by TMA) at the registers the 16-bit one needs (CP_ASYNC_PRODUCER_REGS), except where its pages
# are whole K tiles (a known page size, a multiple of block N), where TMA boxes read them. H200, llama3-8b heads, GQA
# d128 causal, 128 x 128 (BENCHMARKS.md, FP8 paged K: cp.async against TMA): pages of 16, 8 x 2k keys, the kernel
# alone 478 us with cp.async K against 636 with TMA K's 16-key boxes (x1.33; the call with the V^T gather x1.31) and
# 490 for the bf16 paged default (x1.025); with TMA K the FP8 paged bench ran 0.80-0.81x our bf16 on all four mixes at
# pages of 16. Pages of 128 with TMA K: 1.20-1.30x our bf16 on three mixes, 0.995x on 64 random 1-512. An FP8 paged
# campaign searches both (hopper_kv_copy) and seeds the other copy beside the default (fp8_paged_other_k_copy).


# Ping-pong (revision 2: each consumer warpgroup waits for its K tile before its turn) by (layout, head dim), for the
# serving layouts; dense kernels take it from the bucket table (hardware_profiles/bucket_defaults). llama3-8b's paged
# kernel (GQA 32/8, d128, causal, bf16, the cp.async producer; BENCHMARKS.md 2026-11-26), ping-pong against none, two
# processes of 5 interleaved rounds, median per-round ratio: x1.001-1.045 over the four mixes at pages of 16 and 128, 16
# of 16 ahead (2x(2k on 6k) x1.015-1.028). Varlen, one process: 8x2k x1.013, 1x8k+32x256 x0.990, 64 random 1-512 x1.048;
# mixed, so not a varlen default yet.
SERVING_PINGPONG = {("paged", 128)}
# Changes of a serving layout's default that won on one serving bucket's mix and lost on the others, so no default: a
# serving campaign seeds the layout's default with each of them beside the default itself, and its per-bucket
# re-timing keeps one only where it beats the default in two fresh processes. One CTA a tile (persistent false):
# llama3-8b's paged kernel with pages of 128 on 2 x (2k on 6k) (bucket t4k-even-p128), x1.026 and x1.021 over the
# default in two processes of 9 paired rounds, 1.014-1.024x FA4 (BENCHMARKS.md 2026-11-26; 1.007-1.027x
# FA4 in an earlier run of that day), and 0.32-0.44x FA4 on the skewed and short mixes, where the longest-first walk matters; with
# pages of 16 x0.989 and x1.000. The search rarely meets it on its own (a 360 s campaign at pages of 128 did not).
SERVING_SEED_CHANGES = {"paged": ({"persistent": False},)}
# The same for one head dim of a layout, a 16-bit kernel without options: FA3's d256 tile, 128 x 80 with the producer
# at 24 registers (the consumers' 240 hold it; ptxas's 20 spilled bytes lie outside the key loop), on gqa 8/1 against
# the varlen default 128 x 64 (H200, one process each, FA4 in each, BENCHMARKS.md "2026-11-29 (fifth session)"):
# 0.976 / 0.991 non-causal and 0.939 / 0.954 causal of FA4 on 8x2k and 1x8k+32x256 against 0.927 / 0.935 and 0.929 /
# 0.920, but 0.850 / 0.809 against 0.867 / 0.868 on 64 random 1-512.
HEAD_DIM_SERVING_SEED_CHANGES = {("varlen", 256): ({"block_n": 80, "producer_regs": 24},)}


def serving_seed_changes(spec: KernelSpec) -> tuple:
    """The changes a serving campaign seeds beside a spec's default (SERVING_SEED_CHANGES, and
    HEAD_DIM_SERVING_SEED_CHANGES where the spec is a plain 16-bit one of that head dim)."""
    changes = SERVING_SEED_CHANGES.get(spec.layout, ())
    plain = (spec.dtype != "fp8" and spec.d_qk == spec.d_v and not spec.local and not spec.softcap
             and not spec.sinks)
    return changes + (HEAD_DIM_SERVING_SEED_CHANGES.get((spec.layout, spec.d_qk), ()) if plain else ())
# With pages a whole number of K/V tiles (page size a multiple of block N), a paged kernel whose page size is known
# (`tune build --page-size`, a paged campaign, an export per page size) reads its tiles as TMA boxes and waits for its
# P.V GEMM after half the exponentials (pv_wait "half"): llama3-8b's paged kernel with pages of 128, against the
# cp.async producer (both with ping-pong), in three processes (BENCHMARKS.md 2026-11-26): ahead on all four mixes each time, 8x2k 1.045-1.064 against 0.977-0.991 of FA4, 1x8k+32x256 0.993-1.004 against
# 0.908-0.934, 64 random 1-512 1.126-1.141 against 1.115-1.135, 2x(2k on 6k) 0.965-0.968 against 0.893-0.909. Pages
# smaller than a tile keep the cp.async producer (TMA boxes of 16 rows ran 0.45-0.54x FA4); pages of 256 take TMA by
# the same rule, not measured.
WHOLE_TILE_PAGES = dict(g2s_atom="SM90_TMA", producer_regs=SERVING_PRODUCER_REGS["paged"], pv_wait="half")
WHOLE_TILE_PAGES_HEAD_DIMS = (128,)     # where it was measured (d_qk = d_v)


# The softmax's conditional rescale (FA4's rule: a row's O is rescaled only when a tile raised its max by more than
# 8 log2 units; KernelParams.rescale_threshold) by (head dim, causal), dense layout. scripts/param_ab_check.py on
# the H100 (BENCHMARKS.md 2026-11-25; paper grid 1k-16k, 15 paired rounds against rescaling every tile):
# non-causal d128 x1.010-1.031 (MHA and GQA, 10 of 10 points ahead, 8 outside the spread), causal d128
# x1.000-1.028 (none behind), non-causal d64 x1.013-1.026 (3 of 5 outside the spread). Causal d64 keeps every
# tile: x0.976-0.991 at 1k-4k, and ptxas spills 4 bytes of its 128-register consumers. The paged layout takes the
# same table: llama3-8b's paged kernel (d128 causal, BENCHMARKS.md 2026-11-26) with
# threshold 8 against every tile, in two processes, against FA4: 2x(2k on 6k) 0.939 -> 0.960 and 0.941 -> 0.969 with
# pages of 16, 1x8k+32x256 0.953 -> 0.993 and 0.963 -> 0.986; the short mixes within 1% either way. Varlen keeps
# every tile: the same A/B on the varlen layout, two processes, was mixed (8x2k 1.056 -> 1.035 and 1.058 ->
# 1.052, 1x8k+32x256 1.010 -> 1.027 and 1.005 -> 1.017, 64 random even). MLA is not measured yet.
RESCALE_THRESHOLD_DEFAULTS = {(128, False): 8, (128, True): 8, (64, False): 8}
RESCALE_THRESHOLD_LAYOUTS = ("dense", "paged")


# FP8 kernels: V^T's keys in P's accumulator order (KernelParams.vt_key_order), so P reaches the e4m3 A operand
# without the two shuffles per row and k-block of "natural" order (SASS, d128 dense: SHFL 45 -> 13, PRMT 96 -> 24).
# H200, MHA dense 1k-16k keys, 5 interleaved rounds in one process, the per-call V^T copy timed (BENCHMARKS.md, V^T
# key order): 1.004-1.067x natural order everywhere, d128 non-causal 16k 829.0 -> 861.9 TFLOPS, d64 616.5 -> 657.8.
FP8_VT_KEY_ORDER = "accumulator"

# FP8 tiles: FA3's FP8 shapes where our block N set has them (d64 192 rows; d128 128 rows), else the 16-bit ones.
# d96 and d256 take FA3's FP8 tiles (tile_size_fwd_sm90, element size 1): 192 x 128 at d96 and 128 x 128 at d256
# (FA3 narrows 256's to 64 keys for a window only, which FP8 kernels here do not take). d96's three consumer
# warpgroups hold S 64 + O 48 + P 16 + 28 = 156 of their 160 registers; d256's two hold S 64 + O 128 + P 16 + 24 + 8
# (the wide O's: params_sm90.FP8_HEAD_DIM_OVERHEAD) = 240 of 240, and its shared memory (Q 128 x (256 + 512 bf16 O)
# + 2 stages of 128 x 512 K/V^T) is 224 of 227 KB. A varlen or paged kernel's producer keeps 32-40 registers, which
# leaves d256's consumers 232: there ptxas spilled 128 x 128 (32 bytes), validation refuses it and the next seed,
# 128 x 64 (as the 16-bit d256 serving kernels fall to 64 keys), is taken. ptxas (nvcc 13.0, sm_90a) builds each
# default without spills, dense, varlen and paged (tests/translate/test_fp8_head_dims.py). d192 takes FA3's 128 x 160:
# S 80 + O 96 + P 20 + 24 + 8 (params_sm90.FP8_HEAD_DIM_OVERHEAD) = 228 registers, shared memory 192 KB; 128 x 192
# spilled 32 bytes in the dense kernel's 240 (FA3 does not take it either).
FP8_SEEDS = {64: [dict(block_m=192, block_n=128, producer_regs=32), dict(block_m=128, block_n=128)],
             96: [dict(block_m=192, block_n=128, producer_regs=32), dict(block_m=128, block_n=128)],
             128: [dict(block_m=128, block_n=128), dict(block_m=128, block_n=64)],
             192: [dict(block_m=128, block_n=160), dict(block_m=128, block_n=128), dict(block_m=128, block_n=64)],
             256: [dict(block_m=128, block_n=128), dict(block_m=128, block_n=64)]}


def _hopper_seeds(spec: KernelSpec) -> list[dict]:
    """(block_m, block_n, producer registers) in order of preference: FA4's, then FA3's and smaller."""
    d = max(spec.d_qk, spec.d_v)
    if spec.dtype == "fp8":   # block N of 64-byte multiples among CuTe's base N (params_sm90.FP8_BLOCK_N)
        seeds = FP8_SEEDS[d]
    elif d <= 64:
        seeds = [dict(block_m=192, block_n=128, producer_regs=32), dict(block_m=128, block_n=128),
                 dict(block_m=128, block_n=64)]
    elif d <= 96:
        # d128's 128 x 128 RS (no spills, nor at 128 x 144 or 176 non-causal). FA4's d96 tile (192 x 128 causal, else
        # 192 x 144, P through shared memory: an RS P would take 36 more of a consumer's 160 registers) builds without
        # spills since P goes to shared memory by stmatrix (760 bytes of spilled smem pointers before, nvcc 13.0); it is
        # a campaign seed, not yet timed here against this default
        seeds = [dict(block_m=128, block_n=128), dict(block_m=128, block_n=64)]
    elif d <= 128:
        seeds = [dict(block_m=128, block_n=128), dict(block_m=128, block_n=176 if not spec.causal else 128),
                 dict(block_m=128, block_n=64)]
    elif d <= 192:   # MLA 192/128: FA4's 128x128; 192/192 falls to FA3's 128x112 (its O takes the registers)
        seeds = [dict(block_m=128, block_n=128), dict(block_m=128, block_n=112), dict(block_m=128, block_n=96),
                 dict(block_m=64, block_n=64)]
    elif spec.layout == "dense" and not getattr(spec, "local", False):
        # hd256: FA3's and FA4's 128x80 (O 64x256 is 128 of a consumer thread's registers)
        seeds = [dict(block_m=128, block_n=80), dict(block_m=128, block_n=64), dict(block_m=64, block_n=64)]
    elif spec.layout == "dense" or not (spec.local or spec.softcap):
        # hd256 varlen (its producer takes registers from the consumers) and with a window (its bounds): ptxas
        # spilled at 128x80 (nvcc 13.0, gqa causal: varlen 20 bytes, window + softcap 4) and not at 128x64. Paged
        # (the cp.async producer's 56 registers leave the consumers 224) spills 16 bytes at 128x64, none inside the
        # key loop (a tile's epilogue and the producer): 0.93-0.97x FA4 on the serving mixes against 0.84-0.89x at
        # 128x48 (H200, BENCHMARKS.md "2026-11-29 (fifth session)")
        seeds = [dict(block_m=128, block_n=64), dict(block_m=64, block_n=64)]
    else:
        # hd256 paged and varlen with a window or a cap (Gemma 2's padded batches): ptxas spilled at 128x64 (nvcc
        # 13.0, gqa causal: paged 16-48 bytes, varlen with the options 4-44) and not at 128x48
        seeds = [dict(block_m=128, block_n=48), dict(block_m=64, block_n=64)]
    if spec.layout != "dense":
        regs = SERVING_PRODUCER_REGS[spec.layout]
        if spec.dtype == "fp8":
            regs = max(regs, FP8_SERVING_PRODUCER_REGS.get(d, {}).get(spec.layout, 0))
        seeds = [dict(seed, producer_regs=max(seed.get("producer_regs", 24), regs)) for seed in seeds]
    return seeds


def hopper_params(profile: Profile, spec: KernelSpec, warp_specialized: bool = True,
                  page_size: int | None = None) -> KernelParams:
    """FA4's Hopper choice for the head dim, shrunk until it fits; the plain wgmma schedule loads with
    cp.async and takes no producer settings. A paged spec with a known ``page_size`` that is a multiple of the
    tile's block N takes WHOLE_TILE_PAGES (at WHOLE_TILE_PAGES_HEAD_DIMS)."""
    probe = probe_problem(spec)
    tried = []
    for seed in _hopper_seeds(spec):
        base = dict(num_warps=seed["block_m"] // 16, kv_stages=2, mma_atom="SM90_GMMA", pv_operand="rs")
        copies = [dict(g2s_atom="SM80_CP_ASYNC_CACHEGLOBAL")]
        if warp_specialized:
            regs = seed.get("producer_regs", 24)
            copies = [dict(g2s_atom="SM90_TMA", persistent=True, producer_regs=regs)]
            # the indexed producer first (see CP_ASYNC_PRODUCER_REGS); TMA where it cannot (MLA), and FP8's K where
            # pages are whole tiles (see the FP8 note there)
            if spec.layout == "paged" and spec.dtype != "fp8":
                copies.insert(0, dict(g2s_atom="SM80_CP_ASYNC_CACHEGLOBAL", persistent=True,
                                      producer_regs=max(regs, CP_ASYNC_PRODUCER_REGS)))
                if _whole_tile_pages(spec, page_size, seed["block_n"]):
                    copies.insert(0, dict(persistent=True, **WHOLE_TILE_PAGES))
            elif spec.layout == "paged" and not (page_size and page_size % seed["block_n"] == 0):
                copies.insert(0, dict(g2s_atom="SM80_CP_ASYNC_CACHEGLOBAL", persistent=True,
                                      producer_regs=max(regs, CP_ASYNC_PRODUCER_REGS)))
        for copy in copies:
            params = KernelParams(block_m=seed["block_m"], block_n=seed["block_n"], **base, **copy,
                                  pack_gqa=warp_specialized and _packs_query_heads(spec),
                                  rescale_threshold=_rescale_threshold(spec) if warp_specialized else 0,
                                  pingpong=warp_specialized and _serving_pingpong(spec),
                                  vt_key_order=FP8_VT_KEY_ORDER if spec.dtype == "fp8" else "natural")
            errors = validate(params, profile, probe, warp_specialized=warp_specialized)
            if not errors:
                return _local_params(params, spec, profile, probe) if warp_specialized else params
            tried.append(f"{params.key()}: {'; '.join(errors)}")
    raise ValueError(f"no Hopper candidate fits {profile.name} for {spec.label()}:\n  " + "\n  ".join(tried))


# A local kernel of a grouped head layout at head dim 64 (gpt-oss: 64/8 heads, 128-key windows): 128-row tiles of the
# group's 8 heads packed (16 tokens each) and 64-key tiles, so that a window spans few key tiles and one K/V tile
# serves the whole group. Window 128, 64/8 heads, causal, 2k and 16k keys (H200, FA4 in the same process,
# BENCHMARKS.md 2026-11-27): 126.1 and 128.0 TFLOPS, 1.044x and 1.049x FA4, against 97.3 and 98.2 (0.81x) with
# the head dim's default 192 x 128 unpacked; every other tile of 64-192 x 64-128, packed or not, 0.75-0.98x.
LOCAL_GROUPED_D64 = dict(block_m=128, block_n=64, num_warps=8, pack_gqa=True, producer_regs=24)


def _local_params(params: KernelParams, spec: KernelSpec, profile: Profile, probe: Problem) -> KernelParams:
    """LOCAL_GROUPED_D64 for a dense local spec of grouped heads at head dim 64 where it is valid; else ``params``."""
    if not (getattr(spec, "local", False) and spec.layout == "dense" and spec.variant in ("gqa", "mqa")
            and spec.d_qk == spec.d_v == 64):
        return params
    local = KernelParams.from_dict({**params.to_dict(), **LOCAL_GROUPED_D64})
    return local if not validate(local, profile, probe, warp_specialized=True) else params


def fp8_paged_other_k_copy(params: dict) -> dict:
    """The change that gives an FP8 paged default the other K copy (a campaign seeds it beside the default, for its
    re-timing to judge): TMA boxes at the paged producer's registers for a cp.async default, the cp.async producer at
    its registers for a TMA one."""
    if params["g2s_atom"] == "SM80_CP_ASYNC_CACHEGLOBAL":
        return {"g2s_atom": "SM90_TMA", "producer_regs": SERVING_PRODUCER_REGS["paged"]}
    return {"g2s_atom": "SM80_CP_ASYNC_CACHEGLOBAL", "producer_regs": max(params["producer_regs"], CP_ASYNC_PRODUCER_REGS)}


def _whole_tile_pages(spec: KernelSpec, page_size: int | None, block_n: int) -> bool:
    """WHOLE_TILE_PAGES applies: pages of whole tiles, at a head dim where the paged kernel was measured (16-bit: an
    FP8 paged kernel keeps the FP8 varlen kernel's choices, TMA already)."""
    return (bool(page_size) and page_size % block_n == 0 and spec.d_qk == spec.d_v
            and spec.d_qk in WHOLE_TILE_PAGES_HEAD_DIMS and spec.dtype != "fp8")


# Grouped heads at head dim 64 pack the group's query heads into a tile's rows (FA4's default for GQA/MQA). Unpacked
# default / packed: causal, H100, 2 processes x 15 paired rounds (BENCHMARKS.md 2026-11-26 "packed query heads"): gqa
# 32/4 x1.26-1.30 at 512-1k, x1.12 at 2k, x1.03-1.11 at 4k-16k; mqa 32/1 x1.04-1.32. H200 (BENCHMARKS.md "2026-11-29
# (fifth session)"): causal gqa/mqa x1.29-1.31 at 1k, x1.03-1.05 at 16k; non-causal (2 processes) x1.12 at 1k,
# x1.04-1.05 at 2k-4k, level at 16k (x0.999-1.006); gpt-oss's 64/8 with sinks 1.051 / 1.007 / 0.996 / 1.069x FA4 at
# 1k / 2k / 4k / 16k (0.835-0.939x unpacked). d128 gained at most 1-5%, not everywhere: its table decides.
PACKED_HEAD_DIMS = (64,)


def _packs_query_heads(spec: KernelSpec) -> bool:
    """pack_gqa in a dense 16-bit GQA/MQA spec's default at PACKED_HEAD_DIMS (d_qk = d_v)."""
    return (spec.variant in ("gqa", "mqa") and spec.layout == "dense" and spec.dtype != "fp8"
            and spec.d_qk == spec.d_v and spec.d_qk in PACKED_HEAD_DIMS)


def _serving_pingpong(spec: KernelSpec) -> bool:
    """SERVING_PINGPONG's choice for a serving spec whose head dims are equal (measured on 16-bit kernels: an FP8
    paged kernel keeps the FP8 varlen kernel's schedule)."""
    return spec.d_qk == spec.d_v and (spec.layout, spec.d_qk) in SERVING_PINGPONG and spec.dtype != "fp8"


def _rescale_threshold(spec: KernelSpec) -> int:
    """RESCALE_THRESHOLD_DEFAULTS' value for a dense or paged spec whose head dims are equal; 0 (every tile)
    otherwise."""
    if spec.layout not in RESCALE_THRESHOLD_LAYOUTS or spec.d_qk != spec.d_v or spec.dtype == "fp8":
        return 0
    return RESCALE_THRESHOLD_DEFAULTS.get((spec.d_qk, spec.causal), 0)


def probe_problem(spec: KernelSpec, seqlen: int = 1024) -> Problem:
    """A grid-shaped problem of this spec, for checks that need one (validate looks at dims and dtype)."""
    hq, hkv, _, _ = heads_for(spec.variant, spec.d_qk if spec.variant != "mla" else 128)
    return Problem(spec.variant, 1, hq, hkv, seqlen, seqlen, spec.d_qk, spec.d_v, spec.causal, spec.dtype)


def default_params(profile: Profile, spec: KernelSpec, schedule: str = "fa2",
                   page_size: int | None = None) -> KernelParams:
    """The default candidate of ``schedule`` (a ``tl.SCHEDULES`` key): on sm90 Hopper's (warp-specialised
    for the ws_* sketches, plain wgmma for fa2 sketches when ``schedule`` says hopper), otherwise FA2's
    parameters for this head dim on this architecture, shrunk until they fit the profile. ``page_size``: the
    paged kernel is for that page size only (None: it reads every page size its copy can)."""
    if schedule.startswith("ws_") or spec.dtype == "fp8":   # (FP8 kernels are warp-specialised only)
        return hopper_params(profile, spec, warp_specialized=True, page_size=page_size)
    if profile.has_cp_async and "SM80_16x8x16" in profile.mma_atoms:
        atoms = dict(mma_atom="SM80_16x8x16", g2s_atom="SM80_CP_ASYNC_CACHEGLOBAL", s2r_atom="SM75_U32x4_LDSM_N")
    else:  # sm75: m16n8k8 mma, no cp.async (plain 128-bit loads), ldmatrix is there
        atoms = dict(mma_atom="SM75_16x8x8", g2s_atom="UniversalCopy128",
                     s2r_atom="SM75_U32x4_LDSM_N" if "SM75_U32x4_LDSM_N" in profile.s2r_copy_atoms
                     else profile.s2r_copy_atoms[0])
    swizzle = 3 if spec.d_qk % 64 == 0 and spec.d_v % 64 == 0 else 2
    probe = probe_problem(spec)
    tried = []
    for block_m, block_n, warps in _seeds(profile, spec):
        params = KernelParams(block_m=block_m, block_n=block_n, num_warps=warps, kv_stages=1, swizzle=swizzle,
                              q_in_regs=False, **atoms)
        errors = validate(params, profile, probe)
        if not errors:
            return params
        tried.append(f"{params.key()}: {'; '.join(errors)}")
    raise ValueError(f"no default candidate fits {profile.name} for {spec.label()}:\n  " + "\n  ".join(tried))
