"""Attention problems: what a kernel computes, independent of how.

Beyond plain attention, a problem may carry the options today's models use, with FlashAttention's conventions:

* ``window`` (left, right): query row i of a sequence sees key j only when i + off - left <= j <= i + off + right,
  with off = seqlen_k - seqlen_q (bottom-right alignment, as causal); -1 leaves that side open. ``causal`` closes
  the right side at 0 (FlashAttention sets window_size[1] = 0 when causal).
* ``softcap``: the scores (after the softmax scale) become softcap * tanh(scores / softcap); 0 is none.
* ``sinks``: one learned logit per query head joins every row's softmax as one more key with no value (FA4's
  ``learnable_sink``): it raises the row's max and denominator, and the log-sum-exp includes it.

A kernel compiled with such an option (``KernelSpec.local``, ``softcap``, ``sinks``) takes the window sizes, the cap
and the sinks at run time.
"""
from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, replace

VARIANTS = ("mha", "gqa", "mqa", "mla")
DTYPES = ("fp16", "bf16", "fp8")
# fp8: e4m3 q, k and v with fp32 descales per (batch, KV head) (FlashAttention-3's q/k/v_descale), a bf16 output.
# The head dims the FP8 kernels take: rows of e4m3 in 128-byte swizzle atoms (64: one 64-byte atom; 128 and 256: one
# and two 128-byte atoms), at 192 three 64-byte atoms and at 96 (Phi-3-mini) three 32-byte atoms a row
# (translate/sm90/frame.py fp8_chunk), as FA3's FP8 kernels take 64, 96, 128, 192 and 256 (hopper/tile_size.h); 256 is
# Gemma's, 192 the one the 16-bit kernels take besides.
FP8_HEAD_DIMS = (64, 96, 128, 192, 256)
TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp8": "float8_e4m3fn"}   # torch's names of the inputs
OUTPUT_DTYPES = {"fp16": "fp16", "bf16": "bf16", "fp8": "bf16"}                  # and of the output

# Head layouts of the variants at hidden 2048 (the paper grid) and DeepSeek-V3's MLA prefill.
GQA_GROUP = 8          # 64 query heads share 8 KV heads in the anchors: group 8
MLA_D_QK, MLA_D_V = 192, 128
HEAD_DIMS = (64, 96, 128, 192, 256)   # the head dims (d_qk == d_v) of the other variants' kernels
# Query heads of the grid where hidden / head dim would not divide into the variants' KV heads: 2048 / 96 is 21, which
# no GQA group of 8 divides; FlashAttention-4's benchmark runs head dim 96 at 16 heads (hidden 1536).
GRID_HEADS = {96: 16}
NO_WINDOW = (-1, -1)    # FlashAttention's window_size for none


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
    window: tuple[int, int] = NO_WINDOW     # (left, right) keys around the diagonal; -1: unbounded (module doc)
    softcap: float = 0.0                    # scores = softcap * tanh(scores / softcap); 0: none
    sinks: bool = False                     # a learned logit per query head joins each row's softmax

    def __post_init__(self) -> None:
        if isinstance(self.window, list):   # read back from JSON, where a tuple is a list
            object.__setattr__(self, "window", tuple(self.window))
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
    def local(self) -> bool:
        """A sliding window bounds the keys a row sees beyond what causal does."""
        return is_local(self.window, self.causal)

    @property
    def effective_window(self) -> tuple[int, int]:
        """(left, right) as the kernel applies them: causal closes the right side at 0."""
        return effective_window(self.window, self.causal)

    @property
    def flops(self) -> float:
        """FLOPs as docs/benchmarks.md counts them: causal halves the square (for TFLOPS comparable to the
        published figures); a window counts the (query, key) pairs it leaves visible."""
        per_pair = 2.0 * self.batch * self.heads_q * (self.d_qk + self.d_v)
        if self.local:
            return per_pair * visible_pairs(self.seqlen_q, self.seqlen_k, *self.effective_window)
        f = per_pair * self.seqlen_q * self.seqlen_k
        return f / 2 if self.causal else f

    def with_(self, **changes) -> "Problem":
        return replace(self, **changes)

    def label(self) -> str:
        c = "causal" if self.causal else "noncausal"
        extra = "".join([f" window{self.window[0]},{self.window[1]}" if self.window != NO_WINDOW else "",
                         f" softcap{self.softcap:g}" if self.softcap else "", " sinks" if self.sinks else ""])
        return (f"{self.variant} b{self.batch} hq{self.heads_q} hkv{self.heads_kv} sq{self.seqlen_q} "
                f"sk{self.seqlen_k} d{self.d_qk}/{self.d_v} {c} {self.dtype}{extra}")


