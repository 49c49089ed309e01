"""How a generated prefill kernel is called: its argument list and the version the runtime checks.

Bump ``ABI_VERSION`` when the argument list or the launch geometry changes. The history, for kernels exported
earlier: 1, the softmax scale was compiled in as 1/sqrt(d_qk) (``ABI1_ARGS``, no scale argument); 2, the scale is
a launch argument (``softmax_scale_log2``); 3, a decode kernel's combine takes a warp per 128-column slice of a row
from 16 splits on (``kernel_abi.decode.combine_grid``), before it a warp per row; 4, a kernel built with an option of
kernel_abi.spec takes its run-time values (window_left / window_right, softcap_prescale, sinks: the names its metadata
lists) and its spec names the option; 5, a decode kernel's argument struct ends with ``leftpad_k`` (FA2's
cache_leftpad; the fields before it keep their offsets, so ABI 4 decode kernels still launch, without a leftpad).
"""
from __future__ import annotations

ABI_VERSION = 5

# The kernel's arguments, in order (the emitted signature; the runtime packs them from this list).
KERNEL_ARGS = (
    ("q", "ptr"), ("k", "ptr"), ("v", "ptr"), ("o", "ptr"),
    ("seqlen_q", "i32"), ("seqlen_k", "i32"), ("group", "i32"),
    ("q_batch_stride", "i64"), ("q_row_stride", "i64"), ("q_head_stride", "i64"),
    ("k_batch_stride", "i64"), ("k_row_stride", "i64"), ("k_head_stride", "i64"),
    ("v_batch_stride", "i64"), ("v_row_stride", "i64"), ("v_head_stride", "i64"),
    ("o_batch_stride", "i64"), ("o_row_stride", "i64"), ("o_head_stride", "i64"),
    ("softmax_scale_log2", "f32"),
)

# The argument list of ABI 1 kernels, whose metadata predates "args".
ABI1_ARGS = tuple(a for a in KERNEL_ARGS if a[0] != "softmax_scale_log2")

# The g2s copy atom of a TMA producer: a Hopper kernel with it reads K/V tiles as TMA boxes (whole pages of a
# paged cache); any other producer copies row by row with cp.async.
TMA_KV = "SM90_TMA"
