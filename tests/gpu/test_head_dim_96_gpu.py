"""Head dim 96 (Phi-3-mini: 32/32 heads of 96) on a Hopper GPU (marker gpu; skipped elsewhere). Its 192-byte rows are
32-column atoms of the 64-byte swizzle, three TMA boxes a row (translate/sm90/swizzle.py). The kernels pass the
gates against the fp32 reference: dense (the defaults, MHA/GQA/MQA, causal and not, fp16, one CTA a tile, ws_serial,
ping-pong, FA4's 192 x 144 SS tile, packed query heads, a window with soft-capping and sinks), strided views through
the TMA maps, packed sequences and paged caches (the cp.async producer's 32-column blocks, TMA boxes of whole pages),
decode (32-column atoms, a 2-bit swizzle), an sm80-class kernel; then an export of the defaults serves flash_attn_func,
flash_attn_varlen_func and flash_attn_with_kvcache at d96 on the kernels, and a wrong kernel is caught.

The module's fixtures build the kernels with translate.nvcc through $KERNEL_CACHE_DIR (or $TUNER_CACHE_DIR): a cache
filled ahead on a CPU machine (all_kernels and tuner.defaults.export.compile_defaults of SERVE_SPECS) saves the
device's compile time; a miss compiles there."""
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs a Hopper (sm_90) GPU")]

import translate  # noqa: E402
from hardware_profiles import load_profile  # noqa: E402
from kernel_abi.spec import KernelSpec  # noqa: E402
from translate import nvcc  # noqa: E402
from translate.decode import DecodeParams  # noqa: E402
from translate.decode.params import default_decode_params  # noqa: E402
from translate.defaults import default_params  # noqa: E402
from translate.params import KernelParams  # noqa: E402
from tuner.build import load_checked_program  # noqa: E402

D = 96


def S(variant, causal, dtype="bf16", layout="dense", phase="prefill", **options):
    return KernelSpec(variant, D, D, causal, dtype, layout, phase, **options)


TMA_PAGES = {"g2s_atom": "SM90_TMA", "producer_regs": 40}
FA4_D96 = {"block_m": 192, "block_n": 144, "num_warps": 12, "pv_operand": "ss"}   # FA4's tile (translate/defaults.py)
# (id, spec, schedule, parameter changes on top of the default); layout and phase come with the spec
CASES = [
    ("mha96c", S("mha", True), "ws_overlap", {}),
    ("mha96n", S("mha", False), "ws_overlap", {}),
    ("gqa96c", S("gqa", True), "ws_overlap", {}),
    ("mqa96n_fp16_tiles", S("mqa", False, "fp16"), "ws_overlap", {"persistent": False}),
    ("mha96c_serial", S("mha", True), "ws_serial", {}),
    ("gqa96n_pingpong_176", S("gqa", False), "ws_overlap", {"pingpong": True, "block_n": 176}),
    ("mha96n_fa4_ss", S("mha", False), "ws_overlap", FA4_D96),
    ("mha96c_m64_ss", S("mha", True), "ws_overlap", {"block_m": 64, "num_warps": 4, "pv_operand": "ss"}),
    ("gqa96c_pack", S("gqa", True), "ws_overlap", {"pack_gqa": True}),
    ("gqa96c_window_cap_sinks", S("gqa", True, local=True, softcap=True, sinks=True), "ws_overlap", {}),
    ("mha96c_window", S("mha", True, local=True), "ws_overlap", {}),      # Phi-3-mini's sliding window
    ("fa2_mha96c", S("mha", True), "fa2", {}),                             # the sm80-class kernel on sm_90a
    ("varlen_gqa96c", S("gqa", True, layout="varlen"), "ws_overlap", {}),
    ("varlen_mha96n_fp16", S("mha", False, "fp16", layout="varlen"), "ws_overlap", {}),
    ("paged_gqa96c", S("gqa", True, layout="paged"), "ws_overlap", {}),   # the cp.async producer: 32-column blocks
    ("paged_gqa96n_tma", S("gqa", False, layout="paged"), "ws_overlap", TMA_PAGES),
]
DECODE_CASES = [
    ("decode_gqa96_paged", S("gqa", True, layout="paged", phase="decode"), {}),
    ("decode_mha96_dense_unpacked", S("mha", True, phase="decode"), {"pack_gqa": False}),
    ("decode_mqa96_fp16_rows32", S("mqa", True, "fp16", layout="paged", phase="decode"),
     {"block_m": 32, "warps_m": 2, "warps_n": 2}),
]


