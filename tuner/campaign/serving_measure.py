"""A GPU trial of a serving layout (issue 14): the verification gate over length mixes, then every serving mix
of the campaign (tuner/mixes.py) timed; and the library baselines on the same inputs.

Verification: ``tuner.verify_varlen`` (lengths 0/1/127/128/129, one long among short, chunked prefill,
seqused_k, NaN-poisoned output); a paged kernel gets the paged check mixes at the campaign's own page size
(shuffled tables, NaN spare pages), the one it will be exported for. Benchmark inputs: packed q/k/v, or the
keys and values spread over a paged cache by a shuffled table; a trial's kernel and the baselines see the
same inputs (one seed per mix). Baselines: FA4's ``flash_attn_varlen_func`` (cu_seqlens; page_table with
seqused_k when paged) and torch SDPA on the zero-padded batch (self-attention mixes only: SDPA's causal mask
is top-left aligned, which differs from the bottom-right one of a cached prefix).
"""
from __future__ import annotations

import dataclasses
import time as _time
import zlib

SERVING_BASELINES = ("fa4", "sdpa_padded")


def check_mixes(spec, page_size: int | None):
    from tuner.verify_varlen import CHECK_MIXES, CHECK_PAGED_MIXES

    if spec.layout != "paged":
        return CHECK_MIXES
    return tuple(dataclasses.replace(m, page_size=page_size) for m in CHECK_PAGED_MIXES)


def mix_seed(problem) -> int:
    return zlib.crc32(problem.name.encode())


def make_inputs(problem, sets: int, device: str, seed: int | None = None) -> list[dict]:
    """``sets`` input sets of one mix: q/k/v packed (total, heads, d), cu_seqlens, and for the paged layout the
    caches and a shuffled table (pages of ``problem.page_size``; the last page of a sequence padded)."""
    import torch

    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[problem.dtype]
    gen = torch.Generator(device=device).manual_seed(mix_seed(problem) if seed is None else seed)
    i32 = {"dtype": torch.int32, "device": device}
    cu_q = torch.tensor([0, *torch.tensor(problem.seqlens_q).cumsum(0).tolist()], **i32)
    cu_k = torch.tensor([0, *torch.tensor(problem.seqlens_k).cumsum(0).tolist()], **i32)
    out = []
    for _ in range(max(1, sets)):
        def randn(*shape):
            return torch.randn(*shape, generator=gen, device=device, dtype=dt)

        q = randn(problem.total_q, problem.heads_q, problem.d_qk)
        k = randn(problem.total_k, problem.heads_kv, problem.d_qk)
        v = randn(problem.total_k, problem.heads_kv, problem.d_v)
        s = {"q": q, "k": k, "v": v, "cu_q": cu_q, "cu_k": cu_k}
        if problem.layout == "paged":
            s.update(_paged(problem, k, v, gen, device))
        out.append(s)
    return out


