"""A call's model options at the serving entry points: sliding windows, soft-capping and attention sinks
(kernel_abi.spec's conventions, which are FlashAttention's), checked once, and the torch computation that
serves them where no exported kernel does (and that the op's backward differentiates).

    window_size (left, right): query row i of a sequence sees key j when i + off - left <= j <= i + off + right,
        off = seqlen_k - seqlen_q (bottom-right alignment); -1 leaves a side open; causal closes the right at 0.
    softcap: the scaled scores become softcap * tanh(scores / softcap); 0 is none.
    sinks (FA4's ``learnable_sink``, transformers' ``s_aux``): one logit per query head that joins every row's
        softmax as a key with no value. The entry points hand the kernels fp32 sinks; a sink tensor of another
        float dtype is converted (differentiably: its gradient reaches the caller's parameter).

``features`` names what a kernel must be built with (kernel_abi.spec.FEATURES), which is what dispatch
matches an exported config on. ``reference_attention`` is plain torch in fp32 and differentiable in q, k, v and
the sinks: the fallback and the recompute of the op's backward, not a fast path.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from kernel_abi.spec import FEATURES, is_local

NO_WINDOW = (-1, -1)


@dataclass(frozen=True)
class ModelOptions:
    """One call's options, checked (``model_options``): ``window`` with causal's right side closed to 0."""

    window: tuple = NO_WINDOW
    softcap: float = 0.0
    sinks: Any = None          # fp32 (heads_q,) tensor or None

    @property
    def any(self) -> bool:
        return self.window != NO_WINDOW or self.softcap > 0 or self.sinks is not None

    def features(self, causal: bool) -> tuple[str, ...]:
        """What a kernel must be built with to compute this call, in kernel_abi.spec.FEATURES' order."""
        given = {"local": is_local(self.window, causal), "softcap": self.softcap > 0, "sinks": self.sinks is not None}
        return tuple(f for f in FEATURES if given[f])


PLAIN = ModelOptions()


def model_options(window_size, softcap, sinks, *, causal: bool, heads_q: int, device, where: str,
                  sink_dtypes: tuple | None = None) -> ModelOptions:
    """The checked options of one call; ValueError naming the argument (and ``where``, the entry point) for a
    window that is not two ints >= -1, a cap that is not a finite number >= 0, sinks that are not one float per
    query head on the queries' device (of one of ``sink_dtypes`` where given). A causal window's right side is 0
    whatever is given (FlashAttention's convention: causal is window (left, 0))."""
    import torch

    window = NO_WINDOW if window_size is None else window_size
    try:
        window = tuple(int(w) if isinstance(w, numbers.Integral) and not isinstance(w, bool) else w for w in window)
    except TypeError:
        raise ValueError(f"{where}: window_size must be a (left, right) pair of ints >= -1, got {window_size!r}") \
            from None
    if len(window) != 2 or not all(isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window):
        raise ValueError(f"{where}: window_size must be a (left, right) pair of ints >= -1 (-1: open), "
                         f"got {window_size!r}")
    if causal and window[1] != -1:
        window = (window[0], 0)
    if window == (-1, 0) and causal:
        window = NO_WINDOW
    cap = 0.0 if softcap is None else softcap
    # float() first: under torch.compile(dynamic=True) a float argument is symbolic, and float() specialises it
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not math.isfinite(float(cap)) or cap < 0:
        raise ValueError(f"{where}: softcap must be a finite number >= 0 (0: none), got {softcap!r}")
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor) or not sinks.dtype.is_floating_point or sinks.dim() != 1 \
                or sinks.shape[0] != heads_q:
            raise ValueError(f"{where}: learnable_sink must be a float tensor of {heads_q} logits (one per query "
                             f"head), got {getattr(sinks, 'dtype', type(sinks).__name__)} "
                             f"{tuple(getattr(sinks, 'shape', ()))}")
        if sink_dtypes is not None and sinks.dtype not in sink_dtypes:
            raise ValueError(f"{where}: learnable_sink must be {' or '.join(map(str, dict.fromkeys(sink_dtypes)))}, "
                             f"got {sinks.dtype}")
        if sinks.device != device:
            raise ValueError(f"{where}: learnable_sink is on {sinks.device}, the queries on {device}")
        sinks = sinks.float().contiguous()
    return ModelOptions(window, float(cap), sinks)


def visible(sq: int, sk: int, causal: bool, window, device, seqlens=None):
    """(sq, sk) bool: which keys each query row sees (module doc), or None when every row sees every key. With
    ``seqlens`` (b,) (a KV cache: sequence b's keys are the first seqlens[b] of the sk rows, its queries the last
    sq of them): (b, sq, sk), each sequence aligned to its own length and the rows past it hidden."""
    import torch

    left, right = window[0], 0 if causal else window[1]
    cols = torch.arange(sk, device=device)
    if seqlens is None:
        if left < 0 and right < 0:
            return None
        rows = torch.arange(sq, device=device)[:, None] + (sk - sq)
        mask = torch.ones(sq, sk, dtype=torch.bool, device=device)
        cols = cols[None, :]
    else:
        lens = seqlens.long()[:, None, None]
        rows = torch.arange(sq, device=device)[None, :, None] + lens - sq
        cols = cols[None, None, :]
        mask = (cols < lens).expand(seqlens.shape[0], sq, sk)
    if left >= 0:
        mask = mask & (cols >= rows - left)
    if right >= 0:
        mask = mask & (cols <= rows + right)
    return mask


