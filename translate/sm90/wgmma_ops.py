"""The wgmma op of each GEMM of a Hopper kernel, and the declarations of the shapes CuTe leaves out by default.

wgmma takes any N in steps of 8 up to 256, but CuTe declares only N = 8, 16, 32, 64, 96, 128, 192, 256
unless ``CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED`` is defined; the others live in mma_sm90_gmma_ext.hpp
(2.8 MB) and its traits, and parsing them doubles cicc's time for every kernel that defines it: measured
with nvcc 13.0 (2026-11-23, MHA d128 causal ws_overlap default, 128x128 tiles): 20.9 s of cicc with the
define, 9.9 s without, identical SASS. A kernel whose tile needs one of those N (block N = 112, 176, ...)
declares that one op itself instead: the same PTX instruction and the same CuTe traits (ABLayout,
CLayout_64xN) as the extended header's, checked type for type and SASS for SASS against it
(tests/translate/test_wgmma_ops.py), at the cost of the base shapes.

Generated: the fp32-accumulating 16-bit ops (m64nNk16 .f32.f16.f16 / .f32.bf16.bf16, A from shared memory or
registers) and the e4m3 one an FP8 kernel's QK^T issues (m64nNk32 .f32.e4m3.e4m3, both operands K-major from shared
memory; 8-bit wgmma takes no transpose bits): the only ones our kernels issue.
"""
from __future__ import annotations

BASE_WGMMA_N = (8, 16, 32, 64, 96, 128, 192, 256)   # declared without the define (cute/arch/mma_sm90_gmma.hpp)
_PTX_TYPE = {"fp16": "f16", "bf16": "bf16"}
_CUTE_TYPE = {"fp16": "F16", "bf16": "BF16"}
_ELEMENT = {"fp16": "half_t", "bf16": "bfloat16_t"}
OPERANDS = ("ss", "rs")   # A from shared memory (descriptor) or from registers; B always from shared memory


def is_extended(n: int) -> bool:
    """Whether a wgmma of this N is one CuTe declares only with the extended shapes."""
    if n % 8 or not 8 <= n <= 256:
        raise ValueError(f"wgmma N must be a multiple of 8 in 8..256, not {n}")
    return n not in BASE_WGMMA_N


def op_name(dtype: str, n: int, operand: str) -> str:
    """The C++ name (namespace cute) of the op this module declares for an extended N."""
    if operand not in OPERANDS:
        raise ValueError(f"operand must be one of {OPERANDS}, not {operand!r}")
    if dtype == "fp8":
        if operand != "ss":
            raise ValueError("an e4m3 wgmma of an extended N is declared for the SS QK^T GEMM only")
        return f"TL_MMA_64x{n}x32_F32E4M3E4M3_SS_TN"
    t = _CUTE_TYPE[dtype]
    return f"TL_MMA_64x{n}x16_F32{t}{t}_{operand.upper()}"


def mma_op(dtype: str, n: int, n_cpp: str, k_cpp: str, operand: str, b_major: str = "K") -> str:
    """The op expression handed to ``make_tiled_mma`` for a 64 x n x K GEMM (K = ``k_cpp``): CuTe's op
    selector for a base N (as every kernel used before), this module's declared op for an extended one.
    fp8 (e4m3 x e4m3, k-blocks of 32): base N only, both operands K-major (wgmma has no MN-major 8-bit operands)."""
    if b_major not in ("K", "MN"):
        raise ValueError(f"B's major mode must be K or MN, not {b_major!r}")
    if dtype == "fp8":
        if b_major != "K" or (is_extended(n) and operand != "ss"):
            raise ValueError(f"e4m3 wgmma: B K-major (got {b_major}), and an N outside {BASE_WGMMA_N} ({n}) only with "
                             "A from shared memory")
        if is_extended(n):
            return f"{op_name(dtype, n, operand)}<>{{}}"
        return f"GMMA::{operand}_op_selector<Element, Element, float, Shape<_64, {n_cpp}, {k_cpp}>>()"
    if not is_extended(n):
        majors = "" if b_major == "K" else ", GMMA::Major::K, GMMA::Major::MN"
        return (f"GMMA::{operand}_op_selector<Element, Element, float, "
                f"Shape<_64, {n_cpp}, {k_cpp}>{majors}>()")
    return f"{op_name(dtype, n, operand)}<GMMA::Major::K, GMMA::Major::{b_major}>{{}}"


