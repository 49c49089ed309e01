"""FP8 (e4m3) KV caches, vLLM's ``kv_cache_dtype="fp8"``: the cache holds e4m3 values and fp32 scales, and the real
key is ``k_cache * k_scale`` (the value ``v_cache * v_scale``). A scale is one element (per tensor) or one per KV
head ((heads_kv,)); the launch checks them (tuner.serving.launch.plan.check_kv_scales).

Quantising new rows (``flash_attn_with_kvcache(k=, v=)`` into an FP8 cache) divides by the scale and clamps to
e4m3's largest finite value, 448, before rounding to nearest even, as vLLM's cache write does: e4m3fn has no
infinity, so a value past 448 would otherwise round to NaN. Dequantising multiplies in fp32: an e4m3 value has 4
significant bits, so e4m3 x scale is the scale rounded once (2^-24 relative), not a second quantisation.
"""
from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0


def head_scales(scale: torch.Tensor, heads_kv: int) -> torch.Tensor:
    """(heads_kv,) fp32: a per-tensor scale repeated (a view), a per-head one as it is."""
    flat = scale.reshape(-1).float()
    return flat.expand(heads_kv) if flat.numel() == 1 else flat


def quantise(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x (..., heads_kv, d) real values -> e4m3 = clamp(x / scale, -448, 448) rounded to nearest even; NaN stays
    NaN."""
    s = head_scales(scale, x.shape[-2])[:, None]
    return (x.float() / s).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def dequantise(x8: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """x8 (..., heads_kv, d) e4m3 -> x8 * scale of its KV head, in ``dtype`` (computed in fp32)."""
    s = head_scales(scale, x8.shape[-2])[:, None]
    return (x8.float() * s).to(dtype)
