"""A decode TL program + DecodeParams -> one split-KV decode kernel (``GeneratedKernel``) and its combine kernel.

The sketch fixes the flow (tl/phase.py): Q packed into the tile's rows, a loop over one split's key tiles that
gathers K and V (densely or through the page table: tl/layout.py), the score GEMM, mask, online softmax, the
C->A reshape and the P·V GEMM, then the Combine of the splits and the store. The translator checks that flow
statement by statement and honours its order where the kernel has a choice:

- the K/V copies before the loop's first GEMM: the next tile's gathers go out before this tile's GEMMs (the
  ring keeps kv_stages - 1 tiles in flight either way; issuing first gives the memory system the most time);
  after the GEMMs: they go out once this tile's operands are read;
- ``Copy Q_shared from shared to register``: Q is read into registers once; without it every tile's score
  GEMM reads Q from shared memory.
- ``Copy P from register to shared`` in the loop, the P·V GEMM reading ``P_shared``: split-d_v mode (MLA
  absorbed decode, tl/sketches/decode/mla_paged.tl). Each warp group scores its columns of the tile, P goes
  through a shared tile, and every group multiplies all of it by its d_v / warps_n slice of V, so O (512
  columns) is spread over the groups' registers. Without it (P reshaped C->A in registers) the groups run
  independent softmaxes over their columns and each holds all of O.

Whether V is read from K's rows (absorbed MLA: V is the first d_v columns of the latent cache, ``kVFromK``) comes
from the spec, not the sketch: TL has no column slice of a tile, so an MLA sketch still states its V copy, which
the kernel serves from the K stage instead of a second gather (translate/decode/params.py: v_from_k).

The device code is translate/include/attn_decode.cuh; this module emits its configuration and the two entry
points (``<name>`` and ``<name>_combine``), both taking one ``attn_decode::Args`` by value. With
``DecodeParams.mma == "sm90_wgmma"`` (Hopper, absorbed MLA split-d_v only) the split kernel is
attn_decode_sm90.cuh's split_kv_wgmma: the same Args, split rule, workspace and combine kernel, its GEMMs as SS
warpgroup MMAs (the Cfg adds the two TiledMMAs and the GMMA views of Q, K, V and P). The default's source is
unchanged by that option (compile caches are keyed by source). Over an e4m3 cache (``spec.kv_dtype == "fp8"``) the
split kernel is attn_decode_fp8.cuh's split_kv_fp8 (column groups) or, split-d_v (absorbed MLA over an e4m3 latent),
attn_decode_fp8_mla.cuh's split_kv_fp8_mla, the same Cfg with fp16 GEMMs, both taking the scales as a second
argument.
"""
from __future__ import annotations

import math


from tl.ast import Compute, Copy, For, Program, Reshape, walk
from tl.layout import layout_of
from tl.options import OPTIONS, options_of
from tl.phase import combines, split_loops
from kernel_abi.decode import COMBINE_WARPS, v_from_k
from translate.decode.params import WGMMA_KINDS, DecodeParams, decode_smem_bytes, validate_decode
from translate.kernel import GeneratedKernel, TranslationError, sketch_hash
from kernel_abi.spec import KernelSpec

# cuLaunchKernel takes the one struct (tuner/serving/launch/decode_kernel.py packs it): the argument list names it.
DECODE_ARGS = (("args", "struct:attn_decode::Args"),)
# kv_load tma: the split kernel also takes the K cache's TMA descriptor (encoded per call shape, its address
# written per call: tuner/serving/launch/decode_kernel.py); the combine kernel takes the struct alone.
DECODE_TMA_ARGS = DECODE_ARGS + (("k_map", "tensormap:k"),)
# kv_dtype fp8: the split kernel also takes the cache's scales (attn_decode_fp8.cuh KvScales, packed per call).
DECODE_FP8_ARGS = DECODE_ARGS + (("scales", "struct:attn_decode::KvScales"),)
COMBINE_MIN_CTAS = 8   # combine CTAs an SM holds at least: 64 registers a thread, the measured build

