"""``flash_attn_with_kvcache``'s ``k``/``v`` and rotary arguments, as FlashAttention 2 defines them: the new keys
and values written into the cache in place, then the attention over ``cache_seqlens + seqlen_new`` keys.

    o = attn.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=lens,
                                     block_table=table, rotary_cos=cos, rotary_sin=sin, causal=True)

FA2's positions: new key i of sequence b is row ``cache_seqlens[b] + i`` of its cache (through the page table for a
paged cache) and is rotated by row ``cache_seqlens[b] + i`` of ``rotary_cos``/``rotary_sin`` (seqlen_ro,
rotary_dim / 2), over its first rotary_dim columns (``rotary_interleaved``: pairs (0, 1), (2, 3)... as GPT-J;
else halves as GPT-NeoX). Query i is rotated at the same row when causal, else every query at ``cache_seqlens[b]``.
``cache_seqlens`` itself is not changed (the caller advances it, as with FA2). Absorbed MLA (``v_cache=None``)
appends ``k`` alone: its values are the latent rows' first 512 columns.

Torch ops on the device (a gather of the table, ``index_copy_``), so an appending call compiles and captures in a
CUDA graph; an eager call on CUDA writes the rows with one Triton launch instead (kvcache_append_triton.py: the
torch ops cost ~25 µs of host time each there). What would write outside the cache (a row past its capacity, a
table entry that is not a page where a new row lands, a position past ``rotary_cos``) is checked from the lengths
on the host in eager calls (one read of a few numbers: a synchronisation) and refused before anything is written;
while compiling or capturing, where a host read is impossible, or with ``check_append=False``, it is the caller's
contract, as it always is with FA2.
"""
from __future__ import annotations

import torch

from tuner.serving import kvcache_append_triton
from tuner.serving.kvcache_fp8 import E4M3, quantise
from tuner.serving.rule import host_reads_allowed


def append_errors(q, k_cache, v_cache, k, v, cache_seqlens, rotary_cos, rotary_sin, absorbed: bool,
                  page_table=None) -> list[str]:
    """Every reason these ``k``/``v``/rotary arguments cannot be appended (empty: they can). Shapes and dtypes only;
    ``q``, the caches and ``cache_seqlens`` have passed decode_input_errors."""
    errors = []
    rotary = rotary_cos is not None or rotary_sin is not None
    if k is None:
        if v is not None:
            errors.append("v without k: the new keys and values are appended together")
        if rotary:
            errors.append("rotary_cos/rotary_sin rotate the new keys (and the queries): they need k and v, as in FA2")
        return errors
    if absorbed:
        if v is not None:
            errors.append("absorbed MLA (v_cache=None) appends k alone: its values are the latent rows' first columns")
        if rotary:
            errors.append("rotary_cos/rotary_sin rotate the first rotary_dim columns (FA2); absorbed MLA's rotary "
                          "columns are its last 64: rotate q and k before the call")
    elif v is None:
        errors.append("k without v: the new keys and values are appended together (v=None only for absorbed MLA, "
                      "whose v_cache is None too)")
    if cache_seqlens is None:
        errors.append("appending k/v needs cache_seqlens: the new rows of sequence b go at cache_seqlens[b]")
    elif isinstance(cache_seqlens, torch.Tensor) and cache_seqlens.device != k_cache.device:
        errors.append(f"appending reads cache_seqlens on the cache's device ({k_cache.device}), got it on "
                      f"{cache_seqlens.device}")
    if isinstance(page_table, torch.Tensor) and page_table.device != k_cache.device:
        errors.append(f"appending reads the page table on the cache's device ({k_cache.device}), got it on "
                      f"{page_table.device}")
    b = q.shape[0]
    news = [("k", k, k_cache)] + ([("v", v, v_cache)] if v is not None and not absorbed else [])
    for name, new, cache in news:
        if not isinstance(new, torch.Tensor) or new.dim() != 4:
            errors.append(f"{name} must be a 4-D tensor (batch, seqlen_new, kv_heads, head_dim), got "
                          f"{tuple(getattr(new, 'shape', ())) or type(new).__name__}")
            continue
        want = (b, new.shape[1], cache.shape[2], cache.shape[3])
        if tuple(new.shape) != want or new.shape[1] < 1:
            errors.append(f"{name} must be (batch, seqlen_new >= 1, kv_heads, head_dim) = {want} for this cache, got "
                          f"{tuple(new.shape)}")
        if cache.dtype == E4M3:   # an FP8 cache: the new rows come in q's dtype and are quantised with the scales
            if new.dtype != q.dtype or new.device != cache.device:
                errors.append(f"{name} must be {q.dtype} (q's dtype; an FP8 cache quantises it with {name}_scale) on "
                              f"{cache.device}, got {new.dtype} on {new.device}")
        elif new.dtype != cache.dtype or new.device != cache.device:
            errors.append(f"{name} must be {cache.dtype} on {cache.device} like its cache, got {new.dtype} on "
                          f"{new.device}")
    if len(news) == 2 and all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (k, v)) \
            and k.shape[1] != v.shape[1]:
        errors.append(f"k and v append different numbers of rows: {k.shape[1]} and {v.shape[1]}")
    if rotary:
        if not all(isinstance(t, torch.Tensor) for t in (rotary_cos, rotary_sin)):
            errors.append("rotary_cos and rotary_sin come together, as tensors")
        elif rotary_cos.shape != rotary_sin.shape or rotary_cos.dim() != 2 \
                or not 1 <= rotary_cos.shape[1] <= q.shape[3] // 2:
            errors.append(f"rotary_cos and rotary_sin must both be (seqlen_ro, rotary_dim / 2) with rotary_dim <= "
                          f"the head dim {q.shape[3]}, got {tuple(rotary_cos.shape)} and {tuple(rotary_sin.shape)}")
        elif not rotary_cos.dtype.is_floating_point or rotary_cos.device != q.device \
                or rotary_sin.device != q.device:
            errors.append(f"rotary_cos/rotary_sin must be floating-point tensors on {q.device}")
    return errors


