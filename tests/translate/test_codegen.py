"""The translator on CPU: every reference sketch translates for sm75/sm80/sm90, the dependency pass,
the schedule following the statement order, errors with TL lines, parameter rules."""
import json
import re

import pytest

import tl
import translate
from hardware_profiles import load_profile
from translate import TranslationError
from translate.defaults import default_params
from translate.params import KernelParams, validate
from kernel_abi.spec import KernelSpec, Problem
from sketch_edits import moved_prefetch

VARIANTS = ("mha", "gqa", "mqa", "mla")
ARCHS = {"sm75": ("t4", "fp16"), "sm80": ("a100", "bf16"), "sm90": ("h100", "bf16")}


def sketch(variant: str, causal: bool) -> str:
    return tl.sketch_path(variant, causal).read_text() if hasattr(tl, "sketch_path") else ""


def spec_of(variant: str, causal: bool, dtype: str = "bf16") -> KernelSpec:
    return KernelSpec(variant, 192 if variant == "mla" else 128, 128, causal, dtype)


def gen(text: str, spec: KernelSpec, gpu: str = "h100", params: KernelParams | None = None):
    profile = load_profile(gpu)
    return translate.generate(tl.parse_program(text), params or default_params(profile, spec), profile, spec)


def block_of(code: str, tl_marker: str, copy: int = 0) -> str:
    """The emitted lines from a `// TL n: <marker>` comment to the next TL comment."""
    parts = [m.start() for m in re.finditer(r"// TL \d+: " + re.escape(tl_marker), code)]
    start = parts[copy]
    nxt = code.find("// TL ", start + 1)
    return code[start:nxt if nxt > 0 else len(code)]


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_sketch_translates(variant, causal, arch):
    gpu, dtype = ARCHS[arch]
    spec = spec_of(variant, causal, dtype)
    text = sketch(variant, causal)
    k = gen(text, spec, gpu)
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k.name)
    assert f'extern "C" __global__ void __launch_bounds__(kNThreads, 1) {k.name}(' in k.body
    assert k.body.count(f"namespace {k.name}_ns {{") == 1
    assert k.source == k.preamble + "\n" + k.body and "#include" not in k.body
    # Every TL statement of the program is commented in the code with its line.
    program = tl.parse_program(text)
    for st in tl.ast.walk(program.statements):
        assert f"// TL {st.line}: " in k.body, st
    # Atoms follow the architecture and dtype.
    mma = {"sm75": "SM75_16x8x8_F32F16F16F32_TN"}.get(arch, "SM80_16x8x16_F32BF16BF16F32_TN")
    assert mma in k.body
    if arch == "sm75":
        assert "cp_async" not in k.body and "UniversalCopy<cute::uint128_t>" in k.body
    else:
        assert "cp_async_wait" in k.body and "SM80_CP_ASYNC" in k.body
    assert ("apply_mask<true>" in k.body) == causal
    assert (f"kHeadDimQK = {spec.d_qk};" in k.body) and (f"kHeadDimV = {spec.d_v};" in k.body)
    meta = json.loads(json.dumps(k.meta()))
    assert meta["name"] == k.name and meta["smem_bytes"] == k.smem_bytes and meta["spec"]["causal"] == causal


def test_preamble_is_shared_and_names_are_unique():
    spec = spec_of("mha", False)
    a = gen(sketch("mha", False), spec, params=KernelParams(block_n=64))
    b = gen(sketch("mha", False), spec, params=KernelParams(block_n=32, kv_stages=2))
    assert a.preamble == b.preamble and a.name != b.name
    assert (translate.INCLUDE_DIR / "attn_tl.cuh").is_file()


def test_dependency_pass_waits_for_k_before_the_score_gemm():
    k = gen(sketch("mha", False), spec_of("mha", False), params=KernelParams(kv_stages=1))
    gemm1 = block_of(k.body, "Compute GEMM Q_shared, K_shared.T and get S")
    assert "cute::cp_async_wait<0>();" in gemm1 and "__syncthreads();" in gemm1
    assert gemm1.index("cp_async_wait") < gemm1.index("gemm_ss")
    # The prefetch of K(i+1) overwrites the buffer GEMM1 just read: a barrier first (single buffer).
    prefetch = block_of(k.body, "Copy K (BN, HeadDim) in coordinate [L = i+1]")
    assert "__syncthreads();" in prefetch.split("copy_rows_zfill")[0]
    # GEMM2 waits for V only: the K prefetch issued after V may stay in flight.
    gemm2 = block_of(k.body, "Compute GEMM S, V_shared and accumulate O_register")
    assert "cute::cp_async_wait<1>();" in gemm2


@pytest.mark.parametrize("gpu,dtype,g2s", [("t4", "fp16", None), ("h100", "bf16", "UniversalCopy128")])
def test_synchronous_copies_get_a_barrier_the_skipped_prefetch_cannot_provide(gpu, dtype, g2s):
    # Plain 128-bit loads (sm75) have no cp.async wait; the only barrier between the V copy and the
    # PV GEMM used to be the one inside `if i < N - 1` -- absent on the last KV tile, where warps then
    # read V (and later overwrite Q with O) while others still wrote/read it.
    spec = spec_of("mha", True, dtype)
    profile = load_profile(gpu)
    params = default_params(profile, spec)
    if g2s:
        params = KernelParams(**{**params.__dict__, "g2s_atom": g2s})
    k = gen(sketch("mha", True), spec, gpu, params)
    for copy in (0, 1):   # masked and unmasked copies of the loop body
        gemm2 = block_of(k.body, "Compute GEMM S, V_shared and accumulate O_register", copy=copy)
        assert "__syncthreads();" in gemm2.split("gemm_rs")[0], gemm2
        assert "V_shared[slot 0] was written by other threads" in gemm2


