"""Hugging Face ``transformers`` integration: one call registers an export as an attention implementation.

    from tuner.serving import load_exported
    from tuner.serving.hf import register_transformers
    attn = load_exported("exported/")
    register_transformers(attn)                     # name "attn_tuner"
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="attn_tuner")

The masks: ``attention_mask`` below returns None exactly when the layer's mask is the kernels' own causal
pattern (FlashAttention's bottom-right alignment: every query sees the keys up to its own position, a
plain causal mask over a cache with no padding), also while torch.compile traces the model, where
transformers' ``sdpa_mask`` always materialises the mask (it cannot tell torch.export's fixed shapes from
compile's guarded ones); any other mask (padding, a static cache's empty tail, sliding windows, packed
sequences) is built by ``sdpa_mask`` and given to torch SDPA. The function: the same causal rule as
transformers' ``sdpa`` implementation; where the mask is None the exported kernel runs (through the custom
op); a mask, a position bias or dropout run torch SDPA, counted by reason in ``attn.reasons`` ("mask",
"dropout"), as is anything the export has no kernel for. transformers is an optional extra
(``pip install attn-autotuner[hf]``).
"""
from __future__ import annotations

from tuner.serving.rule import host_reads_allowed

DEFAULT_NAME = "attn_tuner"


def attention_function(attn):
    """The ``AttentionInterface`` function over ``attn`` (an ExportedAttention)."""

    def attn_tuner_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                                     scaling: float | None = None, is_causal: bool | None = None,
                                     position_bias=None, **kwargs):
        # query (b, hq, sq, d), key/value (b, hkv, sk, d): transformers hands over the KV heads unrepeated
        is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        # a None mask is the kernels' causal pattern (attention_mask below): bottom-right over every key
        is_causal = query.shape[2] > 1 and attention_mask is None and is_causal
        if position_bias is not None:
            from transformers.integrations.sdpa_attention import create_position_bias_mask

            attention_mask = create_position_bias_mask(position_bias, attention_mask, is_causal, query, key)
            is_causal = False
        q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        if dropout > 0.0:
            out = attn._dropout(q, k, v, is_causal, scaling, dropout, attention_mask)
        elif attention_mask is not None:
            out = attn.fallback("mask", q, k, v, False, scaling, attention_mask)
        else:
            out = attn(q, k, v, causal=is_causal, softmax_scale=scaling)
        return out, None

    return attn_tuner_attention_forward


def attention_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                   attention_mask=None, local_size=None, allow_is_causal_skip: bool = True, **kwargs):
    """transformers' mask interface for the exported kernels: None when the mask is the kernels' causal
    pattern, else ``sdpa_mask``'s materialised mask (module docstring)."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    mask_function = causal_mask_function if mask_function is None else mask_function
    if (allow_is_causal_skip and mask_function is causal_mask_function and local_size is None and kv_offset == 0
            and q_offset + q_length == kv_length and _no_padding(attention_mask, kv_length)):
        return None
    return sdpa_mask(batch_size, q_length, kv_length, q_offset=q_offset, kv_offset=kv_offset,
                     mask_function=mask_function, attention_mask=attention_mask, local_size=local_size,
                     allow_is_causal_skip=False, **kwargs)


def _no_padding(padding_mask, kv_length) -> bool:
    """No 2-D padding mask, or (in eager only: it reads the tensor) one that keeps every key."""
    if padding_mask is None:
        return True
    if not host_reads_allowed():
        return False
    return padding_mask.dim() == 2 and padding_mask.shape[-1] == kv_length and bool(padding_mask.all())


def register_transformers(attn, name: str = DEFAULT_NAME) -> str:
    """Register ``attn`` as transformers attention implementation ``name``, with its mask function
    (``attention_mask``); returns the name to pass as ``attn_implementation``."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as exc:
        raise ImportError("register_transformers needs transformers (pip install 'attn-autotuner[hf]')") from exc
    AttentionInterface.register(name, attention_function(attn))
    AttentionMaskInterface.register(name, attention_mask)
    return name
