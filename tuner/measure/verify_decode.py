"""The verification gate (tuner/measure/verify.py) for decode kernels: correct only if every decode case passes.

Per case: fresh random inputs; a cache whose sequences hold the case's lengths (paged: in pages of a shuffled
cache, table entries past a sequence's pages and the spare pages no table row names hold NaN; the tail of a
sequence's last page, and of a dense cache, holds NaN too); the output and the split workspace poisoned with
NaN; every output element written and finite, the inputs unchanged; tuner.measure.verify's two bounds on the output
against the fp32 reference of each sequence alone (causal aligned bottom-right: the new tokens are the last of
their sequence), and the log-sum-exp the kernel returns against the reference's within 1e-2.

A kernel built with options (a window, a cap, sinks: kernel_abi.spec) is checked on the same cases with the
prefill gate's values of them (``option_cases``): windows at 0, 1, a tile +- 1 and longer than the cache, caps of
1 and 50, sink logits of +-30, 1 to 16 new tokens; the reference and its log-sum-exp take the options (the sinks
join the lse).

A dense GQA/MHA kernel is also checked with FA2's ``cache_leftpad`` (``LEFTPAD_CASES``): each sequence's keys start
after NaN rows of padding (leftpads 0, 1, a tile +- 1; one equal to the length: no key, output 0 and lse -inf), key
counts at tile edges, one split and several; a kernel that reads the padding or counts its rows as keys fails.

An FP8 cache kernel (spec kv_dtype fp8: e4m3 k/v_cache, fp32 k_scale/v_scale per tensor or per KV head, the real K
k_cache * k_scale) is checked on ``fp8_cases`` (the cases above with each scale kind, amplitudes that differ 1000x
across the KV heads, values near e4m3's largest, 448 x scale). Each case's real keys and values are quantised into
the cache (tuner/serving/kvcache_fp8.py: x / scale clamped to +-448, rounded to nearest even), and the reference is
the fp32 attention on the dequantised cache (e4m3 x scale in fp32: the scale rounded once), so the kernel is judged
on what it computes from the bytes it is given, not on FP8's own rounding of the inputs. The bound is then the 16-bit
decode's, for the same reason it holds there: the yardstick is the plain attention in the query's dtype on the
dequantised cache (the dequantised K, V rounded to it: 2^-9 relative in bf16), and the kernel rounds less (each
e4m3 value is exact in its fp16 operands, Q is exact in fp16 for |q| in [2^-14, 65504], the q.k products are exact in
its fp32 accumulators and the scale is applied once to their sum, P is rounded to fp16's 11 bits). Queries of a KV
head's group are divided by the head's amplitude, so that scores stay of order one at every head (a score of 100
makes the bf16 yardstick, and so the bound, loose). A kernel that ignores k_scale scales the scores of a head by
1 / k_scale, one that ignores v_scale its output: with scales far from 1 both are far outside the bound (tests/measure
plants both).

MLA (absorbed decode, translate.decode.v_from_k): one latent KV head of 576 columns whose first 512 are the values
(the cache holds K only; the reference takes V = K[..., :512]), 128 query heads (DeepSeek-V3) and 16 (a
tensor-parallel shard), pages of 64 tokens by default (FlashMLA's), the kernel called with v_cache None or the
view k_cache[..., :512].

MLA over an FP8 latent cache (``fp8_mla_cases``): the MLA cases with the latent quantised at its one scale (V, the
same rows, at the same scale: the kernel is given v_scale = k_scale, the same tensor), amplitudes of 1e-3, 1 and 1e3
in turn, so that the scale is far from 1 both ways (about 9e-6 and 9), and values near 448 x scale at both head counts,
one split and several; the poisoned pages hold e4m3's NaN byte. A kernel that ignores the scale is off by a factor of
the scale in every score, or in its output: far outside the bound (tests/decode/test_decode_fp8_mla_gate.py plants
both).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Optional, Sequence

from kernel_abi.decode import v_from_k
from kernel_abi.spec import KernelSpec
from tuner.measure.verify import (CAUSAL_WINDOWS, CHECK_HEADS, SOFTCAPS, WINDOWS, ShapeCheck, VerificationReport,
                                  judge, reference, reference_lse, sink_logits)

_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
LSE_TOLERANCE = 1e-2


@dataclass(frozen=True)
class DecodeCase:
    """One decode call: per sequence its keys (cache length); seqlen_q new tokens each; ``num_splits`` forces a
    split count (None: the kernel's rule); ``heads`` (hq, hkv) replaces the variant's check heads."""

    cache_seqlens: tuple[int, ...]
    seqlen_q: int = 1
    num_splits: Optional[int] = None
    heads: Optional[tuple[int, int]] = None
    v_view: bool = False      # MLA: pass v_cache = k_cache[..., :d_v] instead of None
    # keys at position i scaled by 1 + key_growth * i / length: the scores' row max keeps rising along the cache (at
    # 3, from about 3.5 to 14: by more than a conditional rescale's 8 log2 units, DecodeParams.rescale_threshold), so
    # factors that are not 1 are checked too; unit-normal keys move the max by less than that after the first tile.
    # (Much larger scores make the dtype's own reference, and so the bound, loose: bf16 rounds a score of 100 by 0.5.)
    key_growth: float = 0.0
    # the options of a kernel built with them (kernel_abi.spec): a window (left, right), a cap, sink logits
    # (tuner.measure.verify.sink_logits: +30 and -30 beside small ones)
    window: tuple = (-1, -1)
    softcap: float = 0.0
    sinks: bool = False
    # FA2's cache_leftpad (a dense cache): rows of padding before sequence i's keys, so that its cache_seqlens is
    # leftpad[i] + cache_seqlens[i] (the keys stay cache_seqlens[i])
    leftpad: Optional[tuple[int, ...]] = None
    # An FP8 cache (spec kv_dtype fp8): "tensor" (one k_scale, one v_scale) or "head" (one per KV head); the KV
    # heads' amplitudes spread geometrically over ``kv_spread`` (the largest / the smallest; the per-head scales
    # follow them, a per-tensor scale is the largest head's); ``near_max``: |values| in [0.6, 1] x 448 x scale
    kv_scale: str = ""
    kv_spread: float = 1.0
    near_max: bool = False
    # every KV head's amplitude times this (absorbed MLA's one latent head: its scale far from 1 either way)
    kv_amp: float = 1.0

    def label(self) -> str:
        text = f"sq{self.seqlen_q} k{list(self.cache_seqlens)}"
        if self.num_splits is not None:
            text += f" splits{self.num_splits}"
        if self.heads is not None:
            text += f" h{self.heads[0]}/{self.heads[1]}"
        if self.v_view:
            text += " v=k[...,:dv]"
        if self.key_growth:
            text += f" keys x(1..{1 + self.key_growth:g})"
        if self.window != (-1, -1):
            text += f" window{self.window[0]},{self.window[1]}"
        if self.softcap:
            text += f" softcap{self.softcap:g}"
        if self.sinks:
            text += " sinks"
        if self.leftpad is not None:
            text += f" leftpad{list(self.leftpad)}"
        if self.kv_scale:
            text += f" fp8 {self.kv_scale} scales" + (f" spread{self.kv_spread:g}" if self.kv_spread != 1 else "") \
                + (" near448" if self.near_max else "") + (f" amp{self.kv_amp:g}" if self.kv_amp != 1 else "")
        return text


# Tile and page edges (1, 63, 64, 65, 4097), very uneven lengths in one batch, split counts from one to many (and
# more than a short sequence has tiles: its later splits are empty), 1..16 query tokens (causal rows that see
# only part of the last tile, and rows that see no key when the tokens outnumber the keys), llama3-8b heads.
CHECK_CASES = (
    DecodeCase((1, 63, 64, 65, 4097)),
    DecodeCase((7, 9000, 1, 300, 2), seqlen_q=1),
    DecodeCase((4097, 65), num_splits=1),
    DecodeCase((4097, 65, 1), num_splits=3),
    DecodeCase((5000, 130), num_splits=64),
    DecodeCase((1000, 17, 64), seqlen_q=2),
    DecodeCase((2000, 3, 129), seqlen_q=4, num_splits=5),
    DecodeCase((700, 16, 9), seqlen_q=16),
    DecodeCase((3000, 1), seqlen_q=16, num_splits=8),
    DecodeCase(tuple(range(1, 2000, 97)), seqlen_q=1, heads=(32, 8)),
    DecodeCase((4097, 700), num_splits=2, key_growth=3.0),
)
# MLA: the same edges at 128 heads (two 64-row tiles per token, up to 32 row blocks at 16 tokens) and 16 heads,
# V given as None and as the view of K.
MLA_HEADS, MLA_TP_HEADS = (128, 1), (16, 1)
MLA_CHECK_CASES = (
    DecodeCase((1, 63, 64, 65, 4097), heads=MLA_HEADS),
    DecodeCase((1, 63, 64, 65, 4097), heads=MLA_TP_HEADS, v_view=True),
    DecodeCase((7, 9000, 1, 300, 2), heads=MLA_HEADS, v_view=True),
    DecodeCase((4097, 65), num_splits=1, heads=MLA_HEADS),
    DecodeCase((4097, 65, 1), num_splits=3, heads=MLA_TP_HEADS),
    DecodeCase((5000, 130), num_splits=64, heads=MLA_HEADS),
    DecodeCase((1000, 17, 64), seqlen_q=2, heads=MLA_HEADS),
    DecodeCase((2000, 3, 129), seqlen_q=4, num_splits=5, heads=MLA_HEADS),
    DecodeCase((700, 16, 9), seqlen_q=16, heads=MLA_TP_HEADS),
    DecodeCase((3000, 1), seqlen_q=16, num_splits=8, heads=MLA_HEADS),
    DecodeCase(tuple(range(1, 2000, 197)), seqlen_q=3, heads=MLA_TP_HEADS),
    DecodeCase((4097, 65, 2000), num_splits=1, heads=MLA_HEADS, key_growth=3.0),
    DecodeCase((5000, 300), seqlen_q=2, num_splits=3, heads=MLA_HEADS, key_growth=3.0),
)
# cache_leftpad (dense GQA/MHA kernels): leftpads 0, 1, a 64- and a 128-key tile +- 1 and one equal to its row's
# length (no key), key counts at tile edges, 1, 4 and 16 tokens (more tokens than keys), one split and several.
LEFTPAD_CASES = (
    DecodeCase((64, 65, 1, 130, 0), leftpad=(0, 1, 63, 65, 7)),
    DecodeCase((63, 4097, 129, 9), seqlen_q=4, num_splits=3, leftpad=(127, 129, 64, 9)),
    DecodeCase((200, 3000), num_splits=1, leftpad=(1, 300)),
    DecodeCase((1000, 9, 0), seqlen_q=16, leftpad=(65, 129, 63)),
)
MAX_PAGES_SPARE = 3      # pages no table row names, poisoned
# An FP8 cache (kv_scale set): the amplitudes' spread across the KV heads that the scales of one cache span
FP8_SPREAD = 1000.0
# e4m3's largest finite value and the quantiles of the values a scale maps there: unit-normal data x 4 sigma -> 448
E4M3_MAX, FP8_SIGMAS = 448.0, 4.0


def check_cases(spec: KernelSpec) -> tuple[DecodeCase, ...]:
    """The decode gate's cases for ``spec``; a kernel built with options gets ``option_cases``, one over an FP8
    cache ``fp8_cases`` of them."""
    if spec.variant == "mla":
        return fp8_mla_cases() if spec.kv_dtype == "fp8" else MLA_CHECK_CASES
    cases = option_cases(spec) if spec.features else CHECK_CASES
    cases = cases + leftpad_cases(spec) if spec.layout == "dense" else cases
    return fp8_cases(cases, spec) if spec.kv_dtype == "fp8" else cases


def fp8_cases(cases: Sequence[DecodeCase], spec: KernelSpec | None = None) -> tuple[DecodeCase, ...]:
    """``cases`` over an FP8 cache: scales per tensor and per KV head in turn, every third case with amplitudes
    spread FP8_SPREAD across the KV heads; then values near e4m3's largest (one scale and per-head ones, one split
    and several) and llama3-8b's heads with per-head scales over the whole spread, these with the options of a
    ``spec`` built with them (the next window, cap and the sinks, as option_cases gives them)."""
    out = [replace(c, kv_scale="head" if i % 2 else "tensor", kv_spread=FP8_SPREAD if i % 3 == 0 else 1.0)
           for i, c in enumerate(cases)]
    more = [DecodeCase((1, 63, 64, 65, 4097), kv_scale="head", kv_spread=FP8_SPREAD, near_max=True),
            DecodeCase((4097, 700, 129), num_splits=3, kv_scale="tensor", near_max=True),
            DecodeCase((2000, 1, 300), seqlen_q=4, num_splits=1, kv_scale="head", near_max=True),
            DecodeCase(tuple(range(1, 2000, 97)), heads=(32, 8), kv_scale="head", kv_spread=FP8_SPREAD)]
    if spec is not None and spec.features:
        windows = (CAUSAL_WINDOWS if spec.causal else WINDOWS) if spec.local else ((-1, -1),)
        caps = SOFTCAPS if spec.softcap else (0.0,)
        more = [replace(c, window=windows[(i + 1) % len(windows)], softcap=caps[(i + 1) % len(caps)],
                        sinks=spec.sinks) for i, c in enumerate(more)]
    return tuple(out + more)


# MLA over an FP8 latent cache: the latent's amplitudes case by case (its one scale about 9e-6, 9e-3 and 9)
FP8_MLA_AMPS = (1e-3, 1.0, 1e3)


def fp8_mla_cases() -> tuple[DecodeCase, ...]:
    """MLA_CHECK_CASES over an FP8 latent cache (one scale: the latent has one KV head), the amplitudes FP8_MLA_AMPS
    in turn; then values near 448 x scale at 128 and 16 heads, one split and several, the scale far from 1."""
    out = [replace(c, kv_scale="tensor", kv_amp=FP8_MLA_AMPS[i % len(FP8_MLA_AMPS)])
           for i, c in enumerate(MLA_CHECK_CASES)]
    more = [DecodeCase((1, 63, 64, 65, 4097), heads=MLA_HEADS, kv_scale="tensor", kv_amp=1e3, near_max=True),
            DecodeCase((4097, 700, 129), num_splits=3, heads=MLA_TP_HEADS, v_view=True, kv_scale="tensor",
                       kv_amp=1e-3, near_max=True),
            DecodeCase((2000, 1, 300), seqlen_q=4, num_splits=1, heads=MLA_HEADS, kv_scale="tensor", near_max=True)]
    return tuple(out + more)


def fp8_amplitudes(case: DecodeCase, hkv: int, gen, device, one_scale: bool = False):
    """(per KV head amplitudes (hkv,), k_scale, v_scale) of an FP8 case: amplitudes geometric over the case's
    spread in a shuffled head order (so no head position is special), times kv_amp, scales that map FP8_SIGMAS
    amplitudes to 448 (per head, or the largest head's for one per tensor), each jittered so that none is a power of
    two. ``one_scale`` (absorbed MLA: V is the latent rows too): v_scale is k_scale, the same tensor."""
    import torch

    steps = torch.linspace(0, 1, hkv, device=device) if hkv > 1 else torch.zeros(1, device=device)
    amps = (case.kv_spread ** (steps - 0.5))[torch.randperm(hkv, generator=gen, device=device)] * case.kv_amp
    def scales():
        jitter = 1 + 0.3 * torch.rand(hkv, generator=gen, device=device)
        s = amps * FP8_SIGMAS / E4M3_MAX * jitter
        return s.max().reshape(1) if case.kv_scale == "tensor" else s
    k_scale = scales()
    return amps, k_scale, k_scale if one_scale else scales()



def leftpad_cases(spec: KernelSpec) -> tuple[DecodeCase, ...]:
    """LEFTPAD_CASES with the spec's options, each case the next window, cap (and the sinks), as option_cases."""
    windows = (CAUSAL_WINDOWS if spec.causal else WINDOWS) if spec.local else ((-1, -1),)
    caps = SOFTCAPS if spec.softcap else (0.0,)
    return tuple(replace(c, window=windows[(i + 2) % len(windows)], softcap=caps[i % len(caps)], sinks=spec.sinks)
                 for i, c in enumerate(LEFTPAD_CASES))


def option_cases(spec: KernelSpec) -> tuple[DecodeCase, ...]:
    """CHECK_CASES with the spec's options (the prefill gate's values, tuner.measure.verify): each case takes the
    next window (windows of 0 and 1 keys, a 64- and a 128-key tile +- 1, one longer than its case's every sequence,
    none: a local kernel also runs without one), the next cap (1, 50) and the sinks, so that every window meets 1
    and several new tokens and one split and several; then every window once more on 1 and 4 tokens of lengths at a
    tile's edges."""
    windows = (CAUSAL_WINDOWS if spec.causal else WINDOWS) if spec.local else ((-1, -1),)
    caps = SOFTCAPS if spec.softcap else (0.0,)
    out = [replace(c, window=windows[i % len(windows)], softcap=caps[i % len(caps)], sinks=spec.sinks)
           for i, c in enumerate(CHECK_CASES)]
    if spec.local:
        # the other of 1 and 4 tokens than the window's case above
        out += [DecodeCase((65, 1, 200, 4097)[:2 + i % 3], seqlen_q=4 if i >= len(out) or out[i].seqlen_q == 1 else 1,
                           num_splits=(None, 1, 3)[i % 3], window=w, softcap=caps[(i + 1) % len(caps)],
                           sinks=spec.sinks)
                for i, w in enumerate(windows)]
    return tuple(out)


def _build_cache(case: DecodeCase, hkv: int, d_qk: int, d_v: int, dt, paged: bool, page_size: int, gen, device,
                 from_k: bool = False, fp8=None):
    """(k_cache, v_cache, page_table or None, cache_seqlens, per-sequence dense (k, v) for the reference).
    ``from_k``: V is the first d_v columns of K (absorbed MLA): v_cache and the reference's v are views of K.
    ``fp8`` (amplitudes, k_scale, v_scale: fp8_amplitudes): an e4m3 cache of the real values quantised, and the
    reference's (k, v) the dequantised cache in fp32."""
    import torch

    if fp8 is not None:
        from tuner.serving.kvcache_fp8 import E4M3, dequantise, quantise

        amps, k_scale, v_scale = fp8
        real = lambda *shape: _fp8_values(case, shape, amps, gen, device)  # noqa: E731
        if from_k:   # the latent rows: V is their first d_v columns (v_scale is k_scale: fp8_amplitudes one_scale)
            seqs8 = [(k8, k8[..., :d_v]) for k8 in (quantise(real(L, hkv, d_qk), k_scale) for L in case.cache_seqlens)]
        else:
            seqs8 = [(quantise(real(L, hkv, d_qk), k_scale), quantise(real(L, hkv, d_v), v_scale))
                     for L in case.cache_seqlens]
        # the cache holds the bytes; the reference reads them dequantised (in fp32)
        case_seqs = iter(seqs8)
        k, v, table, seqlens, _ = _build_cache_of(case, hkv, d_qk, d_v, E4M3, paged, page_size, gen, device, from_k,
                                                  values=lambda: next(case_seqs))
        return k, v, table, seqlens, [(dequantise(a, k_scale), dequantise(b, v_scale)) for a, b in seqs8]
    return _build_cache_of(case, hkv, d_qk, d_v, dt, paged, page_size, gen, device, from_k)


def _fp8_values(case: DecodeCase, shape, amps, gen, device):
    """Real values (fp32) of an FP8 case, each KV head at its amplitude: unit normal, or with near_max of magnitude
    in [0.6, 1] x the scale's reach (FP8_SIGMAS amplitudes) and random signs."""
    import torch

    x = torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)
    if case.near_max:
        mag = 0.6 + 0.4 * torch.rand(*shape, generator=gen, device=device)
        x = torch.where(x < 0, -mag, mag) * FP8_SIGMAS
    return x * amps[:, None]