def capped(scores, softcap: float):
    """The scaled scores soft-capped: softcap * tanh(scores / softcap); unchanged for 0."""
    import torch

    return softcap * torch.tanh(scores / softcap) if softcap > 0 else scores


def softmax_rows(scores, sink=None):
    """(p, lse) of masked scores (-inf: hidden) along the last dim: ``sink`` (broadcastable to the scores' rows,
    (..., 1)) joins every row's max and denominator as a key with no value. A row with no visible key and no sink
    has p 0 and lse -inf (FlashAttention's convention); with a sink its p is 0 and its lse the sink. lse is the
    natural log, the last dim dropped. Differentiable (also in the sink)."""
    import torch

    m = scores.amax(dim=-1, keepdim=True)
    if sink is not None:
        m = torch.maximum(m, sink)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()
    e = torch.exp(scores - m)
    total = e.sum(dim=-1, keepdim=True)
    if sink is not None:
        total = total + torch.exp(sink - m)
    safe = torch.where(total > 0, total, torch.ones_like(total))
    lse = torch.where(total > 0, m + torch.log(safe), torch.full_like(total, float("-inf")))
    return e / safe, lse.squeeze(-1)


def reference_attention(q, k, v, causal: bool, scale: float, options: ModelOptions, attn_mask=None,
                        rows: int = 1024):
    """attention(q, k, v) with ``options`` in fp32, (b, s, h, d) in and out (the output in q's dtype): GQA by
    head groups, bottom-right causal, ``attn_mask`` (SDPA's meaning: bool keeps, float adds; broadcastable to
    (b, hq, sq, sk)) on top. A row that sees no key and has no sink is 0. Differentiable, a block of ``rows``
    query rows at a time (autograd keeps each block's probabilities: b·hq·sq·sk floats in all)."""
    import torch

    sq, hq = q.shape[1], q.shape[2]
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    work = torch.promote_types(q.dtype, torch.float32)
    qf = q.to(work).transpose(1, 2)
    kf = k.to(work).transpose(1, 2).repeat_interleave(group, dim=1)
    vf = v.to(work).transpose(1, 2).repeat_interleave(group, dim=1)
    keep = visible(sq, sk, causal, options.window, q.device)
    sink = None if options.sinks is None else options.sinks.to(work).view(1, hq, 1, 1)
    outs = []
    for start in range(0, sq, rows):
        stop = min(start + rows, sq)
        s = capped(qf[:, :, start:stop] @ kf.transpose(-1, -2) * scale, options.softcap)
        if keep is not None:
            s = s.masked_fill(~keep[start:stop], float("-inf"))
        if attn_mask is not None:
            m = attn_mask[..., start:stop, :] if attn_mask.dim() >= 2 and attn_mask.shape[-2] == sq else attn_mask
            s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.to(work)
        p, _ = softmax_rows(s, sink)
        outs.append(p @ vf)
    out = torch.cat(outs, dim=2) if len(outs) != 1 else outs[0]
    return out.transpose(1, 2).to(q.dtype).contiguous()


def reference_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, causal: bool, scale: float,
                     options: ModelOptions):
    """Packed sequences (q (total_q, hq, d), k/v (total_k, hkv, d)) by ``reference_attention``, one sequence at a
    time (the lengths read on the host); keys past ``seqused_k`` unused; a sequence with no key, and any row
    past the last sequence, is 0 (a sink has no value). Differentiable."""
    import torch

    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    used = seqused_k.tolist() if seqused_k is not None else None
    pieces = []
    for i in range(len(starts_q) - 1):
        q0, q1, k0 = starts_q[i], starts_q[i + 1], starts_k[i]
        n = used[i] if used is not None else starts_k[i + 1] - k0
        if q1 <= q0:
            continue
        if n <= 0:
            pieces.append(q.new_zeros(q1 - q0, q.shape[1], v.shape[2]))
            continue
        pieces.append(reference_attention(q[None, q0:q1], k[None, k0:k0 + n], v[None, k0:k0 + n], causal, scale,
                                          options)[0])
    total = starts_q[-1] if starts_q else 0
    out = torch.cat(pieces, dim=0) if pieces else q.new_zeros(0, q.shape[1], v.shape[2])
    if total < q.shape[0]:
        out = torch.cat([out, q.new_zeros(q.shape[0] - total, q.shape[1], v.shape[2])], dim=0)
    return out


def reference_paged(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, causal: bool, scale: float,
                    options: ModelOptions):
    """A paged cache (tuner/serving/paged_sdpa.py's layout) by ``reference_varlen`` over its pages gathered on the
    device; differentiable in q, the caches (through the gather) and the sinks."""
    from tuner.serving.paged_sdpa import check_used, gather_pages

    check_used(seqused_k, page_table, int(k_cache.shape[1]))
    k, v, cu_k = gather_pages(k_cache, v_cache, page_table)
    return reference_varlen(q, k, v, cu_seqlens_q, cu_k, seqused_k, causal, scale, options)


def kernel_window(options: ModelOptions, kernel_causal: bool) -> tuple:
    """The window to hand a kernel: a causal kernel's is (left, 0), FlashAttention's causal convention (a one-row
    call may run on the kernel of the other causality: bottom-right, both see every key)."""
    if not kernel_causal:
        return options.window
    return (options.window[0], 0) if options.window[0] >= 0 else (-1, -1)


def option_arguments(options: ModelOptions, kernel_causal: bool) -> dict:
    """The options as a kernel launch takes them (window_size, softcap, sinks)."""
    return {"window_size": kernel_window(options, kernel_causal), "softcap": options.softcap, "sinks": options.sinks}
