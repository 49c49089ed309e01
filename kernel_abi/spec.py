"""Attention problems: what a kernel computes, independent of how."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

VARIANTS = ("mha", "gqa", "mqa", "mla")
DTYPES = ("fp16", "bf16")

# Head layouts of the variants at hidden 2048 (the paper grid) and DeepSeek-V3's MLA prefill.
GQA_GROUP = 8          # 64 query heads share 8 KV heads in the anchors: group 8
MLA_D_QK, MLA_D_V = 192, 128
HEAD_DIMS = (64, 128)   # the head dims (d_qk == d_v) of the other variants' kernels


@dataclass(frozen=True)
class Problem:
    """One attention call: q (b, sq, hq, d_qk), k (b, sk, hkv, d_qk), v (b, sk, hkv, d_v) -> o (b, sq, hq, d_v).

    Causal masks are aligned bottom-right when sq != sk, as FlashAttention does: query i sees keys
    j <= i + sk - sq.
    """

    variant: str
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    d_qk: int
    d_v: int
    causal: bool
    dtype: str

    def __post_init__(self) -> None:
        errors = validate_problem(self)
        if errors:
            raise ValueError("; ".join(errors))

    @property
    def group(self) -> int:
        """Query heads per KV head: KV head = query head // group."""
        return self.heads_q // self.heads_kv

    @property
    def softmax_scale(self) -> float:
        return 1.0 / math.sqrt(self.d_qk)

    @property
    def flops(self) -> float:
        """FLOPs as docs/benchmarks.md counts them (causal halves), for TFLOPS figures comparable to the anchors."""
        f = 2.0 * self.batch * self.heads_q * self.seqlen_q * self.seqlen_k * (self.d_qk + self.d_v)
        return f / 2 if self.causal else f

    def with_(self, **changes) -> "Problem":
        return replace(self, **changes)

    def label(self) -> str:
        c = "causal" if self.causal else "noncausal"
        return (f"{self.variant} b{self.batch} hq{self.heads_q} hkv{self.heads_kv} sq{self.seqlen_q} "
                f"sk{self.seqlen_k} d{self.d_qk}/{self.d_v} {c} {self.dtype}")


def validate_problem(p: Problem) -> list[str]:
    errors = []
    if p.variant not in VARIANTS:
        errors.append(f"unknown variant {p.variant!r}; choose one of: {', '.join(VARIANTS)}")
    if p.dtype not in DTYPES:
        errors.append(f"unknown dtype {p.dtype!r}; choose one of: {', '.join(DTYPES)}")
    for name in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "d_qk", "d_v"):
        if getattr(p, name) < 1:
            errors.append(f"{name} must be >= 1, got {getattr(p, name)}")
    if p.heads_kv >= 1 and p.heads_q % p.heads_kv:
        errors.append(f"heads_q ({p.heads_q}) must be a multiple of heads_kv ({p.heads_kv})")
    if p.variant == "mha" and p.heads_q != p.heads_kv:
        errors.append("mha needs heads_q == heads_kv")
    if p.variant == "mqa" and p.heads_kv != 1:
        errors.append("mqa needs heads_kv == 1")
    if p.variant != "mla" and p.d_qk != p.d_v:
        errors.append(f"{p.variant} needs d_qk == d_v")
    return errors


def variant_of_heads(heads_q: int, heads_kv: int) -> str:
    """The variant validate_problem accepts for this head layout (mla is never implied: its head dims say it)."""
    if heads_q == heads_kv:
        return "mha"
    return "mqa" if heads_kv == 1 else "gqa"


def heads_for(variant: str, head_dim: int, hidden: int = 2048) -> tuple[int, int, int, int]:
    """(heads_q, heads_kv, d_qk, d_v) of a variant at the paper grid's hidden size."""
    if variant == "mla":
        # DeepSeek-V3 prefill: 128 heads at hidden 7168; at the grid's token budget we keep 16 heads
        # so that batch * heads matches the d128 MHA rows.
        return 16, 16, MLA_D_QK, MLA_D_V
    hq = hidden // head_dim
    if variant == "mha":
        return hq, hq, head_dim, head_dim
    if variant == "gqa":
        return hq, max(1, hq // GQA_GROUP), head_dim, head_dim
    if variant == "mqa":
        return hq, 1, head_dim, head_dim
    raise ValueError(f"unknown variant {variant!r}; choose one of: {', '.join(VARIANTS)}")


def grid_problems(variant: str, head_dim: int, dtype: str, causal: bool | None = None,
                  total_tokens: int = 16384, seqlens=(512, 1024, 2048, 4096, 8192, 16384), *,
                  heads: tuple[int, int] | None = None) -> list[Problem]:
    """The paper grid: 16k tokens (batch = 16384 / seqlen), hidden 2048, seqlen 512..16k.

    ``heads`` (heads_q, heads_kv) replaces the grid's heads with a model's (a ``--model`` preset); the
    head dims still come from heads_for, and Problem checks the heads fit the variant.
    """
    hq, hkv, dqk, dv = heads_for(variant, head_dim)
    if heads is not None:
        hq, hkv = heads
    out = []
    for c in ([False, True] if causal is None else [causal]):
        for s in seqlens:
            out.append(Problem(variant, max(1, total_tokens // s), hq, hkv, s, s, dqk, dv, c, dtype))
    return out


# DeepSeek-V3's absorbed MLA decode: q/k are the 512 latent + 64 rotary dims of one latent KV head, V the first
# 512 columns of the same rows (FlashMLA's layout).
MLA_ABSORBED_D_QK = 576
MLA_ABSORBED_D_V = 512

@dataclass(frozen=True)
class KernelSpec:
    """What a compiled kernel bakes in at compile time; everything else (batch, heads, seqlens,
    strides) is a runtime argument."""

    variant: str
    d_qk: int
    d_v: int
    causal: bool
    dtype: str
    layout: str = "dense"     # how rows are found (tl/layout.py): dense (b, s, h, d), varlen (cu_seqlens)
    phase: str = "prefill"    # prefill, or decode: a few query tokens per sequence, split-KV (tl/phase.py)

    @classmethod
    def of(cls, problem: Problem) -> "KernelSpec":
        return cls(problem.variant, problem.d_qk, problem.d_v, problem.causal, problem.dtype)

    def label(self) -> str:
        base = f"{self.variant}_d{self.d_qk}x{self.d_v}_{'causal' if self.causal else 'noncausal'}_{self.dtype}"
        base = base if self.layout == "dense" else f"{base}_{self.layout}"
        return base if self.phase == "prefill" else f"{base}_{self.phase}"


def spec_for(variant: str, head_dim: int | None, dtype: str, causal: bool) -> KernelSpec:
    """The kernel spec of a campaign: mla is always 192/128; others default to head dim 128."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of: {', '.join(VARIANTS)}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of: {', '.join(DTYPES)}")
    if variant == "mla":
        if head_dim not in (None, MLA_D_QK):
            raise ValueError(f"mla has head dims q/k {MLA_D_QK}, v {MLA_D_V}; --head-dim {head_dim} does not apply")
        return KernelSpec(variant, MLA_D_QK, MLA_D_V, causal, dtype)
    hd = 128 if head_dim is None else head_dim
    if hd not in HEAD_DIMS:
        raise ValueError(f"head dim {hd} is not supported; choose {' or '.join(map(str, HEAD_DIMS))}")
    return KernelSpec(variant, hd, hd, causal, dtype)
