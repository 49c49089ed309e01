"""The wgmma ops a Hopper kernel declares for N outside CuTe's base shapes (translate/sm90/wgmma_ops.py):
their operands are numbered as the instruction takes them, and (real nvcc) their traits are CuTe's extended
header's, type for type, and their code the same SASS."""
import re
import tempfile
from pathlib import Path

import pytest

from translate import nvcc
from translate.sass import find_cuobjdump, sass_instructions
from translate.sm90 import wgmma_ops


@pytest.mark.parametrize("n,operand,dtype", [(176, "ss", "bf16"), (40, "rs", "fp16"), (248, "ss", "fp16")])
def test_declared_wgmma_op_numbers_its_operands_as_the_instruction_takes_them(n, operand, dtype):
    text = "\n".join(wgmma_ops.declarations(dtype, [(n, operand), (n, operand), (128, operand)]))
    assert text.count("struct TL_MMA") == 1 and f"_{operand.upper()}_DECLARED" in text   # once, behind a guard
    asm = re.search(r'"wgmma[^"]*" *\n *"(.*?);', text).group(1)
    numbers = [int(x) for x in re.findall(r"%(\d+)", asm)]
    a_regs = 4 if operand == "rs" else 1
    immediates = 3 if operand == "rs" else 4            # scale A, scale B, (transpose A,) transpose B
    assert numbers == list(range(n // 2 + a_regs + 1)) + list(range(n // 2 + a_regs + 2, n // 2 + a_regs + 2 + immediates))
    assert f"setp.ne.b32 p, %{n // 2 + a_regs + 1}, 0" in text                     # scale-D from its register
    inputs = re.search(r"\n      : (\"r\"|\"l\").*", text).group(0)
    assert inputs.count('"') // 2 == a_regs + 1 + 1 + immediates                     # A, B, scale-D, immediates
    with pytest.raises(ValueError, match="multiple of 8"):
        wgmma_ops.is_extended(260)


def test_the_e4m3_op_of_an_extended_n_numbers_its_operands_as_the_instruction_takes_them():
    """FA3's FP8 block N 224 and 160: QK^T's e4m3 wgmma declared here, A and B descriptors, scale-D from a register,
    the two immediate scales and no transpose bits (8-bit wgmma has none); P.V's (RS) N is the head dim, a base N."""
    text = "\n".join(wgmma_ops.declarations("fp8", [(224, "ss"), (224, "ss"), (128, "rs")]))
    assert text.count("struct TL_MMA_64x224x32_F32E4M3E4M3_SS_TN") == 1 and "m64n224k32.f32.e4m3.e4m3" in text
    asm = re.search(r'"wgmma[^"]*" *\n *"(.*?);', text).group(1)
    assert [int(x) for x in re.findall(r"%(\d+)", asm)] == list(range(114)) + [115, 116]
    assert "setp.ne.b32 p, %114, 0" in text and "Shape_MNK = Shape<_64, Int<224>, _32>" in text
    assert wgmma_ops.mma_op("fp8", 224, "Int<kBlockN>", "Int<kHeadDimQK>", "ss") == \
        "TL_MMA_64x224x32_F32E4M3E4M3_SS_TN<>{}"
    assert wgmma_ops.mma_op("fp8", 192, "Int<kBlockN>", "Int<kHeadDimQK>", "ss").startswith("GMMA::ss_op_selector")
    with pytest.raises(ValueError, match="only with A from shared memory"):
        wgmma_ops.mma_op("fp8", 224, "Int<kHeadDimV>", "Int<kBlockN>", "rs")


def test_a_base_shape_keeps_cutes_op_selector():
    assert wgmma_ops.mma_op("bf16", 128, "Int<kBlockN>", "Int<kHeadDimQK>", "ss") == \
        "GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kHeadDimQK>>>()"
    assert wgmma_ops.mma_op("fp16", 64, "Int<kHeadDimV>", "Int<kBlockN>", "rs", b_major="MN") == \
        ("GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDimV>, Int<kBlockN>>, "
         "GMMA::Major::K, GMMA::Major::MN>()")
    assert wgmma_ops.mma_op("fp16", 80, "Int<kHeadDimV>", "Int<kBlockN>", "rs", b_major="MN") == \
        "TL_MMA_64x80x16_F32F16F16_RS<GMMA::Major::K, GMMA::Major::MN>{}"
    assert wgmma_ops.declarations("bf16", [(128, "ss"), (64, "rs")]) == []


# (dtype, N, A operand): both element types, both operand kinds, small and large N
COMBOS = [("bf16", 176, "ss"), ("fp16", 112, "ss"), ("bf16", 144, "rs"), ("fp16", 240, "rs"), ("bf16", 24, "ss"),
          ("fp8", 224, "ss"), ("fp8", 160, "ss")]
TRAITS = ("ValTypeD", "ValTypeA", "ValTypeB", "ValTypeC", "Shape_MNK", "ThrID", "ALayout", "BLayout", "CLayout",
          "FrgTypeB")


def _op_identity_unit() -> str:
    """One unit with CuTe's extended shapes and our declarations: static_asserts that the traits are the same
    types, and for each combination two kernels that issue the op once, ours and CuTe's."""
    lines = ["#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED 1", "#include <cute/tensor.hpp>", "#include <type_traits>",
             "#include <utility>"]
    for dtype, n, operand in COMBOS:
        lines += wgmma_ops.declarations(dtype, [(n, operand)])
    lines.append("using namespace cute;")
    for i, (dtype, n, operand) in enumerate(COMBOS):
        if dtype == "fp8":   # (8-bit wgmma: k32, both operands K-major, no transpose arguments)
            majors, ours, theirs = "<>", wgmma_ops.op_name(dtype, n, operand), f"SM90_64x{n}x32_F32E4M3E4M3_SS_TN"
        else:
            t = {"fp16": "F16", "bf16": "BF16"}[dtype]
            majors = "<GMMA::Major::K, GMMA::Major::MN>"
            ours, theirs = wgmma_ops.op_name(dtype, n, operand), f"SM90_64x{n}x16_F32{t}{t}_{operand.upper()}"
        for field in TRAITS + (("FrgTypeA",) if operand == "ss" else ()):
            lines.append(f"static_assert(std::is_same_v<MMA_Traits<{ours}{majors}>::{field}, "
                         f"MMA_Traits<{theirs}{majors}>::{field}>, \"{ours}: {field}\");")
        a = "a[0], a[1], a[2], a[3]" if operand == "rs" else "desc_a"
        for who, op in (("ours", ours), ("cute", theirs)):
            lines += [
                f"__global__ void {who}_{i}(float* out, const uint32_t* a, uint64_t desc_a, uint64_t desc_b, int s) {{",
                f"  float d[{n // 2}];",
                f"  for (int j = 0; j < {n // 2}; ++j) d[j] = out[j + threadIdx.x];",
                f"  [&]<size_t... I>(std::index_sequence<I...>) {{ {op}{majors}::fma({a}, desc_b, d[I]..., "
                f"GMMA::ScaleOut(s)); }}(std::make_index_sequence<{n // 2}>{{}});",
                f"  for (int j = 0; j < {n // 2}; ++j) out[j + threadIdx.x] = d[j];",
                "}",
            ]
    return "\n".join(lines) + "\n"


@pytest.mark.slow
def test_declared_ops_have_cutes_traits_and_build_cutes_sass():
    import subprocess

    try:
        nvcc_path = nvcc.find_nvcc()
        include = nvcc.cutlass_include_dir()
        find_cuobjdump()
    except nvcc.ToolNotFound as exc:
        pytest.skip(str(exc))
    with tempfile.TemporaryDirectory() as tmp:
        source, cubin = Path(tmp) / "ops.cu", Path(tmp) / "ops.cubin"
        source.write_text(_op_identity_unit())
        build = subprocess.run([str(nvcc_path), "-std=c++20", "-arch=sm_90a", "-cubin", f"-I{include}",
                                "-o", str(cubin), str(source)], capture_output=True, text=True, timeout=600)
        assert build.returncode == 0, build.stderr[-3000:]    # a trait that differs fails its static_assert
        sass = sass_instructions(cubin)
    by_name = {re.sub(r"^_Z\d+", "", name).split("P")[0]: code for name, code in sass.items()}
    for i, (dtype, n, operand) in enumerate(COMBOS):
        ours, cute = by_name[f"ours_{i}"], by_name[f"cute_{i}"]
        assert ours == cute, (dtype, n, operand)
        opcode = f"QGMMA.64x{n}x32.F32.E4M3.E4M3" if dtype == "fp8" else f"HGMMA.64x{n}x16.F32"
        assert sum(line.startswith(opcode) for line in ours) == 1, (dtype, n)
