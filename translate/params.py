"""Kernel parameters: the numbers a search picks for one TL program, and their pure validation."""
from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass, field, fields
from typing import get_type_hints

from hardware_profiles import Profile
from kernel_abi.spec import Problem
from translate.copies import copy_row_threads


@dataclass(frozen=True)
class KernelParams:
    """One candidate. Field names are the Optuna parameter names (search_spaces/ uses them)."""

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 4
    kv_stages: int = 1              # K/V shared-memory buffers per tensor (1 = FA2's single buffer)
    mma_atom: str = "SM80_16x8x16"
    g2s_atom: str = "SM80_CP_ASYNC_CACHEGLOBAL"
    s2r_atom: str = "SM75_U32x4_LDSM_N"
    swizzle: int = 3                # B of Swizzle<B,3,3> on the shared-memory tiles; 0 = none
    q_in_regs: bool = False
    # Hopper (mma_atom SM90_GMMA): block_m = 64 x consumer warpgroups and num_warps = block_m / 16.
    pv_operand: str = "rs"          # P·V GEMM: P from registers (rs) or through shared memory (ss)
    pingpong: bool = False          # two consumer warpgroups take turns issuing GEMMs (warp-specialised)
    producer_regs: int = 24         # setmaxnreg of the producer warpgroup; the consumers get the rest
    persistent: bool = False        # warp-specialised: one CTA per SM walks the tiles (else one per tile)
    # Hopper softmax: keep a row's running max until a tile raises it by more than this many log2 units (then
    # the output's rescale is skipped); 0 rescales every tile (attn_sm90.cuh softmax_tile)
    # (not in the repr: the kernels' sources, whose hash keys the caches, stay as they were; the key says it)
    rescale_threshold: int = field(default=0, repr=False)
    # Packed sequences (varlen, paged): the persistent scheduler hands out the sequences with the most keys first
    # (attn_sm90.cuh order_sequences); False walks them in the order given (not in the repr, as above)
    longest_first: bool = field(default=True, repr=False)
    # GQA/MQA, dense: the query heads of one KV head share a tile's rows (row = token x group + head; FA3/FA4's
    # PackGQA), so a causal tile spans block_m / group tokens and wastes less of the diagonal; False: one query head
    # a tile (not in the repr, as above)
    pack_gqa: bool = field(default=False, repr=False)
    # Hopper softmax: how many of every 8 exponentials of a row run as a polynomial on the FMA pipe instead of
    # MUFU.EX2 (attn_sm90.cuh exp2_poly; at head dim 64 the MUFU's time equals the tensor cores'); 0: every one
    # on MUFU (not in the repr, as above)
    exp2_poly: int = field(default=0, repr=False)
    # Hopper, P from registers: where a consumer waits for its P.V GEMM in flight before converting the next P:
    # "after" the whole softmax (the softmax overlaps the GEMM), or "mid", once the row maxima are known (FA4's
    # order: the exponentials, P's conversion and the output's rescale then interleave) (not in the repr, as above)
    pv_wait: str = field(default="after", repr=False)
    # FP8 kernels: the order of the keys in the transposed V the runtime writes. "natural": key j at column j, and P's
    # accumulator reaches the e4m3 A operand's layout by two shuffles within each quad of lanes per row and k-block;
    # "accumulator": within each 16 keys, key 8h + 2q + b at column 4q + 2h + b, the order in which a thread's
    # accumulator holds them, so P converts in place (no shuffles) and V's bytes move instead, for free, in the
    # transpose the runtime makes anyway (attn_sm90.cuh convert_p_fp8_in_place) (not in the repr, as above)
    vt_key_order: str = field(default="natural", repr=False)
    # FP8 kernels: who transposes V for the P·V GEMM (8-bit wgmma operands are K-major). "runtime": the caller's
    # per-call copy V^T, which the kernel TMA-loads; "producer": the kernel reads V as given, and the producer
    # warpgroup's warps transpose each TMA-loaded tile through shared memory (ldmatrix.trans, byte permutes,
    # stmatrix) into the V^T tile the consumers read (attn_sm90::transpose_v_tile) (not in the repr, as above)
    v_transpose: str = field(default="runtime", repr=False)

    @property
    def num_threads(self) -> int:
        return self.num_warps * 32

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "KernelParams":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown kernel parameter(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        wrong = type_errors(data)
        if wrong:
            raise ValueError("; ".join(wrong))
        return cls(**data)

    @property
    def is_gmma(self) -> bool:
        return self.mma_atom == "SM90_GMMA"

    def key(self) -> str:
        """A short stable name, used in kernel symbols and file names."""
        key = (f"m{self.block_m}n{self.block_n}w{self.num_warps}s{self.kv_stages}"
               f"_{self.mma_atom.split('_')[0].lower()}_{_short(self.g2s_atom)}_{_short(self.s2r_atom)}"
               f"_sw{self.swizzle}_q{'r' if self.q_in_regs else 's'}")
        if (self.pv_operand, self.pingpong, self.producer_regs, self.persistent) != ("rs", False, 24, False):
            key += (f"_pv{self.pv_operand}{'_pp' if self.pingpong else ''}_pr{self.producer_regs}"
                    f"{'_per' if self.persistent else ''}")
        if self.rescale_threshold:   # (keys of the kernels that rescale every tile are as they were)
            key += f"_rt{self.rescale_threshold}"
        if not self.longest_first:
            key += "_given"
        if self.pack_gqa:
            key += "_pk"
        if self.exp2_poly:
            key += f"_ep{self.exp2_poly}"
        if self.pv_wait != "after":
            key += f"_w{self.pv_wait}"
        if self.vt_key_order != "natural":
            key += "_vta"
        if self.v_transpose != "runtime":
            key += "_vtp"
        return key


# The fields only the Hopper (wgmma) kernels read; an sm80-class candidate must leave them at their defaults.
HOPPER_ONLY = ("pv_operand", "pingpong", "producer_regs", "persistent", "rescale_threshold", "pack_gqa", "exp2_poly",
               "pv_wait", "vt_key_order", "v_transpose")
_DEFAULTS = {f.name: f.default for f in fields(KernelParams)}

_TYPE_WORDS = {int: "an integer", bool: "true or false", str: "a string"}
_FIELD_TYPES = get_type_hints(KernelParams)


def type_errors(data: dict) -> list[str]:
    """Every value of ``data`` (KernelParams fields by name) that is not of its field's type, each with the type
    expected: a string or a bool where a tile size goes would only fail later, or pass unnoticed."""
    errors = []
    for name, value in data.items():
        expected = _FIELD_TYPES.get(name)
        if expected is None:
            continue
        if expected is int:   # bool is an int in Python, and 64.0 is no tile size
            ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        else:
            ok = isinstance(value, expected)
        if not ok:
            errors.append(f"{name} must be {_TYPE_WORDS[expected]}, got {value!r} ({type(value).__name__})")
    return errors


def _short(atom: str) -> str:
    return {"SM80_CP_ASYNC_CACHEGLOBAL": "cpag", "SM80_CP_ASYNC_CACHEALWAYS": "cpaa",
            "UniversalCopy128": "u128", "SM75_U32x4_LDSM_N": "ldsm4", "SM75_U32x2_LDSM_N": "ldsm2",
            "UniversalCopy": "univ", "SM90_TMA": "tma"}.get(atom, atom.lower())


def smem_bytes(params: KernelParams, problem: Problem) -> int:
    """Dynamic shared memory of the FA2-style design: Q tile (reused for O) + stages x (K tile + V tile)."""
    elem = 2
    q = params.block_m * max(problem.d_qk, problem.d_v) * elem
    kv = params.kv_stages * params.block_n * (problem.d_qk + problem.d_v) * elem
    return q + kv


def validate(params: KernelParams, profile: Profile, problem: Problem,
             warp_specialized: bool | None = None) -> list[str]:
    """Every reason this candidate cannot work on this GPU for this problem; empty when legal.

    Pure and cheap: runs before any compile, so an illegal combination costs nothing.
    ``warp_specialized`` says whether the sketch has warpgroup roles (None: not known, judged as not).
    """
    if params.is_gmma or warp_specialized:
        from translate.params_sm90 import validate_sm90
        return validate_sm90(params, profile, problem, bool(warp_specialized))
    errors: list[str] = []
    hopper_only = [name for name in HOPPER_ONLY if getattr(params, name) != _DEFAULTS[name]]
    if hopper_only:
        errors.append(f"{', '.join(hopper_only)} appl{'ies' if len(hopper_only) == 1 else 'y'} to Hopper kernels "
                      "(mma_atom SM90_GMMA) only")
    if problem.dtype == "fp8":
        errors.append("fp8 kernels are Hopper kernels (e4m3 wgmma: mma_atom SM90_GMMA, a warp-specialised sketch)")
    elif problem.dtype not in profile.dtypes:
        errors.append(f"{profile.name} has no {problem.dtype} tensor cores (supports {', '.join(profile.dtypes)})")
    if params.g2s_atom == "SM90_TMA":
        errors.append("TMA loads (g2s_atom SM90_TMA) go with the Hopper schedule (mma_atom SM90_GMMA)")
    for field_name, legal in (("mma_atom", profile.mma_atoms), ("g2s_atom", profile.g2s_copy_atoms),
                              ("s2r_atom", profile.s2r_copy_atoms)):
        value = getattr(params, field_name)
        if value not in legal:
            errors.append(f"{field_name} {value} is not available on {profile.name} ({profile.nvcc_arch}); "
                          f"legal: {', '.join(legal)}")
    if params.num_warps not in (1, 2, 4, 8, 16):
        errors.append(f"num_warps must be a power of two <= 16, got {params.num_warps}")
    elif params.block_m % (16 * params.num_warps):
        errors.append(f"block_m {params.block_m} must be a multiple of 16 x num_warps = {16 * params.num_warps} "
                      "(each warp owns 16-row slabs of the M tile)")
    if params.block_n % 16 or params.block_n <= 0:
        errors.append(f"block_n {params.block_n} must be a positive multiple of 16 (k16 atoms in the P·V GEMM)")
    if params.block_m <= 0:
        errors.append(f"block_m must be positive, got {params.block_m}")
    if params.kv_stages not in (1, 2, 3):
        errors.append(f"kv_stages must be 1, 2 or 3, got {params.kv_stages}")
    if params.swizzle not in (0, 1, 2, 3):
        errors.append(f"swizzle must be 0..3, got {params.swizzle}")
    for d in {problem.d_qk, problem.d_v}:
        if d % 32:
            errors.append(f"head dim {d} must be a multiple of 32 (shared-memory tile atoms are 32 or 64 wide)")
    # Global->shared copies move 8 halves per thread, kBlockKSmem/8 threads per row: one copy step covers
    # num_threads / row_threads rows, which must divide the Q (BM) and K/V (BN) tiles.
    for d in sorted({problem.d_qk, problem.d_v}):
        row_threads = copy_row_threads(d)
        if params.num_threads % row_threads:
            errors.append(f"{params.num_threads} threads do not tile rows of {row_threads} copy threads")
            continue
        rows = params.num_threads // row_threads
        for name, tile in (("block_m", params.block_m), ("block_n", params.block_n)):
            if tile > 0 and tile % rows:
                errors.append(f"{name} {tile} must be a multiple of {rows}: {params.num_threads} threads copy "
                              f"{rows} rows of a {d}-wide tile per step")
        if d % 64 and params.swizzle > 2:
            errors.append(f"swizzle {params.swizzle} needs 64-element rows; head dim {d} uses 32-wide atoms "
                          "(swizzle <= 2)")
    # Accumulators S (BM x BN) and O (BM x d_v) are fp32 registers spread over the threads; past 256 per
    # thread the kernel spills heavily (FA2's largest, 128x64 at d128 on 4 warps, holds 192).
    acc_regs = params.block_m * (params.block_n + problem.d_v) // max(1, params.num_threads)
    if acc_regs > 256:
        errors.append(f"accumulators need {acc_regs} fp32 registers per thread (S {params.block_m}x"
                      f"{params.block_n} + O {params.block_m}x{problem.d_v} over {params.num_threads} threads); "
                      "more than 256 cannot fit the 255-register limit")
    smem = smem_bytes(params, problem)
    if smem > profile.smem_per_block_bytes:
        errors.append(f"shared memory {smem // 1024} KB (Q {params.block_m}x{problem.d_qk} + "
                      f"{params.kv_stages} stage(s) of K/V {params.block_n}x({problem.d_qk}+{problem.d_v})) "
                      f"exceeds the {profile.smem_per_block_kb} KB per-block limit of {profile.name}")
    if params.num_threads * 1 > profile.max_threads_per_sm:
        errors.append(f"{params.num_threads} threads exceed {profile.max_threads_per_sm} per SM")
    if params.mma_atom == "SM75_16x8x8" and problem.dtype == "bf16":
        errors.append("SM75_16x8x8 has no bf16 variant; use SM80_16x8x16 for bf16")
    return errors
