"""A stand-in for flash-attn-4's ``flash_attn.cute`` (the ``fa4_stand_in`` fixture of tests/conftest.py
installs it as ``flash_attn/cute/__init__.py`` in a temporary folder on sys.path): FA4's signature and (b, s, h, d)
layout, attention computed with torch on the CPU. Knobs a test may set on the module: ``RETURN_LSE`` (return (out,
lse) as some FA4 versions do), ``WRONG`` (a wrong output); every call is recorded in ``CALLS``. ``window_size``,
``softcap`` and ``learnable_sink`` as FA4 takes them (the fp32 reference). Head dims FA4 has no kernel for raise, as
FA4 does."""
import math

import torch

SUPPORTED_HEAD_DIMS = (64, 96, 128, 192)
CALLS: list = []
RETURN_LSE = False
WRONG = False


def flash_attn_func(q, k, v, causal=False, softmax_scale=None, window_size=(None, None), softcap=0.0,
                    learnable_sink=None):
    options = tuple(window_size) != (None, None) or softcap or learnable_sink is not None
    CALLS.append({"q": tuple(q.shape), "k": tuple(k.shape), "v": tuple(v.shape), "causal": causal,
                  "softmax_scale": softmax_scale,
                  **({"window_size": window_size, "softcap": softcap, "learnable_sink": learnable_sink}
                     if options else {})})
    if q.shape[-1] not in SUPPORTED_HEAD_DIMS:
        raise NotImplementedError(f"head_dim {q.shape[-1]} is not supported")
    if options:
        from tuner.measure.reference import reference

        window = tuple(-1 if w is None else w for w in window_size)
        out = reference(q, k, v, causal, window=window, softcap=softcap, sinks=learnable_sink,
                        scale=softmax_scale) + (0.5 if WRONG else 0.0)
        return out.to(q.dtype)
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scale = softmax_scale if softmax_scale is not None else 1 / math.sqrt(q.shape[-1])
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale
    if causal:   # aligned bottom-right, as FlashAttention does
        sq, sk = s.shape[-2:]
        s = s.masked_fill(~torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq), float("-inf"))
    out = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v.float())
    if WRONG:
        out = out + 0.5
    out = out.to(q.dtype)
    return (out, torch.logsumexp(s, dim=-1)) if RETURN_LSE else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                           seqused_k=None, page_table=None, causal=False, softmax_scale=None, **options):
    """Packed q (total_q, h, d); k/v packed by cu_seqlens_k, or caches (pages, page_size, h, d) read through
    page_table with seqused_k keys per sequence. Each sequence through flash_attn_func (bottom-right causal; WRONG
    applies), recorded once in CALLS with ``varlen`` True before the per-sequence calls."""
    CALLS.append({"varlen": True, "q": tuple(q.shape), "k": tuple(k.shape), "paged": page_table is not None,
                  "causal": causal, "softmax_scale": softmax_scale})
    outs = []
    for b in range(cu_seqlens_q.shape[0] - 1):
        qs = q[int(cu_seqlens_q[b]):int(cu_seqlens_q[b + 1])]
        if page_table is not None:
            used = int(seqused_k[b])
            ks = k[page_table[b].long()].flatten(0, 1)[:used]
            vs = v[page_table[b].long()].flatten(0, 1)[:used]
        else:
            ks, vs = (t[int(cu_seqlens_k[b]):int(cu_seqlens_k[b + 1])] for t in (k, v))
        out = flash_attn_func(qs[None], ks[None], vs[None], causal=causal, softmax_scale=softmax_scale, **options)
        outs.append((out[0] if isinstance(out, tuple) else out)[0])
    out = torch.cat(outs)
    return (out, None) if RETURN_LSE else out
