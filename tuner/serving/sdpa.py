"""torch's scaled_dot_product_attention in the exported kernels' layout and semantics: the fallback of
every entry point and the recompute of the op's backward.

(b, s, h, d) in and out, GQA by head groups (query head i reads KV head i // group), the softmax scale
given or 1/sqrt(d_qk), causal aligned bottom-right as FlashAttention does (query i sees keys
j <= i + sk - sq); a query row that sees no key (causal with sq > sk) is 0 and has zero gradients.
Differentiable through torch's own SDPA backward.
"""
from __future__ import annotations


def check_shapes(q, k, v) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D (batch, seqlen, heads, head_dim); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    b, _, hq, dqk = q.shape
    if k.shape[0] != b or v.shape[0] != b:
        raise ValueError(f"batch differs: q {b}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} differ in seqlen or heads")
    if k.shape[3] != dqk:
        raise ValueError(f"q and k head dims differ: {dqk} vs {k.shape[3]}")
    if k.shape[2] < 1 or hq % k.shape[2]:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({k.shape[2]})")


def sdpa_attention(q, k, v, causal: bool = False, softmax_scale: float | None = None, dropout_p: float = 0.0,
                   attn_mask=None):
    """attention(q, k, v) by torch SDPA in our layout and semantics (module docstring). ``attn_mask``
    (broadcastable to (b, hq, sq, sk), SDPA's meaning) replaces ``causal``: SDPA runs with it as given."""
    import torch
    import torch.nn.functional as F

    check_shapes(q, k, v)
    sq, sk = q.shape[1], k.shape[1]
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    kwargs = {"scale": softmax_scale, "dropout_p": dropout_p}
    if q.shape[2] != k.shape[2]:
        kwargs["enable_gqa"] = True
    if attn_mask is not None:
        if causal:
            raise ValueError("give an attention mask or causal, not both (as torch SDPA requires)")
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=attn_mask, **kwargs)
    elif not causal or sq == sk:
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal), **kwargs)
    elif sq > sk:
        # rows r < sq - sk see no key; the others are a square causal problem over all sk keys
        empty = sq - sk
        tail = F.scaled_dot_product_attention(qt[:, :, empty:], kt, vt, is_causal=True, **kwargs)
        out = torch.cat([tail.new_zeros(tail.shape[0], tail.shape[1], empty, tail.shape[3]), tail], dim=2)
    else:
        from torch.nn.attention.bias import causal_lower_right

        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=causal_lower_right(sq, sk), **kwargs)
    return out.transpose(1, 2).contiguous()


def attention_gradients(grad_out, q, k, v, causal: bool, softmax_scale: float, attn_mask=None):
    """(dq, dk, dv) of ``sdpa_attention`` at (q, k, v): torch SDPA's own backward through autograd from the
    saved inputs; where autograd cannot record (the call runs under a dispatch mode, e.g. a FLOP counter
    or a schema check, that hides it), the same gradients by explicit arithmetic (``_gradients_by_rows``)."""
    import torch

    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = sdpa_attention(*leaves, causal=causal, softmax_scale=softmax_scale, attn_mask=attn_mask)
        if out.requires_grad:
            return torch.autograd.grad(out, leaves, grad_out)
    return _gradients_by_rows(grad_out, q, k, v, causal, softmax_scale, attn_mask)


def _gradients_by_rows(grad_out, q, k, v, causal, scale, attn_mask, rows: int = 256):
    """The attention backward written out in fp32 (float64 for float64 inputs: what autograd of SDPA, the other
    path, computes them in), a block of query rows at a time (memory: b·h·rows·sk):
    P = softmax(S), dV = Pᵀ dO, dS = P ∘ (dO Vᵀ − rowsum(dO ∘ O)), dQ = dS K · scale, dK = dSᵀ Q · scale;
    K/V gradients summed over each KV head's query group; rows that see no key contribute nothing."""
    import torch

    b, sq, hq, _ = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    work = torch.promote_types(q.dtype, torch.float32)
    qf = q.to(work).transpose(1, 2)
    kf = k.to(work).transpose(1, 2).repeat_interleave(group, dim=1)
    vf = v.to(work).transpose(1, 2).repeat_interleave(group, dim=1)
    dof = grad_out.to(work).transpose(1, 2)
    dq = torch.zeros_like(qf)
    dk = torch.zeros_like(kf)
    dv = torch.zeros_like(vf)
    cols = torch.arange(sk, device=q.device)
    for start in range(0, sq, rows):
        stop = min(start + rows, sq)
        s = qf[:, :, start:stop] @ kf.transpose(-1, -2) * scale
        if causal:
            visible = cols[None, :] <= torch.arange(start, stop, device=q.device)[:, None] + (sk - sq)
            s = s.masked_fill(~visible, float("-inf"))
        if attn_mask is not None:
            m = attn_mask[..., start:stop, :] if attn_mask.dim() >= 2 and attn_mask.shape[-2] == sq else attn_mask
            s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.to(work)
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        do = dof[:, :, start:stop]
        o = p @ vf
        dv += p.transpose(-1, -2) @ do
        ds = p * (do @ vf.transpose(-1, -2) - (do * o).sum(dim=-1, keepdim=True))
        dq[:, :, start:stop] = ds @ kf * scale
        dk += ds.transpose(-1, -2) @ qf[:, :, start:stop] * scale
    dk = dk.view(b, hkv, group, sk, -1).sum(dim=2)
    dv = dv.view(b, hkv, group, sk, -1).sum(dim=2)
    return tuple(t.transpose(1, 2).to(dtype) for t, dtype in ((dq, q.dtype), (dk, k.dtype), (dv, v.dtype)))


def varlen_sdpa(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k=None, causal: bool = False,
                softmax_scale: float | None = None):
    """Packed sequences (q (total_q, hq, d), k/v (total_k, hkv, d), cumulative lengths) by ``sdpa_attention``,
    one sequence at a time, each with its own bottom-right causal alignment; keys past ``seqused_k`` are not
    used; a sequence with no key gives zeros. The lengths are read on the host (a synchronisation):
    this is the fallback and the backward's recompute, not a fast path. Differentiable."""
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    used = seqused_k.tolist() if seqused_k is not None else None
    out = q.new_zeros(q.shape[0], q.shape[1], v.shape[2])
    for b in range(len(starts_q) - 1):
        q0, q1, k0 = starts_q[b], starts_q[b + 1], starts_k[b]
        n = used[b] if used is not None else starts_k[b + 1] - k0
        if q1 > q0 and n > 0:
            out[q0:q1] = sdpa_attention(q[None, q0:q1], k[None, k0:k0 + n], v[None, k0:k0 + n], causal=causal,
                                        softmax_scale=softmax_scale)[0]
    return out


def varlen_gradients(grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, causal: bool, softmax_scale: float):
    """(dq, dk, dv) of ``varlen_sdpa``, sequence by sequence (``attention_gradients`` of each); keys not used
    get zero gradients."""
    import torch

    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    used = seqused_k.tolist() if seqused_k is not None else None
    for b in range(len(starts_q) - 1):
        q0, q1, k0 = starts_q[b], starts_q[b + 1], starts_k[b]
        n = used[b] if used is not None else starts_k[b + 1] - k0
        if q1 > q0 and n > 0:
            grads = attention_gradients(grad_out[None, q0:q1], q[None, q0:q1], k[None, k0:k0 + n],
                                        v[None, k0:k0 + n], causal, softmax_scale)
            dq[q0:q1], dk[k0:k0 + n], dv[k0:k0 + n] = (g[0] for g in grads)
    return dq, dk, dv
