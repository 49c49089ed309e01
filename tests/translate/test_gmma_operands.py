"""The GMMA operand descriptors of the warp-specialised Hopper kernels are CuTe's (slow: one host-only nvcc build).

The kernels build the descriptor tensors of Q, K, V (and P, SS P·V) with attn_sm90::gmma_operand from what
translate/sm90/frame.py gmma_operand() derives from the tile shape, instead of CuTe's partition_fragment_A/B,
whose partition algebra cost 2-3 s of cicc per distinct tile; the kernels' SASS is the same, instruction for
instruction (BENCHMARKS.md, 2026-11-24). gmma_operands_check.cpp compares, per config, the layout type, the
descriptor fields and every consumer thread's start with CuTe's partitions: tile heights of 1-3 consumer
warpgroups, block N of every swizzle P can take (128-, 64-, 32-byte: 128/64, 96/160, 80/112/144/176), head
dims 64, 96 (32-column atoms of the 64-byte swizzle), 128 and MLA's 192/128, 2 and 3 stages (fp16 and bf16 tiles are alike: 16-bit). (The rules were read off all 216 shapes of
d 64/128/192x128 x block M 64/128/192 x block N 64/80/96/112/128/176 x 2/3 stages x RS/SS first.)"""
import re
from pathlib import Path

import pytest

from hardware_profiles import load_profile
from translate import nvcc
from translate.sass import find_cuobjdump, sass_instructions, wgmmas_fed_by_r2ur
from translate.defaults import hopper_params
from translate.params import KernelParams
from translate.sm90 import frame
from kernel_abi.spec import KernelSpec

from host_checks import run_host_checks

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
OPERANDS = {"q": ("thr_qk", "A", "SmemLayoutQ"), "k": ("thr_qk", "B", "SmemLayoutK"),
            "v": ("thr_pv", "B", "SmemLayoutVt"), "p": ("thr_pv", "A", "SmemLayoutP")}


def _configs():
    h100 = load_profile("h100")
    base = hopper_params(h100, KernelSpec("mha", 128, 128, True, "bf16")).to_dict()
    mha128, mha64 = KernelSpec("mha", 128, 128, True, "bf16"), KernelSpec("mha", 64, 64, False, "bf16")
    mla = KernelSpec("mla", 192, 128, True, "bf16")
    mha96 = KernelSpec("mha", 96, 96, True, "bf16")   # 32-column atoms of the 64-byte swizzle (translate/sm90/swizzle.py)
    shapes = [(mha128, 128, 128, 2, "rs"), (mha128, 192, 80, 3, "ss"), (mha128, 128, 96, 2, "ss"),
              (mha128, 64, 176, 2, "ss"), (mha64, 192, 144, 3, "ss"), (mha64, 128, 160, 2, "ss"),
              (mla, 128, 192, 2, "rs"), (mha96, 128, 128, 2, "rs"), (mha96, 192, 144, 2, "ss"),
              (mha96, 64, 80, 3, "ss"), (mha96, 128, 176, 2, "rs")]
    return [(f"{spec.label()}_m{bm}n{bn}s{st}_{pv}", spec,
             KernelParams.from_dict({**base, "block_m": bm, "block_n": bn, "kv_stages": st, "pv_operand": pv}))
            for spec, bm, bn, st, pv in shapes]


def _checks(label: str, spec, params) -> list[str]:
    lines = []
    for which, (thr, ab, layout) in OPERANDS.items():
        if which == "p" and params.pv_operand != "ss":
            continue
        op = frame.gmma_operand(which, spec, params, params.kv_stages)
        tensor = f"make_tensor(make_smem_ptr(buf), {layout}{{}})"
        lines.append(f'    bad += check::operand<{op.layout}, {op.leading}, {op.stride}, {op.layout_type}, '
                     f'{op.per_warpgroup}>("{label}", "{which.upper()}", {thr}.partition_fragment_{ab}({tensor}), '
                     f'long(&*{thr}.partition_{ab}({tensor}).data() - buf), int(get<1>({thr}.thr_vmnk_)), t);')
    return lines


