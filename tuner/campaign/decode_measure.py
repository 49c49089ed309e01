"""A GPU trial of a decode kernel (issue 15): the decode verification gate, then one decode call per decode
bucket (tuner/decode_problem.py) timed; the baselines on the same inputs; the re-timing rounds; a replay model.

Verification: tuner.verify_decode (KV lengths 1/63/64/65/4097, uneven batches, forced split counts, 1-16 query
tokens with causal, shuffled pages beside NaN pages, a NaN-poisoned workspace) at the campaign's page size, the
one it will be exported for. At benchmark size each call's output is cross-checked against an fp32 reference
of its first and last sequence (their pages gathered back): the largest page and row offsets are what the
small verification shapes never reach. Timing: one input set per call (a decode call reads far more than
the 50 MB L2, and tuner.bench flushes it anyway); ranking by TFLOPS is the same as by GB/s of the cache.
Baselines: FA4's paged decode (flash_attn_varlen_func with a page table, as `tune bench --phase decode`) and
``copy_bound``, the TFLOPS of a kernel reading the call's cache at the GPU's measured copy bandwidth.
"""
from __future__ import annotations

import math
import time as _time

BASELINES = ("fa4", "copy_bound")
CROSS_CHECK_REL_ERR = 2e-2     # as the dense trials' SDPA cross-check at benchmark size (backends.py)


def make_inputs(problem, device: str) -> dict:
    """q, k, v (None for MLA: V is K's first d_v columns), page_table (None: dense) and seqused_k of a call."""
    from tuner.bench_decode import make_decode_inputs, make_mla_inputs

    seed = problem.batch * 7919 + problem.kv_len
    if problem.variant == "mla":
        return {**make_mla_inputs(problem.point(), seed=seed, device=device), "v": None}
    return make_decode_inputs(problem.point(), seed=seed, device=device)


def ours_call(kernel, problem, x: dict):
    scale = problem.softmax_scale
    return lambda: kernel(x["q"], x["k"], x["v"], cache_seqlens=x["seqused_k"], page_table=x["page_table"],
                          softmax_scale=scale)


def tflops(problem, ms: float) -> float:
    return problem.flops / (ms * 1e-3) / 1e12


def _sequence_kv(x: dict, problem, i: int, name: str):
    """Sequence i's keys (or values), (kv_len, hkv, d), gathered back from the cache; MLA's values are the first
    d_v columns of its keys."""
    if name == "v" and x.get("v") is None:
        return _sequence_kv(x, problem, i, "k")[..., : problem.d_v]
    cache = x[name]
    if x["page_table"] is None:
        return cache[i, : problem.kv_len]
    pages = x["page_table"][i]
    return cache[pages.long()].reshape(-1, *cache.shape[2:])[: problem.kv_len]


def cross_check(out, x: dict, problem) -> float:
    """Largest relative error of ``out`` on the first and last sequence against the fp32 reference (the query
    heads of a KV group share its keys: no copies of K per head, which for MLA's 128 heads would be gigabytes)."""
    import torch

    worst = 0.0
    hkv, sq = problem.heads_kv, problem.seqlen_q
    group = problem.heads_q // hkv
    for i in sorted({0, problem.batch - 1}):
        k = _sequence_kv(x, problem, i, "k").float().transpose(0, 1)     # (hkv, kv, d_qk)
        v = _sequence_kv(x, problem, i, "v").float().transpose(0, 1)     # (hkv, kv, d_v)
        # (sq, hq, d) -> (hkv, group * sq, d): row g * sq + t is token t of the group's head g
        q = x["q"][i].float().reshape(sq, hkv, group, -1).permute(1, 2, 0, 3).reshape(hkv, group * sq, -1)
        s = (q @ k.transpose(1, 2)) * problem.softmax_scale
        if problem.causal and sq > 1:
            rows = (torch.arange(group * sq, device=q.device) % sq)[:, None]
            cols = torch.arange(problem.kv_len, device=q.device)[None, :]
            s = s.masked_fill(cols > rows + problem.kv_len - sq, float("-inf"))
        ref = (torch.softmax(s, -1) @ v).reshape(hkv, group, sq, -1).permute(2, 0, 1, 3).reshape(sq, hkv * group, -1)
        err = (out[i].float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)
        worst = max(worst, float(err))
    return worst