def _paged(problem, k, v, gen, device) -> dict:
    import torch

    page = problem.page_size
    counts = [-(-sk // page) for sk in problem.seqlens_k]
    total = sum(counts)
    order = torch.randperm(total, generator=torch.Generator().manual_seed(mix_seed(problem)))
    kc = torch.zeros(total, page, *k.shape[1:], dtype=k.dtype, device=device)
    vc = torch.zeros(total, page, *v.shape[1:], dtype=v.dtype, device=device)
    table = torch.zeros(len(counts), max(1, max(counts)), dtype=torch.int32)
    at = start = 0
    for b, (n, sk) in enumerate(zip(counts, problem.seqlens_k)):
        ids = order[at:at + n]
        table[b, :n] = ids.to(torch.int32)
        for j in range(n):
            rows = min(page, sk - j * page)
            kc[int(ids[j]), :rows] = k[start + j * page:start + j * page + rows]
            vc[int(ids[j]), :rows] = v[start + j * page:start + j * page + rows]
        at, start = at + n, start + sk
    used = torch.tensor(problem.seqlens_k, dtype=torch.int32, device=device)
    return {"k_cache": kc, "v_cache": vc, "table": table.to(device), "used": used}


def ours_call(kernel, problem):
    scale = problem.softmax_scale
    if problem.layout == "paged":
        return lambda s: kernel.paged(s["q"], s["k_cache"], s["v_cache"], s["cu_q"], s["used"], s["table"],
                                      problem.max_seqlen_q, softmax_scale=scale)
    return lambda s: kernel.varlen(s["q"], s["k"], s["v"], s["cu_q"], s["cu_k"], problem.max_seqlen_q,
                                   problem.max_seqlen_k, softmax_scale=scale)


def fa4_call(problem):
    """FA4's flash_attn_varlen_func on a set; raises tuner.fa4.Fa4Unavailable when it is not importable."""
    from tuner.fa4 import MODULE, NOT_INSTALLED, Fa4Unavailable

    try:
        from flash_attn.cute import flash_attn_varlen_func
    except Exception as exc:  # noqa: BLE001 - missing or broken: a reason, never a crash
        raise Fa4Unavailable(f"{NOT_INSTALLED}: {MODULE} is not importable ({type(exc).__name__})") from None

    def call(s):
        if problem.layout == "paged":
            out = flash_attn_varlen_func(s["q"], s["k_cache"], s["v_cache"], cu_seqlens_q=s["cu_q"], cu_seqlens_k=None,
                                         seqused_k=s["used"], page_table=s["table"],
                                         max_seqlen_q=problem.max_seqlen_q, causal=problem.causal,
                                         softmax_scale=problem.softmax_scale)
        else:
            out = flash_attn_varlen_func(s["q"], s["k"], s["v"], cu_seqlens_q=s["cu_q"], cu_seqlens_k=s["cu_k"],
                                         max_seqlen_q=problem.max_seqlen_q, max_seqlen_k=problem.max_seqlen_k,
                                         causal=problem.causal, softmax_scale=problem.softmax_scale)
        return out[0] if isinstance(out, (tuple, list)) else out

    return call


def sdpa_padded_call(problem, device: str):
    """torch SDPA on the zero-padded batch (the padding is part of what it costs); None with the reason when
    the mix has a cached prefix (SDPA's causal mask is top-left aligned)."""
    import torch
    import torch.nn.functional as F

    if problem.causal and problem.seqlens_q != problem.seqlens_k:
        return None, "a cached prefix: SDPA's is_causal is top-left aligned"
    b, m = problem.batch, problem.max_seqlen_k
    padded = {}

    def pad(s):
        key = id(s["q"])
        if key not in padded:
            hq, hkv = problem.heads_q, problem.heads_kv
            qp = torch.zeros(b, hq, m, problem.d_qk, device=device, dtype=s["q"].dtype)
            kp = torch.zeros(b, hkv, m, problem.d_qk, device=device, dtype=s["q"].dtype)
            vp = torch.zeros(b, hkv, m, problem.d_v, device=device, dtype=s["q"].dtype)
            cu = s["cu_q"].tolist()
            for i, n in enumerate(problem.seqlens_q):
                for dst, src in ((qp, s["q"]), (kp, s["k"]), (vp, s["v"])):
                    dst[i, :, :n] = src[cu[i]:cu[i] + n].transpose(0, 1)
            padded[key] = (qp, kp, vp)
        return padded[key]

    def call(s):
        qp, kp, vp = pad(s)
        return F.scaled_dot_product_attention(qp, kp, vp, is_causal=problem.causal, scale=problem.softmax_scale,
                                              enable_gqa=problem.heads_q != problem.heads_kv)

    return call, None


def time_sets(call, sets, timing) -> float:
    """Median ms of ``call`` rotating over the sets (tuner.bench's timer)."""
    import itertools

    from tuner import bench

    cycle = itertools.cycle(sets)
    call(sets[0])   # the first call of a shape may compile (FA4's JIT) or allocate: not timed
    return bench.time_ms(lambda: call(next(cycle)), timing=timing)


def tflops(problem, ms: float) -> float:
    return problem.flops / (ms * 1e-3) / 1e12


def verify_and_bench(kernel, payload: dict, device: str, name: str, timing, seconds: dict, failure,
                     early_stop_decide) -> dict:
    """The timed part of a serving trial (under the GPU lock), as backends._verify_and_bench for dense ones."""
    from tuner import bench
    from tuner.verify_varlen import verify_varlen

    spec, problems = payload["spec"], list(payload["problems"])
    page_size = problems[0].page_size if problems else None
    t1 = _time.perf_counter()
    try:
        report = verify_varlen(kernel, spec, mixes=check_mixes(spec, page_size), device=device)
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
            sets = make_inputs(problem, timing.rotate, device)
            call = ours_call(kernel, problem)
            if plan and problem.key == str(plan["seqlen"]):
                probe_ms = time_sets(call, sets, bench.Timing(**plan["probe"]))
                stopped = early_stop_decide(plan, tflops(problem, probe_ms))
                if stopped is not None:
                    seconds["bench"] = round(_time.perf_counter() - t2, 3)
                    return {"verified": True, "reason": None, "tflops": {problem.key: stopped["probe_tflops"]},
                            "device_name": name, "verification": verification, "seconds": seconds,
                            "early_stop": stopped}
            ms = time_sets(call, sets, timing)
        except Exception as exc:  # noqa: BLE001 - a launch failure or fault at benchmark size
            return failure(name, f"benchmark of {problem.label()} failed: {type(exc).__name__}: {str(exc)[:200]}",
                           verification)
        measured[problem.key] = round(tflops(problem, ms), 2)
        del sets
    seconds["bench"] = round(_time.perf_counter() - t2, 3)
    return {"verified": True, "reason": None, "tflops": {p.key: measured[p.key] for p in payload["problems"]},
            "device_name": name, "verification": verification, "seconds": seconds}


def measure_baselines(problem, timing, device: str, errors: dict) -> dict:
    """{library: TFLOPS or None} on the mix's inputs; ``errors`` gets the reason of each None."""
    sets = make_inputs(problem, timing.rotate, device)
    row: dict = {}
    for lib in SERVING_BASELINES:
        try:
            if lib == "fa4":
                call, why = fa4_call(problem), None
            else:
                call, why = sdpa_padded_call(problem, device)
            if call is None:
                row[lib], errors[lib] = None, why
                continue
            row[lib] = round(tflops(problem, time_sets(call, sets, timing)), 2)
        except Exception as exc:  # noqa: BLE001 - a baseline that cannot run has a reason, not a number
            row[lib], errors[lib] = None, f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    return row
