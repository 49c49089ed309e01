"""The libraries `tune bench --layout varlen|paged` times our kernel against, on a mix's own inputs
(tuner.measure.serving_inputs): FlashAttention-4's ``flash_attn_varlen_func``, FlashInfer's batch prefill wrappers, and
torch SDPA on the zero-padded batch.

A baseline's ``prepare(problem, inputs)`` does the untimed set-up (FlashInfer's plan, SDPA's padded copies
and mask) and returns the call to time and how to read its result as packed (total_q, hq, d_v) rows. A
library that is not importable raises Unavailable, whose message starts with "not installed".

SDPA's ``is_causal`` aligns the mask top-left, FlashAttention's causal bottom-right (a chunk of queries after
a cached prefix sees the whole prefix). So SDPA runs mask-free only where that gives the same rows: causal
with as many keys as queries in every sequence (padded keys then lie past every valid query's diagonal), or
no mask and no padded keys. Anywhere else it gets an explicit boolean mask, bottom-right causal and hiding
the padded keys, which runs a slower SDPA backend (flash takes no mask): the row's ``sdpa_note`` says which.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tuner.measure import dense, fa4
from tuner.measure.serving_inputs import MixInputs, page_counts
from tuner.measure.mixes import ServingProblem

NOT_INSTALLED = fa4.NOT_INSTALLED
FLASHINFER_WORKSPACE_BYTES = 128 * 1024 * 1024   # FlashInfer's documented example size


class Unavailable(RuntimeError):
    """The baseline's library is not importable here; the message starts with NOT_INSTALLED."""


NOT_APPLICABLE = "not applicable"


class NotApplicable(RuntimeError):
    """The baseline cannot compute this mix's attention (an option it has no form for); the message starts with
    NOT_APPLICABLE and names the option."""


@dataclass(frozen=True)
class Prepared:
    call: Callable[[], Any]                 # the call to time
    packed: Callable[[Any], Any]            # its result -> (total_q, hq, d_v)
    note: str = ""                          # how it runs, when that needs saying


@dataclass(frozen=True)
class Baseline:
    name: str
    prepare: Callable[[ServingProblem, MixInputs], Prepared]


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out   # some versions return (out, lse)


def _fa4(problem: ServingProblem, x: MixInputs) -> Prepared:
    try:
        func = fa4.varlen_func()
    except fa4.Fa4Unavailable as exc:
        raise Unavailable(str(exc)) from None
    common = {"max_seqlen_q": problem.max_seqlen_q, "causal": problem.causal,
              "softmax_scale": problem.softmax_scale,
              **fa4.option_kwargs(problem, dense.problem_sinks(problem, x.q.device))}
    if problem.layout == "paged":
        def call():
            return func(x.q, x.k_cache, x.v_cache, cu_seqlens_q=x.cu_seqlens_q, cu_seqlens_k=None,
                        seqused_k=x.seqused_k, page_table=x.page_table, **common)
    else:
        def call():
            return func(x.q, x.k, x.v, cu_seqlens_q=x.cu_seqlens_q, cu_seqlens_k=x.cu_seqlens_k,
                        max_seqlen_k=problem.max_seqlen_k, **common)
    return Prepared(call, _first)


def _flashinfer(problem: ServingProblem, x: MixInputs) -> Prepared:
    """BatchPrefillWithRaggedKVCacheWrapper (varlen) or BatchPrefillWithPagedKVCacheWrapper (paged), NHD;
    plan() is per batch and untimed (an engine plans once for all layers). FlashInfer's causal mask is
    bottom-right aligned (append attention), as ours; its window is ``window_left`` and its cap
    ``logits_soft_cap``; it has no sinks and no right window bound (NotApplicable)."""
    import torch

    p = problem
    if p.sinks:
        raise NotApplicable(f"{NOT_APPLICABLE}: FlashInfer's batch prefill takes no attention sinks")
    if p.window[1] > 0:
        raise NotApplicable(f"{NOT_APPLICABLE}: FlashInfer's batch prefill bounds a window on the left only")
    try:
        import flashinfer
    except Exception as exc:  # noqa: BLE001 - missing, or a broken install that fails at import
        raise Unavailable(f"{NOT_INSTALLED}: flashinfer is not importable ({type(exc).__name__})") from None
    workspace = torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=x.q.device)
    common = {"head_dim_vo": p.d_v, "causal": p.causal, "sm_scale": p.softmax_scale, "q_data_type": x.q.dtype,
              "window_left": p.window[0], "logits_soft_cap": p.softcap or None}
    if p.layout == "paged":
        counts = page_counts(p)
        table = x.page_table.cpu()
        indices = torch.cat([table[b, :n] for b, n in enumerate(counts)]).to(torch.int32)
        indptr = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)
        last = torch.tensor([k - (n - 1) * p.page_size if n else 0 for k, n in zip(p.seqlens_k, counts)],
                            dtype=torch.int32)
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        dev = x.q.device
        wrapper.plan(x.cu_seqlens_q, indptr.to(dev), indices.to(dev), last.to(dev), p.heads_q, p.heads_kv,
                     p.d_qk, p.page_size, **common)
        return Prepared(lambda: wrapper.run(x.q, (x.k_cache, x.v_cache)), _first)
    wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
    wrapper.plan(x.cu_seqlens_q, x.cu_seqlens_k, p.heads_q, p.heads_kv, p.d_qk, **common)
    return Prepared(lambda: wrapper.run(x.q, x.k, x.v), _first)


