"""Hopper kernels on a Hopper GPU (marker gpu; skipped elsewhere): every schedule kind passes the
verification gate — warp-specialised with and without intra-warpgroup overlap, one CTA per tile and
persistent, ping-pong, SS P·V, three consumer warpgroups, the plain wgmma schedule — for MHA/GQA/MQA/MLA,
causal and not, fp16 and bf16; strided (transposed) inputs reach the kernel through its TMA descriptors."""
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
from translate import nvcc  # noqa: E402
from translate.defaults import hopper_params  # noqa: E402
from translate.params import KernelParams  # noqa: E402
from kernel_abi.spec import KernelSpec  # noqa: E402


def S(v, c, dt="bf16", d=128):
    return KernelSpec(v, 192 if v == "mla" else d, 128 if v == "mla" else d, c, dt)


# (id, spec, schedule, parameter changes on top of the Hopper defaults)
CASES = [
    ("mha128c_overlap_persistent", S("mha", True), "ws_overlap", {}),
    ("mha128n_overlap_tiles_fp16", S("mha", False, "fp16"), "ws_overlap", {"persistent": False}),
    ("mha128c_serial", S("mha", True), "ws_serial", {}),
    ("mha128n_pingpong_176", S("mha", False), "ws_overlap", {"pingpong": True, "block_n": 176}),
    ("mha128c_ss", S("mha", True), "ws_serial", {"pv_operand": "ss"}),
    ("mha64c_three_wgs", S("mha", True, d=64), "ws_overlap", {}),
    # the softmax candidates: exponentials by the FMA pipe's polynomial (fully masked rows must still give 0),
    # and the softmax split around the wait for the P.V GEMM, with and without the conditional rescale, fp16 too
    ("mha64c_exp2_poly_mid", S("mha", True, d=64), "ws_overlap", {"exp2_poly": 4, "pv_wait": "mid"}),
    ("mha64n_exp2_poly_fp16", S("mha", False, "fp16", d=64), "ws_overlap", {"exp2_poly": 2, "rescale_threshold": 8}),
    ("gqa128c_mid_rt0", S("gqa", True), "ws_overlap", {"pv_wait": "mid", "rescale_threshold": 0}),
    # part of the exponentials before the wait, the rest (and the row sums' second part) after it
    ("mha64n_half_pp", S("mha", False, d=64), "ws_overlap", {"pv_wait": "half", "pingpong": True, "rescale_threshold": 8}),
    ("mha64c_quarter_poly_fp16", S("mha", True, "fp16", d=64), "ws_overlap", {"pv_wait": "quarter", "exp2_poly": 2}),
    ("gqa128c_half_rt0", S("gqa", True), "ws_overlap", {"pv_wait": "half", "rescale_threshold": 0}),
    ("gqa128c", S("gqa", True), "ws_overlap", {}),
    ("mqa128n", S("mqa", False), "ws_overlap", {}),
    ("mla_causal", S("mla", True), "ws_overlap", {}),
    ("mla_noncausal_tiles", S("mla", False), "ws_overlap", {"persistent": False}),
    # head dims 192 and 256 (FA3/FA4's 128x112 and 128x80), fp16 too, one CTA a tile too
    ("mha192n", S("mha", False, d=192), "ws_overlap", {}),
    ("gqa192c", S("gqa", True, d=192), "ws_overlap", {}),
    ("gqa256c", S("gqa", True, d=256), "ws_overlap", {}),
    ("mha256n_tiles_fp16", S("mha", False, "fp16", d=256), "ws_overlap", {"persistent": False}),
    # head dim 96: 32-column atoms of the 64-byte swizzle, three TMA boxes a row (more in test_head_dim_96_gpu.py)
    ("mha96c", S("mha", True, d=96), "ws_overlap", {}),
    ("plain_mha128c", S("mha", True), "fa2", {}),
    ("plain_mla_noncausal_ss", S("mla", False), "fa2", {"pv_operand": "ss", "kv_stages": 1}),
]


@pytest.fixture(scope="module")
def built():
    profile = load_profile("h200" if "h200" in torch.cuda.get_device_name().lower() else "h100")
    gens = []
    for _, spec, schedule, changes in CASES:
        base = hopper_params(profile, spec, warp_specialized=schedule.startswith("ws_"))
        params = KernelParams.from_dict({**base.to_dict(), **changes})
        program = tl.parse_program(tl.load_sketch(spec.variant, spec.causal, schedule))
        gens.append(translate.generate(program, params, profile, spec))
    cache = os.environ.get("KERNEL_CACHE_DIR")
    results = nvcc.compile_kernels(gens, "sm_90a", jobs=os.cpu_count() or 4, batch_size=2,
                                   cache_dir=Path(cache) if cache else None)
    return dict(zip([c[0] for c in CASES], zip(gens, results)))


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_hopper_schedule_passes_the_verification_gate(built, case):
    from tuner.serving.launch import load_kernel
    from tuner.measure.verify import verify

    gen, result = built[case]
    assert result.ok, result.log[-3000:]
    report = verify(load_kernel(result.cubin, gen.meta()), gen.spec)
    assert report.passed, report.reason


def test_a_wrong_hopper_kernel_is_rejected(built, monkeypatch):
    """The gate is not blind to these kernels: scaling the output by 1.05 fails it."""
    from tuner.serving.launch import load_kernel
    from tuner.measure.verify import verify

    gen, result = built["mha128c_overlap_persistent"]
    kernel = load_kernel(result.cubin, gen.meta())

    def wrong(q, k, v, out=None):
        o = kernel(q, k, v, out=out)
        o.mul_(1.05)
        return o

    assert not verify(wrong, gen.spec).passed


def test_a_hopper_kernel_reads_strided_views(built):
    """Transposed (b, h, s, d) storage seen as (b, s, h, d): the TMA descriptors carry the strides."""
    from tuner.serving.launch import load_kernel

    gen, result = built["gqa128c"]
    kernel = load_kernel(result.cubin, gen.meta())
    q = torch.randn(2, 8, 300, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 2, 300, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 2, 300, 128, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    out = kernel(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    assert (out.float() - ref.transpose(1, 2).float()).norm() / ref.float().norm() < 1e-2