def verify_and_bench(kernel, payload: dict, device: str, name: str, timing, seconds: dict, failure,
                     early_stop_decide) -> dict:
    """The timed part of a decode trial (under the GPU lock), as backends._verify_and_bench for dense ones."""
    from tuner import bench
    from tuner.verify_decode import verify_decode

    spec, problems = payload["spec"], list(payload["problems"])
    page_size = (problems[0].page_size if problems else 0) or 16
    t1 = _time.perf_counter()
    try:
        report = verify_decode(kernel, spec, page_size=page_size, device=device)
    except Exception as exc:  # noqa: BLE001 - anything else still ends this trial only
        return failure(name, f"verification could not run: {type(exc).__name__}: {str(exc)[:200]}")
    t2 = _time.perf_counter()
    seconds["verify"] = round(t2 - t1, 3)
    verification = report.to_dict()
    if not report.passed:
        return failure(name, f"verification failed: {report.reason}", verification)
    plan = payload.get("early_stop")
    if plan:
        problems.sort(key=lambda p: p.key != str(plan["seqlen"]))
    measured: dict[str, float] = {}
    for problem in problems:
        try:
            x = make_inputs(problem, device)
            call = ours_call(kernel, problem, x)
            rel = cross_check(call(), x, problem)
            if not rel <= CROSS_CHECK_REL_ERR:   # also NaN
                return failure(name, f"wrong result at benchmark size {problem.label()}: relative error {rel:.3g} "
                                     f"against the fp32 reference > {CROSS_CHECK_REL_ERR}", verification)
            if plan and problem.key == str(plan["seqlen"]):
                probe_ms = bench.time_ms(call, timing=bench.Timing(**plan["probe"]))
                stopped = early_stop_decide(plan, tflops(problem, probe_ms))
                if stopped is not None:
                    seconds["bench"] = round(_time.perf_counter() - t2, 3)
                    return {"verified": True, "reason": None, "tflops": {problem.key: stopped["probe_tflops"]},
                            "device_name": name, "verification": verification, "seconds": seconds,
                            "early_stop": stopped}
            ms = bench.time_ms(call, timing=timing)
        except Exception as exc:  # noqa: BLE001 - a launch failure or fault at benchmark size
            return failure(name, f"benchmark of {problem.label()} failed: {type(exc).__name__}: {str(exc)[:200]}",
                           verification)
        measured[problem.key] = round(tflops(problem, ms), 3)
        del x
    seconds["bench"] = round(_time.perf_counter() - t2, 3)
    return {"verified": True, "reason": None, "tflops": {p.key: measured[p.key] for p in payload["problems"]},
            "device_name": name, "verification": verification, "seconds": seconds}


_COPY_GBS: dict = {}


def copy_gbs(device: str) -> float:
    """The GPU's device-to-device copy bandwidth (tuner.bench_decode), measured once per process."""
    if device not in _COPY_GBS:
        from tuner.bench_decode import copy_bandwidth_gbs

        _COPY_GBS[device] = copy_bandwidth_gbs()
    return _COPY_GBS[device]


def measure_baselines(problem, timing, device: str, errors: dict) -> dict:
    """{fa4: TFLOPS or None, copy_bound: TFLOPS at the copy bandwidth}; ``errors`` gets each None's reason."""
    from tuner import bench
    from tuner.bench_decode import fa4_decode_call

    row: dict = {}
    try:
        row["copy_bound"] = round(problem.flops / (problem.kv_bytes / (copy_gbs(device) * 1e9)) / 1e12, 3)
    except Exception as exc:  # noqa: BLE001
        row["copy_bound"], errors["copy_bound"] = None, f"{type(exc).__name__}: {str(exc)[:200]}"
    if problem.variant == "mla":
        row["fa4"], errors["fa4"] = None, "FA4 has no absorbed-MLA decode (head dim 576/512)"
        return row
    x = make_inputs(problem, device)
    try:
        call = fa4_decode_call(problem.point(), x)
        call()   # FA4 compiles a shape on its first call: not timed
        row["fa4"] = round(tflops(problem, bench.time_ms(call, timing=timing)), 3)
    except Exception as exc:  # noqa: BLE001 - a baseline that cannot run has a reason, not a number
        row["fa4"], errors["fa4"] = None, f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    return row


def retime_rounds(kernels: dict, failed: dict, problem, timing, device: str, rounds: int, run_rounds):
    """The re-timing rounds on one decode call's inputs, each contender cross-checked on them first."""
    from tuner import bench

    x = make_inputs(problem, device)
    calls = {}
    for role, kernel in list(kernels.items()):
        try:
            call = ours_call(kernel, problem, x)
            rel = cross_check(call(), x, problem)
            why = f"relative error {rel:.3g} against the fp32 reference > {CROSS_CHECK_REL_ERR}"
        except Exception as exc:  # noqa: BLE001 - a launch failure: this contender cannot win
            rel, why = float("nan"), f"{type(exc).__name__}: {str(exc)[:200]}"
        if not rel <= CROSS_CHECK_REL_ERR:
            failed[role] = f"wrong result on the re-timing inputs: {why}"
            del kernels[role]
            continue
        calls[role] = call
    return run_rounds(list(calls), rounds, lambda role: bench.time_ms(calls[role], timing=timing))


def model_tflops(params, problem, profile) -> float:
    """The replay backend's decode model: the cache read at a fraction of the profile's HBM bandwidth that
    grows with the bytes in flight per SM (ring depth x tile), less a fixed launch and combine cost."""
    bw = profile.memory_bandwidth_gbs
    in_flight = params.kv_stages * params.block_n * problem.d_qk * 2 * 2   # bytes of one CTA's ring
    efficiency = 0.93 * (1.0 - math.exp(-in_flight / 48_000.0))
    seconds = problem.kv_bytes / (bw * 1e9 * efficiency) + 6e-6 * (1 + 1 / params.min_split_blocks)
    return problem.flops / seconds / 1e12