def is_local(window, causal: bool) -> bool:
    """Whether ``window`` bounds the visible keys beyond ``causal``: a left bound, or a right one without causal."""
    left, right = window
    return left >= 0 or (right >= 0 and not causal)


def options_text(window, softcap: float, sinks: bool) -> str:
    """`` window 127,0 softcap 50 sinks``: a problem's options in its label (the measure layer's decode points and
    serving mixes); "" for none."""
    return "".join((f" window {window[0]},{window[1]}" if tuple(window) != NO_WINDOW else "",
                    f" softcap {softcap:g}" if softcap else "", " sinks" if sinks else ""))


def effective_window(window, causal: bool) -> tuple[int, int]:
    left, right = window
    return (left, 0 if causal else right)


def window_errors(window, causal: bool) -> list[str]:
    """Why ``window`` is not a (left, right) pair of ints >= -1 (FlashAttention's window_size); empty when it is."""
    if not (isinstance(window, tuple) and len(window) == 2
            and all(isinstance(w, int) and not isinstance(w, bool) for w in window)):
        return [f"window must be a (left, right) pair of ints, got {window!r}"]
    if any(w < -1 for w in window):
        return [f"window sizes must be >= -1 (-1: unbounded), got {window}"]
    if causal and window[1] > 0:
        return [f"a causal window's right side is 0 (or -1), got {window[1]}"]
    return []


def softcap_errors(softcap) -> list[str]:
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not math.isfinite(softcap) \
            or softcap < 0:
        return [f"softcap must be a finite number >= 0 (0: none), got {softcap!r}"]
    return []


@functools.lru_cache(maxsize=4096)
def visible_pairs(seqlen_q: int, seqlen_k: int, left: int, right: int) -> int:
    """(query, key) pairs of one sequence that the window (left, right) leaves visible (-1: that side unbounded),
    aligned bottom-right: row i sees keys max(0, i + off - left) .. min(seqlen_k - 1, i + off + right)."""
    off = seqlen_k - seqlen_q
    total = 0
    for i in range(seqlen_q):
        lo = 0 if left < 0 else max(0, i + off - left)
        hi = seqlen_k - 1 if right < 0 else min(seqlen_k - 1, i + off + right)
        total += max(0, hi - lo + 1)
    return total


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
    errors += window_errors(p.window, p.causal) + softcap_errors(p.softcap)
    if p.dtype == "fp8":
        errors += fp8_errors(p.variant, p.d_qk, p.d_v, p.local or p.softcap or p.sinks)
    return errors


def fp8_errors(variant: str, d_qk: int, d_v: int, options: bool) -> list[str]:
    """Why an FP8 problem is not one the FP8 kernels take (e4m3 attention of a head dim of FP8_HEAD_DIMS, or MLA's
    192/128 prefill, FA3's FP8 hdim-192 kernel with a narrower V)."""
    errors = []
    mla = variant == "mla" and (d_qk, d_v) == (MLA_D_QK, MLA_D_V)
    if not mla and (variant == "mla" or d_qk != d_v or d_qk not in FP8_HEAD_DIMS):
        dims = ", ".join(map(str, FP8_HEAD_DIMS[:-1])) + f" and {FP8_HEAD_DIMS[-1]}"
        errors.append(f"fp8 kernels take head dims {dims} with d_qk == d_v (mla {MLA_D_QK}/{MLA_D_V}), not "
                      f"{variant} {d_qk}/{d_v}")
    if options:
        errors.append("fp8 kernels take no sliding window, soft-capping or sinks (bf16/fp16 kernels do)")
    return errors


# TMA-loaded K rows (a paged cache's in boxes within its pages) and V read transposed: a copy made per call, of the
# dense V, or of each sequence's keys packed (varlen, and a paged cache's pages gathered: the same V^T layout)
FP8_LAYOUTS = ("dense", "varlen", "paged")


