"""The verification gate (tuner/measure/verify.py) for packed sequences: a varlen or paged kernel is correct only if
every length mix passes.

Per mix: fresh random inputs, the packed output poisoned with NaN, every row of every sequence written and
finite, the inputs unchanged, and tuner.measure.verify's two bounds (FlashAttention's yardstick against a plain
torch implementation in the kernel's dtype, and the relative error) over all sequences, each computed alone
by the fp32 reference with causal aligned bottom-right within the sequence. Keys past ``seqused_k`` are
written with a large finite value: a kernel that lets them into a softmax fails, one that masks them (and
multiplies their values by zero probabilities) passes. Paged mixes put each sequence's keys in pages of a
shuffled cache (the table is not the identity) beside spare pages no table row names, which hold NaN: a
kernel that reads a page it was not given fails.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from tuner.serving.launch.paging import TMA_KV, kv_copy_of, page_misfit
from kernel_abi.spec import KernelSpec
from tuner.measure.verify import (CAUSAL_WINDOWS, CHECK_HEADS, SOFTCAPS, WINDOWS, ShapeCheck, VerificationReport, judge,
                                  reference, sink_logits)

_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
_UNUSED_KEY = 1.0e4   # what keys and values past seqused_k hold


@dataclass(frozen=True)
class LengthMix:
    """One varlen call: per sequence its query length, its allocated keys (None: the query's), and the keys
    it uses (None: all allocated)."""

    seqlens_q: tuple[int, ...]
    seqlens_k: Optional[tuple[int, ...]] = None
    seqused_k: Optional[tuple[int, ...]] = None

    @property
    def keys(self) -> tuple[int, ...]:
        return self.seqlens_k if self.seqlens_k is not None else self.seqlens_q

    @property
    def used(self) -> tuple[int, ...]:
        return self.seqused_k if self.seqused_k is not None else self.keys

    def label(self) -> str:
        text = f"q{list(self.seqlens_q)}"
        if self.seqlens_k is not None:
            text += f" k{list(self.seqlens_k)}"
        if self.seqused_k is not None:
            text += f" used{list(self.seqused_k)}"
        return text


# Lengths 0 and 1, tile edges (127/128/129 at BM 128), one long sequence among short ones, chunked prefill
# (a cached prefix: fewer queries than keys), causal rows that see no key (more queries than keys), keys
# used short of the allocated ones (down to none).
CHECK_MIXES = (
    LengthMix((0, 1, 127, 128, 129, 2000, 5, 64)),
    LengthMix((3000, 3, 17, 1, 0, 250)),
    LengthMix((1, 100, 300, 17), (5, 700, 1300, 17)),
    LengthMix((300, 40, 7), (100, 40, 1)),
    LengthMix((64, 300, 9), (500, 500, 30), (257, 1, 0)),
)


@dataclass(frozen=True)
class PagedMix:
    """One paged call: query lengths, the keys each sequence uses and has allocated (whole pages), the page
    size, and the spare pages the cache holds beside them (NaN: never to be read)."""

    seqlens_q: tuple[int, ...]
    seqused_k: tuple[int, ...]
    page_size: int
    allocated_k: Optional[tuple[int, ...]] = None
    spare_pages: int = 7

    @property
    def keys(self) -> tuple[int, ...]:
        return self.allocated_k if self.allocated_k is not None else self.seqused_k

    @property
    def used(self) -> tuple[int, ...]:
        return self.seqused_k

    def label(self) -> str:
        return f"page{self.page_size} q{list(self.seqlens_q)} used{list(self.seqused_k)}"


# Pages smaller than the K/V tile (several boxes a tile), as large (one), larger (a tile within a page);
# chunked prefill on a cached prefix; keys used short of the pages allocated, down to none.
CHECK_PAGED_MIXES = (
    PagedMix((1, 100, 300), (5, 700, 1300), 16),
    PagedMix((64, 2000, 1, 0), (64, 2100, 900, 50), 128, (128, 2176, 1024, 128)),
    PagedMix((300, 129), (1000, 129), 256, (1024, 256)),
    PagedMix((40, 64, 9), (100, 0, 9), 64),
    PagedMix((200, 33), (700, 100), 48),   # a size only the indexed (cp.async) producer reads: rows across pages
)


def readable_paged_mixes(block_n: int, g2s_atom: str = TMA_KV) -> tuple:
    """CHECK_PAGED_MIXES at the page sizes a kernel of ``block_n`` whose producer copies with ``g2s_atom``
    reads (tuner.serving.launch.paging)."""
    return tuple(m for m in CHECK_PAGED_MIXES if page_misfit(m.page_size, block_n, g2s_atom) is None)


def _packed_case(spec: KernelSpec, mix, gen, device):
    """q, k, v packed per the mix (K/V rows past each sequence's used keys set to _UNUSED_KEY), the
    cumulative lengths, the output poisoned with NaN."""
    import torch

    hq, hkv = CHECK_HEADS[spec.variant]
    dt = getattr(torch, _DTYPES[spec.dtype])
    cu_q, cu_k = [0], [0]
    for sq, sk in zip(mix.seqlens_q, mix.keys):
        cu_q.append(cu_q[-1] + sq)
        cu_k.append(cu_k[-1] + sk)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dt)

    q, k, v = randn(cu_q[-1], hq, spec.d_qk), randn(cu_k[-1], hkv, spec.d_qk), randn(cu_k[-1], hkv, spec.d_v)
    for b, used in enumerate(mix.used):     # the unused tail of each sequence's keys
        k[cu_k[b] + used:cu_k[b + 1]] = _UNUSED_KEY
        v[cu_k[b] + used:cu_k[b + 1]] = _UNUSED_KEY
    out = torch.full((cu_q[-1], hq, spec.d_v), float("nan"), dtype=dt, device=device)
    return q, k, v, cu_q, cu_k, out


def _paged_cache(k, v, cu_k, mix: PagedMix, gen, device, unused: float = _UNUSED_KEY):
    """The packed keys and values spread over the pages of a shuffled cache, spare pages of NaN beside them, each
    sequence's last page's rows past its keys at ``unused``; the table (int32, batch x the most pages a sequence
    has)."""
    import torch

    page = mix.page_size
    counts = [-(-(cu_k[b + 1] - cu_k[b]) // page) for b in range(len(cu_k) - 1)]
    total = sum(counts) + mix.spare_pages
    order = torch.randperm(total, generator=torch.Generator().manual_seed(int(gen.initial_seed()) % (2 ** 31)))
    kc = torch.full((total, page, *k.shape[1:]), float("nan"), dtype=k.dtype, device=device)
    vc = torch.full((total, page, *v.shape[1:]), float("nan"), dtype=v.dtype, device=device)
    table = torch.zeros(len(counts), max(1, max(counts)), dtype=torch.int32)
    at = 0
    for b, n in enumerate(counts):
        for j in range(n):
            pid = int(order[at])
            at += 1
            table[b, j] = pid
            rows = slice(cu_k[b] + j * page, min(cu_k[b] + (j + 1) * page, cu_k[b + 1]))
            count = rows.stop - rows.start
            kc[pid, :count], vc[pid, :count] = k[rows], v[rows]
            kc[pid, count:], vc[pid, count:] = unused, unused   # the last page's unused rows
    return kc, vc, table.to(device)


def mix_options(spec: KernelSpec, index: int, gen, device: str) -> dict:
    """The options a kernel of ``spec`` is checked with on its ``index``-th check: the windows, caps and sink logits
    of the dense gate (tuner/measure/verify.py: windows at the tile edges +- 1 and longer than every sequence,
    caps of 1 and 50, sinks of +-30), cycled over the checks; {} for a plain kernel."""
    out = {}
    if getattr(spec, "local", False):
        windows = CAUSAL_WINDOWS if spec.causal else WINDOWS
        out["window"] = windows[index % len(windows)]
    if getattr(spec, "softcap", False):
        out["softcap"] = SOFTCAPS[index % len(SOFTCAPS)]
    if getattr(spec, "sinks", False):
        out["sinks"] = sink_logits(CHECK_HEADS[spec.variant][0], gen, device)
    return out


def option_checks(spec: KernelSpec, mixes: int) -> int:
    """How many checks cover every window of the gate at least once (a local kernel: one more pass over the first
    mix for the windows the mixes did not reach)."""
    if not getattr(spec, "local", False):
        return mixes
    return max(mixes, len(CAUSAL_WINDOWS if spec.causal else WINDOWS))


def check_mix(kernel: Callable, spec: KernelSpec, mix, gen, device: str = "cuda", options_index: int = 0) -> ShapeCheck:
    """``kernel.varlen(...)`` (or ``kernel.paged(...)`` for a PagedMix) on one mix against the reference,
    sequence by sequence; a kernel built with options gets those of its ``options_index``-th check
    (``mix_options``), the reference alike."""
    import torch

    hq, hkv = CHECK_HEADS[spec.variant]
    if spec.dtype == "fp8":   # e4m3 with descales per sequence, against the e4m3-P emulation's bound
        from tuner.measure import verify_fp8

        cache = (lambda k, v, cu_k, unused: _paged_cache(k, v, cu_k, mix, gen, device, unused)) \
            if isinstance(mix, PagedMix) else None
        return verify_fp8.check_packed(kernel, spec, mix, (hq, hkv), gen, device, options_index, cache)
    dt = getattr(torch, _DTYPES[spec.dtype])
    options = mix_options(spec, options_index, gen, device)
    window = options.get("window")
    said = (f" window{window[0]},{window[1]}" if window is not None else "") + \
        (f" softcap{options['softcap']:g}" if "softcap" in options else "") + (" sinks" if "sinks" in options else "")
    label = f"{spec.label()} {mix.label()} hq{hq} hkv{hkv}{said}"
    kernel_options = {k: v for k, v in (("window_size", options.get("window")), ("softcap", options.get("softcap")),
                                        ("sinks", options.get("sinks"))) if v is not None}
    ref_options = {"window": options.get("window", (-1, -1)), "softcap": options.get("softcap", 0.0),
                   "sinks": options.get("sinks")}
    q, k, v, cu_q, cu_k, out = _packed_case(spec, mix, gen, device)
    as_i32 = {"dtype": torch.int32, "device": device}
    cu_seqlens_q, cu_seqlens_k = torch.tensor(cu_q, **as_i32), torch.tensor(cu_k, **as_i32)
    seqused_k = torch.tensor(mix.used, **as_i32) if mix.seqused_k is not None else None
    paged = isinstance(mix, PagedMix)
    if paged:
        k_cache, v_cache, table = _paged_cache(k, v, cu_k, mix, gen, device)
        saved = [t.clone() for t in (q, k_cache, v_cache)]
    else:
        saved = [t.clone() for t in (q, k, v)]

    def fail(reason, max_err=math.nan, rel=math.nan, bound=math.nan, lowp=math.nan):
        return ShapeCheck(label, False, max_err, rel, bound, lowp, reason)

    try:
        if paged:
            result = kernel.paged(q, k_cache, v_cache, cu_seqlens_q, seqused_k, table, max(mix.seqlens_q), out=out,
                                  **kernel_options)
        else:
            result = kernel.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max(mix.seqlens_q), max(mix.keys),
                                   seqused_k=seqused_k, out=out, **kernel_options)
        torch.cuda.synchronize()
    except Exception as exc:   # a faulting kernel is a failed check, not a crash of the caller
        return fail(f"kernel raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    if result is not None and result.data_ptr() != out.data_ptr():
        return fail("the kernel did not write into the output buffer it was given")
    inputs = (q, k_cache, v_cache) if paged else (q, k, v)
    if not all(torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
               for a, b in zip(inputs, saved)):
        return fail("the kernel modified its inputs")
    finite = torch.isfinite(out)
    if not bool(finite.all()):
        rows = sorted({int(r) for r in (~finite).any(dim=2).any(dim=1).nonzero().flatten().tolist()})
        seqs = sorted({next(b for b in range(len(mix.seqlens_q)) if cu_q[b] <= r < cu_q[b + 1]) for r in rows})
        return fail(f"{len(rows)} output rows are NaN/Inf (unwritten or overflowed), in sequences {seqs[:8]}")
    ref, lowp = torch.zeros_like(out, dtype=torch.float32), torch.zeros_like(out, dtype=torch.float32)
    for b, used in enumerate(mix.used):
        qs = q[cu_q[b]:cu_q[b + 1]][None]
        ks, vs = k[cu_k[b]:cu_k[b] + used][None], v[cu_k[b]:cu_k[b] + used][None]
        if qs.shape[1] == 0:
            continue
        if used == 0:      # no key at all: the rows are 0, as for causal rows that see none
            continue
        ref[cu_q[b]:cu_q[b + 1]] = reference(qs, ks, vs, spec.causal, **ref_options)[0]
        lowp[cu_q[b]:cu_q[b + 1]] = reference(qs, ks, vs, spec.causal, dtype=dt, **ref_options)[0].float()
    return judge(label, out, ref, lowp, spec.dtype)


def verify_varlen(kernel, spec: KernelSpec, mixes: Optional[Sequence] = None, seed: Optional[int] = None,
                  device: str = "cuda") -> VerificationReport:
    """Every length mix (CHECK_MIXES for a varlen kernel, CHECK_PAGED_MIXES for a paged one); the report
    fails at the first bad mix (all still run)."""
    import torch

    if spec.layout not in ("varlen", "paged"):
        raise ValueError(f"{spec.label()} does not take packed sequences")
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    default = CHECK_MIXES
    if spec.layout == "paged":   # those the kernel reads (a CPU stand-in without meta: all)
        meta = getattr(kernel, "meta", None) or {}
        default = readable_paged_mixes(int(meta["block_n"]), kv_copy_of(meta)) if "block_n" in meta \
            else CHECK_PAGED_MIXES
    mixes = tuple(mixes or default)
    smallest = min(mixes, key=lambda m: sum(m.keys))     # the windows the mixes did not reach: on the cheapest
    checks = tuple(check_mix(kernel, spec, mixes[i] if i < len(mixes) else smallest, gen, device, i)
                   for i in range(option_checks(spec, len(mixes))))
    bad = [c for c in checks if not c.passed]
    reason = f"{len(bad)} of {len(checks)} mixes failed; first: {bad[0].problem}: {bad[0].reason}" if bad else ""
    return VerificationReport(passed=not bad, checks=checks, reason=reason, seed=seed)
