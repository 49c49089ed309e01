"""FP8 (e4m3) kernels on a Hopper GPU (marker gpu; skipped elsewhere): the default kernels of MHA/GQA/MQA at head dims
64 and 128, causal and not, pass the FP8 gate (tuner/measure/verify_fp8.py: descales 1000x apart, values near 448);
so do kernels with the conditional rescale (P offset by 8 less the threshold); a kernel that ignores a descale
fails it; an export of an FP8 default serves flash_attn_func on the kernel (eager and
compiled) and refuses bad descales before any launch."""
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs a Hopper (sm_90) GPU")]

import tl  # noqa: E402
import translate  # noqa: E402
from hardware_profiles import load_profile  # noqa: E402
from kernel_abi.spec import KernelSpec, Problem  # noqa: E402
from translate import nvcc  # noqa: E402
from translate.defaults import hopper_params  # noqa: E402


def _gpu() -> str:
    return "h200" if "h200" in torch.cuda.get_device_name().lower() else "h100"


SPECS = [KernelSpec(v, d, d, c, "fp8") for v, d, c in (("mha", 128, False), ("mha", 128, True), ("gqa", 128, True),
                                                        ("mqa", 128, False), ("mha", 64, True), ("gqa", 64, False),
                                                        ("mha", 96, True), ("gqa", 96, False), ("mha", 256, False),
                                                        ("gqa", 256, True), ("mha", 192, False), ("gqa", 192, True))] + \
    [KernelSpec("mla", 192, 128, c, "fp8") for c in (False, True)]


def build_defaults(specs, page_size=None, **changes) -> dict:
    """{spec label: (generated, compile result)} of each spec's default warp-specialised kernel for this GPU (paged:
    for ``page_size``, if given; with parameter ``changes``), through the nvcc cache KERNEL_CACHE_DIR names (if any)."""
    from translate.params import KernelParams

    profile = load_profile(_gpu())
    params = [KernelParams.from_dict({**hopper_params(profile, s, page_size=page_size).to_dict(), **changes})
              for s in specs]
    gens = [translate.generate(tl.parse_program(tl.load_sketch(s.variant, s.causal, "ws_overlap", s.layout)),
                               p, profile, s) for s, p in zip(specs, params)]
    cache = os.environ.get("KERNEL_CACHE_DIR")
    results = nvcc.compile_kernels(gens, "sm_90a", jobs=os.cpu_count() or 4, batch_size=1,
                                   cache_dir=Path(cache) if cache else None)
    return {s.label(): (g, r) for s, g, r in zip(specs, gens, results)}


@pytest.fixture(scope="module")
def built():
    return build_defaults(SPECS)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.label())
def test_fp8_defaults_pass_the_fp8_gate(built, spec):
    from tuner.measure.verify import verify
    from tuner.serving.launch import load_kernel

    gen, result = built[spec.label()]
    assert result.ok, result.log[-3000:]
    report = verify(load_kernel(result.cubin, gen.meta()), gen.spec)
    assert report.passed, report.reason


@pytest.mark.parametrize("threshold", [2])
def test_kernels_with_the_conditional_rescale_pass_the_fp8_gate(threshold):
    """A rescale threshold t lets a row's P run 2^t past its running max, so P is offset by 8 - t
    (translate/sm90/frame.py fp8_max_offset): held to the same gate as the defaults (the emulation's offset 8)."""
    from tuner.measure.verify import verify
    from tuner.serving.launch import load_kernel

    specs = [SPECS[0], SPECS[1], SPECS[4]]
    built = build_defaults(specs, rescale_threshold=threshold)
    for spec in specs:
        gen, result = built[spec.label()]
        assert result.ok and result.spill_stores == 0, result.log[-3000:]
        report = verify(load_kernel(result.cubin, gen.meta()), gen.spec)
        assert report.passed, (spec.label(), report.reason)


