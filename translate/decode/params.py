"""Decode kernel parameters: the numbers a search picks for a decode sketch, and their pure validation."""
from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass, fields

from hardware_profiles import Profile
from kernel_abi.decode import MLA_DECODE_D_QK, MLA_DECODE_D_V, v_from_k
from kernel_abi.spec import KernelSpec, kv_dtype_errors

# A decode query tile holds at most 16 tokens (speculative decoding) x a KV group's heads; past 4 row slabs per
# warp the O accumulator no longer fits the registers (see validate_decode).
MAX_SEQLEN_Q = 16


@dataclass(frozen=True)
class DecodeParams:
    """One decode candidate. Field names are the Optuna parameter names (search_spaces/decode.toml)."""

    block_m: int = 16            # packed rows per CTA: seqlen_q x (the KV group's query heads if pack_gqa)
    block_n: int = 64            # keys per ring stage
    warps_m: int = 1             # warps along the rows, 16-row slabs each
    warps_n: int = 4             # independent online softmaxes over the columns of each tile, merged at the end
    # cp.async ring depth. 3: at 64 keys x d128 that is 100 KB, two CTAs per SM; on the H100 it won the 15-candidate
    # probe of the decode candidates and held >= 1.0x FA4 on the whole decode grid (BENCHMARKS.md, 2026-11-24).
    kv_stages: int = 3
    pack_gqa: bool = True        # one CTA reads a K/V tile once for every query head of its group
    min_split_blocks: int = 2    # split rule (kernel_abi/splits.py): the fewest key tiles one split takes
    swizzle: int = 3
    # The tensor-core instructions: "sm80" (ldmatrix + mma.sync, every sm80+ GPU) or "sm90_wgmma" (Hopper
    # warpgroup MMAs reading Q, K, V and P from shared memory: attn_decode_sm90.cuh; MLA split-d_v, sm_90a), or
    # "sm90_seesaw" (the same instructions, the two warpgroups scoring alternate tiles out of step:
    # attn_decode_sm90_seesaw.cuh).
    mma: str = "sm80"
    # How a key tile reaches shared memory: "gather" (cp.async by rows through the page table, any page size) or
    # "tma" (sm90_seesaw only: a whole tile of keys within one page, or of a dense cache, as TMA boxes issued by one
    # thread a warpgroup; a sequence's last, partial tile and pages smaller than block_n still gather, zero-filled).
    kv_load: str = "gather"
    # sm90_seesaw only: FA4's conditional rescale. A row keeps its running max while a tile's max exceeds it by at
    # most this many log2 units (P then reaches 2^threshold), so its factor is exactly 1 and a warp whose rows all
    # kept theirs skips the output's multiplies (128 a thread, four a tile pair, on the warpgroups' critical path).
    # 0: the max follows every tile. 8 (the Hopper MLA default): 1.017-1.038x at 128 heads, 1.00-1.05x over batch
    # 1-128 x 2k-32k (H100, BENCHMARKS.md 2026-11-26).
    rescale_threshold: int = 0

    @property
    def num_warps(self) -> int:
        return self.warps_m * self.warps_n

    @property
    def num_threads(self) -> int:
        return 32 * self.num_warps

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "DecodeParams":
        known = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"unknown decode parameter(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        for name, value in data.items():
            if known[name] in (str, "str"):
                if not isinstance(value, str):
                    raise ValueError(f"{name} must be a string, got {value!r}")
                continue
            want_bool = known[name] in (bool, "bool")
            ok = isinstance(value, bool) if want_bool else (isinstance(value, numbers.Integral)
                                                              and not isinstance(value, bool))
            if not ok:
                raise ValueError(f"{name} must be {'true or false' if want_bool else 'an integer'}, got {value!r}")
        return cls(**data)

    def key(self) -> str:
        return (f"dm{self.block_m}n{self.block_n}w{self.warps_m}x{self.warps_n}s{self.kv_stages}"
                f"{'p' if self.pack_gqa else 'h'}_b{self.min_split_blocks}_sw{self.swizzle}"
                f"{'' if self.mma == 'sm80' else '_' + MMA_KEYS.get(self.mma, self.mma)}"
                f"{'' if self.kv_load == 'gather' else '_' + self.kv_load}"
                f"{'' if not self.rescale_threshold else f'_rt{self.rescale_threshold}'}")


