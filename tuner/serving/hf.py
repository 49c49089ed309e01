"""Hugging Face ``transformers`` integration: one call registers an export as an attention implementation.

    from tuner.serving import load_exported
    from tuner.serving.hf import register_transformers
    attn = load_exported("exported/")
    register_transformers(attn)                     # name "attn_tuner"
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="attn_tuner")

The masks: ``attention_mask`` below returns None exactly when the layer's mask is the kernels' own causal
pattern (FlashAttention's bottom-right alignment: every query sees the keys up to its own position, a
plain causal mask over a cache with no padding), or that pattern within transformers' sliding window, also
while torch.compile traces the model, where transformers' ``sdpa_mask`` always materialises the mask (it cannot
tell torch.export's fixed shapes from compile's guarded ones). The same pattern over a padded batch (left or right
padding, as tokenizers and ``generate()`` make it) returns the keys' 2-D padding mask, and the attention function
packs the batch through the packed-sequence kernels (tuner/serving/padded.py); a decode step over a left-padded
cache (at most 16 new tokens) instead runs the export's decode kernel on the cache in place, each sequence's keys
from its first kept row (``cache_leftpad``), where the export has a dense-cache decode kernel for it and the host may
read the mask (eager: packing would copy the whole cache every step; under torch.compile it still packs).
Any other mask (padding inside a sequence, a static cache's empty tail, packed sequences, chunked attention) is
built by ``sdpa_mask`` and given to torch SDPA. The function: the
same causal rule as transformers' ``sdpa`` implementation; where the mask is None the exported kernel runs
(through the custom op) with the layer's options: ``sliding_window`` (window (W - 1, 0)), ``softcap`` (Gemma 2)
and ``s_aux`` (gpt-oss's sinks), which need a kernel built with them; a mask, a position bias or dropout run
torch SDPA (with a cap or sinks: the fp32 reference), counted by reason in ``attn.reasons`` ("mask",
"dropout"), as is anything the export has no kernel for. transformers is an optional extra
(``pip install attn-autotuner[hf]``).
"""
from __future__ import annotations

from tuner.serving.padded import attend_decode_padded, attend_padded, dense_mask, is_edge_padding
from tuner.serving.rule import host_reads_allowed

DEFAULT_NAME = "attn_tuner"


def attention_function(attn):
    """The ``AttentionInterface`` function over ``attn`` (an ExportedAttention)."""

    def attn_tuner_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                                     scaling: float | None = None, is_causal: bool | None = None,
                                     position_bias=None, sliding_window: int | None = None,
                                     softcap: float | None = None, s_aux=None, **kwargs):
        # query (b, hq, sq, d), key/value (b, hkv, sk, d): transformers hands over the KV heads unrepeated
        is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        # a None mask is the kernels' causal pattern (attention_mask below): bottom-right over every key
        is_causal = query.shape[2] > 1 and attention_mask is None and is_causal
        if position_bias is not None:
            from transformers.integrations.sdpa_attention import create_position_bias_mask

            attention_mask = create_position_bias_mask(position_bias, attention_mask, is_causal, query, key)
            is_causal = False
        q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        softcap = softcap or 0.0
        if dropout > 0.0:
            if softcap or s_aux is not None:
                raise NotImplementedError("attention dropout with soft-capping or sinks: no kernel or fallback here")
            if attention_mask is not None and attention_mask.dim() == 2:
                window = (-1, -1) if sliding_window is None else (int(sliding_window) - 1, 0)
                attention_mask = dense_mask(attention_mask, query.shape[2], query.shape[2] > 1, window)
            out = attn._dropout(q, k, v, is_causal, scaling, dropout, attention_mask)
        elif attention_mask is not None and attention_mask.dim() == 2:
            # the keys' padding (attention_mask below): the batch packed through the packed-sequence kernels
            causal = query.shape[2] > 1
            window = (-1, -1) if sliding_window is None else (int(sliding_window) - 1, 0 if causal else -1)
            # a decode step over a left-padded cache: the decode kernel reads the cache in place
            out = attend_decode_padded(attn, q, k, v, attention_mask, scaling, (window[0], 0), softcap, s_aux)
            if out is None:
                out = attend_padded(attn, q, k, v, attention_mask, causal, scaling, window, softcap, s_aux)
        elif attention_mask is not None:
            # the materialised mask holds the window already; the cap and the sinks are the reference's
            out = attn.attend_options(q, k, v, False, scaling, (-1, -1), softcap, s_aux, attention_mask,
                                      where="transformers")
        else:
            # transformers' sliding window: key j visible from query i when j > i - sliding_window
            window = (-1, -1) if sliding_window is None else (int(sliding_window) - 1, 0 if is_causal else -1)
            out = attn.attend_options(q, k, v, is_causal, scaling, window, softcap, s_aux, where="transformers")
        return out, None

    return attn_tuner_attention_forward