def declarations(dtype: str, gemms) -> list[str]:
    """C++ that declares the extended-N ops among ``gemms`` ((n, operand) pairs), in namespace cute, each
    behind its own guard so that kernels of one translation unit may declare the same op."""
    lines: list[str] = []
    seen = set()
    for n, operand in gemms:
        if not is_extended(n) or (n, operand) in seen:
            continue
        seen.add((n, operand))
        lines += _declare(dtype, n, operand)
    if not lines:
        return []
    return ["namespace cute {  // wgmma shapes outside CuTe's base set (translate/sm90/wgmma_ops.py)", *lines,
            "}  // namespace cute", ""]


def _declare_e4m3(n: int) -> list[str]:
    """The SS e4m3 op of N ``n``: CuTe's SM90_64xNx32_F32E4M3E4M3_SS_TN for an N it leaves out (scale-D, then the
    immediate scales of A and B; no transpose bits), with the same traits."""
    name = op_name("fp8", n, "ss")
    guard = f"{name}_DECLARED"
    acc = n // 2
    params = ["uint64_t const& desc_a", "uint64_t const& desc_b"] + [f"float& d{i:03d}" for i in range(acc)] + \
        ["GMMA::ScaleOut const scale_D = GMMA::ScaleOut::One"]
    accumulators = "{" + ", ".join(f"%{i}" for i in range(acc)) + "}"
    return [
        f"#ifndef {guard}",
        f"#define {guard}",
        f"// wgmma m64n{n}k32 fp32 += e4m3 x e4m3, A and B K-major from shared memory",
        "template <GMMA::ScaleIn scaleA = GMMA::ScaleIn::One, GMMA::ScaleIn scaleB = GMMA::ScaleIn::One>",
        f"struct {name} {{",
        "  using DRegisters = void;",
        "  using ARegisters = uint64_t[1];",
        "  using BRegisters = uint64_t[1];",
        f"  using CRegisters = float[{acc}];",
        "  CUTE_HOST_DEVICE static void fma(" + ", ".join(params) + ") {",
        "#if defined(CUTE_ARCH_MMA_SM90A_ENABLED)",
        "    asm volatile(",
        '      "{\\n.reg .pred p;\\n"',
        f'      "setp.ne.b32 p, %{acc + 2}, 0;\\n"',
        f'      "wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3 "',
        f'      "{accumulators}, %{acc}, %{acc + 1}, p, %{acc + 3}, %{acc + 4};\\n}}\\n"',
        "      : " + ", ".join(f'"+f"(d{i:03d})' for i in range(acc)),
        '      : "l"(desc_a), "l"(desc_b), "r"(int32_t(scale_D)), "n"(int32_t(scaleA)), "n"(int32_t(scaleB)));',
        "#else",
        f'    CUTE_INVALID_CONTROL_PATH("{name} needs sm_90a (CUTE_ARCH_MMA_SM90A_ENABLED)");',
        "#endif",
        "  }",
        "};",
        "template <GMMA::ScaleIn scaleA, GMMA::ScaleIn scaleB>",
        f"struct MMA_Traits<{name}<scaleA, scaleB>> {{",
        "  using ValTypeD = float;",
        "  using ValTypeA = float_e4m3_t;",
        "  using ValTypeB = float_e4m3_t;",
        "  using ValTypeC = float;",
        "  using FrgTypeA = GMMA::smem_desc<GMMA::Major::K>;",
        "  using FrgTypeB = GMMA::smem_desc<GMMA::Major::K>;",
        f"  using Shape_MNK = Shape<_64, Int<{n}>, _32>;",
        "  using ThrID = Layout<_128>;",
        "  using ALayout = GMMA::ABLayout<64, 32>;",
        f"  using BLayout = GMMA::ABLayout<{n}, 32>;",
        f"  using CLayout = GMMA::CLayout_64xN<{n}>;",
        "  GMMA::ScaleOut accumulate_ = GMMA::ScaleOut::One;",
        "};",
        f"#endif  // {guard}",
    ]