MMA_CHOICES = ("sm80", "sm90_wgmma", "sm90_seesaw")
MMA_KEYS = {"sm90_wgmma": "wg", "sm90_seesaw": "ss"}   # key() suffix of a non-default mma (the default has none)
WGMMA_KINDS = ("sm90_wgmma", "sm90_seesaw")   # the Hopper warpgroup-MMA kernels (MLA split-d_v, sm_90a)
KV_LOADS = ("gather", "tma")
# The conditional rescale's thresholds in log2 units (P up to 2^16 still leaves fp32 sums and 16-bit P far from
# overflow); 0 turns it off.
MAX_RESCALE_THRESHOLD = 16


def split_dv_default(spec: KernelSpec) -> bool:
    """The mode the reference decode sketch of the spec's variant states (tl/sketches/decode): split-d_v (P
    through shared memory, O's columns split over the warp groups) for MLA, else independent column groups."""
    return spec.variant == "mla"


def decode_smem_bytes(params: DecodeParams, spec: KernelSpec, split_dv: bool | None = None) -> int:
    """Q tile + the larger of the K/V ring (no V ring when V is read from K; split-d_v: then the P tile and the
    (warps_n, block_m) fp32 max exchange) and the merge buffer that reuses it after the loop (O rows in fp32 per
    warp group, one O for split-d_v, and a max and a sum per group and row). attn_decode.cuh lays it out so."""
    split_dv = split_dv_default(spec) if split_dv is None else split_dv
    q = params.block_m * spec.d_qk * 2
    if params.mma == "sm90_seesaw":   # Q | two slots | P0 (P1 in Q's last chunk) | max, two scales | 4 mbarriers
        slots = 2 * params.block_n * spec.d_qk * 2
        return q + slots + params.block_m * params.block_n * 2 + 3 * params.block_m * 4 + 4 * 8
    kv_bytes = 1 if spec.kv_dtype == "fp8" else 2   # an e4m3 cache's ring holds its bytes as they are
    ring = params.kv_stages * params.block_n * (spec.d_qk + (0 if v_from_k(spec) else spec.d_v)) * kv_bytes
    if split_dv:
        ring += params.block_m * params.block_n * 2 + params.warps_n * params.block_m * 4
    o_tiles = 1 if split_dv else params.warps_n
    merge = o_tiles * params.block_m * spec.d_v * 4 + params.warps_n * params.block_m * 2 * 4
    if split_dv:   # the merge buffer starts at Q (dead after the loop too): 64 x 512 fp32 beside a small ring
        return max(q + ring, merge)
    return q + max(ring, merge)