def _build_cache_of(case: DecodeCase, hkv: int, d_qk: int, d_v: int, dt, paged: bool, page_size: int, gen, device,
                    from_k: bool = False, values=None):
    """_build_cache's layout; ``values`` (a function giving each sequence's (k, v) in turn, already in ``dt``)
    instead of fresh random ones."""
    import torch

    lens = list(case.cache_seqlens)
    b = len(lens)
    pads = list(case.leftpad or (0,) * b)
    if case.leftpad is not None and (paged or len(pads) != b):
        raise ValueError(f"{case.label()}: a leftpad is one row count per sequence of a dense cache")

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dt)

    def keys(length):
        ks = torch.randn(length, hkv, d_qk, generator=gen, device=device, dtype=torch.float32)
        if case.key_growth:
            ks *= 1 + case.key_growth * torch.arange(length, device=device, dtype=torch.float32)[:, None, None] / length
        return ks.to(dt)

    if values is not None:
        seqs = [values() for _ in lens]
    elif from_k:
        seqs = [(ks, ks[..., :d_v]) for ks in (keys(L) for L in lens)]
    else:
        seqs = [(keys(L), randn(L, hkv, d_v)) for L in lens]
    seqlens = torch.tensor([p + L for p, L in zip(pads, lens)], dtype=torch.int32, device=device)

    def poisoned(*shape):   # NaN (an e4m3 cache's NaN byte, 0x7f: filled as bytes)
        if dt == torch.float8_e4m3fn:
            return torch.full(shape, 0x7F, dtype=torch.uint8, device=device).view(dt)
        return torch.full(shape, float("nan"), dtype=dt, device=device)

    def caches(*rows):
        k = poisoned(*rows, hkv, d_qk)
        return k, (k[..., :d_v] if from_k else poisoned(*rows, hkv, d_v))

    if not paged:     # the padding before a leftpad's keys and the rows past them hold NaN
        cap = max(p + L for p, L in zip(pads, lens)) + 5
        k, v = caches(b, cap)
        for i, (ks, vs) in enumerate(seqs):
            k[i, pads[i]:pads[i] + lens[i]] = ks
            if not from_k:
                v[i, pads[i]:pads[i] + lens[i]] = vs
        return k, v, None, seqlens, seqs
    pages = [math.ceil(L / page_size) for L in lens]
    width = max(pages) + 1                               # a column past every sequence's last page
    total = sum(pages) + MAX_PAGES_SPARE
    order = torch.randperm(total, generator=gen, device=device).cpu()
    k, v = caches(total, page_size)
    spare = order[sum(pages):]
    table = torch.empty((b, width), dtype=torch.int32)
    at = 0
    for i, (ks, vs) in enumerate(seqs):
        mine = order[at:at + pages[i]]
        at += pages[i]
        table[i, :pages[i]] = mine.to(torch.int32)
        table[i, pages[i]:] = int(spare[i % len(spare)])     # names a poisoned page the kernel must not read
        for j, page in enumerate(mine.tolist()):
            rows = ks[j * page_size:(j + 1) * page_size]
            k[page, :rows.shape[0]] = rows
            if not from_k:
                v[page, :rows.shape[0]] = vs[j * page_size:(j + 1) * page_size]
    return k, v, table.to(device), seqlens, seqs


