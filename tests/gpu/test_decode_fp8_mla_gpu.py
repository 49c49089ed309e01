"""Absorbed-MLA decode over an FP8 (e4m3) latent cache on a GPU (marker gpu; skipped elsewhere): the FP8 latent kernels
(translate/include/attn_decode_fp8_mla.cuh: the split-d_v mma.sync kernel over e4m3 latent rows, V the first 512
columns at the same scale) pass the decode gate's FP8 MLA cases (tuner/measure/verify_decode.py fp8_mla_cases: 128
and 16 heads, the scale about 9e-6, 9e-3 and 9, values near 448 x scale, KV lengths 1..9000 over shuffled pages
beside NaN pages, split counts 1, 3, 64 and the rule's, 1..16 query tokens, v_cache None or the view of K) for the
paged defaults of 128 and 16 heads, a dense cache, fp16 non-causal queries and 32-key tiles; a kernel that ignores
the scale is caught; bad calls are refused before any launch; flash_attn_with_kvcache serves an exported FP8 latent
kernel, appending quantised rows; and a bench point beside the 16-bit latent kernel gives finite, agreeing rows.

The kernels are the ones tests/gpu compiles with TUNER_CACHE_DIR (translate.nvcc.default_cache_dir)."""
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
from tuner.measure.verify_decode import MLA_HEADS, MLA_TP_HEADS, DecodeCase, verify_decode  # noqa: E402
from tuner.serving.kvcache_fp8 import E4M3, dequantise, quantise  # noqa: E402

MLA8 = KernelSpec("mla", 576, 512, True, "bf16", "paged", "decode", kv_dtype="fp8")
CASES = [
    ("paged_h128_default", MLA8, 128),
    ("paged_h16_default", MLA8, 16),
    ("dense_h128_default", dataclasses.replace(MLA8, layout="dense"), 128),
    ("paged_noncausal_fp16", dataclasses.replace(MLA8, causal=False, dtype="fp16"), 128),
    ("paged_bn32_s2", MLA8, DecodeParams(block_m=64, block_n=32, warps_m=4, warps_n=2, kv_stages=2)),
]


def fp8_mla_kernel(spec=MLA8, params=128, body=None):
    """The FP8 latent kernel of the MLA decode sketch, compiled and loaded (``params`` an int: the default of that
    many heads); ``body`` edits the generated body (a planted bug) under another name."""
    profile = profile_here()
    params = default_decode_params(spec, params, profile) if isinstance(params, int) else params
    gk = kernel_for(spec, params, profile)
    if body is not None:
        name = gk.name + "_planted"
        gk = dataclasses.replace(gk, name=name, body=body(gk.body).replace(gk.name, name))
    return compile_and_load(gk, profile)


@pytest.mark.parametrize("name,spec,params", CASES, ids=[c[0] for c in CASES])
def test_fp8_latent_kernels_pass_the_gate(name, spec, params):
    k = fp8_mla_kernel(spec, params)
    for page in ((64, 16) if spec.layout == "paged" else (64,)):
        report = verify_decode(k, spec, page_size=page)
        assert report.passed, report.reason


def test_a_kernel_that_ignores_the_scale_is_caught():
    """The entry point hands the kernel 1.0 in place of the scale: it then reads the e4m3 bytes as the real latent,
    as one that never applied the scale would (scores off by the scale, V too)."""
    def plant(body):
        entry = body.index('extern "C" __global__')
        return (body[:entry] + "__device__ const float planted_one = 1.0f;\n" + body[entry:]).replace(
            "(args, scales, smem)", "(args, attn_decode::KvScales{&planted_one, &planted_one, 0, 0}, smem)")

    k = fp8_mla_kernel(body=plant)
    cases = [DecodeCase((1, 63, 65, 4097), heads=MLA_HEADS, kv_scale="tensor", kv_amp=1e3),
             DecodeCase((700, 129), num_splits=3, heads=MLA_TP_HEADS, kv_scale="tensor", kv_amp=1e-3,
                        near_max=True)]
    report = verify_decode(k, MLA8, cases=cases)
    assert not report.passed and all(not c.passed for c in report.checks), report.checks


