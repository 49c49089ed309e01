"""FP8 (e4m3) kernels that transpose V in the producer warpgroup (KernelParams.v_transpose "producer") on a Hopper GPU
(marker gpu; skipped elsewhere). The kernels read V as given (no per-call V^T copy) and pass the FP8 gates: dense at head
dims 64 and 128, causal and not, both key orders of V^T (tuner/measure/verify_fp8.py); packed sequences and a paged
cache through the packed gate (tuner/measure/verify_varlen.py). A kernel whose transposer writes the other key order
than its consumers read fails the gate (the planted bug), as does one fed no v descale. A timing print compares each
producer kernel with the runtime-transpose kernel of the same parameters (its per-call V^T copy included) on the same
inputs.

    pytest -m gpu tests/gpu/test_fp8_vt_producer_gpu.py -q -s
"""
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
from translate.params import KernelParams  # noqa: E402
from translate.params_sm90 import vt_producer_regs  # noqa: E402


def _gpu() -> str:
    return "h200" if "h200" in torch.cuda.get_device_name().lower() else "h100"


DENSE = [KernelSpec(v, d, d, c, "fp8") for v, d, c in (("mha", 128, False), ("gqa", 128, True), ("mha", 64, True),
                                                        ("gqa", 64, False))]
PACKED = [KernelSpec("gqa", 128, 128, True, "fp8", layout="varlen"), KernelSpec("mha", 64, 64, False, "fp8", layout="varlen"),
          KernelSpec("gqa", 128, 128, True, "fp8", layout="paged"), KernelSpec("mha", 64, 64, True, "fp8", layout="paged")]
ORDERS = ("accumulator", "natural")


def producer_params(profile, spec, order: str, **changes) -> KernelParams:
    """The spec's default with the in-kernel transpose: V^T's keys in ``order``, the producer's registers the transposer
    needs."""
    # (paged: built for pages of whole tiles, so K comes by TMA, as the producer transpose needs)
    base = hopper_params(profile, spec, page_size=128 if spec.layout == "paged" else None)
    return KernelParams.from_dict({**base.to_dict(), "v_transpose": "producer", "vt_key_order": order,
                                   "producer_regs": max(base.producer_regs, vt_producer_regs(base)), **changes})


def _key(spec, order, what="producer"):
    return f"{spec.label()}:{order}:{what}"


@pytest.fixture(scope="module")
def built():
    """{key: (generated, compile result)}: every producer kernel, the runtime-transpose kernels of the same parameters
    (for the timing), and the planted bug (a transposer writing natural order for consumers that read accumulator
    order), built in parallel through the nvcc cache KERNEL_CACHE_DIR names (if any)."""
    profile = load_profile(_gpu())
    jobs = []
    for spec in DENSE + PACKED:
        for order in (ORDERS if spec in DENSE else (ORDERS[spec.d_v == 64],)):
            jobs.append((_key(spec, order), spec, producer_params(profile, spec, order)))
    for spec in (DENSE[0], DENSE[2]):
        p = producer_params(profile, spec, "accumulator")
        jobs.append((_key(spec, "accumulator", "runtime"), spec, KernelParams.from_dict({**p.to_dict(),
                                                                                       "v_transpose": "runtime"})))
    gens = {}
    for key, spec, params in jobs:
        program = tl.parse_program(tl.load_sketch(spec.variant, spec.causal, "ws_overlap", spec.layout))
        gens[key] = translate.generate(program, params, profile, spec)
    planted = gens[_key(DENSE[1], "accumulator")]
    assert "constexpr bool kVtAccumulatorOrder = true;" in planted.body
    import dataclasses
    gens["planted"] = dataclasses.replace(
        planted, name=planted.name + "_planted",
        body=planted.body.replace("constexpr bool kVtAccumulatorOrder = true;",
                                  "constexpr bool kVtAccumulatorOrder = false;  // planted: the other order")
        .replace(planted.name, planted.name + "_planted"))
    cache = os.environ.get("KERNEL_CACHE_DIR")
    results = nvcc.compile_kernels(list(gens.values()), "sm_90a", jobs=os.cpu_count() or 8, batch_size=1,
                                   cache_dir=Path(cache) if cache else None)
    return {k: (g, r) for (k, g), r in zip(gens.items(), results)}