def attention_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                   attention_mask=None, local_size=None, allow_is_causal_skip: bool = True, **kwargs):
    """transformers' mask interface for the exported kernels: None when the mask is the kernels' causal
    pattern, also within a sliding window (the layer hands the window to the attention function), else
    ``sdpa_mask``'s materialised mask (module docstring)."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    mask_function = causal_mask_function if mask_function is None else mask_function
    kernels_pattern = (mask_function is causal_mask_function and local_size is None) or \
        sliding_window_mask(local_size, kwargs.get("config"))
    # the last query and the last key at the same position: bottom-right alignment is the mask's, also over a
    # sliding-window cache that keeps only the window's keys (kv_offset > 0)
    if allow_is_causal_skip and kernels_pattern and kv_offset + kv_length == q_offset + q_length:
        if _no_padding(attention_mask, kv_length):
            return None
        padding = _edge_padding(attention_mask, kv_offset, kv_length)
        if padding is not None:     # the keys' padding alone: the attention function packs the batch
            return padding
    return sdpa_mask(batch_size, q_length, kv_length, q_offset=q_offset, kv_offset=kv_offset,
                     mask_function=mask_function, attention_mask=attention_mask, local_size=local_size,
                     allow_is_causal_skip=False, **kwargs)


def sliding_window_mask(local_size, config) -> bool:
    """Whether a mask request with ``local_size`` is transformers' causal sliding-window mask of the model's
    window: ``create_sliding_window_causal_mask`` passes ``local_size=config.sliding_window`` (chunked attention
    passes its chunk size, and every variant with other overlays, packing or bidirection refuses the causal skip
    this is asked under). Read from the config, not the mask function's closure: torch.compile traces this."""
    window = getattr(config, "sliding_window", None) if config is not None else None
    chunk = getattr(config, "attention_chunk_size", None) if config is not None else None
    return local_size is not None and type(window) is int and local_size == window and local_size != chunk


def _edge_padding(padding_mask, kv_offset, kv_length):
    """The (batch, kv_length) bool columns of a 2-D padding mask that cover the call's keys, where packing serves
    it (tuner/serving/padded.py): padding at the sequences' edges only (checked in eager; under torch.compile
    transformers' padding is taken as its tokenizers and generate() make it, left or right: where a sequence has a
    hole, packing still computes the causal attention among its kept tokens, and a window then counts kept tokens,
    as transformers' own flash-attention path does); else None."""
    if padding_mask is None or padding_mask.dim() != 2 or padding_mask.shape[-1] < kv_offset + kv_length:
        return None
    kept = padding_mask[:, kv_offset:kv_offset + kv_length].bool()
    if host_reads_allowed() and not is_edge_padding(kept):
        return None
    return kept


def _no_padding(padding_mask, kv_length) -> bool:
    """No 2-D padding mask, or (in eager only: it reads the tensor) one that keeps every key: of the call's keys,
    or of every position so far (a sliding-window layer's keys are the mask's last ``kv_length``)."""
    if padding_mask is None:
        return True
    if not host_reads_allowed():
        return False
    return padding_mask.dim() == 2 and padding_mask.shape[-1] >= kv_length and bool(padding_mask.all())


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