def _program(configs) -> str:
    parts = ["#include <cute/tensor.hpp>", '#include "attn_sm90.cuh"', (HERE / "gmma_operands_check.cpp").read_text()]
    calls = []
    for i, (label, spec, params) in enumerate(configs):
        parts += frame.wgmma_declarations(spec, params)
        body = frame.kernel_types(spec, params, params.kv_stages, True, layouts=True)
        body += ["int check(const char* label) {",
                 "  alignas(1024) static Element buf[1 << 17];",
                 "  TiledMmaQK tiled_mma_qk;",
                 "  TiledMmaPV tiled_mma_pv;",
                 # the accumulators' written-out layouts (frame.accumulator_layouts) are CuTe's very types
                 "  static_assert(std::is_same_v<AccLayoutS, decltype(partition_fragment_C(tiled_mma_qk, "
                 "Shape<Int<kBlockM>, Int<kBlockN>>{}))::layout_type>, \"AccLayoutS is not partition_fragment_C's\");",
                 "  static_assert(std::is_same_v<AccLayoutO, decltype(partition_fragment_C(tiled_mma_pv, "
                 "Shape<Int<kBlockM>, Int<kHeadDimV>>{}))::layout_type>, \"AccLayoutO is not partition_fragment_C's\");",
                 "  int bad = 0;",
                 "  for (int t = 0; t < kConsumerThreads; ++t) {",
                 "    auto thr_qk = tiled_mma_qk.get_thread_slice(t);",
                 "    auto thr_pv = tiled_mma_pv.get_thread_slice(t);"]
        body += _checks(label, spec, params)
        body += ["  }", '  std::printf("%s %s\\n", bad ? "FAIL" : "OK", label);', "  return bad ? 1 : 0;", "}"]
        parts.append(f"namespace cfg{i} {{\nusing namespace cute;\n" + "\n".join(body) + f"\n}}  // cfg{i}")
        calls.append(f'  bad += cfg{i}::check("{label}");')
    parts.append("int main() {\n  int bad = 0;\n" + "\n".join(calls) + "\n  return bad;\n}")
    return "\n\n".join(parts) + "\n"


def test_generated_descriptors_are_cutes_partitions_for_every_thread(tmp_path):
    configs = _configs()
    run_host_checks(_program(configs), "gmma_operands", tmp_path, len(configs), opt="-O0", arch="sm_90a")


def test_the_kernel_takes_its_descriptors_from_gmma_operand():
    import tl
    import translate

    h100, spec = load_profile("h100"), KernelSpec("mha", 128, 128, True, "bf16")
    params = KernelParams.from_dict({**hopper_params(h100, spec).to_dict(), "pv_operand": "ss"})
    src = translate.generate(tl.parse_program(tl.load_sketch("mha", True, "ws_overlap")), params, h100, spec).source
    assert ".partition_fragment_A(" not in src and ".partition_fragment_B(" not in src
    assert "partition_fragment_C(" not in src and "make_tensor<float>(AccLayoutS{})" in src   # the accumulators too
    for name in ("tSrQ", "tSrK", "tOrV", "tOsP"):
        assert f"Tensor {name} = attn_sm90::gmma_operand<Layout<" in src
    assert "(smem_q + wg * 4096)" in src   # warpgroup 1 starts 64 rows of 64 further
    # ... with wg uniform across the warp (a shuffle from lane 0): the descriptors stay in uniform registers
    assert "const int wg = cutlass::canonical_warp_group_idx() - 1;" in src


