"""What the translator hands out: a generated kernel (source + launch facts) and its error type."""
from __future__ import annotations

from dataclasses import dataclass, field

from kernel_abi.abi import ABI_VERSION, KERNEL_ARGS
from translate.params import KernelParams
from kernel_abi.spec import KernelSpec

class TranslationError(ValueError):
    """A TL program the translator cannot turn into a kernel; names the TL line."""

    def __init__(self, message: str, line: int = 0):
        self.line = line
        self.message = message
        super().__init__(f"TL line {line}: {message}" if line else message)


# The #include block of every sm80-class kernel (translate/compiler.py); Hopper kernels add their helpers to it
# (translate/sm90/preamble.py).
PREAMBLE = ("// Generated from a TL program by translate (github: this repository); do not edit.\n"
            "#include <cute/tensor.hpp>\n"
            "#include \"attn_tl.cuh\"\n")


@dataclass(frozen=True)
class GeneratedKernel:
    """One kernel: ``preamble`` (#includes, identical for every config) + ``body`` (a namespace
    holding the ``extern "C"`` kernel ``name``), so that many bodies can share one translation unit.

    Launch: grid (ceil(seqlen_q / block_m), heads_q, batch), ``num_threads`` threads,
    ``smem_bytes`` dynamic shared memory; arguments as in ``KERNEL_ARGS``.
    """

    name: str
    preamble: str
    body: str
    num_threads: int
    smem_bytes: int
    block_m: int
    block_n: int
    spec: KernelSpec
    params: KernelParams
    # Arguments after KERNEL_ARGS: (name, kind) with kind "tensormap:<q|k|v|o>" for a TMA descriptor that
    # the host encodes per call (runtime.py) from ``tensor_maps``: per tensor, the box rows and which head
    # dim ("d_qk" or "d_v") its columns are.
    extra_args: tuple = ()
    tensor_maps: dict = field(default_factory=dict)
    grid: str = "blocks"    # blocks: (query blocks, heads, batch); tiles: one CTA per tile; persistent: one per SM;
                            # decode: (splits, head units x row blocks, batch), tuner/serving/launch/decode_kernel.py

    @property
    def source(self) -> str:
        return self.preamble + "\n" + self.body

    def meta(self) -> dict:
        """JSON-able sidecar that runtime.load_kernel needs to launch the cubin."""
        return {
            "abi": ABI_VERSION,
            "name": self.name,
            "num_threads": self.num_threads,
            "smem_bytes": self.smem_bytes,
            "block_m": self.block_m,
            "block_n": self.block_n,
            "spec": self.spec.to_dict(),
            "params": self.params.to_dict(),
            # a decode kernel takes one struct (translate/decode): its extra_args are the whole list
            "args": [list(a) for a in (() if self.grid == "decode" else KERNEL_ARGS) + tuple(self.extra_args)],
            "tensor_maps": dict(self.tensor_maps),
            "grid": self.grid,
        }


def sketch_hash(program) -> str:
    """Eight hex digits of the program's canonical text: the sketch is part of the kernel, so two schedules
    with the same parameters are two kernels (and two symbols in one translation unit)."""
    import hashlib

    from tl import format_program

    return hashlib.sha256(format_program(program).encode()).hexdigest()[:8]
