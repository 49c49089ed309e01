"""The #include block of every Hopper kernel: identical for all of them, so any mix shares a batch's unit.

wgmma ops of N outside CuTe's base set are declared by the kernels that use them (translate/sm90/wgmma_ops.py),
not by defining ``CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED``, which made cicc parse 3.4 MB more for every kernel.
"""
from __future__ import annotations

from translate.kernel import PREAMBLE

HOPPER_PREAMBLE = PREAMBLE + "#include \"attn_sm90.cuh\"\n"
