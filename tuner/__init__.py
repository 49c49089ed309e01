"""attn-autotuner: search-built FlashAttention kernels for each GPU."""

__version__ = "0.1.0"
