"""Decode kernel parameters: the numbers a search picks for a decode sketch, and their pure validation."""
from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass, fields

from hardware_profiles import Profile
from translate.problem import KernelSpec

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
    # probe of scripts/decode_check.py and held >= 1.0x FA4 on the whole decode grid (BENCHMARKS.md, 2026-11-24).
    kv_stages: int = 3
    pack_gqa: bool = True        # one CTA reads a K/V tile once for every query head of its group
    min_split_blocks: int = 2    # split rule (translate/decode/splits.py): the fewest key tiles one split takes
    swizzle: int = 3

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
            want_bool = known[name] in (bool, "bool")
            ok = isinstance(value, bool) if want_bool else (isinstance(value, numbers.Integral)
                                                              and not isinstance(value, bool))
            if not ok:
                raise ValueError(f"{name} must be {'true or false' if want_bool else 'an integer'}, got {value!r}")
        return cls(**data)

    def key(self) -> str:
        return (f"dm{self.block_m}n{self.block_n}w{self.warps_m}x{self.warps_n}s{self.kv_stages}"
                f"{'p' if self.pack_gqa else 'h'}_b{self.min_split_blocks}_sw{self.swizzle}")


def decode_smem_bytes(params: DecodeParams, spec: KernelSpec) -> int:
    """Q tile + the larger of the K/V ring and the merge buffer that reuses it after the loop (per warp group:
    O rows in fp32 and a max and a sum per row)."""
    q = params.block_m * spec.d_qk * 2
    ring = params.kv_stages * params.block_n * (spec.d_qk + spec.d_v) * 2
    merge = params.warps_n * params.block_m * (spec.d_v + 2) * 4
    return q + max(ring, merge)


def validate_decode(params: DecodeParams, profile: Profile, spec: KernelSpec) -> list[str]:
    """Every reason this decode candidate cannot work on this GPU for this spec; empty when legal."""
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
    for d in {spec.d_qk, spec.d_v}:
        if d % 64:
            errors.append(f"head dim {d} must be a multiple of 64 (64-wide swizzled shared-memory atoms)")
    # fp32 registers per thread: O (rows x d_v) and S (rows x the group's columns) spread over one group's warps,
    # Q kept as 16-bit operands. Past ~200 ptxas spills (nvcc 13, checked with the SASS tests).
    if params.warps_m in (1, 2, 4) and params.block_m > 0:
        lanes = 32 * params.warps_m
        regs = (params.block_m * spec.d_v + params.block_m * max(per_group, 0) + params.block_m * spec.d_qk // 2) // lanes
        if regs > 200:
            errors.append(f"O, S and Q need ~{regs} registers per thread (rows {params.block_m} over {params.warps_m} "
                          f"warp(s), d_v {spec.d_v}): more than 200 spills")
    smem = decode_smem_bytes(params, spec)
    if smem > profile.smem_per_block_bytes:
        errors.append(f"shared memory {smem // 1024} KB (Q, {params.kv_stages} K/V stages of {params.block_n} keys) "
                      f"exceeds the {profile.smem_per_block_kb} KB per-block limit of {profile.name}")
    if spec.variant == "mla":
        errors.append("MLA decode (absorbed, d 576/512) needs the warpgroup kernel that splits d_v across warps; "
                      "this kernel keeps all of O in one warp group's registers")
    return errors
