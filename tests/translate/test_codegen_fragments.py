"""The register dataflow of the emitted GEMMs, checked on the CPU (slow: one host-only nvcc build).

codegen_fragment_emulation.cpp emulates ldmatrix and mma.sync from the PTX ISA on top of the CuTe
partitions of each config's own types (translate.emitters.kernel_types): S = Q K^T through the
Q/K shared->register copies, then O = S V through the accumulator->operand reshape and the V^T
(ldmatrix.trans) copy. Every value of S and O must land where the kernel's coordinates say, for the
sm75 k8 atom and the sm80 k16 atom alike."""
from pathlib import Path

import pytest

from hardware_profiles import load_profile
from translate import emitters
from translate.defaults import default_params
from translate.params import KernelParams
from kernel_abi.spec import KernelSpec

from host_checks import run_host_checks

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
S2R_KIND = {"SM75_U32x4_LDSM_N": 4, "SM75_U32x2_LDSM_N": 2, "UniversalCopy": 0}
CFG_NAMES = ("TiledMma", "SmemLayoutQ", "SmemLayoutK", "SmemLayoutV", "SmemLayoutVt", "SmemLayoutVtNoSwizzle",
             "S2RAtomQK", "S2RAtomV")
CFG_INTS = ("kBlockM", "kBlockN", "kHeadDimQK", "kHeadDimV", "kNThreads", "kS2RKind")


def _with(params: KernelParams, **changes) -> KernelParams:
    return KernelParams(**{**params.__dict__, **changes})


def _configs():
    t4, h100 = load_profile("t4"), load_profile("h100")
    mha128 = KernelSpec("mha", 128, 128, True, "fp16")
    sm75 = default_params(t4, mha128)
    assert sm75.mma_atom == "SM75_16x8x8"
    out = [
        ("sm75_k8_ldsm4", mha128, sm75),
        ("sm75_k8_ldsm2", mha128, _with(sm75, s2r_atom="SM75_U32x2_LDSM_N")),
        ("sm75_k8_universal", mha128, _with(sm75, s2r_atom="UniversalCopy")),
        ("sm75_k8_d64", KernelSpec("mha", 64, 64, False, "fp16"), default_params(t4, KernelSpec("mha", 64, 64, False, "fp16"))),
    ]
    bf = KernelSpec("mha", 128, 128, False, "bf16")
    out += [
        ("sm80_k16_ldsm4", bf, default_params(h100, bf)),
        ("sm80_k16_ldsm2_sw2", bf, _with(default_params(h100, bf), s2r_atom="SM75_U32x2_LDSM_N", swizzle=2)),
        ("sm80_k16_mla_w8", KernelSpec("mla", 192, 128, True, "bf16"),
         default_params(h100, KernelSpec("mla", 192, 128, True, "bf16"))),
    ]
    return out


def _program(configs) -> str:
    parts = ["#include <cute/tensor.hpp>", '#include "attn_tl.cuh"',
             (HERE / "codegen_fragment_emulation.cpp").read_text()]
    calls = []
    for i, (label, spec, params) in enumerate(configs):
        ns = f"cfg{i}"
        body = emitters.kernel_types(spec, params, 1, 1)
        body.append(f"constexpr int kS2RKind = {S2R_KIND[params.s2r_atom]};")
        body.append("struct Cfg {")
        body += [f"  using {n} = {ns}::{n};" for n in CFG_NAMES]
        body += [f"  static constexpr int {n} = {ns}::{n};" for n in CFG_INTS]
        body.append("};")
        parts.append(f"namespace {ns} {{\nusing namespace cute;\n" + "\n".join(body) + f"\n}}  // {ns}")
        calls.append(f'  bad += emu::check<{ns}::Cfg>("{label}");')
    parts.append("int main() {\n  int bad = 0;\n" + "\n".join(calls) + "\n  return bad;\n}")
    return "\n\n".join(parts) + "\n"


def test_fragments_of_both_gemms_pair_up_for_k8_and_k16_atoms(tmp_path):
    configs = _configs()
    run_host_checks(_program(configs), "fragments", tmp_path, len(configs), opt="-O1")