_MMA = {"fp16": "SM80_16x8x16_F32F16F16F32_TN", "bf16": "SM80_16x8x16_F32BF16BF16F32_TN"}
_ELEMENT = {"fp16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t"}
PREAMBLE = ("// Generated from a decode TL program by translate (github: this repository); do not edit.\n"
            "#include <cute/tensor.hpp>\n"
            "#include \"attn_decode.cuh\"\n")
# (header, split entry point) of each Hopper warpgroup-MMA kernel (translate.decode.params.WGMMA_KINDS, sm_90a only):
# "sm90_wgmma" the split-d_v kernel with Hopper warpgroup MMAs, "sm90_seesaw" the same with the warpgroups out of step
_WGMMA_KERNELS = {"sm90_wgmma": ("attn_decode_sm90.cuh", "split_kv_wgmma"),
                  "sm90_seesaw": ("attn_decode_sm90_seesaw.cuh", "split_kv_seesaw")}
# (header, split entry point) of the e4m3-cache kernels by split-d_v: the grouped one (column groups), and the absorbed
# MLA one over an e4m3 latent cache (split-d_v, V from K's rows)
_FP8_KERNELS = {False: ("attn_decode_fp8.cuh", "split_kv_fp8"), True: ("attn_decode_fp8_mla.cuh", "split_kv_fp8_mla")}


def _loop_flow(loop: For) -> tuple[bool, bool, list[str]]:
    """(the K/V gathers come before the first GEMM, split-d_v: P goes through shared memory to the P·V GEMM,
    what the loop body lacks)."""
    body = list(walk(loop.body))
    kinds = []
    p_to_shared: set[str] = set()     # X_shared of every `Copy X from register to shared` in the loop
    pv_a = None                       # the A operand of the second GEMM
    for s in body:
        if isinstance(s, Copy) and s.src == "global" and s.dst == "shared":
            kinds.append(("copy", s.tensor.name))
        elif isinstance(s, Copy) and s.src == "register" and s.dst == "shared":
            p_to_shared.add(f"{s.tensor.base}_shared")
        elif isinstance(s, Compute):
            kinds.append((s.op_key, s.result or ""))
            if s.op_key == "gemm" and sum(k == "gemm" for k, _ in kinds) == 2 and s.args:
                pv_a = s.args[0].name
        elif isinstance(s, Reshape):
            kinds.append(("reshape", s.name))
    split_dv = pv_a is not None and pv_a in p_to_shared
    copies = [i for i, (k, _) in enumerate(kinds) if k == "copy"]
    gemms = [i for i, (k, _) in enumerate(kinds) if k == "gemm"]
    missing = []
    if {name for k, name in kinds if k == "copy"} < {"K", "V"} or len(copies) < 2:
        missing.append("the K and V copies from global to shared")
    if len(gemms) != 2:
        missing.append("two GEMMs (scores Q·K^T, then P·V)")
    needs = [("softmax", "the online softmax")]
    if not split_dv:   # through shared memory P needs no register reshape: ldmatrix reads it as the A operand
        needs.append(("reshape", "the C->A Reshape of the scores (or P through shared memory: "
                                 "`Copy P from register to shared`, then `GEMM P_shared, V_shared`)"))
    for op, what in needs:
        if not any(k == op for k, _ in kinds):
            missing.append(what)
    first_gemm = gemms[0] if gemms else len(kinds)
    return bool(copies) and max(copies) < first_gemm, split_dv, missing