def _declare(dtype: str, n: int, operand: str) -> list[str]:
    if dtype == "fp8":
        return _declare_e4m3(n)
    name = op_name(dtype, n, operand)
    guard = f"{name}_DECLARED"
    acc = n // 2                       # fp32 accumulators per thread: 64 x n over 128 threads
    rs = operand == "rs"
    a_args = [f"uint32_t const& a{i}" for i in range(4)] if rs else ["uint64_t const& desc_a"]
    params = a_args + ["uint64_t const& desc_b"] + [f"float& d{i:03d}" for i in range(acc)] + \
        ["GMMA::ScaleOut const scale_D = GMMA::ScaleOut::One"]
    # operand numbering: accumulators, then A (4 registers or a descriptor), B's descriptor, scale-D,
    # then the immediates (scale A, scale B, and the transpose bits the instruction takes)
    a_ops = "{" + ", ".join(f"%{acc + i}" for i in range(4)) + "}" if rs else f"%{acc}"
    b_op = acc + (4 if rs else 1)
    scale_d = b_op + 1
    immediates = ", ".join(f"%{scale_d + 1 + i}" for i in range(3 if rs else 4))
    accumulators = "{" + ", ".join(f"%{i}" for i in range(acc)) + "}"
    ptx = _PTX_TYPE[dtype]
    inputs = ([f'"r"(a{i})' for i in range(4)] if rs else ['"l"(desc_a)']) + \
        ['"l"(desc_b)', '"r"(int32_t(scale_D))', '"n"(int32_t(scaleA))', '"n"(int32_t(scaleB))'] + \
        ([] if rs else ['"n"(int32_t(tnspA))']) + ['"n"(int32_t(tnspB))']
    template = ("template <GMMA::Major tnspA, GMMA::Major tnspB, "
                "GMMA::ScaleIn scaleA = GMMA::ScaleIn::One, GMMA::ScaleIn scaleB = GMMA::ScaleIn::One>")
    lines = [
        f"#ifndef {guard}",
        f"#define {guard}",
        f"// wgmma m64n{n}k16 fp32 += {dtype} x {dtype}, A from {'registers' if rs else 'shared memory'}",
        template,
        f"struct {name} {{",
        "  using DRegisters = void;",
        f"  using ARegisters = {'uint32_t[4]' if rs else 'uint64_t[1]'};",
        "  using BRegisters = uint64_t[1];",
        f"  using CRegisters = float[{acc}];",
    ]
    if rs:
        lines.append('  static_assert(tnspA == GMMA::Major::K, "A from registers must be K-major");')
    lines += [
        "  CUTE_HOST_DEVICE static void fma(" + ", ".join(params) + ") {",
        "#if defined(CUTE_ARCH_MMA_SM90A_ENABLED)",
        "    asm volatile(",
        '      "{\\n.reg .pred p;\\n"',
        f'      "setp.ne.b32 p, %{scale_d}, 0;\\n"',
        f'      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} "',
        f'      "{accumulators}, {a_ops}, %{b_op}, p, {immediates};\\n}}\\n"',
        "      : " + ", ".join(f'"+f"(d{i:03d})' for i in range(acc)),
        "      : " + ", ".join(inputs) + ");",
        "#else",
        f'    CUTE_INVALID_CONTROL_PATH("{name} needs sm_90a (CUTE_ARCH_MMA_SM90A_ENABLED)");',
        "#endif",
        "  }",
        "};",
        "template <GMMA::Major tnspA, GMMA::Major tnspB, GMMA::ScaleIn scaleA, GMMA::ScaleIn scaleB>",
        f"struct MMA_Traits<{name}<tnspA, tnspB, scaleA, scaleB>> {{",
        "  using ValTypeD = float;",
        f"  using ValTypeA = {_ELEMENT[dtype]};",
        f"  using ValTypeB = {_ELEMENT[dtype]};",
        "  using ValTypeC = float;",
        *([] if rs else ["  using FrgTypeA = GMMA::smem_desc<tnspA>;"]),
        "  using FrgTypeB = GMMA::smem_desc<tnspB>;",
        f"  using Shape_MNK = Shape<_64, Int<{n}>, _16>;",
        "  using ThrID = Layout<_128>;",
        f"  using ALayout = {'GMMA::ALayout_64x16' if rs else 'GMMA::ABLayout<64, 16>'};",
        f"  using BLayout = GMMA::ABLayout<{n}, 16>;",
        f"  using CLayout = GMMA::CLayout_64xN<{n}>;",
        "  GMMA::ScaleOut accumulate_ = GMMA::ScaleOut::One;",
        "};",
        f"#endif  // {guard}",
    ]
    return lines
