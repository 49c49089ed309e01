"""A padded batch through the packed-sequence kernels: (batch, seqlen) tensors whose padding a 2-D mask marks (left
or right, as transformers' tokenizers and ``generate()`` make them) are packed sequence by sequence, run by
``flash_attn_varlen_func`` (with the model's options) and put back in place.

No shape depends on the mask's content, so torch.compile traces it without a graph break and CUDA graphs can
capture it: a stable sort puts each sequence's tokens first, in order, and the padding after them (the packed
tensors keep batch x seqlen rows); the cumulative lengths are a (batch + 1) tensor; ``max_seqlen`` is the padded
length. Rows past the last sequence are never attended to and come back as zeros, so padded positions of the
output are 0 (transformers discards them).

Alignment: query i of a sequence is its i-th real query, and causal (and a window) align each sequence's last
query with its last key, FlashAttention's bottom-right rule. That is the padded mask's own pattern when the
queries are the mask's last ``seqlen_q`` positions (a prefill, or a decode step over a cache) and padding never sits
between a sequence's tokens; ``is_edge_padding`` says whether it does not, where the host may read the mask.
"""
from __future__ import annotations

import torch


def pack_order(valid):
    """(order, cu_seqlens) of a (batch, seqlen) bool mask: ``order`` the flat row indices with every sequence's kept
    rows first, in order, then the padding (a stable sort); ``cu_seqlens`` int32 (batch + 1)."""
    flat = valid.reshape(-1)
    order = torch.argsort((~flat).to(torch.uint8), stable=True)
    lengths = valid.sum(dim=1, dtype=torch.int32)
    cu_seqlens = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    return order, cu_seqlens


def is_edge_padding(valid) -> bool:
    """Whether every row's kept entries are one contiguous run (left, right or no padding): a host read."""
    as_int = valid.to(torch.int8)
    starts = (as_int[:, 1:] > as_int[:, :-1]).sum(dim=1) + as_int[:, 0]
    return bool((starts <= 1).all())


def left_padding(keys_kept):
    """(batch,) int32: each sequence's padded keys before its first kept one, when every sequence's kept keys run to
    the last key (left padding, as generate() makes it for decoder-only models); None otherwise. A host read."""
    sk = keys_kept.shape[1]
    leftpad = sk - keys_kept.sum(dim=1, dtype=torch.int32)
    suffix = torch.arange(sk, device=keys_kept.device)[None, :] >= leftpad[:, None]
    return leftpad if bool(torch.equal(suffix, keys_kept.bool())) else None


def attend_decode_padded(attn, q, k, v, keys_kept, scale: float | None, window_size=(-1, -1), softcap: float = 0.0,
                         learnable_sink=None):
    """A decode step of a left-padded batch through the decode kernel, the cache read in place: (batch, seqlen_q <=
    16, heads, dim) queries, the last positions of (batch, seqlen_k, kv heads, dim) keys whose padding ``keys_kept``
    marks; each sequence's keys from its first kept row (``cache_leftpad``), causal to its last. Packing would copy
    the whole cache every step (tuner/serving/padded.attend_padded). In eager calls the mask is read on the host and
    must be left padding; under torch.compile or CUDA-graph capture (no host read) a decode step's padding is taken as
    generate() makes it for decoder-only models, left padding, as the packed path takes it as edge padding there:
    each sequence's leftpad is its count of padded keys (a right-padded sequence's new token is a padded position, its
    row discarded by transformers either way). None where this does not serve the call: more queries, padding that is
    not left padding (eager), or an export with no decode kernel for its shapes and options."""
    from tuner.serving.decode import MAX_SEQLEN_Q
    from tuner.serving.rule import host_reads_allowed

    b, sq = q.shape[0], q.shape[1]
    sk = k.shape[1]
    if sq > MAX_SEQLEN_Q or sq >= sk or keys_kept.shape != (b, sk):
        return None
    q = q.contiguous()       # a few rows; the cache is read where it is
    if not attn.serves_decode(q, k, v, True, scale, window_size, softcap, learnable_sink):
        return None
    kept = keys_kept.to(device=q.device, dtype=torch.bool)
    if host_reads_allowed():
        leftpad = left_padding(kept)
        if leftpad is None:
            return None
    else:
        leftpad = sk - kept.sum(dim=1, dtype=torch.int32)
    return attn.flash_attn_with_kvcache(q, k, v, cache_seqlens=sk, cache_leftpad=leftpad, softmax_scale=scale,
                                        causal=True, window_size=window_size, softcap=softcap,
                                        learnable_sink=learnable_sink)


def attend_padded(attn, q, k, v, keys_kept, causal: bool, scale: float | None, window_size=(-1, -1),
                  softcap: float = 0.0, learnable_sink=None):
    """Attention of (batch, seqlen, heads, dim) q, k, v whose keys ``keys_kept`` (batch, seqlen_k) marks; the
    queries are the last seqlen_q positions of the keys'. Packed, run through ``attn.flash_attn_varlen_func``, put
    back: (batch, seqlen_q, heads_q, d_v), zeros at padded query positions."""
    b, sq, hq, _ = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    if keys_kept.shape != (b, sk):
        raise ValueError(f"the padding mask is {tuple(keys_kept.shape)}; the keys need ({b}, {sk})")
    keys_kept = keys_kept.to(device=q.device, dtype=torch.bool)
    # one query a sequence (a decode step): bottom-right causal sees every key, so the causal kernels serve it
    causal = bool(causal) or sq == 1
    order_k, cu_k = pack_order(keys_kept)
    order_q, cu_q = pack_order(keys_kept[:, sk - sq:])
    packed_q = q.reshape(b * sq, hq, q.shape[3]).index_select(0, order_q)
    packed_k = k.reshape(b * sk, hkv, k.shape[3]).index_select(0, order_k)
    packed_v = v.reshape(b * sk, hkv, v.shape[3]).index_select(0, order_k)
    out = attn.flash_attn_varlen_func(packed_q, packed_k, packed_v, cu_q, cu_k, sq, sk, softmax_scale=scale,
                                      causal=causal, window_size=window_size, softcap=softcap,
                                      learnable_sink=learnable_sink)
    in_a_sequence = torch.arange(b * sq, device=q.device) < cu_q[-1]
    out = torch.where(in_a_sequence[:, None, None], out, out.new_zeros(()))
    return out.new_zeros(out.shape).index_copy(0, order_q, out).view(b, sq, hq, out.shape[-1])


def dense_mask(keys_kept, seqlen_q: int, causal: bool, window_size=(-1, -1)):
    """The (batch, 1, seqlen_q, seqlen_k) bool mask of what ``attend_padded`` computes (SDPA's meaning: True
    attends), for the paths that take a materialised mask (dropout). Relative to each row of the padded layout,
    which is each sequence's own when the padding is at the edges."""
    b, sk = keys_kept.shape
    i = torch.arange(seqlen_q, device=keys_kept.device)[:, None] + (sk - seqlen_q)
    j = torch.arange(sk, device=keys_kept.device)[None, :]
    keep = torch.ones(seqlen_q, sk, dtype=torch.bool, device=keys_kept.device)
    left, right = window_size[0], (0 if causal else window_size[1])
    if left >= 0:
        keep = keep & (j >= i - left)
    if right >= 0:
        keep = keep & (j <= i + right)
    return keys_kept.bool()[:, None, None, :] & keep
