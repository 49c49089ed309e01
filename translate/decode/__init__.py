"""Decode kernels (split-KV over a long, possibly paged, KV cache): parameters, the split rule, the generator."""
from translate.decode.params import DecodeParams, decode_smem_bytes, validate_decode
from translate.decode.splits import SplitPlan, plan_splits

__all__ = ["DecodeParams", "SplitPlan", "decode_smem_bytes", "plan_splits", "validate_decode"]