def default_decode_params(spec: KernelSpec, heads_q: int | None = None, profile: Profile | None = None) -> DecodeParams:
    """The decode candidate to start from. GQA/MQA/MHA: DecodeParams(), with fewer stages or keys where the profile's
    shared memory needs (below). MLA (split-d_v, one latent KV head, all
    heads packed into the rows): 128 heads (DeepSeek-V3) take 64-row tiles, 4 warps along the rows x 2 over
    d_v (O slice 16 x 256 per warp: 128 registers), 64 keys x 2 stages (Q 72 KB + K 144 KB + P 8 KB = 225 KB,
    one CTA per SM: the kernel is bound by its tensor cores there, 241 FLOP per cache byte); 16 heads (a
    tensor-parallel shard, 8x fewer FLOP per byte) one 16-row tile, 4 warps over d_v, 64 keys x 2 stages. Where
    ``profile``'s shared memory is smaller (A100: 163 KB), 32-key stages; on Hopper the 64-row tile's GEMMs are
    warpgroup MMAs with the two warpgroups out of step (mma sm90_seesaw) and whole key tiles come by TMA."""
    if spec.variant != "mla" and spec.kv_dtype == "fp8":
        # an e4m3 tile is half the bytes and its operands are converted in registers: 128-key tiles (32 keys a warp
        # group) spread the per-tile work (O's rescale, the softmax's reductions, the gather's page lookups) over
        # twice the bytes of 64 (about 0.10 SASS instructions a cache byte in the loop at d128, nvcc 13, against 0.12
        # at 64 keys); three stages are 100 KB at d128 (two CTAs an SM, as the 16-bit default)
        p = DecodeParams(block_n=128, kv_stages=3)
        if profile is not None and decode_smem_bytes(p, spec) > profile.smem_per_block_bytes:
            p = DecodeParams(block_n=128, kv_stages=2)
        return p
    if spec.variant == "mla" and spec.kv_dtype == "fp8":
        return _fp8_mla_default(heads_q, profile)
    if spec.variant != "mla":
        # a head dim that 64 does not divide (96) lays its rows out in 32-column atoms, whose swizzle is 2 bits
        base = DecodeParams() if spec.d_qk % 64 == 0 and spec.d_v % 64 == 0 else DecodeParams(swizzle=2)
        p = base
        # where three stages of 64 keys do not fit (head dim 256: 200 KB, over the A100's 163; the L40S's 99 KB at
        # head dim 128): fewer stages, then fewer keys over two warp groups
        for fewer in (dict(kv_stages=2), dict(kv_stages=2, block_n=32, warps_n=2)):
            if profile is None or decode_smem_bytes(p, spec) <= profile.smem_per_block_bytes:
                break
            p = DecodeParams(**{**base.to_dict(), **fewer})
        return p
    if heads_q is not None and heads_q <= 16:
        p = DecodeParams(block_m=16, block_n=64, warps_m=1, warps_n=4, kv_stages=2)
    else:
        p = DecodeParams(block_m=64, block_n=64, warps_m=4, warps_n=2, kv_stages=2)
    if profile is not None and decode_smem_bytes(p, spec) > profile.smem_per_block_bytes:
        p = DecodeParams(**{**p.to_dict(), "block_n": 32})
    if profile is not None and profile.sm >= 90 and p.block_m == 64 and not validate_decode(
            DecodeParams(**{**p.to_dict(), "mma": "sm90_seesaw"}), profile, spec):
        # Hopper: the same tile on warpgroup MMAs, 1.4-1.7x the mma.sync kernel's bandwidth at 128 heads with the row
        # gather (sm90_wgmma: H100, BENCHMARKS.md 2026-11-24: 1632-1800 against 1041-1133 GB/s), and out of step
        # 1.01-1.13x that at every point of batch 1-128 x 2k-32k keys and 2-4 tokens (sm90_seesaw: the same two builds
        # timed side by side, BENCHMARKS.md 2026-11-25)
        # Whole tiles by TMA (kv_load tma): 1.033-1.061x the seesaw's row gathers at 128 heads, batch 64-128 x
        # 4k-16k keys and 2-4 tokens, 1.001-1.059x over batch 1-128 x 2k-32k (H100, BENCHMARKS.md 2026-11-26); an L2
        # prefetch (TMA tensor prefetch) of the tiles one or two pairs after the ones each pair loads was 0.88-0.95x
        # of it.
        # The conditional rescale (rescale_threshold 8): 1.017-1.051x the seesaw without it at 128 heads and every
        # grid point (H100, BENCHMARKS.md 2026-11-26).
        p = DecodeParams(**{**p.to_dict(), "mma": "sm90_seesaw", "kv_load": "tma", "rescale_threshold": 8})
    return p


def _fp8_mla_default(heads_q: int | None, profile: Profile | None) -> DecodeParams:
    """The absorbed-MLA decode over an e4m3 latent cache (split_kv_fp8_mla, mma.sync on every GPU: the warpgroup
    kernels take no e4m3 cache). The 16-bit kernel's tiles (128 heads: 64 rows, 4 x 2 warps; 16: 16 rows, 1 x 4), a
    slot of 64 keys (36 KB) half the 16-bit one. 128 heads: three stages (Q 72 KB + 108 KB + P 8 KB; 254 registers a
    thread, so one CTA an SM whatever the ring, and the kernel is tensor-core bound there). 16 heads: two stages
    (92 KB), so that two CTAs (8 warps) share an SM where the 16-bit kernel's 72 KB stages allow one (4 warps) for the
    same bytes in flight; a four-stage ring of one CTA is a seed of the search space. Fewer stages where the profile's
    shared memory is smaller. Neither is measured on a GPU yet."""
    if heads_q is not None and heads_q <= 16:
        p = DecodeParams(block_m=16, block_n=64, warps_m=1, warps_n=4, kv_stages=2)
    else:
        p = DecodeParams(block_m=64, block_n=64, warps_m=4, warps_n=2, kv_stages=3)
    spec = KernelSpec("mla", MLA_DECODE_D_QK, MLA_DECODE_D_V, True, "bf16", "paged", "decode", kv_dtype="fp8")
    while profile is not None and p.kv_stages > 2 and decode_smem_bytes(p, spec) > profile.smem_per_block_bytes:
        p = DecodeParams(**{**p.to_dict(), "kv_stages": p.kv_stages - 1})
    return p


