"""A warp-specialised TL program + parameters -> one Hopper kernel (``GeneratedKernel``).

Warpgroup 0 runs the producer block: one thread issues the TMA loads (Q once, then K and V tile by tile
into a ring of ``kStages`` stages, each behind a full/empty mbarrier pair) after giving most of its
registers back (setmaxnreg). Warpgroups 1..W run the consumer block with the registers the producer
gave up: wgmma GEMMs issued asynchronously, the waits the dependency pass placed, the online softmax on
the accumulator layout, and an epilogue through shared memory and a TMA store.
"""
from __future__ import annotations

from tl.ast import Program
from translate.kernel import GeneratedKernel, TranslationError
from translate.sm90 import emit as em
from translate.sm90.ir import Op
from translate.sm90.lower import WsLowering, stmt_text
from translate.sm90.schedule import schedule_consumer

PREAMBLE = ("// Generated from a TL program by translate (github: this repository); do not edit.\n"
            "#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED 1  // wgmma N in steps of 8, not only powers of two\n"
            "#include <cute/tensor.hpp>\n"
            "#include \"attn_tl.cuh\"\n"
            "#include \"attn_sm90.cuh\"\n")

# The arguments after the sm80 ones (translate/kernel.py KERNEL_ARGS): the TMA descriptors, by value.
TMA_ARGS = (("tma_q", "tensormap:q"), ("tma_k", "tensormap:k"), ("tma_v", "tensormap:v"), ("tma_o", "tensormap:o"))


def generate_warp_specialized(program: Program, params, profile, spec) -> GeneratedKernel:
    lowered = WsLowering(program, params, spec).run()
    if params.block_m % 64 or not 1 <= params.block_m // 64 <= 3:
        raise TranslationError(f"block_m {params.block_m} must be 64, 128 or 192 (64 rows per consumer warpgroup)")
    consumer = lowered.consumer + [Op("drain", None, "end of the consumer warpgroups")]
    pipelined = {b for b, r in WsLowering_buffer_roles(lowered).items() if r in ("k", "v")}
    holders = schedule_consumer(consumer, lowered.pv_acc, pipelined)
    pingpong = bool(params.pingpong)
    if pingpong and params.block_m != 128:
        raise TranslationError("ping-pong takes turns between exactly two consumer warpgroups (block_m 128)")
    ctx = em.Ctx(spec=spec, params=params, lowered=lowered, stage_holders=holders,
                 buffer_role=WsLowering_buffer_roles(lowered))
    name = f"attn_{spec.label()}_{params.key()}"

    producer_lines = em.emit_nodes(lowered.producer, ctx, pingpong=False)
    consumer_lines = em.consumer_setup(params, lowered, holders, ctx)
    if pingpong:
        consumer_lines.append(f"if (wg == 1) {{ cutlass::arch::NamedBarrier::arrive(2 * 128, {em.PINGPONG_BARRIER}); }}"
                              "  // ping-pong: warpgroup 0 issues first")
    body = em.emit_nodes(consumer, ctx, pingpong)
    if pingpong:   # warpgroup 0 takes the turn warpgroup 1 gives after its last GEMMs: the barrier ends balanced
        at = next(k for k, ln in enumerate(body) if "registers -> shared" in ln) if \
            any("registers -> shared" in ln for ln in body) else len(body)
        body[at:at] = [f"if (wg == 0) {{ cutlass::arch::NamedBarrier::sync(2 * 128, {em.PINGPONG_BARRIER}); }}"
                       "  // ping-pong: the last turn"]
    consumer_lines += body

    wgs = params.block_m // 64
    use_setmaxnreg = wgs > 1     # 256 threads already get 255 registers each
    kernel = [
        "if (tidx < 128) {  // producer warpgroup",
        *( [f"{em.INDENT}cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();"] if use_setmaxnreg else []),
        f"{em.INDENT}if (tidx == 0) {{  // one thread issues every TMA load",
        f"{em.INDENT * 2}int k_write = 0, v_write = 0;  // tiles put into each ring so far",
        *em._indent(producer_lines, 2),
        f"{em.INDENT}}}",
        "} else {  // consumer warpgroups",
        *( [f"{em.INDENT}cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();"] if use_setmaxnreg else []),
        *em._indent(consumer_lines),
        "}",
    ]
    header = [f"// kernel {name}", f"// spec: {spec}", f"// params: {params}",
              f"// target: {profile.name} ({profile.nvcc_arch}); warp-specialised, {wgs} consumer warpgroup(s), "
              f"{lowered.stages} stage(s), P·V {params.pv_operand.upper()}" + (", ping-pong" if pingpong else ""),
              "// TL program:"]
    header += [f"//   {ln}" for ln in _program_lines(program.statements)]
    body_lines = header + [f"namespace {name}_ns {{", "using namespace cute;", ""]
    body_lines += em.kernel_types(spec, params, lowered.stages) + [""]
    body_lines += em.kernel_signature(name)
    body_lines += em._indent(em.kernel_setup() + [""] + kernel)
    body_lines += ["}", "", f"}}  // namespace {name}_ns", ""]
    smem = smem_bytes_ws(params, spec, lowered.stages)
    return GeneratedKernel(name=name, preamble=PREAMBLE, body="\n".join(body_lines),
                           num_threads=128 * (wgs + 1), smem_bytes=smem, block_m=params.block_m,
                           block_n=params.block_n, spec=spec, params=params, extra_args=TMA_ARGS,
                           tensor_maps=tensor_map_boxes(params, spec))


def WsLowering_buffer_roles(lowered) -> dict:
    return {f"{n}_shared": r for n, r in lowered.roles.items() if r != "o"}


def smem_bytes_ws(params, spec, stages: int) -> int:
    """Q (reused for O) + stages x (K + V) + P (SS only) + the mbarriers, as the kernel lays them out."""
    q = params.block_m * max(spec.d_qk, spec.d_v)
    kv = stages * params.block_n * (spec.d_qk + spec.d_v)
    p = params.block_m * params.block_n if params.pv_operand == "ss" else 0
    return (q + kv + p) * 2 + (1 + 4 * stages) * 8


def tensor_map_boxes(params, spec) -> dict:
    """What the host encodes per tensor (runtime.py): a 4-D map (head dim, seqlen, heads, batch) of the
    (batch, seqlen, heads, dim) tensor, 128-byte swizzle, a box of 64 columns x ``rows``."""
    return {"q": {"rows": params.block_m, "dim": "d_qk"}, "k": {"rows": params.block_n, "dim": "d_qk"},
            "v": {"rows": params.block_n, "dim": "d_v"}, "o": {"rows": 64, "dim": "d_v"}}


def _program_lines(stmts, depth: int = 0) -> list[str]:
    out = []
    for s in stmts:
        out.append("    " * depth + stmt_text(s))
        body = getattr(s, "body", None)
        if body is not None:
            out += _program_lines(body, depth + 1)
            out.append("    " * depth + "end")
    return out