def check_case(kernel, spec: KernelSpec, case: DecodeCase, gen, page_size: int, device: str = "cuda") -> ShapeCheck:
    import torch

    label = case.label()
    dt = getattr(torch, _DTYPES[spec.dtype])
    from_k = v_from_k(spec)
    hq, hkv = case.heads or (MLA_HEADS if from_k else CHECK_HEADS[spec.variant])
    b = len(case.cache_seqlens)

    def fail(reason):
        return ShapeCheck(label, False, math.nan, math.nan, math.nan, math.nan, reason)

    q = torch.randn(b, case.seqlen_q, hq, spec.d_qk, generator=gen, device=device, dtype=torch.float32)
    fp8 = None
    if spec.kv_dtype == "fp8":   # scores of order one at every KV head: its group's queries / its amplitude
        fp8 = fp8_amplitudes(case, hkv, gen, device, one_scale=from_k)
        q = q / fp8[0].repeat_interleave(hq // hkv)[:, None]
    q = q.to(dt)
    k, v, table, seqlens, seqs = _build_cache(case, hkv, spec.d_qk, spec.d_v, dt, spec.layout == "paged",
                                              page_size, gen, device, from_k, fp8)
    leftpad = None if case.leftpad is None else torch.tensor(case.leftpad, dtype=torch.int32, device=device)
    extras = tuple(t for t in (table, leftpad) if t is not None)
    saved = [t.clone() for t in (q, k, v, seqlens) + extras]
    out = torch.full((b, case.seqlen_q, hq, spec.d_v), float("nan"), dtype=dt, device=device)
    capacity = table.shape[1] * page_size if table is not None else k.shape[1]
    split, _, _ = kernel.split_plan(b, hq, hkv, case.seqlen_q, capacity, case.num_splits)
    rows = b * case.seqlen_q * hq
    workspace = (torch.full((split.num_splits, rows, spec.d_v), float("nan"), device=device),
                 torch.full((split.num_splits, rows), float("nan"), device=device))
    sinks = sink_logits(hq, gen, device) if case.sinks else None
    options = {"window": case.window, "softcap": case.softcap, "sinks": sinks}
    given = {}
    if spec.features:     # the launcher's names; a kernel without options takes none
        given = {"window_size": case.window, "softcap": case.softcap, "learnable_sink": sinks}
    if leftpad is not None:
        given["cache_leftpad"] = leftpad
    if fp8 is not None:
        given["k_scale"], given["v_scale"] = fp8[1], fp8[2]
        extras += (fp8[1], fp8[2])
        saved += [fp8[1].clone(), fp8[2].clone()]
    try:
        v_arg = v if (case.v_view or not from_k) else None
        result, lse = kernel(q, k, v_arg, cache_seqlens=seqlens, page_table=table, num_splits=case.num_splits,
                             return_lse=True, out=out, workspace=workspace, **given)
        if out.is_cuda:
            torch.cuda.synchronize()
    except Exception as exc:   # a faulting kernel is a failed check, not a crash of the caller
        return fail(f"kernel raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    label += f" ({split.num_splits} split{'s' if split.num_splits > 1 else ''})"
    if result.data_ptr() != out.data_ptr():
        return fail("the kernel did not write into the output buffer it was given")
    after = (q, k, v, seqlens) + extras
    if not all(_same(x, y) for x, y in zip(after, saved)):
        return fail("the kernel modified its inputs")
    finite = torch.isfinite(out)
    if not bool(finite.all()):
        return fail(f"{int((~finite).sum())} of {out.numel()} output elements are NaN/Inf (unwritten, or a poisoned "
                    "page or workspace reached them)")
    refs, lowps, lses = [], [], []
    for i, (ks, vs) in enumerate(seqs):
        qi, ki, vi = q[i:i + 1], ks[None], vs[None]
        refs.append(reference(qi, ki, vi, spec.causal, **options))
        lowps.append(reference(qi, ki, vi, spec.causal, dtype=dt, **options).float())
        # (1, hq, sq), the sinks included; -inf for rows that see no key and have no sink
        lses.append(reference_lse(qi, ki, spec.causal, **options))
    verdict = judge(label, out, torch.cat(refs), torch.cat(lowps), spec.dtype)
    if not verdict.passed:
        return verdict
    ref_lse = torch.cat(lses)
    if not torch.equal(torch.isinf(ref_lse), torch.isinf(lse)) or bool(torch.isnan(lse).any()):
        return fail("the returned log-sum-exp is not -inf exactly where a row sees no key (and no sink)")
    fin = torch.isfinite(ref_lse)
    lse_err = float((lse[fin] - ref_lse[fin]).abs().max()) if bool(fin.any()) else 0.0
    if lse_err > LSE_TOLERANCE:
        return fail(f"log-sum-exp error {lse_err:.3g} > {LSE_TOLERANCE}")
    return verdict


def _same(x, y) -> bool:
    """x and y hold the same values, NaN where NaN (e4m3 tensors: the same bytes)."""
    import torch

    if x.dtype == torch.float8_e4m3fn:
        return torch.equal(x.view(torch.uint8), y.view(torch.uint8))
    return torch.equal(x.nan_to_num(0.5), y.nan_to_num(0.5))


def verify_decode(kernel, spec: KernelSpec, cases: Optional[Sequence[DecodeCase]] = None,
                  page_size: Optional[int] = None, seed: Optional[int] = None,
                  device: str = "cuda") -> VerificationReport:
    """Every decode case on ``kernel`` (a tuner.serving.launch.decode_kernel.DecodeKernel); paged kernels at ``page_size``
    (None: 64 for MLA, FlashMLA's page, else 16). ``cases`` None: the spec's (check_cases)."""
    page_size = page_size or (64 if spec.variant == "mla" else 16)
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("verify_decode needs a CUDA GPU")
    if spec.phase != "decode":
        raise ValueError(f"{spec.label()} is not a decode kernel")
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    checks = tuple(check_case(kernel, spec, c, gen, page_size, device) for c in (cases or check_cases(spec)))
    bad = [c for c in checks if not c.passed]
    reason = f"{len(bad)} of {len(checks)} cases failed; first: {bad[0].problem}: {bad[0].reason}" if bad else ""
    return VerificationReport(passed=not bad, checks=checks, reason=reason, seed=seed)
