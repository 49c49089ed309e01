"""The drop-in entry points of an export, beside ``ExportedAttention.__call__``: torch SDPA's signature and
semantics, FlashAttention 2's ``flash_attn_func`` (with FA4's ``learnable_sink``), and the fallbacks they need (a
mask, dropout), counted by reason."""
from __future__ import annotations

import torch

from tuner.serving.reasons import REASONS
from tuner.serving.sdpa import check_shapes, sdpa_attention


class DropIns:
    """Mixed into ExportedAttention: uses its ``__call__``, ``fallback``, ``stats``, ``reasons`` and ``last_*``."""

    def _dropout(self, q, k, v, causal, scale, dropout_p, attn_mask=None):
        """Dropout draws random numbers a recomputing backward could not redraw: torch SDPA runs directly
        (traced as itself). Counted in eager calls only: under torch.compile this line is traced, not run."""
        if not torch.compiler.is_compiling():
            self.stats["sdpa"] += 1
            self.reasons["dropout"] += 1
            self.last_path, self.last_reason, self.last_bucket = "sdpa", REASONS["dropout"], None
        return sdpa_attention(q, k, v, causal=causal, softmax_scale=scale, dropout_p=dropout_p, attn_mask=attn_mask)

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p: float = 0.0,
                                     is_causal: bool = False, scale: float | None = None,
                                     enable_gqa: bool = False):
        """``torch.nn.functional.scaled_dot_product_attention``'s signature and semantics, (b, h, s, d).
        What the kernels cannot do (a mask, dropout, top-left causal with sq != sk, other ranks) runs
        torch SDPA itself and is counted in ``reasons``."""
        if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 or dropout_p > 0.0:
            import torch.nn.functional as F

            if not torch.compiler.is_compiling():
                code = "layout" if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 else "dropout"
                self.stats["sdpa"] += 1
                self.reasons[code] += 1
                self.last_path, self.last_reason, self.last_bucket = "sdpa", REASONS[code], None
            return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                                  is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        if query.shape[1] != key.shape[1] and not enable_gqa:
            raise ValueError(f"query has {query.shape[1]} heads and key {key.shape[1]}: pass enable_gqa=True "
                             "for grouped-query attention (as torch SDPA requires)")
        if attn_mask is not None:
            if is_causal:
                raise ValueError("give attn_mask or is_causal, not both (as torch SDPA requires)")
            q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
            return self.fallback("mask", q, k, v, False, scale, attn_mask).transpose(1, 2)
        if is_causal and query.shape[2] != key.shape[2]:
            q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
            top_left = torch.ones(query.shape[2], key.shape[2], dtype=torch.bool, device=query.device).tril()
            return self.fallback("sdpa-causal-top-left", q, k, v, False, scale, top_left).transpose(1, 2)
        return self(query, key, value, causal=is_causal, scale=scale, layout="bhsd")

    def flash_attn_func(self, q, k, v, dropout_p: float = 0.0, softmax_scale: float | None = None,
                        causal: bool = False, window_size=(-1, -1), softcap: float = 0.0, alibi_slopes=None,
                        deterministic: bool = False, return_attn_probs: bool = False, learnable_sink=None,
                        q_descale=None, k_descale=None, v_descale=None):
        """``flash_attn.flash_attn_func``'s signature (FlashAttention 2, and FA4's ``learnable_sink``): q (b, sq, hq,
        d), k/v (b, sk, hkv, d), bottom-right causal. A window, soft-capping and sinks go to a kernel built with
        them (``__call__``); dropout runs torch SDPA (counted); dropout with soft-capping or sinks, ALiBi and
        returning the probabilities are refused (NotImplementedError), as no fallback computes them here.
        float8_e4m3fn inputs take FlashAttention-3's ``q_descale``/``k_descale``/``v_descale`` and return bf16."""
        if return_attn_probs:
            raise NotImplementedError("return_attn_probs=True: the exported kernels return only the output")
        if alibi_slopes is not None:
            raise NotImplementedError("alibi_slopes: ALiBi is not supported by the exported kernels")
        if dropout_p > 0.0:
            if q.dtype == torch.float8_e4m3fn:
                raise NotImplementedError("dropout with FP8 inputs is not supported here")
            if softcap or learnable_sink is not None:
                raise NotImplementedError("dropout with softcap or learnable_sink is not supported here")
            check_shapes(q, k, v)
            window = tuple(window_size) if window_size is not None else (-1, -1)
            windowed = window[0] >= 0 or window[1] >= 0
            mask = _window_mask(q.shape[1], k.shape[1], window, causal, q.device) if windowed else None
            return self._dropout(q, k, v, causal and not windowed, softmax_scale, dropout_p, mask)
        return self(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size, softcap=softcap,
                    learnable_sink=learnable_sink, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)


def _window_mask(sq: int, sk: int, window, causal: bool, device):
    """FlashAttention's local attention: query i sees keys j with i + sk - sq - left <= j <= i + sk - sq + right
    (a negative side is unbounded); causal caps right at 0. A row that sees no key is left to SDPA (NaN),
    as FlashAttention leaves such windows undefined."""
    left, right = window
    right = 0 if causal else right
    rows = torch.arange(sq, device=device)[:, None] + (sk - sq)
    cols = torch.arange(sk, device=device)[None, :]
    mask = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        mask &= cols >= rows - left
    if right >= 0:
        mask &= cols <= rows + right
    return mask
