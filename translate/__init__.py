"""TL program + kernel parameters + GPU profile -> CuTe C++ (translate.generate)."""
from pathlib import Path

from translate.kernel import ABI_VERSION, KERNEL_ARGS, GeneratedKernel, TranslationError

# Device helpers the generated code includes ("attn_tl.cuh"); pass as -I to nvcc.
INCLUDE_DIR = Path(__file__).resolve().parent / "include"


def generate(program, params, profile, spec) -> GeneratedKernel:
    """Translate a TL program into one kernel (see translate/compiler.py)."""
    from translate.compiler import generate as _generate
    return _generate(program, params, profile, spec)


__all__ = ["ABI_VERSION", "GeneratedKernel", "INCLUDE_DIR", "KERNEL_ARGS", "TranslationError", "generate"]