_STEPS: dict = {}


def _steps(n: int, device) -> torch.Tensor:
    """arange(n) (int64) on the device, kept between eager calls: each small torch op costs ~25 us of host time on
    the H100 machine (BENCHMARKS.md 2026-11-27), so the append is written in as few of them as it can."""
    if torch.compiler.is_compiling():
        return torch.arange(n, device=device)
    key = (n, device)
    steps = _STEPS.get(key)
    if steps is None:
        steps = _STEPS[key] = torch.arange(n, device=device)
    return steps


def new_positions(cache_seqlens: torch.Tensor, seqlen_new: int) -> torch.Tensor:
    """(batch, seqlen_new) int64: the cache rows of the new keys."""
    return torch.add(cache_seqlens[:, None], _steps(seqlen_new, cache_seqlens.device))


def page_ids(positions, page_table, cache_rows: int, clamp: bool = False):
    """(the table column, the page id) of each new row. ``clamp``: the column is clamped into the table, so that a
    row past it is reported by room_errors, not a failed gather (a no-op for rows inside the table)."""
    column = torch.div(positions, cache_rows, rounding_mode="floor")
    if clamp:
        column.clamp_(0, page_table.shape[1] - 1)
    return column, page_table.gather(1, column)


def cache_slots(positions, page_table, cache_rows: int, pages=None):
    """The flat row of each new row in k_cache.flatten(0, 1); ``pages``: page_ids' answer where the check read it
    already."""
    if page_table is None:
        return torch.add(positions, _steps(positions.shape[0], positions.device)[:, None], alpha=cache_rows)
    column, ids = pages if pages is not None else page_ids(positions, page_table, cache_rows)
    # page * rows + position % rows, as position + (page - column) * rows: two ops
    return torch.add(positions, ids - column, alpha=cache_rows)


def room_errors(positions, pages, width: int, num_pages: int, rotary_rows: int | None = None,
                rotary_last: torch.Tensor | None = None) -> list[str]:
    """Where the new rows would land outside the cache (rows per sequence ``width``; ``pages`` their page ids, None
    for a dense cache) or, rotary_last the queries' last rotary row, past rotary_cos: one host read."""
    read = [positions.min(), positions.max()]
    if pages is not None:
        read += [pages.min().long(), pages.max().long()]
    if rotary_last is not None:
        read.append(torch.maximum(read[1], rotary_last))
    values = torch.stack(read).tolist()
    first, last = values[0], values[1]
    errors = []
    if first < 0:
        errors.append(f"a cache_seqlens entry is negative ({first})")
    if last >= width:
        errors.append(f"the new rows reach row {last} of a sequence whose cache holds {width} rows "
                      f"({'the table width x the page size' if pages is not None else 'k_cache.shape[1]'})")
    elif pages is not None and (values[2] < 0 or values[3] >= num_pages):
        errors.append(f"a new row lands in a page-table entry outside [0, {num_pages}) (a padded entry): give the "
                      f"sequence its next page before appending")
    if rotary_rows is not None and values[-1] >= rotary_rows:
        errors.append(f"rotary_cos/rotary_sin have {rotary_rows} rows; position {values[-1]} needs more")
    return errors