def _load(built, key):
    from tuner.serving.launch import load_kernel
    from tuner.serving.launch.plan import transposes_v

    gen, result = built[key]
    assert result.ok, result.log[-3000:]
    assert result.spill_stores == 0 and result.spill_loads == 0, (result.spill_stores, result.spill_loads)
    kernel = load_kernel(result.cubin, gen.meta())
    assert transposes_v(gen.meta()) == (gen.params.v_transpose == "runtime")
    return gen, kernel


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("spec", DENSE, ids=lambda s: s.label())
def test_dense_producer_kernels_pass_the_fp8_gate(built, spec, order):
    from tuner.measure.verify import verify

    gen, kernel = _load(built, _key(spec, order))
    report = verify(kernel, gen.spec)
    assert report.passed, report.reason


@pytest.mark.parametrize("spec", PACKED, ids=lambda s: s.label())
def test_packed_and_paged_producer_kernels_pass_the_packed_fp8_gate(built, spec):
    from tuner.measure.verify_varlen import verify_varlen

    gen, kernel = _load(built, _key(spec, ORDERS[spec.d_v == 64]))
    report = verify_varlen(kernel, gen.spec)
    assert report.passed, report.reason
    assert len(report.checks) >= 4   # (the packed gate checks a paged kernel on 4 mixes)


def test_a_transposer_writing_the_other_key_order_fails_the_gate(built):
    from tuner.measure.verify import verify

    gen, kernel = _load(built, "planted")
    assert not verify(kernel, gen.spec).passed


def test_a_producer_kernel_fed_no_v_descale_fails_the_gate(built):
    from tuner.measure.verify import verify

    gen, kernel = _load(built, _key(DENSE[1], "accumulator"))

    def ignoring(q, k, v, out=None, **scales):
        scales["v_descale"] = torch.ones_like(scales["v_descale"])
        return kernel(q, k, v, out=out, **scales)

    assert not verify(ignoring, gen.spec).passed


def _time_ms(fn, iters: int = 30) -> float:
    for _ in range(5):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(3):
        start.record()
        for _ in range(iters):
            fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / iters)
    return min(times)


@pytest.mark.parametrize("spec", [DENSE[0], DENSE[2]], ids=lambda s: s.label())
def test_timing_runtime_transpose_against_the_producer_transpose(built, spec):
    """Prints ms a call: the runtime-transpose kernel with its per-call V^T copy, the same kernel given that copy made
    before (v_t: the kernel alone), and the producer kernel (no copy), same inputs; and the memory a call allocates
    (the producer kernel none). The times are not a pass/fail criterion; the outputs must agree."""
    from tuner.measure import verify_fp8
    from tuner.serving.launch.plan import transposed_v, vt_key_order

    _, runtime = _load(built, _key(spec, "accumulator", "runtime"))
    _, producer = _load(built, _key(spec, "accumulator"))
    b, s, hq, hkv = 2, 8192, 16, 16
    problem = Problem(spec.variant, b, hq, hkv, s, s, spec.d_qk, spec.d_v, spec.causal, "fp8")
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, scales = verify_fp8.inputs(problem, gen, "cuda", near_max=False)
    out_r, out_p = runtime(q, k, v, **scales), producer(q, k, v, **scales)
    torch.cuda.synchronize()
    assert (out_r.float() - out_p.float()).abs().max().item() <= 2e-2 * out_r.float().abs().max().item() + 1e-3
    out = torch.empty_like(out_p)   # the producer kernel allocates nothing a call; the runtime's V^T copy does
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    producer(q, k, v, out=out, **scales)
    torch.cuda.synchronize()
    producer_bytes = torch.cuda.max_memory_allocated() - base
    torch.cuda.reset_peak_memory_stats()
    runtime(q, k, v, out=out, **scales)
    torch.cuda.synchronize()
    runtime_bytes = torch.cuda.max_memory_allocated() - base
    assert producer_bytes == 0 and runtime_bytes >= v.numel(), (producer_bytes, runtime_bytes)
    v_t = transposed_v(v, order=vt_key_order(runtime.meta))
    ms_copy = _time_ms(lambda: runtime(q, k, v, **scales))
    ms_kernel = _time_ms(lambda: runtime(q, k, v, v_t=v_t, **scales))
    ms_producer = _time_ms(lambda: producer(q, k, v, **scales))
    flops = problem.flops
    print(f"\n[vt timing] {spec.label()} b{b} s{s} h{hq}: runtime transpose {ms_copy:.3f} ms incl. its V^T copy "
          f"({flops / ms_copy / 1e9:.0f} TFLOPS), {ms_kernel:.3f} ms kernel alone; producer transpose {ms_producer:.3f} "
          f"ms ({flops / ms_producer / 1e9:.0f} TFLOPS): x{ms_copy / ms_producer:.3f} vs runtime incl. copy, "
          f"x{ms_kernel / ms_producer:.3f} vs kernel alone; memory a call: runtime {runtime_bytes / 2**20:.1f} MiB "
          f"(V^T), producer {producer_bytes} B")