def fp8_layout_errors(layout: str) -> list[str]:
    """Why an FP8 kernel is not built for ``layout``: its V is read transposed (8-bit wgmma operands are K-major), from
    a copy the runtime makes per call (the dense V, or each sequence's keys packed, gathered from the pages of a paged
    cache)."""
    if layout in FP8_LAYOUTS:
        return []
    return [f"fp8 kernels take the {', '.join(FP8_LAYOUTS)} layouts, not {layout}: V is read transposed from a copy "
            "the runtime makes of those layouts' V"]


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
    hq = GRID_HEADS.get(head_dim, hidden // head_dim) if hidden == 2048 else hidden // head_dim
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
    # The options of the module doc, compiled in; their values (window sizes, the cap, the sinks) are run-time
    # arguments. A kernel without one refuses a call that needs it.
    local: bool = False       # a sliding window (window_left, window_right)
    softcap: bool = False     # logit soft-capping (softcap_prescale; the softmax scale argument carries the cap)
    sinks: bool = False       # a learned logit per query head (sinks: fp32, one per query head)
    # Decode only: the KV cache's dtype where it is not ``dtype`` ("" : the same). "fp8": an e4m3 cache with fp32
    # k_scale / v_scale per tensor or per KV head (vLLM's kv_cache_dtype "fp8"), read by queries of ``dtype``.
    kv_dtype: str = ""

    @classmethod
    def of(cls, problem: Problem) -> "KernelSpec":
        return cls(problem.variant, problem.d_qk, problem.d_v, problem.causal, problem.dtype,
                   local=problem.local, softcap=bool(problem.softcap), sinks=problem.sinks)

    @property
    def features(self) -> tuple[str, ...]:
        """The options of this spec, by name: ("local", "softcap", "sinks") or a part of it."""
        return tuple(f for f in FEATURES if getattr(self, f))

    def label(self) -> str:
        base = f"{self.variant}_d{self.d_qk}x{self.d_v}_{'causal' if self.causal else 'noncausal'}_{self.dtype}"
        base = "_".join((base, *self.features))
        base = f"{base}_kv{self.kv_dtype}" if self.kv_dtype else base
        base = base if self.layout == "dense" else f"{base}_{self.layout}"
        return base if self.phase == "prefill" else f"{base}_{self.phase}"

    def __repr__(self) -> str:   # (the options only where set: generated sources name the spec)
        fields = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items())
        return f"KernelSpec({fields})"

    def to_dict(self) -> dict:
        """The spec as stored (kernel metadata, records, cache keys): the options only where set, so that a spec
        without them reads as it always did."""
        out = asdict(self)
        for f in FEATURES:
            if not out[f]:
                del out[f]
        if not out["kv_dtype"]:
            del out["kv_dtype"]
        return out


FEATURES = ("local", "softcap", "sinks")
KV_DTYPES = ("fp8",)   # KernelSpec.kv_dtype: caches of another dtype than the queries (decode)
KV_DTYPE_QUERIES = ("fp16", "bf16")   # the query dtypes an FP8 cache is read by (its values are exact in both)


def kv_dtype_errors(spec: KernelSpec) -> list[str]:
    """Why ``spec``'s kv_dtype is not one a kernel reads (empty: it is, or the spec has none): an e4m3 cache is
    read by the grouped split-KV decode kernel (d_qk == d_v) or, absorbed MLA, by the split-d_v kernel over an e4m3
    latent cache (576/512: validate_decode checks the form), under fp16 or bf16 queries."""
    if not spec.kv_dtype:
        return []
    errors = []
    if spec.kv_dtype not in KV_DTYPES:
        errors.append(f"unknown kv_dtype {spec.kv_dtype!r}; choose one of: {', '.join(KV_DTYPES)} (or none)")
    if spec.phase != "decode":
        errors.append(f"kv_dtype {spec.kv_dtype}: an FP8 KV cache is read by decode kernels, not {spec.phase}")
    if spec.dtype not in KV_DTYPE_QUERIES:
        errors.append(f"kv_dtype {spec.kv_dtype}: the queries are fp16 or bf16, got {spec.dtype}")
    if spec.variant != "mla" and spec.d_qk != spec.d_v:
        errors.append(f"kv_dtype fp8: d_qk == d_v, got {spec.d_qk}/{spec.d_v}")
    return errors


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
        raise ValueError(f"head dim {hd} is not supported; choose {', '.join(map(str, HEAD_DIMS))}")
    if dtype == "fp8" and fp8_errors(variant, hd, hd, False):
        raise ValueError(fp8_errors(variant, hd, hd, False)[0])
    return KernelSpec(variant, hd, hd, causal, dtype)
