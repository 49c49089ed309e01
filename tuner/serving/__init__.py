"""Exported kernels inside real models: a torch custom op (``torch.ops.attn_tuner.attention``) and the
entry points that dispatch to it.

    from tuner.serving import load_exported
    attn = load_exported("exported/")        # tune export's folder
    o = attn(q, k, v, causal=True)           # (b, s, h, d); attn.scaled_dot_product_attention, attn.flash_attn_func

The runtime side imports nothing of optuna, ray or openai: a serving host needs torch, cuda-python and the
exported folder.
"""
from tuner.serving.configs import (Choice, ExportedConfig, ExportedKernel, ExportError, choose, read_config,
                                   read_configs)
from tuner.serving.exported import DeviceFacts, ExportedAttention, load_exported
from tuner.serving.reasons import REASONS
from tuner.serving.sdpa import sdpa_attention

__all__ = ["REASONS", "Choice", "DeviceFacts", "ExportError", "ExportedAttention", "ExportedConfig", "ExportedKernel",
           "choose", "load_exported", "read_config", "read_configs", "sdpa_attention"]