def sdpa_mask_free(problem: ServingProblem) -> bool:
    """Whether SDPA's own masking (is_causal, or none) gives every valid row of the padded batch right."""
    if problem.window != (-1, -1):
        return False
    if problem.causal:
        return all(q == k for q, k in zip(problem.seqlens_q, problem.seqlens_k))
    return all(k == problem.max_seqlen_k for k in problem.seqlens_k)


def padded_mask(problem: ServingProblem, device):
    """(batch, 1, max_q, max_k) bool, True where a query sees a key: keys of its sequence only, with causal those
    up to its own position counted from the end (bottom-right), and with a window those within it of that
    position."""
    import torch

    from kernel_abi.spec import effective_window

    p = problem
    left, right = effective_window(p.window, p.causal)   # causal: the right side 0
    i = torch.arange(p.max_seqlen_q, device=device)[:, None]
    j = torch.arange(p.max_seqlen_k, device=device)[None, :]
    masks = []
    for sq, sk in zip(p.seqlens_q, p.seqlens_k):
        m = (j < sk).expand(p.max_seqlen_q, -1)
        diag = i + (sk - sq)
        if right >= 0:
            m = m & (j <= diag + right)
        if left >= 0:
            m = m & (j >= diag - left)
        masks.append(m)
    return torch.stack(masks)[:, None]


def _sdpa(problem: ServingProblem, x: MixInputs) -> Prepared:
    import torch
    import torch.nn.functional as F

    p = problem
    if p.softcap or p.sinks:
        raise NotApplicable(f"{NOT_APPLICABLE}: SDPA has no {'soft-capping' if p.softcap else 'attention sinks'}")
    q = x.q.new_zeros(p.batch, p.heads_q, p.max_seqlen_q, p.d_qk)
    k = x.k.new_zeros(p.batch, p.heads_kv, p.max_seqlen_k, p.d_qk)
    v = x.v.new_zeros(p.batch, p.heads_kv, p.max_seqlen_k, p.d_v)
    at_q = at_k = 0
    for b, (sq, sk) in enumerate(zip(p.seqlens_q, p.seqlens_k)):
        q[b, :, :sq] = x.q[at_q:at_q + sq].transpose(0, 1)
        k[b, :, :sk] = x.k[at_k:at_k + sk].transpose(0, 1)
        v[b, :, :sk] = x.v[at_k:at_k + sk].transpose(0, 1)
        at_q, at_k = at_q + sq, at_k + sk
    kwargs = {"scale": p.softmax_scale}
    if sdpa_mask_free(p):
        kwargs["is_causal"] = p.causal
        if p.heads_q != p.heads_kv:
            kwargs["enable_gqa"] = True
        note = "is_causal on the padded batch" if p.causal else "no mask (no padded keys)"
    else:
        kwargs["attn_mask"] = padded_mask(p, x.q.device)
        note = ("explicit mask of the window" if p.window != (-1, -1) else
                "explicit bottom-right causal mask (more keys than queries: SDPA's is_causal is top-left)"
                if p.causal and any(q != k for q, k in zip(p.seqlens_q, p.seqlens_k))
                else "explicit mask hiding the padded keys")
        if p.heads_q != p.heads_kv:   # enable_gqa runs on flash (no mask) and math (S in memory) only
            k = k.repeat_interleave(p.heads_q // p.heads_kv, dim=1)
            v = v.repeat_interleave(p.heads_q // p.heads_kv, dim=1)
            note += ", KV heads repeated (the backends that take a mask have no GQA)"

    def packed(out):
        return torch.cat([out[b, :, :sq].transpose(0, 1) for b, sq in enumerate(p.seqlens_q)])

    return Prepared(lambda: F.scaled_dot_product_attention(q, k, v, **kwargs), packed, note)


# Column order; tuner.commands.bench_serving cross-checks our output against SDPA first (torch's, the plainest).
BASELINES = (Baseline("fa4", _fa4), Baseline("flashinfer", _flashinfer), Baseline("sdpa", _sdpa))