def generate_decode(program: Program, params: DecodeParams, profile, spec: KernelSpec) -> GeneratedKernel:
    if not isinstance(params, DecodeParams):
        raise TranslationError("a decode sketch takes decode parameters (translate.decode.DecodeParams)")
    if spec.phase != "decode":
        raise TranslationError(f"the sketch is a decode sketch (a loop over split_begin:split_end) but the kernel "
                               f"is asked for {spec.phase}")
    layout = layout_of(program)
    if layout not in ("dense", "paged"):
        raise TranslationError(f"decode reads its cache densely or through a page table, not {layout}")
    if layout != spec.layout:
        raise TranslationError(f"the sketch states the {layout} cache (its K/V offsets) but the kernel is asked for "
                               f"{spec.layout}")
    loops = split_loops(program)
    if len(loops) != 1:
        raise TranslationError("a decode sketch has one loop over its split's keys", loops[1].line if loops else 0)
    prefetch_first, split_dv, missing = _loop_flow(loops[0])
    if missing:
        raise TranslationError("the split loop lacks " + ", ".join(missing), loops[0].line)
    if not combines(program):
        raise TranslationError("the splits are never combined (`Compute Combine ...` after the loop)", loops[0].line)
    q_in_regs = any(isinstance(s, Copy) and s.tensor.name in ("Q", "Q_shared") and s.src == "shared"
                    and s.dst == "register" for s in walk(program.statements))
    problems = validate_decode(params, profile, spec, split_dv=split_dv, q_in_regs=q_in_regs)
    problems += option_problems(program, spec, params)
    if problems:
        raise TranslationError("parameters rejected: " + "; ".join(problems))
    name = f"attn_{spec.label()}_{params.key()}_dec{sketch_hash(program)}"
    wgmma = params.mma in WGMMA_KINDS
    body = (_body_wgmma if wgmma else _body)(name, params, spec, layout == "paged", prefetch_first, q_in_regs,
                                              split_dv)
    preamble = PREAMBLE.replace('"attn_decode.cuh"', f'"{_WGMMA_KERNELS[params.mma][0]}"') if wgmma else PREAMBLE
    extra_args = DECODE_TMA_ARGS if params.kv_load == "tma" else DECODE_ARGS
    if spec.kv_dtype == "fp8":   # validate_decode has checked: an mma.sync kernel, grouped or (MLA) split-d_v
        preamble = PREAMBLE.replace('"attn_decode.cuh"', f'"{_FP8_KERNELS[split_dv][0]}"')
        extra_args = DECODE_FP8_ARGS
    return GeneratedKernel(name=name, preamble=preamble, body=body,
                           num_threads=params.num_threads,
                           smem_bytes=decode_smem_bytes(params, spec, split_dv=split_dv), block_m=params.block_m,
                           block_n=params.block_n, spec=spec, params=params, extra_args=extra_args, grid="decode")


def option_problems(program: Program, spec: KernelSpec, params: DecodeParams) -> list[str]:
    """Why the sketch and the spec disagree on the options (tl/options.py: a Mask naming the Window, Softcap, Sink),
    or why this kernel cannot build them: the split kernel with CUDA-core MMAs computes them, the absorbed-MLA
    (V from K) and Hopper warpgroup kernels do not."""
    features = tuple(getattr(spec, "features", ()))
    stated = tuple(o for o in OPTIONS if o in options_of(program))
    problems = []
    if stated != features:
        problems.append(f"the sketch states the options ({', '.join(stated) or 'none'}) but the kernel is asked for "
                        f"({', '.join(features) or 'none'}): tl.options.with_options adds them to a sketch")
    if features and (v_from_k(spec) or params.mma in WGMMA_KINDS):
        problems.append(f"{', '.join(features)}: built by the grouped decode kernel (mma sm80), not the absorbed-MLA "
                        "or warpgroup kernels")
    return problems


def _options_cfg(spec: KernelSpec) -> list[str]:
    """attn_decode.cuh's Options<Cfg>: emitted only for a kernel with options (the others keep their source)."""
    features = tuple(getattr(spec, "features", ()))
    if not features:
        return []
    b = lambda v: "true" if v else "false"   # noqa: E731
    return [f"  struct Opts {{ static constexpr bool kLocal = {b('local' in features)}, "
            f"kSoftcap = {b('softcap' in features)}, kSinks = {b('sinks' in features)}; }};   // run-time sizes: Args"]