@pytest.mark.parametrize("ignored", ["q_descale", "k_descale", "v_descale"])
def test_a_kernel_that_ignores_a_descale_fails_the_gate(built, ignored):
    from tuner.measure.verify import verify
    from tuner.serving.launch import load_kernel

    gen, result = built[SPECS[2].label()]
    kernel = load_kernel(result.cubin, gen.meta())

    def ignoring(q, k, v, out=None, **scales):
        scales[ignored] = torch.ones_like(scales[ignored])
        return kernel(q, k, v, out=out, **scales)

    assert not verify(ignoring, gen.spec).passed


def test_the_kernel_refuses_bad_descales_before_launching(built):
    from tuner.serving.launch import load_kernel

    gen, result = built[SPECS[0].label()]
    kernel = load_kernel(result.cubin, gen.meta())
    q = torch.randn(1, 64, 16, 128, device="cuda").to(torch.float8_e4m3fn)
    ones = torch.ones(1, 16, device="cuda")
    with pytest.raises(ValueError, match="k_descale is on cpu"):
        kernel(q, q, q, q_descale=ones, k_descale=ones.cpu(), v_descale=ones)
    with pytest.raises(ValueError, match="v_descale is missing"):
        kernel(q, q, q, q_descale=ones, k_descale=ones)
    with pytest.raises(ValueError, match="q_descale holds values that are not finite"):
        kernel(q, q, q, q_descale=ones * float("inf"), k_descale=ones, v_descale=ones)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from tuner.defaults.export import export_defaults
    from tuner.serving import load_exported

    out = tmp_path_factory.mktemp("fp8-export")
    cache = os.environ.get("KERNEL_CACHE_DIR")
    export_defaults(_gpu(), [KernelSpec("gqa", 128, 128, True, "fp8")], out / "export",
                    cache_dir=Path(cache) if cache else None, buckets=("s1024",), study_dir=out / "studies")
    return load_exported(out / "export")


def _call_inputs(seed=0):
    from tuner.measure import verify_fp8

    problem = Problem("gqa", 2, 16, 2, 700, 900, 128, 128, True, "fp8")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return problem, verify_fp8.inputs(problem, gen, "cuda", near_max=False)


def test_an_fp8_export_serves_flash_attn_func_on_the_kernel(exported):
    from tuner.measure import verify_fp8

    problem, (q, k, v, scales) = _call_inputs()
    out = exported.flash_attn_func(q, k, v, causal=True, **scales)
    assert exported.last_path == "kernel" and exported.stats["kernel"] == 1 and out.dtype == torch.bfloat16
    check = verify_fp8.judge("served", out, verify_fp8.reference(q, k, v, scales, True),
                             verify_fp8.emulate(q, k, v, scales, True))
    assert check.passed, check.reason


def test_a_compiled_fp8_call_runs_the_kernel(exported):
    from tuner.measure import verify_fp8

    problem, (q, k, v, scales) = _call_inputs(1)

    def f(q, k, v, qd, kd, vd):
        return exported.flash_attn_func(q, k, v, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)

    before = exported.stats["kernel"]
    out = torch.compile(f, fullgraph=True)(q, k, v, *scales.values())
    assert exported.stats["kernel"] > before and exported.stats["sdpa"] == 0
    check = verify_fp8.judge("compiled", out, verify_fp8.reference(q, k, v, scales, True),
                             verify_fp8.emulate(q, k, v, scales, True))
    assert check.passed, check.reason


@pytest.mark.parametrize("shape", [(2, 1000, 3, 128), (1, 1, 1, 64), (3, 4097, 2, 64), (2, 1000, 3, 96),
                                   (2, 333, 2, 256), (2, 777, 2, 192)])
def test_v_is_transposed_by_the_triton_kernel_as_torch_would(shape):
    from tuner.serving.launch.plan import transposed_v

    v = torch.randn(*shape, device="cuda").to(torch.float8_e4m3fn)
    strided = torch.randn(shape[0], shape[1], shape[2] * 2, shape[3], device="cuda").to(torch.float8_e4m3fn)[:, :, ::2]
    for x in (v, strided):
        vt = transposed_v(x)
        assert tuple(vt.shape) == (shape[0], shape[3], shape[2], shape[1]) and vt.stride(1) % 16 == 0
        assert torch.equal(vt.permute(0, 3, 2, 1).view(torch.uint8), x.view(torch.uint8))
