"""The runtime side of `tune export`, by its first name: ``tuner.serving`` holds it (the custom op, the
entry points, the transformers integration); this module keeps the names earlier code imports.

    from tuner.loader import load_exported
    attention = load_exported("exported/")
    o = attention(q, k, v, causal=True)     # q (b, sq, hq, d_qk), k (b, sk, hkv, d_qk), v (b, sk, hkv, d_v)
"""
from tuner.serving import (Choice, ExportedAttention, ExportedConfig, ExportedKernel, ExportError, choose,  # noqa: F401
                           load_exported, read_config, read_configs, sdpa_attention)
from tuner.serving.configs import infer_variant  # noqa: F401
