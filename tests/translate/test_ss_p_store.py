"""P through shared memory (the SS P·V GEMM, warp-specialised schedules): the consumer stores P with stmatrix, not
CuTe's element-wise copy, which kept a 64-bit shared-memory pointer per element and spilled them (nvcc 13.0: 760 bytes
at FA4's d96 192 x 144 tile, 1100 at FA3's d64 192 x 192, 92-492 at 128- and 192-row tiles of d64-d256)."""
import dataclasses

import pytest
from sass_counts import compiled_or_skip, sass_counts

import tl
import translate
from hardware_profiles import load_profile
from kernel_abi.spec import spec_for
from translate.defaults import hopper_params

H200 = load_profile("h200")
TILES = [("mha", 96, False, 192, 144, "ws_overlap"), ("mha", 64, False, 192, 192, "ws_overlap"),
         ("mqa", 64, False, 192, 128, "ws_overlap"), ("gqa", 128, False, 128, 128, "ws_overlap"),
         ("gqa", 128, True, 128, 128, "ws_serial")]


def _ss(variant, d, causal, bm, bn, schedule):
    spec = spec_for(variant, d, "bf16", causal)
    params = dataclasses.replace(hopper_params(H200, spec), block_m=bm, num_warps=bm // 16, block_n=bn,
                                 pv_operand="ss")
    return translate.generate(tl.parse_program(tl.load_sketch(variant, causal, schedule, "dense")), params, H200, spec)


def test_the_ss_consumer_stores_p_by_stmatrix():
    for case in TILES:
        body = _ss(*case).body
        assert "make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, tiled_mma_qk)" in body, case
        assert "Copy_Atom<DefaultCopy, Element>{}, tiled_mma_qk" not in body, case


@pytest.mark.slow
def test_ss_kernels_build_without_spills_and_store_p_by_stsm():
    gens = [_ss(*case) for case in TILES]
    for case, gen, result in zip(TILES, gens, compiled_or_skip(gens)):
        assert result.spill_stores == 0, (case, result.spill_stores)
        ops = sass_counts(gen.name, result.cubin)
        assert ops["STSM"] >= 1 and ops["STL"] == 0 and ops["LDL"] == 0, (case, ops["STSM"], ops["STL"])
