"""A paged cache's V as an FP8 paged kernel reads it: each sequence's keys gathered from its pages into the packed V^T
layout of the FP8 varlen kernel (tuner/serving/launch/plan.py transposed_packed_v), so that both kernels read V^T the
same way (attn_sm90::packed_vt_key0).

A sequence's keys are the first seqused_k[b] rows of its pages in table order; ``key_starts`` numbers them as if packed
(cu[b] = seqused_k[0] + ... + seqused_k[b - 1], on the device: no host read), and the kernel takes that as its
cu_seqlens_k (its lengths still come from seqused_k). Column c of V^T holds sequence b's key c - (align x
ceil(cu[b] / align) + align x b) where that is one of its keys, else zero: the zeros meet P = 0 in the P.V GEMM, where
uninitialised bytes, or a poisoned page's, could hold e4m3 NaN.

V^T's width is fixed per plan, so it is bounded by shapes, not by the lengths: ``max_keys`` keys a sequence (the call's
max_seqlen_k where given, never more than the table's capacity, pages a row x page size, nor the cache's pages). The
Triton copy writes only up to READ_PAST_END columns past the last sequence (transpose_triton.py): the kernel reads no
further, and a skewed batch's width is mostly past it.
"""
from __future__ import annotations

from tuner.serving.launch.plan import packed_vt_keys, packed_vt_probe, vt_key


def max_keys_of(page_table_pages: int, page_size: int, max_seqlen_k: int | None = None,
                cache_pages: int | None = None) -> int:
    """The most keys a sequence of the call can have: the table's capacity (pages a row x page size), no more than
    the cache holds (a sequence's pages are distinct), or ``max_seqlen_k`` where smaller (the caller's bound on every
    sequence's keys, FlashAttention's contract)."""
    capacity = int(page_table_pages) * int(page_size)
    if cache_pages is not None:
        capacity = min(capacity, int(cache_pages) * int(page_size))
    if max_seqlen_k is None:
        return max(1, capacity)
    if isinstance(max_seqlen_k, bool) or not isinstance(max_seqlen_k, int) or max_seqlen_k < 0:
        raise ValueError(f"max_seqlen_k must be an int >= 0 (the most keys a sequence has), got {max_seqlen_k!r}")
    return max(1, min(capacity, max_seqlen_k))


def paged_vt_keys(batch: int, max_keys: int, align: int) -> int:
    """Keys of a row of a paged call's V^T: room for ``batch`` sequences of up to ``max_keys`` keys packed."""
    return packed_vt_keys(batch * max_keys, batch, align)


def key_starts(seqused_k):
    """cu (batch + 1) int32: where each sequence's keys would start were they packed, on the lengths' device."""
    import torch

    cu = torch.zeros(seqused_k.shape[0] + 1, dtype=torch.int32, device=seqused_k.device)
    torch.cumsum(seqused_k, 0, dtype=torch.int32, out=cu[1:])
    return cu


def column_keys(keys: int, starts, batch: int, align: int, order: str = "natural"):
    """For each V^T column (``keys`` of them): (sequence, key within it, whether it is one of the sequence's keys), as
    torch tensors, the keys in ``order`` from each sequence's first column (plan.vt_key); the mapping the Triton
    kernel computes (vt_kernels.transpose_paged_v)."""
    import torch

    cu = starts.to(torch.int64)
    first = (cu[:batch] + align - 1) // align * align + align * torch.arange(batch, device=cu.device)
    c = torch.arange(keys, device=cu.device)
    seq = (torch.searchsorted(first, c, right=True) - 1).clamp_(min=0)
    offset = c - first[seq]
    key = vt_key(offset.clamp(min=0), order)
    valid = (offset >= 0) & (key < cu[seq + 1] - cu[seq])
    return seq, key, valid


def transposed_paged_v(v_cache, page_table, starts, batch: int, keys: int, align: int, alloc: bool = True,
                       order: str = "natural"):
    """A paged cache's V (pages, page_size, heads, d) as an FP8 paged kernel's TMA map reads it: a (1, d, heads, keys)
    view of a (1, heads, d, keys) tensor holding each sequence's keys from its aligned column (see the module doc),
    zeros elsewhere, in ``order`` (plan.vt_column); ``starts`` is key_starts(seqused_k). One Triton launch on CUDA
    tensors (which leaves the columns READ_PAST_END past the last sequence unwritten), else torch's gather.
    ``alloc`` False: the geometry only (a plan's probe)."""
    _, page_size, h, d = (int(x) for x in v_cache.shape)
    if not alloc:
        return packed_vt_probe(h, d, keys, v_cache.element_size())
    import torch

    buf = torch.empty((1, h, d, keys), dtype=v_cache.dtype, device=v_cache.device)
    if v_cache.is_cuda and v_cache.stride(-1) == 1:
        from tuner.serving.launch.transpose_triton import transpose_paged_into

        if transpose_paged_into(buf, v_cache, page_table, starts, batch, align, order == "accumulator"):
            return buf.permute(0, 2, 1, 3)
    seq, key, valid = column_keys(keys, starts, batch, align, order)
    rows = page_table.to(torch.int64)[seq, (key.clamp(min=0) // page_size).clamp_(max=page_table.shape[1] - 1)]
    gathered = v_cache.view(torch.uint8)[rows, key.clamp(min=0) % page_size]      # (keys, heads, d)
    gathered[~valid] = 0
    buf.view(torch.uint8)[0].copy_(gathered.permute(1, 2, 0))
    return buf.permute(0, 2, 1, 3)
