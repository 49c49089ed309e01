"""Why torch SDPA runs instead of an exported kernel: the countable categories of every fallback (a decode
call's fallback is the masked reference of tuner/serving/decode_sdpa.py, counted the same way)."""

# Why SDPA runs instead of an exported kernel: the countable categories (``ExportedAttention.reasons``).
REASONS = {
    "not-cuda": "the tensors are not on a CUDA device",
    "no-device-config": "no exported config for this GPU",
    "other-arch": "the configs for this GPU's name were exported for another SM",
    "dtype": "dtype has no exported kernels (fp16, bf16 and fp8 only)",
    "mixed-dtypes": "q, k, v have different dtypes",
    "mixed-devices": "q, k, v are on different devices",
    "no-shape-config": "no exported config for these head dims, dtype and causality",
    "no-option-config": "no exported kernel built with the call's options (window, soft-capping, sinks)",
    "no-variant": "no exported variant serves this head layout",
    "scale": "the softmax scale is not a positive finite number",
    "kernel-unloadable": "the kernel cannot be loaded (its warning says why)",
    "inputs-refused": "the kernel refused the inputs' layout (strides, alignment)",
    "mask": "an attention mask (the kernels take none)",
    "dropout": "dropout (the kernels have none)",
    "window": "a sliding window (the kernels attend to every visible key)",
    "softcap": "logit soft-capping",
    "alibi": "ALiBi slopes",
    "sdpa-causal-top-left": "SDPA's is_causal with seqlen_q != seqlen_k is aligned top-left (the kernels: bottom-right)",
    "layout": "a shape the kernels do not take (not 4-D)",
    "no-paged-config": "a paged call and no exported paged config for this GPU",
    "page-size": "no paged kernel of the config can tile this page size (it must divide block N or be a multiple)",
    "no-decode-config": "a decode call (flash_attn_with_kvcache) and no exported decode config of this cache layout "
                        "for this GPU",
    "decode-page-size": "no decode kernel of the config was tuned for this page size",
    "decode-seqlen-q": "more than 16 query tokens per sequence (decode kernels take 1..16: longer chunks are prefill)",
}