def _write_rows(cache: torch.Tensor, flat_rows: torch.Tensor, new: torch.Tensor) -> None:
    """cache rows (its first two dims flattened) = new rows: one index_copy_ where the flattening is a view. An e4m3
    cache is written as its bytes (the copies are byte moves)."""
    if cache.dtype == E4M3:
        cache, new = cache.view(torch.uint8), new.view(torch.uint8)
    if cache.stride(0) == cache.shape[1] * cache.stride(1):
        cache.flatten(0, 1).index_copy_(0, flat_rows.reshape(-1), new.reshape(-1, *new.shape[2:]))
    else:
        rows = cache.shape[1]
        cache.index_put_((torch.div(flat_rows, rows, rounding_mode="floor"), flat_rows % rows), new)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
           interleaved: bool) -> torch.Tensor:
    """x (batch, seqlen, heads, d) with its first rotary_dim columns rotated by rows ``positions`` (batch, seqlen)
    of cos/sin (seqlen_ro, rotary_dim / 2); computed in fp32, returned in x's dtype."""
    half = cos.shape[1]
    c = cos[positions].float()[:, :, None, :]
    s = sin[positions].float()[:, :, None, :]
    head = x[..., :2 * half].float()
    if interleaved:
        even, odd = head[..., 0::2], head[..., 1::2]
        turned = torch.stack((even * c - odd * s, even * s + odd * c), dim=-1).flatten(-2)
    else:
        first, second = head[..., :half], head[..., half:]
        turned = torch.cat((first * c - second * s, first * s + second * c), dim=-1)
    return torch.cat((turned.to(x.dtype), x[..., 2 * half:]), dim=-1)


def append(q, k_cache, v_cache, k, v, cache_seqlens, page_table, rotary_cos, rotary_sin, rotary_interleaved: bool,
           causal: bool, absorbed: bool, check: bool = True, kv_scales=None):
    """Write the new rows into the caches (in place) and rotate; returns (q to attend with, the key lengths to
    attend over). With ``check`` (and a host read possible) raises ValueError, before any write, where the rows
    would land outside the cache. ``kv_scales`` (k_scale, v_scale): an FP8 cache's (checked by the caller); the new
    rows, rotated first, are quantised with them (tuner/serving/kvcache_fp8.py)."""
    seqlen_new = k.shape[1]
    rotary = rotary_cos is not None
    check = check and host_reads_allowed()
    # eager CUDA: the write as one Triton launch (16-bit rows; an e4m3 cache's rows go through the torch ops)
    fused = kv_scales is None and kvcache_append_triton.usable(k_cache, k, v)
    positions = pages = None
    if check or rotary or not fused:
        positions = new_positions(cache_seqlens, seqlen_new)
    if check:
        if page_table is not None:
            pages = page_ids(positions, page_table, k_cache.shape[1], clamp=True)
        width = k_cache.shape[1] * (page_table.shape[1] if page_table is not None else 1)
        # the queries' rotary rows reach cache_seqlens + seqlen_q - 1 when causal (FA2's positions, below)
        q_last = positions[:, :1] + (q.shape[1] - 1 if causal else 0)
        errors = room_errors(positions, None if pages is None else pages[1], width, k_cache.shape[0],
                             rotary_cos.shape[0] if rotary else None, q_last.max() if rotary else None)
        if errors:
            raise ValueError("flash_attn_with_kvcache: " + "; ".join(errors))
    if rotary:
        # FA2 puts query i at cache_seqlens + i when causal, every query at cache_seqlens else
        q_rows = new_positions(cache_seqlens, q.shape[1]) if causal else positions[:, :1].expand(-1, q.shape[1])
        k = rotate(k, rotary_cos, rotary_sin, positions, rotary_interleaved)
        q = rotate(q, rotary_cos, rotary_sin, q_rows, rotary_interleaved)
    if kv_scales is not None:
        k, v = quantise(k, kv_scales[0]), (None if v is None else quantise(v, kv_scales[1]))
    if fused:
        lens = kvcache_append_triton.write_rows(k_cache, None if absorbed else v_cache, k,
                                                None if absorbed else v, cache_seqlens, page_table)
        return q, lens
    flat_rows = cache_slots(positions, page_table, k_cache.shape[1], pages)
    _write_rows(k_cache, flat_rows, k)
    if not absorbed:
        _write_rows(v_cache, flat_rows, v)
    return q, cache_seqlens + seqlen_new
