"""Decode kernels on a GPU (marker gpu; skipped elsewhere): the reference decode sketches' kernels pass the decode
gate (tuner/measure/verify_decode.py: KV lengths 1/63/64/65/4097, uneven batches, shuffled pages beside NaN pages, NaN
workspace, split counts 1..64, 1..16 query tokens with causal, GQA/MQA/MHA), a wrong kernel is caught, and a bad
call is refused before any launch."""
import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8,
                                 reason="needs an sm80+ GPU")]

import tl  # noqa: E402
from hardware_profiles import load_profile  # noqa: E402
from tl.parser import parse  # noqa: E402
from translate import nvcc  # noqa: E402
from translate.compiler import generate  # noqa: E402
from translate.decode import DecodeParams  # noqa: E402
from kernel_abi.spec import KernelSpec  # noqa: E402
from tuner.serving.launch.decode_kernel import load_decode_kernel  # noqa: E402
from tuner.measure.verify_decode import DecodeCase, verify_decode  # noqa: E402

CASES = [
    ("gqa_paged_causal", KernelSpec("gqa", 128, 128, True, "bf16", "paged", "decode"), DecodeParams()),
    ("gqa_paged_noncausal_bn128", KernelSpec("gqa", 128, 128, False, "bf16", "paged", "decode"),
     DecodeParams(block_n=128, warps_n=8, kv_stages=3)),
    ("gqa_dense_causal", KernelSpec("gqa", 128, 128, True, "bf16", "dense", "decode"), DecodeParams()),
    ("mqa64_fp16_rows32", KernelSpec("mqa", 64, 64, True, "fp16", "paged", "decode"),
     DecodeParams(block_m=32, warps_m=2, warps_n=2)),
    ("mha_unpacked", KernelSpec("mha", 128, 128, True, "bf16", "paged", "decode"), DecodeParams(pack_gqa=False)),
    # head dim 96: 32-column atoms, a 2-bit swizzle (translate/decode/params.py)
    ("gqa96_paged_causal", KernelSpec("gqa", 96, 96, True, "bf16", "paged", "decode"), DecodeParams(swizzle=2)),
]


def profile_here():
    name = torch.cuda.get_device_name().lower()
    return load_profile("h200" if "h200" in name else "h100" if "h100" in name else "a100")


def compile_and_load(gk, profile):
    result = nvcc.compile_kernel(gk, profile.nvcc_arch, cache_dir=nvcc.default_cache_dir())
    assert result.ok, result.log[-2000:]
    return load_decode_kernel(result.cubin, gk.meta())


def kernel_for(spec, params, profile, text=None):
    """The kernel of ``text``, else of the reference decode sketch of the spec's variant and cache (MLA's own)."""
    text = text or tl.load_sketch(spec.variant, spec.causal, "decode", spec.layout)
    return generate(parse(text).program, params, profile, spec)


@pytest.mark.parametrize("name,spec,params", CASES, ids=[c[0] for c in CASES])
def test_decode_kernels_pass_the_gate(name, spec, params):
    profile = profile_here()
    k = compile_and_load(kernel_for(spec, params, profile), profile)
    for page in ((16, 64) if spec.layout == "paged" else (16,)):
        report = verify_decode(k, spec, page_size=page)
        assert report.passed, report.reason


def test_a_kernel_that_drops_the_causal_mask_is_caught():
    profile = profile_here()
    causal = KernelSpec("gqa", 128, 128, True, "bf16", "paged", "decode")
    gk = kernel_for(causal, DecodeParams(), profile)
    wrong = dataclasses.replace(gk, body=gk.body.replace("kCausal = true", "kCausal = false"),
                                name=gk.name + "_wrong")
    wrong = dataclasses.replace(wrong, body=wrong.body.replace(gk.name, wrong.name))
    k = compile_and_load(wrong, profile)
    report = verify_decode(k, causal, cases=[DecodeCase((700, 16, 9), seqlen_q=16)])
    assert not report.passed and "error" in report.reason


def test_bad_calls_are_refused_before_any_launch():
    profile = profile_here()
    spec = KernelSpec("gqa", 128, 128, True, "bf16", "paged", "decode")
    k = compile_and_load(kernel_for(spec, DecodeParams(), profile), profile)
    q = torch.randn(2, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    cache = torch.randn(10, 16, 2, 128, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([20, 30], dtype=torch.int32, device="cuda")
    table = torch.arange(4, dtype=torch.int32, device="cuda").view(2, 2)
    with pytest.raises(ValueError, match="page_table"):
        k(q, cache, cache, cache_seqlens=lens)
    with pytest.raises(ValueError, match="1..16 query tokens"):
        k(torch.randn(2, 17, 8, 128, device="cuda", dtype=torch.bfloat16), cache, cache, lens, table)
    with pytest.raises(ValueError, match="built for"):
        k(q.half(), cache, cache, lens, table)
    with pytest.raises(ValueError, match="power of two"):
        odd = torch.randn(10, 24, 2, 128, device="cuda", dtype=torch.bfloat16)
        k(q, odd, odd, lens, table)
    out = k(q, cache, cache, lens, table)
    assert out.shape == (2, 1, 8, 128) and bool(torch.isfinite(out).all())
