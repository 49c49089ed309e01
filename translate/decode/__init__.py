"""Decode kernels (split-KV over a long, possibly paged, KV cache): parameters, the split rule, the generator."""
from translate.decode.params import (MLA_DECODE_D_QK, MLA_DECODE_D_V, DecodeParams, decode_smem_bytes,
                                     default_decode_params, v_from_k, validate_decode)
from kernel_abi.splits import SplitPlan, plan_splits

__all__ = ["DecodeParams", "MLA_DECODE_D_QK", "MLA_DECODE_D_V", "SplitPlan", "decode_smem_bytes",
           "default_decode_params", "plan_splits", "v_from_k", "validate_decode"]
