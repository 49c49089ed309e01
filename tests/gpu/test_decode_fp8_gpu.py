"""Decode over an FP8 (e4m3) KV cache on a GPU (marker gpu; skipped elsewhere): the FP8 cache kernels pass the decode
gate's FP8 cases (tuner/measure/verify_decode.py fp8_cases: per-tensor and per-KV-head scales, amplitudes 1000x apart
across KV heads, values near 448 x scale, KV lengths 1..4097 over shuffled pages beside NaN pages, split counts 1, 3
and the rule's, 1..16 query tokens) for GQA d128 paged (bf16 and fp16 queries), MHA d64, MQA dense and a kernel with
a window, soft-capping and sinks; kernels that ignore k_scale or v_scale are caught; bad calls are refused before any
launch; and flash_attn_with_kvcache serves an exported FP8 cache kernel, appending quantised rows, against the
reference on the dequantised cache.

The kernels are the ones tests/gpu compiles with TUNER_CACHE_DIR (translate.nvcc.default_cache_dir); a cache
precompiled elsewhere with the same nvcc, CUTLASS and helper headers is hit (translate.nvcc.cache_key)."""
import dataclasses
import math

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                                 reason="needs an sm89+ GPU (cvt.rn.f16x2.e4m3x2); the profiles are Hopper's")]

from test_decode_gpu import compile_and_load, kernel_for, profile_here  # noqa: E402

from kernel_abi.spec import KernelSpec  # noqa: E402
from translate.decode import DecodeParams  # noqa: E402
from translate.decode.params import default_decode_params  # noqa: E402
from tuner.measure.verify_decode import DecodeCase, FP8_SPREAD, verify_decode  # noqa: E402
from tuner.serving.kvcache_fp8 import E4M3, dequantise, quantise  # noqa: E402

GQA = KernelSpec("gqa", 128, 128, True, "bf16", "paged", "decode", kv_dtype="fp8")
CASES = [
    ("gqa_paged_bf16", GQA, None),
    ("gqa_paged_bf16_bn64", GQA, DecodeParams(block_n=64, kv_stages=4)),
    ("gqa_paged_fp16", dataclasses.replace(GQA, dtype="fp16"), None),
    ("mha64_paged_noncausal", KernelSpec("mha", 64, 64, False, "bf16", "paged", "decode", kv_dtype="fp8"), None),
    ("mqa_dense", KernelSpec("mqa", 128, 128, True, "bf16", "dense", "decode", kv_dtype="fp8"), None),
    ("gqa_paged_options", dataclasses.replace(GQA, local=True, softcap=True, sinks=True), None),
]


def fp8_kernel(spec, params=None, body=None):
    """The FP8 cache kernel of the reference sketch (its options stated), compiled and loaded; ``body`` edits the
    generated body (a planted bug) under another name."""
    from tl.options import with_options
    from tl.parser import parse
    from translate.compiler import generate
    import tl

    profile = profile_here()
    params = params or default_decode_params(spec, None, profile)
    program = parse(tl.load_sketch(spec.variant, spec.causal, "decode", spec.layout)).program
    if spec.features:
        program = with_options(program, spec.local, spec.softcap, spec.sinks)
    gk = generate(program, params, profile, spec)
    if body is not None:
        name = gk.name + "_planted"
        gk = dataclasses.replace(gk, name=name, body=body(gk.body).replace(gk.name, name))
    return compile_and_load(gk, profile)


@pytest.mark.parametrize("name,spec,params", CASES, ids=[c[0] for c in CASES])
def test_fp8_cache_kernels_pass_the_gate(name, spec, params):
    k = fp8_kernel(spec, params)
    for page in ((16, 64) if spec.layout == "paged" else (16,)):
        report = verify_decode(k, spec, page_size=page)
        assert report.passed, report.reason


@pytest.mark.parametrize("ignored", ["k_scale", "v_scale"])
def test_a_kernel_that_ignores_a_scale_is_caught(ignored):
    """The entry point hands the kernel 1.0 for every KV head in place of the ignored scale: the kernel then reads
    k_fp8 (or v_fp8) as the real values, as one that never applied the scale would."""
    fields = {"k_scale": "attn_decode::KvScales{&planted_one, scales.v, 0, scales.v_stride}",
              "v_scale": "attn_decode::KvScales{scales.k, &planted_one, scales.k_stride, 0}"}[ignored]

    def plant(body):
        entry = body.index('extern "C" __global__')
        return (body[:entry] + "__device__ const float planted_one = 1.0f;\n" + body[entry:]).replace(
            "(args, scales, smem)", f"(args, {fields}, smem)")

    k = fp8_kernel(GQA, body=plant)
    cases = [DecodeCase((1, 63, 65, 4097), kv_scale="head", kv_spread=FP8_SPREAD),
             DecodeCase((700, 129), num_splits=3, kv_scale="tensor", near_max=True)]
    report = verify_decode(k, GQA, cases=cases)
    assert not report.passed and all(not c.passed for c in report.checks), report.checks


