"""flash_attn_with_kvcache over an FP8 (e4m3) KV cache through an export, on the CPU: the FP8 cache's decode config
(exported as a config of its own) serves it and a 16-bit cache's never does, nor the reverse; the scales are
checked before anything is appended or launched, each refusal naming the argument; without an FP8 config the
reference on the dequantised cache runs, counted; appended rows are quantised into the cache."""
import math

import pytest
import torch
from conftest import serve_records
from store_fakes import make_decode_record

from tuner.serving.kvcache_fp8 import E4M3, dequantise, quantise

HQ, HKV, D, PAGE = 8, 2, 128, 16


def _record(kv_dtype="", bucket="d-b8-kv8k-p16"):
    r = make_decode_record(bucket=bucket, cubin=(bucket + kv_dtype).encode())
    r.kernel_meta["spec"] = {"variant": "gqa", "causal": True, "d_qk": D, "d_v": D, "dtype": "bf16",
                             "layout": "paged", "phase": "decode", **({"kv_dtype": kv_dtype} if kv_dtype else {})}
    return r


@pytest.fixture
def served(tmp_path):
    return serve_records(tmp_path / "fp8", [_record("fp8"), _record()])


@pytest.fixture
def bf16_only(tmp_path):
    return serve_records(tmp_path / "bf16", [_record()])