def validate_decode(params: DecodeParams, profile: Profile, spec: KernelSpec, *, split_dv: bool | None = None,
                    q_in_regs: bool | None = None) -> list[str]:
    """Every reason this decode candidate cannot work on this GPU for this spec; empty when legal. ``split_dv``
    and ``q_in_regs`` are what the sketch states (translate/decode/generate.py); None: what the variant's
    reference decode sketch states (MLA: split-d_v, Q read from shared memory; else column groups, Q in
    registers)."""
    split_dv = split_dv_default(spec) if split_dv is None else split_dv
    q_in_regs = not split_dv_default(spec) if q_in_regs is None else q_in_regs
    errors: list[str] = []
    if profile.sm < 80:
        errors.append(f"decode kernels gather K/V with cp.async and multiply with sm80 mma.sync: {profile.name} is "
                      f"sm{profile.sm}")
    if spec.dtype not in profile.dtypes:
        errors.append(f"{profile.name} has no {spec.dtype} tensor cores")
    if params.warps_m not in (1, 2, 4) or params.warps_n not in (1, 2, 4, 8):
        errors.append(f"warps_m must be 1, 2 or 4 and warps_n 1, 2, 4 or 8; got {params.warps_m} x {params.warps_n}")
    elif params.num_warps > 16:
        errors.append(f"{params.num_warps} warps exceed the 16 a CTA of this kernel may have")
    if params.block_m <= 0 or params.block_m % (16 * max(1, params.warps_m)):
        errors.append(f"block_m {params.block_m} must be a positive multiple of 16 x warps_m "
                      f"({16 * max(1, params.warps_m)}): each warp owns 16-row slabs")
    if params.block_m > 16 * MAX_SEQLEN_Q:
        errors.append(f"block_m {params.block_m} exceeds {16 * MAX_SEQLEN_Q} rows")
    per_group = params.block_n // max(1, params.warps_n)
    if params.block_n <= 0 or params.block_n % (16 * max(1, params.warps_n)):
        errors.append(f"block_n {params.block_n} must be a positive multiple of 16 x warps_n "
                      f"({16 * max(1, params.warps_n)}): each warp group takes k16 slices of every tile")
    if params.kv_stages < 2 or params.kv_stages > 12:
        errors.append(f"kv_stages must be 2..12 (a ring of cp.async stages), got {params.kv_stages}")
    if params.min_split_blocks < 1:
        errors.append(f"min_split_blocks must be >= 1, got {params.min_split_blocks}")
    if params.swizzle not in (0, 1, 2, 3):
        errors.append(f"swizzle must be 0..3, got {params.swizzle}")
    for d in sorted({spec.d_qk, spec.d_v}):
        if d % 32:
            errors.append(f"head dim {d} must be a multiple of 32 (swizzled shared-memory atoms of 64 or 32 columns)")
        elif d % 64 and params.swizzle > 2:
            errors.append(f"swizzle {params.swizzle} needs 64-column rows; head dim {d} takes 32-column atoms "
                          "(swizzle <= 2)")
    # fp32 registers per thread: O (rows x d_v, split-d_v: the group's d_v / warps_n slice) and S (rows x the
    # group's columns) spread over one group's warps, Q as 16-bit operands when kept in registers. Past ~200
    # ptxas spills (nvcc 13, checked with the SASS tests). Split-d_v takes more than the estimate: the MLA
    # defaults estimate 144 (hq 128) and 80 (hq 16) and ptxas gives 240 and 128 registers, no spills (sm_90a).
    if params.warps_m in (1, 2, 4) and params.block_m > 0 and params.warps_n in (1, 2, 4, 8):
        lanes = 32 * params.warps_m
        o_cols = spec.d_v // params.warps_n if split_dv else spec.d_v
        q_regs = params.block_m * spec.d_qk // 2 if q_in_regs else 0
        regs = (params.block_m * o_cols + params.block_m * max(per_group, 0) + q_regs) // lanes
        if regs > 200:
            errors.append(f"O{' slice' if split_dv else ''}, S{' and Q' if q_in_regs else ''} need ~{regs} registers "
                          f"per thread (rows {params.block_m} over {params.warps_m} warp(s), "
                          f"{o_cols} O columns per warp): more than 200 spills")
    if split_dv:
        if params.warps_n in (1, 2, 4, 8) and spec.d_v % (16 * params.warps_n):
            errors.append(f"split-d_v: d_v {spec.d_v} must split into warps_n ({params.warps_n}) slices of a "
                          f"multiple of 16 columns (ldmatrix.trans n-blocks of V)")
        if params.block_n > 0 and params.block_n not in (16, 32) and params.block_n % 64:
            errors.append(f"split-d_v: block_n {params.block_n} must be 16, 32 or a multiple of 64 (the shared P "
                          "tile's swizzled atoms)")
    smem = decode_smem_bytes(params, spec, split_dv)
    if smem > profile.smem_per_block_bytes:
        what = "K stages (V read from K)" if v_from_k(spec) else "K/V stages"
        errors.append(f"shared memory {smem // 1024} KB (Q, {params.kv_stages} {what} of {params.block_n} keys"
                      f"{', the P tile' if split_dv else ''}) exceeds the {profile.smem_per_block_kb} KB per-block "
                      f"limit of {profile.name}")
    if params.mma not in MMA_CHOICES:
        errors.append(f"mma must be one of {', '.join(MMA_CHOICES)}, got {params.mma!r}")
    elif params.mma in WGMMA_KINDS:
        errors += _wgmma_reasons(params, profile, spec, split_dv, q_in_regs)
    if params.kv_load not in KV_LOADS:
        errors.append(f"kv_load must be one of {', '.join(KV_LOADS)}, got {params.kv_load!r}")
    elif params.kv_load == "tma" and params.mma != "sm90_seesaw":
        errors.append(f"kv_load tma: the TMA tile loads are written for the seesaw kernel (mma sm90_seesaw), not "
                      f"mma {params.mma}, which gathers with cp.async")
    if not 0 <= params.rescale_threshold <= MAX_RESCALE_THRESHOLD:
        errors.append(f"rescale_threshold must be 0..{MAX_RESCALE_THRESHOLD} log2 units, got "
                      f"{params.rescale_threshold}")
    elif params.rescale_threshold and params.mma != "sm90_seesaw":
        errors.append(f"rescale_threshold: the conditional rescale is written for the seesaw kernel (mma "
                      f"sm90_seesaw), not {params.mma}")
    if spec.kv_dtype:
        errors += kv_dtype_errors(spec) + _fp8_cache_reasons(params, spec, split_dv)
    if spec.variant == "mla" and (spec.d_qk, spec.d_v) != (MLA_DECODE_D_QK, MLA_DECODE_D_V):
        errors.append(f"MLA decode is the absorbed form: d_qk {MLA_DECODE_D_QK} (512 latent + 64 rotary), d_v "
                      f"{MLA_DECODE_D_V} read from the same rows; got {spec.d_qk}/{spec.d_v} (MLA 192/128 is prefill)")
    return errors


