"""The #include block of a Hopper kernel, and when it needs CUTLASS's extended wgmma shapes.

wgmma takes any N in steps of 8 up to 256, but CuTe declares only N = 8, 16, 32, 64, 96, 128, 192, 256 unless
``CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED`` is defined; the other shapes live in mma_sm90_gmma_ext.hpp (2.8 MB)
and its traits, and parsing them plus matching their thousands of trait specialisations doubles cicc's time:
measured with nvcc 13.0 (2026-11-23, this repo's MHA d128 causal ws_overlap default, 128x128 tiles): 20.9 s of
cicc with the define, 9.9 s without, identical SASS. So a kernel defines it only when a GEMM's N needs it.
"""
from __future__ import annotations

EXTENDED_SHAPES_DEFINE = "CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED"
BASE_WGMMA_N = (8, 16, 32, 64, 96, 128, 192, 256)   # declared without the define (cute/arch/mma_sm90_gmma.hpp)

_HEAD = "// Generated from a TL program by translate (github: this repository); do not edit.\n"
_INCLUDES = ("#include <cute/tensor.hpp>\n"
             "#include \"attn_tl.cuh\"\n"
             "#include \"attn_sm90.cuh\"\n")


def needs_extended_shapes(*gemm_n: int) -> bool:
    """Whether a wgmma of one of these N (the tile's N as the op selectors get it) is an extended shape."""
    return any(n not in BASE_WGMMA_N for n in gemm_n)


def hopper_preamble(*gemm_n: int) -> str:
    """The preamble of a kernel whose wgmma GEMMs have these N (QK^T: block_n; P.V: d_v)."""
    define = (f"#define {EXTENDED_SHAPES_DEFINE} 1  // wgmma N in steps of 8, not only the eight base shapes\n"
              if needs_extended_shapes(*gemm_n) else "")
    return _HEAD + define + _INCLUDES