def profile_here():
    return load_profile("h200" if "h200" in torch.cuda.get_device_name().lower() else "h100")


def build_prefill(spec, schedule, changes, profile):
    program, *_ = load_checked_program(spec.variant, spec.causal, None, schedule, spec.layout, spec)
    base = default_params(profile, spec, schedule)
    return translate.generate(program, KernelParams.from_dict({**base.to_dict(), **changes}), profile, spec)


def build_decode(spec, changes, profile):
    from translate.compiler import generate

    program, *_ = load_checked_program(spec.variant, spec.causal, None, "decode", spec.layout, spec)
    base = default_decode_params(spec, None, profile)
    return generate(program, DecodeParams.from_dict({**base.to_dict(), **changes}), profile, spec)


def all_kernels(profile):
    """Every kernel of this module by case id (compiled once, through KERNEL_CACHE_DIR when set: a cache built on a
    CPU machine is hit)."""
    out = {name: build_prefill(spec, schedule, changes, profile) for name, spec, schedule, changes in CASES}
    out.update({name: build_decode(spec, changes, profile) for name, spec, changes in DECODE_CASES})
    return out


def _cache():
    cache = os.environ.get("KERNEL_CACHE_DIR") or os.environ.get("TUNER_CACHE_DIR")
    return Path(cache) if cache else None


@pytest.fixture(scope="module")
def built():
    gens = all_kernels(profile_here())
    results = nvcc.compile_kernels(list(gens.values()), "sm_90a", jobs=os.cpu_count() or 4, batch_size=1,
                                   cache_dir=_cache())
    return {name: (gen, result) for (name, gen), result in zip(gens.items(), results)}


def _load(built, case):
    from tuner.serving.launch import load_kernel

    gen, result = built[case]
    assert result.ok, result.log[-3000:]
    return gen, load_kernel(result.cubin, gen.meta())


@pytest.mark.parametrize("case", [c[0] for c in CASES if c[1].layout == "dense"])
def test_dense_kernels_at_96_pass_the_gate(built, case):
    from tuner.measure.verify import verify

    gen, kernel = _load(built, case)
    report = verify(kernel, gen.spec)
    assert report.passed, report.reason


@pytest.mark.parametrize("case", [c[0] for c in CASES if c[1].layout != "dense"])
def test_varlen_and_paged_kernels_at_96_pass_the_gate(built, case):
    """The packed-sequence gate (lengths 0/1/127-129, chunked prefill, seqused_k, 1e4 past the used keys); a paged
    kernel on a shuffled cache beside NaN pages, at each page size its copy reads (16, 64, 128, ...)."""
    from tuner.measure.verify_varlen import verify_varlen

    gen, kernel = _load(built, case)
    report = verify_varlen(kernel, gen.spec)
    assert report.passed, report.reason


@pytest.mark.parametrize("case", [c[0] for c in DECODE_CASES])
def test_decode_kernels_at_96_pass_the_gate(built, case):
    from tuner.measure.verify_decode import verify_decode
    from tuner.serving.launch.decode_kernel import load_decode_kernel

    gen, result = built[case]
    assert result.ok, result.log[-3000:]
    kernel = load_decode_kernel(result.cubin, gen.meta())
    for page in ((16, 64) if gen.spec.layout == "paged" else (16,)):
        report = verify_decode(kernel, gen.spec, page_size=page)
        assert report.passed, report.reason


def test_a_wrong_d96_kernel_is_rejected(built):
    """The gate is not blind at d96: the default kernel's output scaled by 1.05 fails it."""
    from tuner.measure.verify import verify

    gen, kernel = _load(built, "mha96c")

    def wrong(q, k, v, out=None):
        o = kernel(q, k, v, out=out)
        o.mul_(1.05)
        return o

    assert not verify(wrong, gen.spec).passed