def test_two_stage_ring_needs_no_barrier_before_the_prefetch():
    k = gen(sketch("mha", False), spec_of("mha", False), params=KernelParams(kv_stages=2))
    prefetch = block_of(k.body, "Copy K (BN, HeadDim) in coordinate [L = i+1]")
    assert "__syncthreads" not in prefetch.split("copy_rows_zfill")[0]
    assert "(((i + 1)) % 2) * kTileKElems" in prefetch        # the slot of tile i+1
    gemm1 = block_of(k.body, "Compute GEMM Q_shared, K_shared.T and get S")
    assert "smem_k + ((i) % 2) * kTileKElems" in gemm1        # GEMM1 reads the slot of tile i


def test_statement_order_is_the_schedule():
    spec = spec_of("mha", False)
    params = KernelParams(kv_stages=1)
    original = gen(sketch("mha", False), spec, params=params)
    moved = gen(moved_prefetch(sketch("mha", False)), spec, params=params)
    assert original.body != moved.body
    loop = moved.body[moved.body.index("// unmasked iterations"):]
    # The K prefetch now follows the second GEMM ...
    assert loop.index("Copy K (BN, HeadDim) in coordinate [L = i+1]") > loop.index("attn_tl::gemm_rs")
    # ... where GEMM2's wait+barrier already released K: no extra barrier, and GEMM2 waits for all.
    prefetch = block_of(moved.body, "Copy K (BN, HeadDim) in coordinate [L = i+1]", copy=1)
    assert "__syncthreads" not in prefetch.split("copy_rows_zfill")[0]
    assert "cute::cp_async_wait<0>();" in block_of(moved.body, "Compute GEMM S, V_shared", copy=1)


def test_q_in_registers_is_hoisted_out_of_the_loop():
    k = gen(sketch("mha", False), spec_of("mha", False), params=KernelParams(q_in_regs=True))
    hoisted = k.body.index("attn_tl::load_fragment(tSrQ")
    assert hoisted < k.body.index("// KV tiles run last to first")
    assert "gemm_ss<true>" in k.body and "gemm_ss<false>" not in k.body


BROKEN = [
    ("Copy K (BN, HeadDim) in coordinate [L = j+1] from global to shared", "unresolved symbol 'j'"),
    ("Compute Exp S", "unknown operator 'Exp'"),
    ("Copy V_shared from shared to global", "Copy from shared to global is not supported"),
]


@pytest.mark.parametrize("replacement, message", BROKEN)
def test_translation_errors_name_the_tl_line(replacement, message):
    text = sketch("mha", False)
    lines = text.splitlines()
    idx = next(i for i, ln in enumerate(lines) if "L = i+1" in ln)
    lines[idx] = "        " + replacement
    with pytest.raises(TranslationError) as err:
        gen("\n".join(lines) + "\n", spec_of("mha", False))
    assert message in str(err.value) and err.value.line == idx + 1


def test_reshape_omission_and_gemm_layout_are_errors():
    text = sketch("mha", False)
    no_reshape = "\n".join(ln for ln in text.splitlines() if not ln.strip().startswith("Reshape")) + "\n"
    with pytest.raises(TranslationError, match="Reshape to MMA_A must come first"):
        gen(no_reshape, spec_of("mha", False))
    with pytest.raises(TranslationError, match=r"needs K_shared.T"):
        gen(text.replace("K_shared.T", "K_shared"), spec_of("mha", False))
    with pytest.raises(TranslationError, match="causal kernel needs `Compute Mask S`"):
        gen(text, spec_of("mha", True))


def test_invalid_params_are_rejected_before_translation():
    with pytest.raises(TranslationError, match="parameters rejected"):
        gen(sketch("mha", False), spec_of("mha", False), params=KernelParams(block_n=40))


def _problem(**kw):
    base = dict(variant="mha", batch=1, heads_q=8, heads_kv=8, seqlen_q=1024, seqlen_k=1024, d_qk=128, d_v=128,
                causal=False, dtype="bf16")
    base.update(kw)
    return Problem(**base)


@pytest.mark.parametrize("params, reason", [
    (KernelParams(block_m=128, block_n=192, num_warps=4), "accumulators need 320 fp32 registers"),
    (KernelParams(block_m=128, block_n=16, num_warps=8), "block_n 16 must be a multiple of 32"),
    (KernelParams(mma_atom="SM75_16x8x8"), "no bf16"),
])
def test_validate_refinements(params, reason):
    assert any(reason in e for e in validate(params, load_profile("h100"), _problem())), \
        validate(params, load_profile("h100"), _problem())


def test_validate_accepts_what_the_sweep_uses():
    h100 = load_profile("h100")
    for p in (KernelParams(128, 64, 4, 2), KernelParams(128, 128, 4), KernelParams(64, 32, 2, 3)):
        assert validate(p, h100, _problem(d_qk=64, d_v=64)) == []
