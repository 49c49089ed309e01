"""The tensors of one serving mix (tuner.measure.mixes.ServingProblem), as every backend of `tune bench --layout`
takes them: packed q/k/v with cumulative lengths (varlen), and for the paged layout the same keys and values
spread over the pages of a cache whose table is shuffled (a serving engine's pages are not in order, and an
identity table would hide a kernel that ignores it). torch is imported lazily; any device works (CPU tests).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from tuner.measure.mixes import ServingProblem

_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp8": "float8_e4m3fn"}


@dataclass(frozen=True, eq=False)
class MixInputs:
    """q (total_q, hq, d_qk), k (total_k, hkv, d_qk), v (total_k, hkv, d_v); int32 cumulative lengths
    (batch + 1) and the keys each sequence uses (batch). Paged: caches (pages, page_size, hkv, d) holding the
    same keys and values, and the table (batch, most pages of a sequence; unused entries 0)."""

    q: Any
    k: Any
    v: Any
    cu_seqlens_q: Any
    cu_seqlens_k: Any
    seqused_k: Any
    k_cache: Optional[Any] = None
    v_cache: Optional[Any] = None
    page_table: Optional[Any] = None
    descales: Optional[dict] = None   # FP8: q_descale, k_descale, v_descale (fp32 ones, (batch, KV heads))


def page_counts(problem: ServingProblem) -> list[int]:
    """Pages each sequence's keys take (the last one partly filled)."""
    return [-(-k // problem.page_size) for k in problem.seqlens_k]


def make_mix_inputs(problem: ServingProblem, device: str = "cuda", seed: int = 0) -> MixInputs:
    """Random inputs of ``problem`` on ``device`` (normal values in the problem's dtype; FP8: e4m3 with descales of
    one, as the dense FP8 bench takes them)."""
    import torch

    dt = getattr(torch, _DTYPES[problem.dtype])
    gen = torch.Generator(device=device).manual_seed(seed)
    p = problem

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dt)

    q = randn(p.total_q, p.heads_q, p.d_qk)
    k, v = randn(p.total_k, p.heads_kv, p.d_qk), randn(p.total_k, p.heads_kv, p.d_v)
    as_i32 = {"dtype": torch.int32, "device": device}
    cu_q = torch.tensor([0, *_cumsum(p.seqlens_q)], **as_i32)
    cu_k = torch.tensor([0, *_cumsum(p.seqlens_k)], **as_i32)
    used = torch.tensor(p.seqlens_k, **as_i32)
    descales = None
    if p.dtype == "fp8":
        ones = torch.ones(p.batch, p.heads_kv, dtype=torch.float32, device=device)
        descales = {"q_descale": ones, "k_descale": ones.clone(), "v_descale": ones.clone()}
    if p.layout != "paged":
        return MixInputs(q, k, v, cu_q, cu_k, used, descales=descales)
    k_cache, v_cache, table = _paged_cache(p, k, v, seed, device)
    return MixInputs(q, k, v, cu_q, cu_k, used, k_cache, v_cache, table, descales)


def _cumsum(values) -> list[int]:
    out, total = [], 0
    for x in values:
        total += x
        out.append(total)
    return out


def _paged_cache(p: ServingProblem, k, v, seed: int, device: str):
    """Each sequence's keys page by page into a cache whose page ids are a random permutation."""
    import torch

    page, counts = p.page_size, page_counts(p)
    order = torch.randperm(max(1, sum(counts)), generator=torch.Generator().manual_seed(seed + page))
    k_cache = torch.zeros(max(1, sum(counts)), page, *k.shape[1:], dtype=k.dtype, device=device)
    v_cache = torch.zeros(max(1, sum(counts)), page, *v.shape[1:], dtype=v.dtype, device=device)
    table = torch.zeros(p.batch, max(1, max(counts)), dtype=torch.int32)
    start, at = 0, 0
    for b, (keys, n) in enumerate(zip(p.seqlens_k, counts)):
        ids = order[at:at + n]
        table[b, :n] = ids.to(torch.int32)
        for j, pid in enumerate(ids.tolist()):
            rows = min(page, keys - j * page)
            k_cache[pid, :rows] = k[start + j * page:start + j * page + rows]
            v_cache[pid, :rows] = v[start + j * page:start + j * page + rows]
        start, at = start + keys, at + n
    return k_cache, v_cache, table.to(device)


def baseline_view(problem: ServingProblem, x: MixInputs) -> tuple[ServingProblem, MixInputs]:
    """What the libraries take of an FP8 mix: the same values in bf16 (none of them reads e4m3 here), a paged mix's
    caches too; a 16-bit mix as it is."""
    if problem.dtype != "fp8":
        return problem, x
    import dataclasses

    import torch

    bf16 = {name: getattr(x, name).to(torch.bfloat16) for name in ("q", "k", "v", "k_cache", "v_cache")
            if getattr(x, name) is not None}
    return dataclasses.replace(problem, dtype="bf16"), dataclasses.replace(x, descales=None, **bf16)
