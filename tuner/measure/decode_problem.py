"""A decode benchmark problem of a campaign: one decode call (batch sequences of kv_len cached keys, seqlen_q new
tokens each) standing for its decode bucket (tuner/serving/buckets/decode.py), with its work and its bytes.

A decode campaign measures each bucket's representative point (its class edges: batch 1/8/32/128 x KV
2k/8k/32k) and ranks kernels by TFLOPS there; GB/s of the KV cache read is the same ranking in the unit
decode is judged in (the bytes are fixed per point), and the export carries both.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kernel_abi.spec import effective_window, visible_pairs
from tuner.serving.buckets.decode import bucket_points, decode_bucket


@dataclass(frozen=True)
class DecodeProblem:
    variant: str
    batch: int
    kv_len: int
    heads_q: int
    heads_kv: int
    d_qk: int
    d_v: int
    causal: bool
    dtype: str
    seqlen_q: int = 1
    page_size: int = 0            # 0: a dense cache (b, kv_len, hkv, d)
    # the options of a kernel built with them (kernel_abi.spec): the window as the problem's causality states it
    window: tuple = (-1, -1)
    softcap: float = 0.0
    sinks: bool = False
    kv_dtype: str = ""            # "fp8": an e4m3 cache with per-KV-head scales (tuner.measure.decode.make_decode_inputs)

    phase = "decode"              # (a class attribute: what tuner/campaign/problems.py tells problems apart by)

    @property
    def layout(self) -> str:
        return "paged" if self.page_size else "dense"

    @property
    def kv_capacity(self) -> int:
        """Keys the call's cache can hold per sequence: what the runtime buckets and splits by."""
        if not self.page_size:
            return self.kv_len
        return math.ceil(self.kv_len / self.page_size) * self.page_size

    @property
    def key(self) -> str:
        """``b8-kv8k``: the point within its campaign (one point per bucket)."""
        kv = f"{self.kv_len // 1024}k" if self.kv_len % 1024 == 0 else str(self.kv_len)
        return f"b{self.batch}-kv{kv}"

    @property
    def bucket(self) -> str:
        return decode_bucket(self.batch, self.kv_capacity, self.page_size or None)

    @property
    def name(self) -> str:
        return self.key

    @property
    def keys_seen(self) -> float:
        """Key rows each query token attends to, summed over the new tokens (causal: bottom-right aligned)."""
        return visible_pairs(self.seqlen_q, self.kv_len, *effective_window(tuple(self.window), self.causal))

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.heads_q * self.keys_seen * (self.d_qk + self.d_v)

    @property
    def kv_bytes(self) -> int:
        """Bytes of the cache one call reads: K and V rows of every KV head (MLA: the latent rows once, V being
        their first d_v columns)."""
        from tuner.measure.decode import keys_read

        width = self.d_qk if self.variant == "mla" else self.d_qk + self.d_v
        element = 1 if self.kv_dtype == "fp8" else 2
        return self.batch * keys_read(self.kv_len, self.seqlen_q, self.window) * self.heads_kv * width * element

    @property
    def softmax_scale(self) -> float:
        return 1.0 / math.sqrt(self.d_qk)

    def label(self) -> str:
        from kernel_abi.spec import options_text

        cache = f"p{self.page_size}" if self.page_size else "dense"
        return f"decode b{self.batch} kv{self.kv_len} sq{self.seqlen_q} {cache}" + \
            options_text(self.window, self.softcap, self.sinks) + (f" kv{self.kv_dtype}" if self.kv_dtype else "")

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return {**asdict(self), "phase": "decode", "layout": self.layout, "name": self.key,
                "kv_bytes": self.kv_bytes}

    def point(self):
        """The tuner.measure.decode point of this call (its inputs, and FA4's call): an MLAPoint for absorbed MLA,
        else a DecodePoint."""
        from tuner.measure.decode import DecodePoint, MLAPoint

        if self.variant == "mla":
            return MLAPoint(self.batch, self.kv_len, self.heads_q, self.seqlen_q, self.page_size, self.causal,
                            self.dtype, self.kv_dtype)
        return DecodePoint(self.batch, self.kv_len, self.heads_q, self.heads_kv, self.d_qk, self.seqlen_q,
                           self.page_size, self.causal, self.dtype, tuple(self.window), self.softcap, self.sinks,
                           self.kv_dtype)


def decode_problems(variant: str, heads_q: int, heads_kv: int, d_qk: int, d_v: int, causal: bool, dtype: str,
                    page_size: int | None, window=(-1, -1), softcap: float = 0.0,
                    sinks: bool = False, kv_dtype: str = "") -> list[DecodeProblem]:
    """One problem per decode bucket: its class edges (tuner/decode_buckets.bucket_points), with the options of a
    kernel built with them and the cache's dtype."""
    return [DecodeProblem(variant, b, kv, heads_q, heads_kv, d_qk, d_v, causal, dtype, 1, page_size or 0,
                          tuple(window), float(softcap), bool(sinks), kv_dtype)
            for b, kv, _ in bucket_points(page_size)]