def _cache(lens, per_head=True, seed=0):
    """q bf16; a paged e4m3 cache of real values quantised with scales (per KV head 1000x apart, or one), NaN in
    the spare pages and past each length; the table; int32 lengths; the scales."""
    g = torch.Generator().manual_seed(seed)
    b = len(lens)
    amps = torch.tensor([0.03, 30.0])
    k_scale = amps * 4 / 448 if per_head else torch.tensor([30.0 * 4 / 448])
    v_scale = k_scale * 1.5
    q = (torch.randn(b, 1, HQ, D, generator=g) / amps.repeat_interleave(HQ // HKV)[:, None]).to(torch.bfloat16)
    counts = [-(-n // PAGE) for n in lens]
    pages = sum(counts) + 2
    kc = torch.full((pages, PAGE, HKV, D), float("nan"), dtype=E4M3)
    vc = kc.clone()
    table = torch.zeros(b, max(counts) + 1, dtype=torch.int32)
    order = torch.randperm(pages, generator=g).tolist()
    for i, n in enumerate(lens):
        for j in range(counts[i]):
            pid = order.pop()
            table[i, j] = pid
            rows = min(PAGE, n - j * PAGE)
            kc[pid, :rows] = quantise(torch.randn(rows, HKV, D, generator=g) * amps[:, None], k_scale)
            vc[pid, :rows] = quantise(torch.randn(rows, HKV, D, generator=g) * amps[:, None], v_scale)
    return q, kc, vc, table, torch.tensor(lens, dtype=torch.int32), k_scale, v_scale


def _naive(q, kc, vc, table, lens, k_scale, v_scale):
    """float64 attention sequence by sequence on the dequantised pages (one query token sees every key)."""
    b = q.shape[0]
    out = torch.zeros(b, 1, HQ, D, dtype=torch.float64)
    for i in range(b):
        n = int(lens[i])
        pids = table[i, :-(-n // PAGE)].long()
        k = dequantise(kc[pids].reshape(-1, HKV, D)[:n], k_scale).double()
        v = dequantise(vc[pids].reshape(-1, HKV, D)[:n], v_scale).double()
        for h in range(HQ):
            kh = h // (HQ // HKV)
            s = q[i, 0, h].double() @ k[:, kh].T / math.sqrt(D)
            out[i, 0, h] = torch.softmax(s, -1) @ v[:, kh]
    return out


def _calls(attn, kv_dtype):
    """Calls the loaded stand-in kernels over a cache of kv_dtype ("" : 16-bit) have taken (kernels load lazily)."""
    return sum(len(k.splits) for k in attn.stand_ins if k.meta["spec"].get("kv_dtype", "") == kv_dtype)


@pytest.mark.parametrize("per_head", [True, False])
def test_an_fp8_cache_runs_its_own_kernel_with_the_scales(served, per_head):
    q, kc, vc, table, lens, ks, vs = _cache([37, 200, 1], per_head)
    out = served.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True,
                                         k_scale=ks, v_scale=vs)
    assert served.last_path == "kernel"
    assert _calls(served, "fp8") == 1 and _calls(served, "") == 0
    torch.testing.assert_close(out.double(), _naive(q, kc, vc, table, lens, ks, vs), atol=2e-2, rtol=2e-2)
    assert out.dtype == torch.bfloat16


def test_a_16_bit_cache_never_meets_the_fp8_kernel(served):
    q, kc, vc, table, lens, ks, vs = _cache([37, 200])
    served.flash_attn_with_kvcache(q, dequantise(kc, ks, torch.bfloat16), dequantise(vc, vs, torch.bfloat16),
                                   cache_seqlens=lens, block_table=table, causal=True)
    assert _calls(served, "") == 1 and _calls(served, "fp8") == 0


def test_the_fp8_config_is_a_file_of_its_own(served, tmp_path):
    names = sorted(p.name for p in (tmp_path / "fp8").glob("*.json") if "phase=decode" in p.name)
    assert len(names) == 2 and sum(",kv_dtype=fp8," in n for n in names) == 1
    fp8 = [c for c in served.configs if c.kv_dtype == "fp8"]
    assert len(fp8) == 1 and fp8[0].dtype == "bf16" and fp8[0].phase == "decode"


def test_without_an_fp8_config_the_reference_runs_on_the_dequantised_cache_and_is_counted(bf16_only):
    q, kc, vc, table, lens, ks, vs = _cache([64, 65])
    out = bf16_only.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True,
                                            k_scale=ks, v_scale=vs)
    assert bf16_only.last_path != "kernel" and _calls(bf16_only, "") == 0
    assert bf16_only.reasons.get("no-shape-config") == 1
    torch.testing.assert_close(out.double(), _naive(q, kc, vc, table, lens, ks, vs), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("change,words", [
    (dict(k_scale=None), "k_scale is missing"),
    (dict(v_scale=None), "v_scale is missing"),
    (dict(k_scale=torch.ones(2, dtype=torch.float16)), "k_scale must be fp32"),
    (dict(v_scale=torch.ones(3)), "v_scale must have shape () or (1,) (per tensor) or (2,) (per KV head), got (3,)"),
    (dict(k_scale=torch.tensor([1.0, float("nan")])), "k_scale holds values that are not finite"),
    (dict(v_scale=torch.ones(4)[::2]), "v_scale must be contiguous"),
    (dict(k_scale=0.5), "k_scale must be a torch tensor"),
    (dict(v_cache="bf16"), "k_cache and v_cache must both be"),
    (dict(q="fp32"), "fp16 or bf16 queries"),
])
def test_bad_scales_are_refused_naming_them_before_anything_is_appended(served, change, words):
    q, kc, vc, table, lens, ks, vs = _cache([37, 20])
    args = dict(q=q, k_cache=kc, v_cache=vc, k_scale=ks, v_scale=vs)
    for name, value in change.items():
        args[name] = value
    if change.get("v_cache") == "bf16":
        args["v_cache"] = torch.zeros(vc.shape, dtype=torch.bfloat16)
    if change.get("q") == "fp32":
        args["q"] = q.float()
    before = kc.view(torch.uint8).clone()
    k_new = torch.randn(2, 1, HKV, D).to(args["q"].dtype)
    with pytest.raises(ValueError, match="^flash_attn_with_kvcache: .*" + words.replace("(", r"\(").replace(")", r"\)")):
        served.flash_attn_with_kvcache(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), k=k_new, v=k_new,
                                       cache_seqlens=lens, block_table=table, causal=True, **args)
    assert torch.equal(kc.view(torch.uint8), before)     # nothing appended


def test_scales_with_a_16_bit_cache_are_refused(served):
    q, kc, vc, table, lens, ks, vs = _cache([37])
    with pytest.raises(ValueError, match="k_scale and v_scale go with an FP8"):
        served.flash_attn_with_kvcache(q, kc.to(torch.bfloat16), vc.to(torch.bfloat16), cache_seqlens=lens,
                                       block_table=table, k_scale=ks, v_scale=vs)


def test_appended_rows_are_quantised_into_the_cache_with_the_scales(served):
    q, kc, vc, table, lens, ks, vs = _cache([37, 16])
    k_new = torch.randn(2, 2, HKV, D).to(torch.bfloat16) * 3
    v_new = torch.randn(2, 2, HKV, D).to(torch.bfloat16) * 1000    # past 448 x scale: clamped, not NaN
    served.flash_attn_with_kvcache(q, kc, vc, k=k_new, v=v_new, cache_seqlens=lens, block_table=table, causal=True,
                                   k_scale=ks, v_scale=vs)
    for i, n in enumerate(lens.tolist()):
        for t in range(2):
            pid, row = int(table[i, (n + t) // PAGE]), (n + t) % PAGE
            assert torch.equal(kc[pid, row].view(torch.uint8), quantise(k_new[i, t], ks).view(torch.uint8))
            assert torch.equal(vc[pid, row].view(torch.uint8), quantise(v_new[i, t], vs).view(torch.uint8))
    assert not bool(vc.float()[int(table[0, 38 // PAGE]), 38 % PAGE].isnan().any())
    assert float(dequantise(vc[int(table[1, 1]), 1], vs).abs().max()) == pytest.approx(448 * float(vs.max()))
    assert _calls(served, "fp8") == 1


def test_the_fp8_decode_op_schema_and_fake(served):
    from tuner.serving.op_decode_fp8 import decode_kvcache_fp8_op

    q, kc, vc, table, lens, ks, vs = _cache([37, 20])
    kc, vc = (t.float().nan_to_num(0.0).to(E4M3) for t in (kc, vc))     # opcheck compares NaN
    scale = 1 / math.sqrt(D)
    route = served.route_decode(q, kc, vc, table, True, scale)
    for r in (route, served._fallback["no-shape-config"]):
        torch.library.opcheck(decode_kvcache_fp8_op, (q, kc, vc, ks, vs, lens, table, True, scale, 0, True, -1, -1,
                                                      0.0, None, r), test_utils=("test_faketensor",))
        # (torch's schema check multiplies the inputs to find mutations: no e4m3 multiply on the CPU)


def test_absorbed_mla_over_an_fp8_latent_cache_runs_the_reference_with_k_scale_for_v(served):
    """Without an FP8 latent-cache MLA config (this export has GQA ones) the call runs the reference, V being the
    latent rows' first 512 columns at k_scale; a different v_scale is refused by name."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 1, 16, 576, generator=g).to(torch.bfloat16)
    ks = torch.tensor([0.02])
    kc = quantise(torch.randn(4, 64, 1, 576, generator=g), ks)
    table = torch.arange(4, dtype=torch.int32).view(2, 2)
    lens = torch.tensor([100, 7], dtype=torch.int32)
    with pytest.raises(ValueError, match="absorbed MLA .* v_scale=None or k_scale itself"):
        served.flash_attn_with_kvcache(q, kc, None, cache_seqlens=lens, block_table=table, k_scale=ks,
                                       v_scale=ks.clone())
    out = served.flash_attn_with_kvcache(q, kc, None, cache_seqlens=lens, block_table=table, k_scale=ks)
    assert served.last_path != "kernel"
    real = dequantise(kc, ks)
    for i, n in enumerate(lens.tolist()):
        k = real[table[i].long()].reshape(-1, 576)[:n].double()
        p = torch.softmax(q[i, 0].double() @ k.T / math.sqrt(576), -1)
        torch.testing.assert_close(out[i, 0].double(), p @ k[:, :512], atol=2e-2, rtol=2e-2)


def test_an_fp8_cache_call_traces_without_graph_breaks(served):
    q, kc, vc, table, lens, ks, vs = _cache([37, 200])

    def step(q, kc, vc, lens, table, ks, vs):
        return served.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True,
                                              k_scale=ks, v_scale=vs, return_softmax_lse=True)

    explained = torch._dynamo.explain(step)(q, kc, vc, lens, table, ks, vs)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got, want = compiled(q, kc, vc, lens, table, ks, vs), step(q, kc, vc, lens, table, ks, vs)
    torch.testing.assert_close(got[0], want[0])
    assert _calls(served, "fp8") >= 2


@pytest.mark.parametrize("name", ["q_descale", "k_descale", "v_descale"])
def test_fa3_descales_are_refused_naming_k_scale_and_v_scale(served, name):
    q, kc, vc, table, lens, ks, vs = _cache([37])
    with pytest.raises(NotImplementedError, match=f"{name} .* takes k_scale=/v_scale="):
        served.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, k_scale=ks, v_scale=vs,
                                       **{name: torch.ones(1, HKV)})


def _mla_record(kv_dtype="fp8"):
    """An absorbed-MLA decode record (576/512, one latent head, pages of 64) over an FP8 latent cache."""
    r = make_decode_record(bucket="d-b8-kv8k-p64", cubin=("mla" + kv_dtype).encode(), variant="mla", d_qk=576,
                           d_v=512)
    r.kernel_meta["spec"] = {"variant": "mla", "causal": True, "d_qk": 576, "d_v": 512, "dtype": "bf16",
                             "layout": "paged", "phase": "decode", **({"kv_dtype": kv_dtype} if kv_dtype else {})}
    r.problem.update(variant="mla", heads_q=16, heads_kv=1, d_qk=576, d_v=512)
    return r


def _latent(lens, seed=4, amp=30.0):
    g = torch.Generator().manual_seed(seed)
    ks = torch.tensor([amp * 4 / 448])
    q = (torch.randn(len(lens), 1, 16, 576, generator=g) / amp).to(torch.bfloat16)
    pages = [-(-n // 64) for n in lens]
    kc = quantise(torch.randn(sum(pages) + 1, 64, 1, 576, generator=g) * amp, ks)
    table = torch.zeros(len(lens), max(pages), dtype=torch.int32)
    at = 0
    for i, n in enumerate(pages):
        table[i, :n] = torch.arange(at, at + n, dtype=torch.int32)
        at += n
    return q, kc, table, torch.tensor(lens, dtype=torch.int32), ks


def _latent_naive(q, kc, table, lens, ks):
    real = dequantise(kc, ks)
    out = torch.zeros(q.shape[0], 1, 16, 512, dtype=torch.float64)
    for i, n in enumerate(lens.tolist()):
        k = real[table[i].long()].reshape(-1, 576)[:n].double()
        out[i, 0] = torch.softmax(q[i, 0].double() @ k.T / math.sqrt(576), -1) @ k[:, :512]
    return out


def test_absorbed_mla_over_an_fp8_latent_cache_runs_its_fp8_kernel_with_k_scale_for_v(tmp_path):
    """An exported MLA config of kv_dtype fp8 serves the call (v_cache None, v_scale None or k_scale itself): its
    kernel is given k_scale for both; a bf16 latent cache's MLA config never serves an e4m3 cache, nor the reverse."""
    attn = serve_records(tmp_path / "mla8", [_mla_record("fp8"), _mla_record("")])
    q, kc, table, lens, ks = _latent([100, 7, 64])
    for v_scale in (None, ks):
        out = attn.flash_attn_with_kvcache(q, kc, None, cache_seqlens=lens, block_table=table, causal=True,
                                           k_scale=ks, v_scale=v_scale)
        assert attn.last_path == "kernel"
        torch.testing.assert_close(out.double(), _latent_naive(q, kc, table, lens, ks), atol=2e-2, rtol=2e-2)
    assert _calls(attn, "fp8") == 2 and _calls(attn, "") == 0
    with pytest.raises(ValueError, match="absorbed MLA .* v_scale=None or k_scale itself"):
        attn.flash_attn_with_kvcache(q, kc, None, cache_seqlens=lens, block_table=table, k_scale=ks,
                                     v_scale=ks.clone())
    with pytest.raises(ValueError, match="k_scale is missing"):
        attn.flash_attn_with_kvcache(q, kc, None, cache_seqlens=lens, block_table=table)
    with pytest.raises(ValueError, match="k_scale holds values that are not finite"):
        attn.flash_attn_with_kvcache(q, kc, None, cache_seqlens=lens, block_table=table,
                                     k_scale=torch.tensor([float("nan")]))
    bf16 = kc.float().to(torch.bfloat16)
    attn.flash_attn_with_kvcache(q, bf16, None, cache_seqlens=lens, block_table=table, causal=True)
    assert attn.last_path == "kernel" and _calls(attn, "") == 1 and _calls(attn, "fp8") == 2


def test_appending_to_an_fp8_latent_cache_quantises_the_new_rows_with_k_scale(tmp_path):
    attn = serve_records(tmp_path / "mla8a", [_mla_record("fp8")])
    q, kc, table, lens, ks = _latent([100, 7], seed=6)
    new = torch.randn(2, 1, 1, 576, generator=torch.Generator().manual_seed(8)).mul(30.0).to(torch.bfloat16)
    before = kc.clone()
    attn.flash_attn_with_kvcache(q, kc, None, k=new, cache_seqlens=lens, block_table=table, causal=True, k_scale=ks)
    assert attn.last_path == "kernel"
    for i, n in enumerate(lens.tolist()):
        page, row = int(table[i, n // 64]), n % 64
        assert torch.equal(kc[page, row].view(torch.uint8), quantise(new[i, 0].float(), ks).view(torch.uint8))
        assert torch.equal(dequantise(kc[page, row], ks), dequantise(quantise(new[i, 0].float(), ks), ks))
    changed = (kc.view(torch.uint8) != before.view(torch.uint8)).any(-1).any(-1).nonzero().tolist()
    assert sorted(changed) == sorted([[int(table[i, n // 64]), n % 64] for i, n in enumerate(lens.tolist())])