def test_a_d96_kernel_reads_strided_views(built):
    """Transposed (b, h, s, d) storage seen as (b, s, h, d): the 32-column TMA maps carry the strides."""
    _, kernel = _load(built, "gqa96c")
    q = torch.randn(2, 8, 300, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 2, 300, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 2, 300, D, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    out = kernel(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    assert (out.float() - ref.transpose(1, 2).float()).norm() / ref.float().norm() < 1e-2


def test_phi3_mini_shaped_call_at_benchmark_size(built):
    """32 heads of 96, 4k tokens, causal: against torch SDPA (fp32 accumulate) within the trials' 2e-2 bound."""
    _, kernel = _load(built, "mha96c")
    q, k, v = (torch.randn(2, 4096, 32, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                           is_causal=True).transpose(1, 2)
    out = kernel(q, k, v)
    assert (out.float() - ref.float()).norm() / ref.float().norm() < 2e-2


SERVE_SPECS = [S("mha", True), S("mha", True, local=True), S("gqa", True, layout="varlen"),
               S("gqa", True, layout="paged"), S("gqa", True, layout="paged", phase="decode")]


@pytest.fixture(scope="module")
def attn(tmp_path_factory):
    from tuner.defaults.export import export_defaults
    from tuner.serving import load_exported

    gpu = "h200" if "h200" in torch.cuda.get_device_name().lower() else "h100"
    out = tmp_path_factory.mktemp("d96-export")
    export_defaults(gpu, SERVE_SPECS, out, cache_dir=_cache(), buckets=("s4096",), page_sizes=(16,),
                    study_dir=out.parent / "d96-studies")
    served = load_exported(out)
    assert {(c.d_qk, c.d_v) for c in served.configs} == {(D, D)}
    return served


def _qkv(b, s, hq, hkv, sk=None, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(b, n, h, D, device="cuda", dtype=torch.bfloat16, generator=g)
                 for n, h in ((s, hq), (sk or s, hkv), (sk or s, hkv)))


def _reference(q, k, v, causal=True, window=(-1, -1)):
    from tuner.serving.options import ModelOptions, reference_attention

    return reference_attention(q.float(), k.float(), v.float(), causal, D ** -0.5, ModelOptions(window, 0.0, None))


@pytest.mark.parametrize("window", [(-1, -1), (2046, 0), (127, 0)], ids=["full", "phi3-window", "window-127"])
def test_flash_attn_func_at_96_runs_on_the_kernel(attn, window):
    q, k, v = _qkv(2, 3000, 32, 32, seed=window[0] + 2)
    out = attn.flash_attn_func(q, k, v, causal=True, window_size=window)
    assert attn.last_path == "kernel", attn.last_reason
    assert torch.isfinite(out).all() and (out.float() - _reference(q, k, v, window=window)).abs().max() <= 2 ** -6


def test_flash_attn_varlen_func_at_96_runs_on_the_kernel(attn):
    lens = [700, 1, 129, 2000]
    q, k, v = (t.squeeze(0) for t in _qkv(1, sum(lens), 16, 2, seed=5))
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    out = attn.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    assert attn.last_path == "kernel", attn.last_reason
    for lo, hi in zip(cu[:-1].tolist(), cu[1:].tolist()):
        ref = _reference(q[None, lo:hi], k[None, lo:hi], v[None, lo:hi])[0]
        assert (out[lo:hi].float() - ref).abs().max() <= 2 ** -6


def test_flash_attn_with_kvcache_at_96_runs_on_the_kernel(attn):
    from tuner.serving.decode_sdpa import decode_reference

    lens, page, hq, hkv = [3000, 65, 1], 16, 16, 2
    g = torch.Generator(device="cuda").manual_seed(7)
    pages = [-(-n // page) for n in lens]
    kc = torch.randn(sum(pages) + 3, page, hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
    vc = torch.randn(sum(pages) + 3, page, hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
    table = torch.zeros(len(lens), max(pages), dtype=torch.int32, device="cuda")
    order = torch.randperm(sum(pages), generator=torch.Generator().manual_seed(7)).tolist()
    at = 0
    for b, n in enumerate(pages):
        table[b, :n] = torch.tensor(order[at:at + n], dtype=torch.int32)
        at += n
    q = torch.randn(len(lens), 1, hq, D, device="cuda", dtype=torch.bfloat16, generator=g)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out = attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table, causal=True)
    assert attn.last_path == "kernel", attn.last_reason
    ref, _ = decode_reference(q.float(), kc.float(), vc.float(), seqlens, table, causal=True)
    assert torch.isfinite(out).all() and (out.float() - ref).abs().max() <= 2 ** -6