def _latent(lens, heads=16, seed=0, amp=30.0, page=64, room=1, spare=3):
    """q bf16 (/ amp), a shuffled e4m3 latent cache (spare pages NaN bytes) of values of amplitude ``amp``
    quantised with one scale, int32 lengths, the table (``room`` rows past each length), the scale."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    ks = torch.tensor([amp * 4 / 448], device="cuda")
    b = len(lens)
    q = (torch.randn(b, 1, heads, 576, device="cuda", generator=g) / amp).to(torch.bfloat16)
    counts = [-(-(n + room) // page) for n in lens]
    total = sum(counts) + spare
    order = torch.randperm(total, device="cuda", generator=g).tolist()
    kc = torch.full((total, page, 1, 576), 0x7F, dtype=torch.uint8, device="cuda").view(E4M3)
    table = torch.zeros(b, max(counts), dtype=torch.int32, device="cuda")
    for i, n in enumerate(lens):
        for j in range(counts[i]):
            pid = order.pop()
            table[i, j] = pid
            rows = max(0, min(page, n - j * page))
            kc[pid, :rows] = quantise(torch.randn(rows, 1, 576, device="cuda", generator=g) * amp, ks)
    return q, kc, torch.tensor(lens, dtype=torch.int32, device="cuda"), table, ks


def test_bad_calls_are_refused_before_any_launch():
    k = fp8_mla_kernel(params=16)
    q, kc, lens, table, ks = _latent([20, 130])
    for kwargs, words in ((dict(), "k_scale is missing"),
                          (dict(k_scale=ks, v_scale=ks.clone()), "v_scale: absorbed MLA reads V"),
                          (dict(k_scale=ks.cpu()), "k_scale is on cpu"),
                          (dict(k_scale=ks.half()), "k_scale must be fp32"),
                          (dict(k_scale=torch.ones(2, device="cuda")), "k_scale must have shape")):
        with pytest.raises(ValueError, match=words):
            k(q, kc, None, cache_seqlens=lens, page_table=table, **kwargs)
    with pytest.raises(ValueError, match="k_cache is torch.bfloat16; this kernel was built for torch.float8_e4m3fn"):
        k(q, kc.to(torch.bfloat16), None, cache_seqlens=lens, page_table=table, k_scale=ks)
    with pytest.raises(ValueError, match="MLA decode reads one latent KV head"):
        k(q, kc.expand(-1, -1, 2, -1).contiguous(), None, cache_seqlens=lens, page_table=table, k_scale=ks)


def _naive(q, kc, lens, table, ks):
    """fp32 absorbed attention of each sequence (one query token) on the dequantised latent, V its first 512 columns."""
    out = torch.zeros(q.shape[0], 1, q.shape[2], 512, device="cuda")
    lse = torch.zeros(q.shape[0], q.shape[2], 1, device="cuda")
    real = dequantise(kc, ks)   # (pages, page, 1, 576) fp32
    for i, n in enumerate(lens.tolist()):
        k = real[table[i].long()].reshape(-1, 576)[:n]
        s = q[i, 0].float() @ k.T / math.sqrt(576)
        out[i, 0] = torch.softmax(s, -1) @ k[:, :512]
        lse[i, :, 0] = torch.logsumexp(s, -1)
    return out, lse


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
    root = tmp_path_factory.mktemp("fp8-mla-export")
    store = KernelStore(root / "study")
    params = default_decode_params(MLA8, 16, profile)
    text = tl.load_sketch("mla", True, "decode", "paged")
    gk = generate(parse(text).program, params, profile, MLA8)
    result = nvcc.compile_kernel(gk, profile.nvcc_arch, cache_dir=nvcc.default_cache_dir())
    assert result.ok, result.log[-2000:]
    report = verify_decode(compile_and_load(gk, profile), MLA8, page_size=64)
    assert report.passed, report.reason
    verification = report.to_dict()
    verification["checks"] = [{k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in c.items()}
                              for c in verification["checks"]]
    device_name = torch.cuda.get_device_name()
    assert store.offer(KernelRecord(
        arch=profile.arch_family, gpu=profile.name, device_name=device_name, variant="mla", dtype="bf16", d_qk=576,
        d_v=512, causal=True, bucket="d-b8-kv8k-p64", params=params.to_dict(), kernel_name=gk.name,
        kernel_meta=gk.meta(), source=gk.source, cubin=result.cubin, tl_program=text, verification=verification,
        tflops=1.0, baselines={}, problem={"layout": "paged"}, provenance=collect(profile, device_name), study="test",
        layout="paged", phase="decode"))
    export_records(store.records(), profile, root / "out")
    served = load_exported(root / "out")
    assert [(c.variant, c.kv_dtype) for c in served.configs] == [("mla", "fp8")]
    return served


@pytest.mark.parametrize("v_scale_given", [False, True])
def test_flash_attn_with_kvcache_serves_the_fp8_latent_and_appends_quantised_rows(attn, v_scale_given):
    lens = [1, 100, 3000, 777]
    q, kc, seqlens, table, ks = _latent(lens, seed=int(v_scale_given))
    new = (torch.randn(4, 1, 1, 576, device="cuda", generator=torch.Generator(device="cuda").manual_seed(9))
           * 30.0).to(torch.bfloat16)
    extra = {"v_scale": ks} if v_scale_given else {}
    out, lse = attn.flash_attn_with_kvcache(q, kc, None, new, cache_seqlens=seqlens, block_table=table, causal=True,
                                            return_softmax_lse=True, k_scale=ks, **extra)
    assert attn.last_path == "kernel", attn.last_reason
    pages = table.gather(1, (seqlens // 64).long()[:, None]).long()[:, 0]
    rows = (seqlens % 64).long()
    assert torch.equal(kc[pages, rows].view(torch.uint8), quantise(new[:, 0], ks).view(torch.uint8))
    ref, ref_lse = _naive(q, kc, seqlens + 1, table, ks)
    err = (out.float() - ref).abs().max().item() / ref.abs().max().item()
    assert torch.isfinite(out).all() and err < 2e-2, err
    torch.testing.assert_close(lse, ref_lse, atol=1e-2, rtol=1e-3)
    assert sum(attn.reasons.values()) == 0


def test_a_16_bit_latent_is_not_served_by_the_fp8_config(attn):
    q, kc, seqlens, table, ks = _latent([100, 20])
    before = dict(attn.reasons)
    attn.flash_attn_with_kvcache(q, dequantise(kc, ks, torch.bfloat16), None, cache_seqlens=seqlens,
                                 block_table=table, causal=True)
    assert attn.last_path != "kernel" and sum(attn.reasons.values()) == sum(before.values()) + 1


@pytest.mark.parametrize("heads", [128, 16])
def test_a_bench_point_beside_the_16_bit_latent_kernel(heads):
    """tune bench's measurement (tuner.measure.decode.measure_fp8_mla_point) on one point: the 16-bit latent cache's
    default kernel (reading the e4m3 latent dequantised to bf16) beside the FP8 one, finite times, outputs that agree
    (the 16-bit cache rounds each value to bf16's 8 bits, P too). The rows are printed for BENCHMARKS.md (run with
    -s)."""
    from tuner.measure.decode import MLAPoint, measure_fp8_mla_point

    profile = profile_here()
    spec16 = dataclasses.replace(MLA8, kv_dtype="")
    k16 = compile_and_load(kernel_for(spec16, default_decode_params(spec16, heads, profile), profile), profile)
    k8 = fp8_mla_kernel(params=heads)
    row = measure_fp8_mla_point(k8, k16, MLAPoint(64, 8192, heads_q=heads, seqlen_q=1, kv_dtype="fp8"))
    print(row)
    assert all(math.isfinite(row[f]) and row[f] > 0 for f in ("fp8_us", "base_us", "fp8_gbs", "base_gbs"))
    assert row["rel_diff"] < 2e-2, row