def _wgmma_reasons(params: DecodeParams, profile: Profile, spec: KernelSpec, split_dv: bool,
                   q_in_regs: bool) -> list[str]:
    """What attn_decode::split_kv_wgmma (attn_decode_sm90.cuh) needs beyond the split-d_v kernel's rules: one
    CTA of two consumer warpgroups over a 64-row x 64-key tile (each scores 32 keys, then multiplies all of P
    by its d_v / 2 columns: wgmma N <= 256), V read from K's rows, Q and P in shared memory, an sm_90a GPU."""
    errors = []
    if params.mma == "sm90_seesaw" and params.kv_stages != 2:
        errors.append(f"mma sm90_seesaw holds two tiles, one a warpgroup (kv_stages 2), got {params.kv_stages}")
    if profile.sm != 90:
        errors.append(f"mma {params.mma} issues Hopper warpgroup MMAs (sm_90a): {profile.name} is sm{profile.sm}")
    if not split_dv or not v_from_k(spec):
        errors.append(f"mma {params.mma} is the split-d_v kernel with V read from K's rows (absorbed MLA decode)")
    if q_in_regs:
        errors.append(f"mma {params.mma} reads Q from shared memory (a sketch without `Copy Q_shared from shared to "
                      "register`)")
    if (params.block_m, params.block_n, params.warps_m, params.warps_n) != (64, 64, 4, 2):
        errors.append(f"mma {params.mma} takes block_m 64, block_n 64, warps 4 x 2 (two warpgroups); got block_m "
                      f"{params.block_m}, block_n {params.block_n}, warps {params.warps_m} x {params.warps_n}")
    if params.swizzle != 3:
        errors.append(f"mma {params.mma} reads 128-byte swizzled tiles: swizzle 3, got {params.swizzle}")
    if spec.d_v % 128 or spec.d_v // 2 > 256:
        errors.append(f"mma {params.mma}: d_v {spec.d_v} must split into two slices of at most 256 columns (wgmma "
                      "N), multiples of 64")
    return errors