def _combine_call(name: str, spec: KernelSpec) -> str:
    sinks = ", true" if "sinks" in getattr(spec, "features", ()) else ""
    return f"  attn_decode::combine<{name}_ns::Cfg::Element, {spec.d_v}{sinks}>(args);"


def _atom(width: int, swizzle: int) -> str:
    """Q/K/V's 8-row atom: 64 columns, or 32 where 64 do not divide the head dim (96; validate_decode keeps its
    swizzle to 2 bits, the four 16-byte chunks of a row)."""
    base = ("Layout<Shape<_8, _64>, Stride<_64, _1>>" if width % 64 == 0 else
            "Layout<Shape<_8, Int<32>>, Stride<Int<32>, _1>>")
    return f"decltype(composition(Swizzle<{swizzle}, 3, 3>{{}}, {base}{{}}))" if swizzle else base


def _p_atom(block_n: int, swizzle: int) -> str:
    """The P tile's 8-row atom: 64 columns as Q/K's, else the tile's width (a 16-column row of 16-bit values
    is two 16-byte chunks: Swizzle<1, 3, 3>, 32 columns Swizzle<2, 3, 3>), bank-conflict-free for ldmatrix."""
    width = min(64, block_n)
    bits = {16: 1, 32: 2, 64: 3}[width]
    base = f"Layout<Shape<_8, Int<{width}>>, Stride<Int<{width}>, _1>>"
    return f"decltype(composition(Swizzle<{min(bits, swizzle)}, 3, 3>{{}}, {base}{{}}))" if swizzle else base


def _body(name: str, p: DecodeParams, spec: KernelSpec, paged: bool, prefetch_first: bool, q_in_regs: bool,
          split_dv: bool = False) -> str:
    b = lambda v: "true" if v else "false"   # noqa: E731
    p_layout = ["  using SmemLayoutP = decltype(tile_to_shape(" + _p_atom(p.block_n, p.swizzle) +
                "{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));"] if split_dv else []
    lines = [
        f"namespace {name}_ns {{",
        "using namespace cute;",
        "struct Cfg {",
        f"  using Element = {_ELEMENT[spec.dtype]};",
        f"  static constexpr int kBlockM = {p.block_m}, kBlockN = {p.block_n}, kStages = {p.kv_stages};",
        f"  static constexpr int kWarpsM = {p.warps_m}, kWarpsN = {p.warps_n}, kThreads = {p.num_threads};",
        f"  static constexpr int kHeadDimQK = {spec.d_qk}, kHeadDimV = {spec.d_v};",
        f"  static constexpr bool kCausal = {b(spec.causal)}, kPaged = {b(paged)}, kPackGqa = {b(p.pack_gqa)};",
        f"  static constexpr bool kPrefetchFirst = {b(prefetch_first)}, kQInRegs = {b(q_in_regs)};",
        f"  static constexpr bool kSplitDV = {b(split_dv)}, kVFromK = {b(v_from_k(spec))};",
        *_options_cfg(spec),
        f"  using TiledMma = TiledMMA<MMA_Atom<{_MMA[_mma_dtype(spec)]}>, Layout<Shape<Int<kWarpsM>, _1, _1>>,",
        "                            Tile<Int<16 * kWarpsM>, _16, _16>>;   // one warp group: warps along M",
        f"  using SmemAtom = {_atom(math.gcd(spec.d_qk, spec.d_v), p.swizzle)};",
        "  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDimQK>>{}));",
        "  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDimQK>>{}));",
        "  using SmemLayoutV = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDimV>>{}));",
        "  using SmemLayoutVt = decltype(composition(SmemLayoutV{}, make_layout(Shape<Int<kHeadDimV>, Int<kBlockN>>{},"
        " GenRowMajor{})));",
        "  using SmemLayoutVtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutVt{}));",
        "  using S2RAtomQK = Copy_Atom<SM75_U32x4_LDSM_N, Element>;",
        "  using S2RAtomV = Copy_Atom<SM75_U16x8_LDSM_T, Element>;",
        *p_layout,
        "};",
        f"}}  // namespace {name}_ns",
        "",
        *_split_entry(name, p, spec, split_dv),
        "",
        f'extern "C" __global__ void __launch_bounds__({32 * COMBINE_WARPS}, {COMBINE_MIN_CTAS}) {name}_combine('
        "const attn_decode::Args args) {",
        _combine_call(name, spec),
        "}",
    ]
    return "\n".join(lines) + "\n"


