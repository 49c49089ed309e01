"""The Hopper epilogue's stmatrix stores (attn_sm90::store_o_tile) are CuTe's (slow: one host-only nvcc build).

store_o_tile replaced make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>, tiled_mma_pv) + cute::copy, whose
partition algebra cost ~2 s of cicc per distinct tile (BENCHMARKS.md, 2026-11-24). store_o_check.cpp takes
CuTe's copy apart on the host, from each config's own kernel types, and compares what every consumer thread
passes to each stmatrix.x4 (address and registers) with the helper's: the same stores, for every tile height
(1, 2, 3 consumer warpgroups), output head dim (64, 96: 32-column blocks of the 64-byte swizzle, 128; MLA's d_v 128 with d_qk 192), 16-bit type and P·V
operand (RS, SS), a block N outside CuTe's base wgmma shapes, and the plain (not warp-specialised) wgmma kernel's
types."""
from pathlib import Path

import pytest

from hardware_profiles import load_profile
from translate.defaults import hopper_params
from translate.params import KernelParams
from translate.sm90 import frame, plain
from kernel_abi.spec import KernelSpec

from host_checks import run_host_checks

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
CFG_TYPES = ("Element", "TiledMmaPV", "SmemLayoutO")
CFG_INTS = ("kBlockM", "kHeadDimV")


def _configs():
    h100 = load_profile("h100")

    def params(spec, **changes):
        return KernelParams.from_dict({**hopper_params(h100, spec).to_dict(), **changes})

    mha128, mha64 = KernelSpec("mha", 128, 128, True, "bf16"), KernelSpec("mha", 64, 64, False, "fp16")
    mla = KernelSpec("mla", 192, 128, True, "bf16")
    mha96, mha96h = KernelSpec("mha", 96, 96, True, "bf16"), KernelSpec("mha", 96, 96, False, "fp16")
    return [
        ("m128_d128_rs_bf16", mha128, params(mha128)),
        ("m64_d128_ss", mha128, params(mha128, block_m=64, pv_operand="ss")),
        ("m192_d128_n112", mha128, params(mha128, block_m=192, block_n=112)),
        ("m192_d64_fp16", mha64, params(mha64, block_m=192)),
        ("m128_d64_fp16_ss", mha64, params(mha64, block_m=128, pv_operand="ss")),
        ("mla_m128_dv128", mla, params(mla)),
        ("m128_d96_rs", mha96, params(mha96)),
        ("m192_d96_ss", mha96, params(mha96, block_m=192, block_n=144, pv_operand="ss")),
        ("m64_d96_fp16", mha96h, params(mha96h, block_m=64)),
        ("plain_m128_d128", mha128, KernelParams.from_dict(hopper_params(h100, mha128, warp_specialized=False).to_dict())),
    ]


def _program(configs) -> str:
    parts = ["#include <cute/tensor.hpp>", '#include "attn_sm90.cuh"', (HERE / "store_o_check.cpp").read_text()]
    calls = []
    for i, (label, spec, params) in enumerate(configs):
        ns = f"cfg{i}"
        ws = params.g2s_atom == "SM90_TMA"   # else the plain wgmma kernel (translate/sm90/plain.py): every warpgroup computes
        body = frame.kernel_types(spec, params, params.kv_stages, True, layouts=True) if ws else plain.kernel_types(spec, params, 1, 1)
        body.append("struct Cfg {")
        body += [f"  using {n} = {ns}::{n};" for n in CFG_TYPES]
        body += [f"  static constexpr int {n} = {ns}::{n};" for n in CFG_INTS]
        body.append("};")
        parts += frame.wgmma_declarations(spec, params)
        parts.append(f"namespace {ns} {{\nusing namespace cute;\n" + "\n".join(body) + f"\n}}  // {ns}")
        calls.append(f'  bad += check::store_o<{ns}::Cfg>("{label}");')
    parts.append("int main() {\n  int bad = 0;\n" + "\n".join(calls) + "\n  return bad;\n}")
    return "\n\n".join(parts) + "\n"


def test_the_epilogue_passes_each_stmatrix_the_address_and_registers_of_cutes_tiled_copy(tmp_path):
    configs = _configs()
    run_host_checks(_program(configs), "store_o", tmp_path, len(configs), opt="-O1", arch="sm_90a")