def _fp8_cache_reasons(params: DecodeParams, spec: KernelSpec, split_dv: bool) -> list[str]:
    """What the e4m3-cache kernels need beyond the 16-bit kernels' rules: mma.sync with the cp.async gather (no
    warpgroup kernel: those read B from shared memory, which would need a converted 16-bit copy of every tile). The
    grouped kernel (attn_decode_fp8.cuh split_kv_fp8) runs column groups and whole e4m3 rows per thread step of its
    gather (16-byte chunks: d / 16 of them a row, so the threads must be a multiple of that and a tile's chunks a
    multiple of the threads); the absorbed-MLA one (attn_decode_fp8_mla.cuh split_kv_fp8_mla) runs split-d_v with V
    read from the latent rows."""
    errors = []
    if spec.kv_dtype != "fp8":
        return errors
    if params.mma != "sm80" or params.kv_load != "gather":
        errors.append(f"kv_dtype fp8: the FP8 cache kernels are the mma.sync gather kernels (mma sm80, kv_load "
                      f"gather; the warpgroup kernels read K and V from shared memory as 16-bit operands), got mma "
                      f"{params.mma}, kv_load {params.kv_load}")
    if v_from_k(spec):
        return errors + _fp8_latent_reasons(split_dv)
    if split_dv:
        errors.append("kv_dtype fp8: the FP8 cache kernel runs column groups, not split-d_v (P through shared memory)")
    chunks = spec.d_qk // 16
    if chunks and params.warps_m in (1, 2, 4) and params.warps_n in (1, 2, 4, 8) and params.block_n > 0 and (
            params.num_threads % (8 * chunks) or (params.block_n * chunks) % params.num_threads):
        # a thread's rows are num_threads / chunks apart: a multiple of 8, the swizzle's period (attn_decode_fp8.cuh)
        errors.append(f"kv_dtype fp8: {params.num_threads} threads copy 16-byte chunks of {spec.d_qk}-byte rows "
                      f"({chunks} a row): the threads must be a multiple of 8 x {chunks} (rows 8 apart) and a "
                      f"tile's {params.block_n} x {chunks} chunks a multiple of the threads")
    return errors


def _fp8_latent_reasons(split_dv: bool) -> list[str]:
    """The absorbed-MLA kernel over an e4m3 latent cache (split_kv_fp8_mla) is split-d_v (the sketch's P through
    shared memory). Its gather copies 4 rows a warp at a time, so a tile must be whole 4-row groups of every warp:
    block_n a multiple of 4 x warps_m x warps_n, which the rule of 16 x warps_n keys (warps_m <= 4) already implies;
    each group's d_v slice is a multiple of 32 columns (pv_col permutes within 32) by the split-d_v rule."""
    if split_dv:
        return []
    return ["kv_dtype fp8 over an MLA latent cache: the kernel is split-d_v (P through shared memory), not column "
            "groups"]
