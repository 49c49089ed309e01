"""A deterministic performance model of the FA2-style kernel, used where nothing was measured.

It builds the recorded grids that the replay backend serves in CI (tests/campaign/make_replay_grid.py)
and values configurations a replay file does not hold. The shape of the model follows what FA2's
launch template comments record: register spills are ruinous, 8 warps on small tiles are
slower, ldmatrix and cp.async matter, causal masking and short sequences cost more with large tiles.
Its numbers are plausible, not measured: never store them as a real GPU's.
"""
from __future__ import annotations

import hashlib
import math

from translate.params import KernelParams, smem_bytes


def _noise(key: str, seqlen: int, amplitude: float = 0.02) -> float:
    h = int.from_bytes(hashlib.sha256(f"{key}/{seqlen}".encode()).digest()[:8], "big")
    return 1.0 + amplitude * (2.0 * (h / 2**64) - 1.0)


def registers_per_thread(params: KernelParams, d_qk: int, d_v: int) -> float:
    threads = params.num_threads
    regs = 48 + params.block_m * d_v / threads + params.block_m * params.block_n / threads
    if params.q_in_regs:
        regs += params.block_m * d_qk / (2 * threads)
    return regs


def model_tflops(params: KernelParams, problem, profile) -> float:
    """Modelled TFLOPS of ``params`` on ``problem`` (a kernel_abi.spec.Problem) for ``profile``; a serving mix
    (tuner.measure.mixes.ServingProblem) as its sequences one after the other."""
    if getattr(problem, "phase", "prefill") == "decode":

        return decode_model_tflops(params, problem, profile)
    if hasattr(problem, "layout"):
        return _mix_tflops(params, problem, profile)
    peak = profile.peak_tflops(problem.dtype) or profile.tflops_fp16
    ceiling = 0.42 * peak                     # FA2-class kernels: ~30-40% of the tensor-core peak
    bm, bn, threads = params.block_m, params.block_n, params.num_threads
    regs = registers_per_thread(params, problem.d_qk, problem.d_v)
    spill = max(0.0, regs - 255)
    f = 1.0 / (1.0 + spill / 24.0)
    f *= min(1.0, (bm * bn / (bm + bn)) / 43.0) ** 0.45          # operand reuse of the tile
    rows_per_warp = bm / params.num_warps
    f *= {16: 0.84, 32: 1.0, 48: 0.98, 64: 0.9}.get(int(rows_per_warp), 0.8)
    smem = smem_bytes(params, problem)
    ctas = min(profile.smem_per_sm_kb * 1024 // max(smem, 1), profile.max_threads_per_sm // threads,
               65536 // max(1, int(min(regs, 255)) * threads), profile.max_blocks_per_sm)
    f *= 1.0 if ctas >= 2 else 0.86
    blocks = problem.batch * problem.heads_q * math.ceil(problem.seqlen_q / bm)
    waves = blocks / (profile.sm_count * max(ctas, 1))
    f *= waves / math.ceil(waves)
    steps = problem.seqlen_k / bn
    f *= steps / (steps + 3.0)                                   # prologue and epilogue
    if problem.causal:
        f *= 1.0 - 0.5 * min(1.0, (bm + bn) / problem.seqlen_k)  # masked diagonal blocks
    f *= {"SM80_16x8x16": 1.0, "SM75_16x8x8": 0.8}.get(params.mma_atom, 0.7)
    f *= {"SM80_CP_ASYNC_CACHEGLOBAL": 1.0, "SM80_CP_ASYNC_CACHEALWAYS": 0.97,
          "UniversalCopy128": 0.8}.get(params.g2s_atom, 0.7)
    if params.kv_stages > 1:
        f *= 1.06 if bn <= 64 else 1.02
    f *= {"SM75_U32x4_LDSM_N": 1.0, "SM75_U32x2_LDSM_N": 0.94, "UniversalCopy": 0.58}.get(params.s2r_atom, 0.5)
    if params.swizzle == 0 and "LDSM" in params.s2r_atom:
        f *= 0.72                                                # ldmatrix bank conflicts
    if params.q_in_regs and spill == 0:
        f *= 1.04
    return round(ceiling * f * _noise(params.key(), problem.seqlen_k), 2)


def _mix_tflops(params: KernelParams, mix, profile) -> float:
    from kernel_abi.spec import Problem

    seconds = 0.0
    for sq, sk in zip(mix.seqlens_q, mix.seqlens_k):
        if sq == 0:
            continue
        one = Problem(mix.variant, 1, mix.heads_q, mix.heads_kv, sq, sk, mix.d_qk, mix.d_v, mix.causal, mix.dtype)
        seconds += one.flops / (max(model_tflops(params, one, profile), 1e-3) * 1e12)
    return round(mix.flops / seconds / 1e12, 2) if seconds else 0.0


def decode_model_tflops(params, problem, profile) -> float:
    """The replay backend's decode model: the cache read at a fraction of the profile's HBM bandwidth that
    grows with the bytes in flight per SM (ring depth x tile), less a fixed launch and combine cost."""
    bw = profile.memory_bandwidth_gbs
    in_flight = params.kv_stages * params.block_n * problem.d_qk * 2 * 2   # bytes of one CTA's ring
    efficiency = 0.93 * (1.0 - math.exp(-in_flight / 48_000.0))
    seconds = problem.kv_bytes / (bw * 1e9 * efficiency) + 6e-6 * (1 + 1 / params.min_split_blocks)
    return problem.flops / seconds / 1e12
