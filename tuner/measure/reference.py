"""The fp32 attention reference of the verification gate (tuner/measure/verify.py): plain torch math on upcast
inputs, GQA heads repeated, masks aligned bottom-right, and the rows' log-sum-exp."""
from __future__ import annotations

import math


def reference(q, k, v, causal: bool, dtype=None, chunk_bytes: int = 1 << 29, *, window=(-1, -1), softcap: float = 0.0,
              sinks=None, scale: float | None = None):
    """Plain attention in torch, in ``dtype`` (default fp32 on upcast inputs); rows with no visible key
    are 0. Chunked over query rows so benchmark-sized shapes fit in memory. ``window`` (left, right), ``softcap``
    and ``sinks`` (one logit per query head) as kernel_abi.spec defines them; ``scale`` None is 1/sqrt(d_qk)."""
    import torch

    dt = dtype or torch.float32
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    k = k.repeat_interleave(group, dim=2).transpose(1, 2)     # (b, hq, sk, d)
    v = v.repeat_interleave(group, dim=2).transpose(1, 2)
    qt = q.transpose(1, 2)                                    # (b, hq, sq, d)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    left, right = window[0], 0 if causal else window[1]
    bounded = causal or left >= 0 or right >= 0
    sink = None if sinks is None else sinks.to(device=q.device, dtype=torch.float32).view(1, hq, 1, 1)
    out = torch.empty((b, hq, sq, v.shape[-1]), dtype=dt, device=q.device)
    rows = max(1, chunk_bytes // max(1, b * hq * sk * 4))
    cols = torch.arange(sk, device=q.device)
    for r0 in range(0, sq, rows):
        r1 = min(sq, r0 + rows)
        s = torch.matmul(qt[:, :, r0:r1], k.transpose(-1, -2)) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        if bounded:
            diag = torch.arange(r0, r1, device=q.device)[:, None] + (sk - sq)
            visible = torch.ones_like(diag, dtype=torch.bool) & (cols[None, :] >= 0)
            if right >= 0:
                visible &= cols[None, :] <= diag + right
            if left >= 0:
                visible &= cols[None, :] >= diag - left
            s = s.masked_fill(~visible, float("-inf"))
        s = s.float()
        if sink is not None:   # one more key of logit sink and no value: it joins the max and the denominator
            s = torch.cat([s, sink.expand(b, hq, r1 - r0, 1)], dim=-1)
        p = torch.softmax(s, dim=-1)
        if sink is not None:
            p = p[..., :-1]
        p = torch.nan_to_num(p.to(dt), nan=0.0)               # rows with no visible key -> 0
        out[:, :, r0:r1] = torch.matmul(p, v)
    return out.transpose(1, 2)                                # (b, sq, hq, d_v)


def reference_lse(q, k, causal: bool, *, window=(-1, -1), softcap: float = 0.0, sinks=None,
                  scale: float | None = None):
    """The fp32 log-sum-exp (natural log) of every row's scores, (b, hq, sq), the sink included; -inf for a row
    with no visible key and no sink (FlashAttention's convention for an empty row)."""
    import torch

    q, k = q.float(), k.float()
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    k = k.repeat_interleave(hq // hkv, dim=2).transpose(1, 2)
    s = torch.matmul(q.transpose(1, 2), k.transpose(-1, -2)) * (1.0 / math.sqrt(d) if scale is None else scale)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    left, right = window[0], 0 if causal else window[1]
    diag = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    cols = torch.arange(sk, device=q.device)[None, :]
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if right >= 0:
        visible &= cols <= diag + right
    if left >= 0:
        visible &= cols >= diag - left
    s = s.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.float().to(q.device).view(1, hq, 1, 1).expand(b, hq, sq, 1)], dim=-1)
    return torch.logsumexp(s, dim=-1)