def test_bad_calls_are_refused_before_any_launch():
    k = fp8_kernel(GQA)
    q = torch.randn(2, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    cache = torch.randn(10, 16, 2, 128, device="cuda").to(E4M3)
    lens = torch.tensor([20, 30], dtype=torch.int32, device="cuda")
    table = torch.arange(4, dtype=torch.int32, device="cuda").view(2, 2)
    ones = torch.ones(2, device="cuda")
    for kwargs, words in ((dict(k_scale=None, v_scale=ones), "k_scale is missing"),
                          (dict(k_scale=ones, v_scale=torch.ones(2)), "v_scale is on cpu"),
                          (dict(k_scale=ones.half(), v_scale=ones), "k_scale must be fp32")):
        with pytest.raises(ValueError, match=words):
            k(q, cache, cache, cache_seqlens=lens, page_table=table, **kwargs)
    with pytest.raises(ValueError, match="k_cache is torch.bfloat16; this kernel was built for torch.float8_e4m3fn"):
        k(q, cache.to(torch.bfloat16), cache, cache_seqlens=lens, page_table=table, k_scale=ones, v_scale=ones)


def test_a_v_cache_of_other_strides_than_k_cache_is_read_by_its_own():
    """The kernel reads V at K's offsets when the two caches share strides; a V of other strides (a view into wider
    rows) takes its own offsets."""
    from tuner.serving.decode_sdpa import decode_reference

    k = fp8_kernel(GQA)
    q, kc, vc, lens, table, ks, vs = _paged_fp8([1, 700, 129], seed=5)
    wide = torch.zeros(*vc.shape[:3], 2 * D, device="cuda").to(E4M3)
    wide[..., D:] = vc
    v_view = wide[..., D:]
    assert v_view.stride() != kc.stride()
    out = k(q, kc, v_view, cache_seqlens=lens, page_table=table, k_scale=ks, v_scale=vs)
    ref, _ = decode_reference(q.float(), kc, vc, lens, table, True, None, kv_scales=(ks, vs))
    lowp, _ = decode_reference(q, kc, vc, lens, table, True, None, kv_scales=(ks, vs))
    err = (out.float() - ref).abs().max().item()
    assert err <= 2 * (lowp.float() - ref).abs().max().item() + 2 ** -7, err


# ---- served through an export -----------------------------------------------------------------------------------

HQ, HKV, D, PAGE = 32, 8, 128, 16


@pytest.fixture(scope="module")
def attn(tmp_path_factory):
    from tl.parser import parse
    import tl
    from translate import nvcc
    from translate.compiler import generate
    from tuner.serving import load_exported
    from tuner.store.export import export_records
    from tuner.store.provenance import collect
    from tuner.store.records import KernelRecord, KernelStore

    profile = profile_here()
    root = tmp_path_factory.mktemp("fp8-decode-export")
    store = KernelStore(root / "study")
    params = default_decode_params(GQA, None, profile)
    text = tl.load_sketch("gqa", True, "decode", "paged")
    gk = generate(parse(text).program, params, profile, GQA)
    result = nvcc.compile_kernel(gk, profile.nvcc_arch, cache_dir=nvcc.default_cache_dir())
    assert result.ok, result.log[-2000:]
    report = verify_decode(compile_and_load(gk, profile), GQA, page_size=PAGE)
    assert report.passed, report.reason
    verification = report.to_dict()
    verification["checks"] = [{k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in c.items()}
                              for c in verification["checks"]]
    device_name = torch.cuda.get_device_name()
    assert store.offer(KernelRecord(
        arch=profile.arch_family, gpu=profile.name, device_name=device_name, variant="gqa", dtype="bf16", d_qk=D,
        d_v=D, causal=True, bucket="d-b8-kv8k-p16", params=params.to_dict(), kernel_name=gk.name,
        kernel_meta=gk.meta(), source=gk.source, cubin=result.cubin, tl_program=text, verification=verification,
        tflops=1.0, baselines={}, problem={"layout": "paged"}, provenance=collect(profile, device_name), study="test",
        layout="paged", phase="decode"))
    export_records(store.records(), profile, root / "out")
    served = load_exported(root / "out")
    assert [c.kv_dtype for c in served.configs] == ["fp8"]
    return served


def _paged_fp8(lens, seed=0, spare=5):
    """q bf16 (each KV group's queries / its head's amplitude), a shuffled e4m3 cache (spare pages NaN) of values
    1000x apart across KV heads quantised with per-head scales, lengths, the table, the scales."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    amps = torch.logspace(-1.5, 1.5, HKV, device="cuda")
    k_scale = amps * 4 / 448
    v_scale = k_scale * 0.7
    b = len(lens)
    q = (torch.randn(b, 1, HQ, D, device="cuda", generator=g)
         / amps.repeat_interleave(HQ // HKV)[:, None]).to(torch.bfloat16)
    counts = [-(-(n + 1) // PAGE) for n in lens]     # room for one appended row
    total = sum(counts) + spare
    order = torch.randperm(total, device="cuda", generator=g).tolist()
    kc = torch.full((total, PAGE, HKV, D), float("nan"), device="cuda").to(E4M3)
    vc = kc.clone()
    table = torch.zeros(b, max(counts), dtype=torch.int32, device="cuda")
    for i, n in enumerate(lens):
        for j in range(counts[i]):
            pid = order.pop()
            table[i, j] = pid
            rows = max(0, min(PAGE, n - j * PAGE))
            real = torch.randn(2, rows, HKV, D, device="cuda", generator=g) * amps[:, None]
            kc[pid, :rows], vc[pid, :rows] = quantise(real[0], k_scale), quantise(real[1], v_scale)
    return q, kc, vc, torch.tensor(lens, dtype=torch.int32, device="cuda"), table, k_scale, v_scale


@pytest.mark.parametrize("per_head", [True, False])
def test_flash_attn_with_kvcache_serves_the_fp8_cache_and_appends_quantised_rows(attn, per_head):
    from tuner.serving.decode_sdpa import decode_reference

    lens = [1, 100, 3000, 777]
    q, kc, vc, seqlens, table, ks, vs = _paged_fp8(lens, seed=int(per_head))
    if not per_head:
        ks, vs = ks.max().reshape(1), vs.max().reshape(1)
    g = torch.Generator(device="cuda").manual_seed(9)
    k_new = torch.randn(4, 1, HKV, D, device="cuda", generator=g).to(torch.bfloat16)
    v_new = torch.randn(4, 1, HKV, D, device="cuda", generator=g).to(torch.bfloat16)
    out, lse = attn.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=seqlens, block_table=table,
                                            causal=True, return_softmax_lse=True, k_scale=ks, v_scale=vs)
    assert attn.last_path == "kernel" and attn.last_bucket == "d-b8-kv8k-p16", attn.last_reason
    pages = table.gather(1, (seqlens // PAGE).long()[:, None]).long()[:, 0]
    rows = (seqlens % PAGE).long()
    assert torch.equal(kc[pages, rows].view(torch.uint8), quantise(k_new[:, 0], ks).view(torch.uint8))
    assert torch.equal(vc[pages, rows].view(torch.uint8), quantise(v_new[:, 0], vs).view(torch.uint8))
    ref, ref_lse = decode_reference(q.float(), kc, vc, seqlens + 1, table, True, None, kv_scales=(ks, vs))
    lowp, _ = decode_reference(q, kc, vc, seqlens + 1, table, True, None, kv_scales=(ks, vs))
    err = (out.float() - ref).abs().max().item()
    assert torch.isfinite(out).all() and err <= 2 * (lowp.float() - ref).abs().max().item() + 2 ** -7, err
    torch.testing.assert_close(lse, ref_lse, atol=1e-2, rtol=1e-3)
    assert sum(attn.reasons.values()) == 0


def test_without_scales_the_call_is_refused_and_a_16_bit_cache_is_not_served_by_the_fp8_config(attn):
    q, kc, vc, seqlens, table, ks, vs = _paged_fp8([100, 20])
    with pytest.raises(ValueError, match="flash_attn_with_kvcache: k_scale is missing"):
        attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table, causal=True, v_scale=vs)
    before = dict(attn.reasons)
    attn.flash_attn_with_kvcache(q, dequantise(kc, ks, torch.bfloat16), dequantise(vc, vs, torch.bfloat16),
                                 cache_seqlens=seqlens, block_table=table, causal=True)
    assert attn.last_path != "kernel" and sum(attn.reasons.values()) == sum(before.values()) + 1