# What the kernels called before attn_sm90::gmma_operand, on the slice of the warpgroup's first thread (CUTLASS's
# collectives slice by warpgroup index too): a GMMA operand's partition depends on the warpgroup alone, and a
# slice by the uniform wg keeps the descriptors in uniform registers, as the kernels' do. (Sliced by the thread's
# own index, ptxas kept them in ordinary registers and moved each to a uniform one before its wgmma: 2-6% slower
# dense kernels on the H100, BENCHMARKS.md 2026-11-26.)
CUTE_PARTITIONS = {
    "tSrQ": "tiled_mma_qk.get_thread_slice(wg * 128).partition_fragment_A(make_tensor(make_smem_ptr(smem_q), "
            "SmemLayoutQ{}))",
    "tSrK": "tiled_mma_qk.get_thread_slice(wg * 128).partition_fragment_B(make_tensor(make_smem_ptr(smem_k), "
            "SmemLayoutK{}))",
    "tOrV": "tiled_mma_pv.get_thread_slice(wg * 128).partition_fragment_B(make_tensor(make_smem_ptr(smem_v), "
            "SmemLayoutVt{}))",
    "tOsP": "tiled_mma_pv.get_thread_slice(wg * 128).partition_fragment_A(sP)",
}


def test_the_descriptors_build_the_sass_of_cutes_partitions(tmp_path):
    """The default tile with SS P·V (all four operands, two consumer warpgroups) as generated and with CuTe's
    partitions (sliced by the uniform warpgroup) put back: the same wgmma instructions, each on a uniform
    descriptor register (which ones is ptxas's choice), and no more than 1% other instructions apart (the two set the descriptors up in a few
    different uniform instructions: 8 of 3232 with nvcc 13.0). And no wgmma waits on a register moved into a
    uniform one (R2UR) just before it: the descriptors are built in uniform registers, as CUTLASS's are."""
    import dataclasses

    import tl
    import translate

    try:
        nvcc.find_nvcc()
        nvcc.cutlass_include_dir()
        find_cuobjdump()
    except nvcc.ToolNotFound as exc:
        pytest.skip(str(exc))
    h100, spec = load_profile("h100"), KernelSpec("mha", 128, 128, True, "bf16")
    params = KernelParams.from_dict({**hopper_params(h100, spec).to_dict(), "pv_operand": "ss"})
    gen = translate.generate(tl.parse_program(tl.load_sketch("mha", True, "ws_overlap")), params, h100, spec)
    lines = gen.body.split("\n")
    for i, line in enumerate(lines):
        for name, call in CUTE_PARTITIONS.items():
            if line.lstrip().startswith(f"Tensor {name} = attn_sm90::gmma_operand<"):
                lines[i] = line[:len(line) - len(line.lstrip())] + f"Tensor {name} = {call};"
    # CuTe's partitions take the tiles' layouts, which the kernel declares only for P (frame.smem_layouts)
    at = next(i for i, line in enumerate(lines) if line.startswith("using TiledMmaPV")) + 1
    lines[at:at] = [line for line in frame.smem_layouts(params, spec) if "SmemLayoutP" not in line]
    with_cute = dataclasses.replace(gen, body="\n".join(lines))
    assert with_cute.body.count(".partition_fragment_") == 4
    sass = {}
    for label, kernel in (("ours", gen), ("cute", with_cute)):
        result = nvcc.compile_kernel(kernel, h100.nvcc_arch, timeout=600)
        assert result.ok, result.log[-3000:]
        cubin = tmp_path / f"{label}.cubin"
        cubin.write_bytes(result.cubin)
        sass[label] = sass_instructions(cubin)[gen.name]
    ours, cute = sass["ours"], sass["cute"]
    assert len(ours) > 1000 and abs(len(ours) - len(cute)) <= len(cute) // 100
    def wgmmas(sass_lines):
        return [re.sub(r"gdesc\[UR\d+\]", "gdesc[UR]", i) for i in sass_lines if "HGMMA" in i]

    assert wgmmas(ours) == wgmmas(cute)
    assert not wgmmas_fed_by_r2ur(ours), wgmmas_fed_by_r2ur(ours)[:3]