def _mma_dtype(spec: KernelSpec) -> str:
    """The GEMMs' operand dtype: the queries', or over an e4m3 cache fp16 whatever the queries (attn_decode_fp8.cuh
    says why)."""
    return "fp16" if spec.kv_dtype == "fp8" else spec.dtype


def _split_entry(name: str, p: DecodeParams, spec: KernelSpec, split_dv: bool) -> list[str]:
    """The split kernel's entry point: split_kv, or over an e4m3 cache split_kv_fp8 (split-d_v: split_kv_fp8_mla)
    with the scales' argument."""
    fp8 = spec.kv_dtype == "fp8"
    scales = ", const attn_decode::KvScales scales" if fp8 else ""
    call = (f"{_FP8_KERNELS[split_dv][1]}<{name}_ns::Cfg>(args, scales, smem)" if fp8 else
            f"split_kv<{name}_ns::Cfg>(args, smem)")
    return [f'extern "C" __global__ void __launch_bounds__({p.num_threads}) {name}(const attn_decode::Args args'
            f'{scales}) {{',
            "  extern __shared__ __align__(128) char smem[];",
            f"  attn_decode::{call};",
            "}"]


def _body_wgmma(name: str, p: DecodeParams, spec: KernelSpec, paged: bool, prefetch_first: bool,
                q_in_regs: bool, split_dv: bool) -> str:
    """The Cfg of attn_decode::split_kv_wgmma, or with mma sm90_seesaw of split_kv_seesaw (validate_decode has
    checked: split-d_v, V from K, 64 x 64 tiles, two warpgroups, Q in shared memory): the cp.async writes' layouts
    as _body's, the wgmma TiledMMAs of one warpgroup (lockstep: SS over half a tile's keys; seesaw: a whole tile's
    keys by 64-column chunks, plus the RS ones for Q's last chunk and its own P) and the GMMA views of Q, K, V
    (MN-major, the K slot's first d_v columns) and P."""
    b = lambda v: "true" if v else "false"   # noqa: E731
    gmma_k = "GMMA::Layout_K_SW128_Atom<Element>{}"
    seesaw = p.mma == "sm90_seesaw"
    tma = p.kv_load == "tma"   # validate_decode: seesaw only
    if seesaw:   # each warpgroup scores a whole tile, 64 columns of d_qk a chunk (the last chunk's Q in registers)
        mmas = [
            "  // wgmma, one warpgroup each: S = Q . K^T of its own tile by 64-column chunks (SS, the last chunk RS),",
            "  // O_wg += P . V_wg (its d_v / 2 columns): its own P from registers (RS), the other's from shared (SS)",
            "  using TiledMmaQK = decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, "
            "Shape<_64, Int<kBlockN>, _64>>()));",
            "  using TiledMmaQKrs = decltype(make_tiled_mma(GMMA::rs_op_selector<Element, Element, float, "
            "Shape<_64, Int<kBlockN>, _64>>()));",
            "  using TiledMmaPV = decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, "
            "Shape<_64, Int<kHeadDimV / 2>, Int<kBlockN>>, GMMA::Major::K, GMMA::Major::MN>()));",
            "  using TiledMmaPVrs = decltype(make_tiled_mma(GMMA::rs_op_selector<Element, Element, float, "
            "Shape<_64, Int<kHeadDimV / 2>, Int<kBlockN>>, GMMA::Major::K, GMMA::Major::MN>()));",
        ]
    else:
        mmas = [
            "  // wgmma, one warpgroup each: S = Q . K_wg^T (its kBlockN / 2 keys), O_wg += P . V_wg (its d_v / 2 "
            "columns)",
            "  using TiledMmaQK = decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, "
            "Shape<_64, Int<kBlockN / 2>, Int<kHeadDimQK>>>()));",
            "  using TiledMmaPV = decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, "
            "Shape<_64, Int<kHeadDimV / 2>, Int<kBlockN>>, GMMA::Major::K, GMMA::Major::MN>()));",
        ]
    lines = [
        f"namespace {name}_ns {{",
        "using namespace cute;",
        "struct Cfg {",
        f"  using Element = {_ELEMENT[spec.dtype]};",
        f"  static constexpr int kBlockM = {p.block_m}, kBlockN = {p.block_n}, kStages = {p.kv_stages};",
        f"  static constexpr int kWarpsM = {p.warps_m}, kWarpsN = {p.warps_n}, kThreads = {p.num_threads};",
        f"  static constexpr int kHeadDimQK = {spec.d_qk}, kHeadDimV = {spec.d_v};",
        f"  static constexpr bool kCausal = {b(spec.causal)}, kPaged = {b(paged)}, kPackGqa = {b(p.pack_gqa)};",
        f"  static constexpr bool kPrefetchFirst = {b(prefetch_first)}, kQInRegs = {b(q_in_regs)};",
        f"  static constexpr bool kSplitDV = {b(split_dv)}, kVFromK = {b(v_from_k(spec))};",
        *(["  static constexpr bool kTmaLoad = true;   // whole tiles as TMA boxes (kv_load tma)"]
          if tma else []),
        *([f"  static constexpr int kRescaleThreshold = {p.rescale_threshold};   // the conditional rescale"]
          if p.rescale_threshold else []),
        "  // the cp.async writes (Swizzle<3, 3, 3> over 8 x 64 atoms: the bytes of the 128-byte GMMA swizzle)",
        f"  using SmemAtom = {_atom(math.gcd(spec.d_qk, spec.d_v), p.swizzle)};",
        "  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDimQK>>{}));",
        "  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDimQK>>{}));",
        *mmas,
        f"  using GmmaLayoutQ = decltype(tile_to_shape({gmma_k}, Shape<Int<kBlockM>, Int<kHeadDimQK>>{{}}));",
        f"  using GmmaLayoutK = decltype(tile_to_shape({gmma_k}, Shape<Int<kBlockN>, Int<kHeadDimQK>>{{}}));",
        "  // V^T: the K slot's first d_v columns read MN-major (keys 8-row atoms first, then 64-column chunks)",
        "  using GmmaLayoutVt = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Element>{}, "
        "Shape<Int<kHeadDimV>, Int<kBlockN>>{}, Step<_2, _1>{}));",
        f"  using GmmaLayoutP = decltype(tile_to_shape({gmma_k}, Shape<Int<kBlockM>, Int<kBlockN>>{{}}));",
        "};",
        f"}}  // namespace {name}_ns",
        "",
        f'extern "C" __global__ void __launch_bounds__({p.num_threads}, 1) {name}(const attn_decode::Args args'
        + (", const __grid_constant__ CUtensorMap k_map) {" if tma else ") {"),
        "  extern __shared__ __align__(1024) char smem[];",
        f"  attn_decode::{_WGMMA_KERNELS[p.mma][1]}<{name}_ns::Cfg>(args, smem{', &k_map' if tma else ''});",
        "}",
        "",
        f'extern "C" __global__ void __launch_bounds__({32 * COMBINE_WARPS}, {COMBINE_MIN_CTAS}) {name}_combine('
        "const attn_decode::Args args) {",
        f"  attn_decode::combine<{name}_ns::Cfg::Element, {spec.d_v}>(args);",
        "}",
    ]
    return "\n".join(lines) + "\n"
