"""flash_attn_with_kvcache through an export on the CPU: decode configs' stand-in kernels and the reference fallback
against a float64 loop, the decode bucket rule (nearest bucket, page sizes), the custom op's schema, fake and
autograd (opcheck), gradients, torch.compile without graph breaks, fallback reasons, and the refusals."""
import math

import pytest
import torch
from conftest import H100, make_export, stand_in_loader
from store_fakes import make_decode_record, make_record

from tuner.serving.buckets.decode import BATCH_EDGES, KV_EDGES, decode_bucket, parse_decode_bucket
from tuner.serving import DeviceFacts, load_exported, op
from tuner.serving.decode_rule import DecodeTable, class_edge, nearest_decode_bucket
from tuner.serving.decode_sdpa import decode_gradients, decode_reference

PAGED_BUCKETS = ("d-b8-kv8k-p16", "d-b1-kv2k-p16", "d-b32-kv32k-p64")


def _load(folder):
    return load_exported(folder, devices={("cpu", None): DeviceFacts(H100, (9, 0))}, kernel_loader=stand_in_loader)


@pytest.fixture
def decoded(tmp_path):
    """Causal gqa d128 bf16 decode kernels: paged (page 16: two buckets, page 64: one) and dense (one), beside a
    prefill kernel of the same spec (never used by a decode call)."""
    records = [make_decode_record(bucket=b, cubin=b.encode()) for b in PAGED_BUCKETS]
    records.append(make_decode_record(layout="dense", bucket="d-b8-kv2k", cubin=b"dense"))
    records.append(make_record(variant="gqa", bucket="s1024", cubin=b"prefill"))
    for r in records:
        r.kernel_meta["spec"] = {"causal": r.causal, "d_qk": r.d_qk, "d_v": r.d_v, "dtype": r.dtype,
                                 "layout": r.layout}
    return _load(make_export(tmp_path / "decode", records))


def decode_case(lens, sq=1, page=16, hq=8, hkv=2, d=128, dtype=torch.bfloat16, seed=0, dense=False, spare=3,
                pages=None):
    """q (b, sq, hq, d); the cache paged over shuffled pages (spare pages and every row past a length NaN, table
    rows padded with -1) or dense (b, capacity, hkv, d) NaN past each length; lengths int32; the table."""
    g = torch.Generator().manual_seed(seed)
    b = len(lens)
    q = torch.randn(b, sq, hq, d, generator=g).to(dtype)
    if dense:
        capacity = pages * page if pages else max(lens)
        kc = torch.full((b, capacity, hkv, d), float("nan"), dtype=dtype)
        vc = kc.clone()
        for i, n in enumerate(lens):
            kc[i, :n] = torch.randn(n, hkv, d, generator=g).to(dtype)
            vc[i, :n] = torch.randn(n, hkv, d, generator=g).to(dtype)
        return q, kc, vc, torch.tensor(lens, dtype=torch.int32), None
    counts = [-(-n // page) for n in lens]
    width = pages or max(1, max(counts))
    order = torch.randperm(sum(counts) + spare, generator=g).tolist()
    kc = torch.full((len(order), page, hkv, d), float("nan"), dtype=dtype)
    vc = kc.clone()
    table = torch.full((b, width), -1, dtype=torch.int32)
    at = 0
    for i, n in enumerate(lens):
        for j in range(counts[i]):
            pid, at = order[at], at + 1
            table[i, j] = pid
            rows = min(page, n - j * page)
            kc[pid, :rows] = torch.randn(rows, hkv, d, generator=g).to(dtype)
            vc[pid, :rows] = torch.randn(rows, hkv, d, generator=g).to(dtype)
    return q, kc, vc, torch.tensor(lens, dtype=torch.int32), table


def naive(q, kc, vc, lens, table, causal, scale=None):
    """(out, lse) in float64, sequence by sequence and head by head; a row that sees no key: 0 and -inf."""
    b, sq, hq, d = q.shape
    hkv, dv = kc.shape[2], vc.shape[3]
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = torch.zeros(b, sq, hq, dv, dtype=torch.float64)
    lse = torch.full((b, hq, sq), float("-inf"), dtype=torch.float64)
    for i in range(b):
        n = int(lens[i]) if lens is not None else kc.shape[1]
        if table is not None:
            page = kc.shape[1]
            pids = table[i, :-(-n // page)].long()
            k, v = kc[pids].reshape(-1, hkv, d)[:n], vc[pids].reshape(-1, hkv, dv)[:n]
        else:
            k, v = kc[i, :n], vc[i, :n]
        for h in range(hq):
            kh = h // (hq // hkv)
            s = q[i, :, h].double() @ k[:, kh].double().T * scale
            if causal:
                keep = torch.arange(n)[None, :] <= torch.arange(sq)[:, None] + n - sq
                s = s.masked_fill(~keep, float("-inf"))
            lse[i, h] = torch.logsumexp(s, dim=-1)
            out[i, :, h] = torch.softmax(s, dim=-1).nan_to_num(0.0) @ v[:, kh].double()
    return out, lse


def close(got, want, atol=2e-2):
    torch.testing.assert_close(got.double(), want, atol=atol, rtol=atol)


# ---- the bucket rule ----------------------------------------------------------------------------------------
def test_class_edges_are_the_decode_bucket_rule():
    for batch in (1, 2, 7, 8, 9, 31, 32, 33, 128, 129, 4096):
        for kv in (1, 2047, 2048, 2049, 8192, 8193, 32768, 10 ** 6):
            b, k, _ = parse_decode_bucket(decode_bucket(batch, kv))
            assert (class_edge(batch, BATCH_EDGES), class_edge(kv, KV_EDGES)) == (b, k)


def test_the_nearest_bucket_by_log_distance_of_the_same_page_size():
    table = DecodeTable.build(PAGED_BUCKETS)
    assert table.page_sizes == (16, 64)
    assert table.bucket(8, 8192, 16) == "d-b8-kv8k-p16"                   # its own class
    assert table.bucket(1, 100, 16) == "d-b1-kv2k-p16"
    assert table.bucket(3, 2048, 16) == "d-b8-kv8k-p16"                   # (8, 2k): 0 + 2 beats 3 + 0
    assert table.bucket(500, 10 ** 5, 16) == "d-b8-kv8k-p16"              # (128, 32k): 4 + 2 beats 7 + 4
    assert table.bucket(1, 100, 64) == "d-b32-kv32k-p64"                  # the only page-64 bucket
    assert table.bucket(8, 8192, 32) is None                              # no bucket of page 32
    tie = DecodeTable.build(["d-b8-kv32k-p16", "d-b128-kv2k-p16"])
    assert tie.bucket(32, 8192, 16) == "d-b8-kv32k-p16"                   # 2 + 2 each: the larger KV wins
    dense = DecodeTable.build(["d-b8-kv2k", "d-b128-kv32k"])
    assert dense.bucket(2, 1000) == "d-b8-kv2k" and dense.bucket(100, 9000) == "d-b128-kv32k"
    assert dense.page_sizes == ()
    for b in BATCH_EDGES:                                                 # the settled table is the function
        for kv in KV_EDGES:
            assert table.bucket(b, kv, 16) == nearest_decode_bucket(b, kv, 16, PAGED_BUCKETS)


# ---- calls ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("keyword", ["block_table", "page_table"])
def test_a_paged_call_runs_the_decode_kernel_of_its_bucket(decoded, keyword):
    q, kc, vc, lens, table = decode_case([5, 70, 33], sq=1)
    out = decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, **{keyword: table})
    # batch 3, 5 pages of 16: class (8, 2k), not stored; d-b8-kv8k-p16 is nearer (0 + 2) than d-b1-kv2k-p16 (3 + 0)
    assert decoded.last_path == "kernel" and decoded.last_bucket == "d-b8-kv8k-p16", decoded.last_reason
    assert decoded.last_reason == "gqa decode paged"
    close(out, naive(q, kc, vc, lens, table, True)[0])


def test_speculative_tokens_causal_bottom_right_lse_and_out(decoded):
    q, kc, vc, lens, table = decode_case([40, 3, 17, 16, 1, 100, 64, 9, 20], sq=4, pages=40, seed=1)
    out = torch.full((9, 4, 8, 128), float("nan"), dtype=torch.bfloat16)
    res, lse = decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True,
                                               softmax_scale=0.05, return_softmax_lse=True, out=out)
    assert res is out and decoded.last_bucket == "d-b8-kv8k-p16"
    want, want_lse = naive(q, kc, vc, lens, table, True, 0.05)
    close(out, want)
    assert lse.shape == (9, 8, 4) and lse.dtype == torch.float32
    assert torch.isneginf(lse[4, :, :3]).all()                  # a 1-key sequence: its first 3 queries see nothing
    finite = torch.isfinite(want_lse)
    torch.testing.assert_close(lse.double()[finite], want_lse[finite], atol=1e-3, rtol=1e-3)
    assert (out[4, :3] == 0).all()


def test_a_dense_cache_and_a_whole_cache_without_lengths(decoded):
    q, kc, vc, lens, _ = decode_case([30, 50], sq=2, dense=True, seed=2)
    out = decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True)
    assert decoded.last_path == "kernel" and decoded.last_bucket == "d-b8-kv2k"
    close(out, naive(q, kc, vc, lens, None, True)[0])
    full = kc.nan_to_num(0.5), vc.nan_to_num(-0.5)
    out = decoded.flash_attn_with_kvcache(q, *full, causal=True)          # FA2: None means every row
    close(out, naive(q, *full, None, None, True)[0])
    out = decoded.flash_attn_with_kvcache(q, *full, cache_seqlens=50, causal=True)   # an int: every sequence
    close(out, naive(q, *full, None, None, True)[0])


def test_a_paged_call_without_lengths_reads_the_whole_table(decoded):
    q, kc, vc, lens, table = decode_case([32, 48], page=16)
    kc, vc = kc.nan_to_num(0.25), vc.nan_to_num(0.25)
    table = table.clamp(min=0)
    out = decoded.flash_attn_with_kvcache(q, kc, vc, block_table=table, causal=True)
    assert decoded.last_path == "kernel"
    close(out, naive(q, kc, vc, torch.tensor([48, 48]), table, True)[0])


def test_num_splits_reaches_the_kernel(decoded):
    q, kc, vc, lens, table = decode_case([5, 70], sq=1)
    decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, num_splits=3)
    decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table)
    (kernel,) = [k for k in decoded._kernels.values() if hasattr(k, "splits")]
    assert kernel.splits[-2:] == [3, None]


@pytest.mark.parametrize("case,code", [
    ("page-32", "decode-page-size"), ("fp32", "dtype"), ("noncausal-2-tokens", "no-shape-config"),
    ("17-tokens", "decode-seqlen-q"), ("d64", "no-shape-config"), ("refused", "inputs-refused"),
])
def test_what_no_decode_kernel_serves_runs_the_reference_and_says_why(decoded, case, code):
    kwargs = dict(sq=1, page=16)
    causal = True
    if case == "page-32":
        kwargs["page"] = 32
    elif case == "fp32":
        kwargs["dtype"] = torch.float32
    elif case == "noncausal-2-tokens":
        kwargs["sq"], causal = 2, False
    elif case == "17-tokens":
        kwargs["sq"] = 17
    elif case == "d64":
        kwargs["d"] = 64
    q, kc, vc, lens, table = decode_case([40, 90], **kwargs)
    if case == "refused":                                  # a head dim the kernel cannot read: strided
        kc = torch.cat([kc, kc], dim=-1)[..., ::2]
    out = decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=causal)
    assert decoded.last_path == "sdpa" and decoded.reasons == {code: 1}, decoded.last_reason
    close(out, naive(q, kc, vc, lens, table, causal)[0], atol=2e-2 if q.dtype != torch.float32 else 1e-5)


def test_one_token_uses_a_kernel_of_the_other_causality(decoded):
    q, kc, vc, lens, table = decode_case([40, 90], sq=1)
    out = decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=False)
    assert decoded.last_path == "kernel"
    close(out, naive(q, kc, vc, lens, table, False)[0])


def test_an_export_without_decode_configs_counts_its_reason(served):
    q, kc, vc, lens, table = decode_case([40, 90], sq=1)
    out = served.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True)
    assert served.last_path == "sdpa" and served.reasons == {"no-decode-config": 1}
    assert "no exported decode config" in served.last_reason
    close(out, naive(q, kc, vc, lens, table, True)[0])


def test_decode_configs_never_serve_prefill_calls(decoded):
    from conftest import qkv

    q, k, v = qkv(hq=8, hkv=2, sq=64)
    decoded(q, k, v, causal=True)
    assert decoded.last_path == "kernel" and decoded.last_bucket == "s1024"   # the prefill config
    assert all(c.phase == "prefill" for t in decoded._tables.values() for by in t.values() for c in by.values())


# ---- refusals ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arg", ["cache_batch_idx", "alibi_slopes"])
def test_unsupported_arguments_are_refused_by_name(decoded, arg):
    q, kc, vc, lens, table = decode_case([40], sq=1)
    value = torch.zeros(1)
    with pytest.raises(NotImplementedError, match=arg):
        decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, **{arg: value})
    assert decoded.stats == {}


@pytest.mark.parametrize("change,fragment", [
    ("table-int64", "2-D int32 tensor"), ("table-rows", "the page table has 1 rows for a batch of 2"),
    ("two-tables", "block_table and page_table name the same thing"), ("dense-batch", "one sequence per batch"),
    ("lens-shape", "cache_seqlens must hold one integer length per sequence"), ("splits", "num_splits"),
    ("heads", "multiple of the KV heads"), ("out", "out must be"), ("3d", "must be 4-D"),
])
def test_bad_decode_inputs_are_refused_clearly(decoded, change, fragment):
    q, kc, vc, lens, table = decode_case([40, 20], sq=1)
    kwargs = {"cache_seqlens": lens, "block_table": table}
    if change == "table-int64":
        kwargs["block_table"] = table.long()
    elif change == "table-rows":
        kwargs["block_table"] = table[:1]
    elif change == "two-tables":
        kwargs["page_table"] = table.clone()
    elif change == "dense-batch":
        kwargs.pop("block_table")
    elif change == "lens-shape":
        kwargs["cache_seqlens"] = lens[:1]
    elif change == "splits":
        kwargs["num_splits"] = -1
    elif change == "heads":
        q = q[:, :, :7]
    elif change == "out":
        kwargs["out"] = torch.empty(2, 1, 8, 64, dtype=q.dtype)
    elif change == "3d":
        q = q[:, 0]
    with pytest.raises(ValueError, match=fragment):
        decoded.flash_attn_with_kvcache(q, kc, vc, **kwargs)


# ---- the op --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("route_kind", ["kernel", pytest.param("per-call", marks=pytest.mark.slow), "reference"])
@pytest.mark.parametrize("return_lse", [False, True])
def test_decode_opcheck_schema_fake_and_autograd(decoded, route_kind, return_lse):
    q, kc, vc, lens, table = decode_case([37], sq=3, hq=4, hkv=2, d=128, spare=1, seed=4)
    q, kc, vc = (t.nan_to_num(0.0).requires_grad_() for t in (q, kc, vc))     # opcheck compares NaN
    table = table.clamp(min=0)
    scale = 1 / math.sqrt(128)
    route = decoded.route_decode(q, kc, vc, table, True, scale)
    config = op._ROUTES[route].config
    assert config is not None and op._ROUTES[route].bucket == "d-b1-kv2k-p16"
    if route_kind == "per-call":
        route = decoded._routes[(id(config), None)]
    elif route_kind == "reference":
        route = decoded._fallback["decode-page-size"]
    torch.library.opcheck(torch.ops.attn_tuner.decode_kvcache.default,
                          (q, kc, vc, lens, table, True, scale, 0, return_lse, route),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_decode_opcheck_dense_without_lengths(decoded):
    q, kc, vc, _, _ = decode_case([30, 30], sq=2, dense=True, seed=5)
    q, kc, vc = (t.requires_grad_() for t in (q, kc, vc))
    route = decoded.route_decode(q, kc, vc, None, True, 0.1)
    assert op._ROUTES[route].bucket == "d-b8-kv2k"
    torch.library.opcheck(torch.ops.attn_tuner.decode_kvcache.default, (q, kc, vc, None, None, True, 0.1, 2, True,
                                                                         route))


def test_opcheck_of_the_decode_backward_op():
    q, kc, vc, lens, table = decode_case([20, 9], sq=2, hq=4, hkv=1, d=64, dtype=torch.float32, spare=0)
    grad, grad_lse = torch.randn(2, 2, 4, 64), torch.randn(2, 4, 2)
    for g_lse in (grad_lse, None):
        torch.library.opcheck(torch.ops.attn_tuner.decode_kvcache_backward.default,
                              (grad, g_lse, q, kc.nan_to_num(0.0), vc.nan_to_num(0.0), lens, table.clamp(min=0),
                               True, 0.2), test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("dense", [False, True])
def test_gradients_of_out_and_lse_match_float64_autograd(decoded, dense):
    """Decode is inference, but under autograd it is differentiable (the reference's gradients written out):
    q, k_cache, v_cache against float64 autograd of the loop, also through the lse."""
    q, kc, vc, lens, table = decode_case([40, 23], sq=3, seed=6, dense=dense, spare=1)
    kc, vc = kc.nan_to_num(0.0), vc.nan_to_num(0.0)
    if table is not None:
        table = table.clamp(min=0)
    leaves = [t.detach().clone().requires_grad_() for t in (q, kc, vc)]
    out, lse = decoded.flash_attn_with_kvcache(*leaves, cache_seqlens=lens, block_table=table, causal=True,
                                               return_softmax_lse=True)
    assert decoded.last_path == "kernel" and out.grad_fn is not None
    g_out, g_lse = torch.randn_like(out.float()), torch.randn_like(lse)
    got = torch.autograd.grad((out.float() * g_out).sum() + (lse * g_lse).sum(), leaves)
    ref = [t.detach().double().requires_grad_() for t in (q, kc, vc)]
    w_out, w_lse = naive(*ref, lens, table, True)
    want = torch.autograd.grad((w_out * g_out.double()).sum() + (w_lse * g_lse.double()).sum(), ref)
    for name, g, w in zip(("q", "k_cache", "v_cache"), got, want):
        assert g.dtype == torch.bfloat16 and g.shape == w.shape
        err = ((g.double() - w).norm() / w.norm()).item()
        assert err < 2e-2, (name, err)


def test_the_written_out_backward_equals_autograd_of_the_reference():
    q, kc, vc, lens, table = decode_case([33, 7, 16], sq=4, hq=6, hkv=2, d=64, dtype=torch.float32, spare=2)
    kc, vc, table = kc.nan_to_num(0.0), vc.nan_to_num(0.0), table.clamp(min=0)
    leaves = [t.clone().requires_grad_() for t in (q, kc, vc)]
    out, lse = decode_reference(*leaves, lens, table, True, 0.3)
    g_out, g_lse = torch.randn_like(out), torch.randn_like(lse)
    finite = torch.isfinite(lse)
    want = torch.autograd.grad((out * g_out).sum() + (lse[finite] * g_lse[finite]).sum(), leaves)
    got = decode_gradients(g_out, g_lse * finite, q, kc, vc, lens, table, True, 0.3)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


def _step(attn):
    def f(q, kc, vc, lens, table):
        out, lse = attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True,
                                                return_softmax_lse=True)
        return out.float() * 2, lse
    return f


@pytest.mark.slow   # torch.compile of a model: seconds of Inductor
def test_decode_under_torch_compile_fullgraph(decoded):
    args = decode_case([70], sq=1, seed=7)
    f = _step(decoded)
    explained = torch._dynamo.explain(f)(*args)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    before = decoded.stats["kernel"]
    got, want = compiled(*args), f(*args)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    assert decoded.stats["kernel"] == before + 2 and decoded.last_bucket == "d-b1-kv2k-p16"
    inductor = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(inductor(*args)[0], want[0], atol=1e-2, rtol=1e-2)


@pytest.mark.slow   # torch.compile: seconds of Inductor
def test_compiled_dynamic_batch_picks_the_bucket_per_call(decoded):
    compiled = torch.compile(_step(decoded), fullgraph=True, backend="aot_eager", dynamic=True)
    buckets = []
    for lens in ([5, 9], [70], [5, 70, 33]):
        args = decode_case(lens, sq=1, seed=len(lens))
        got = compiled(*args)
        buckets.append(decoded.last_bucket)
        close(got[0] / 2, naive(*args, True)[0])
    assert buckets == ["d-b8-kv8k-p16", "d-b1-kv2k-p16", "d-b8-kv8k-p16"]


def test_compiled_fallbacks_are_counted_per_call(decoded):
    args = decode_case([40, 90], sq=1, page=32)                 # no page-32 bucket
    compiled = torch.compile(_step(decoded), fullgraph=True, backend="aot_eager")
    for _ in range(3):
        compiled(*args)
    assert decoded.reasons["decode-page-size"] == 3


def test_eager_inference_skips_the_dispatcher_only_when_nothing_observes(decoded, monkeypatch):
    calls = []
    real = op.decode_kvcache_op
    monkeypatch.setattr(op, "decode_kvcache_op", lambda *a: calls.append(1) or real(*a))
    q, kc, vc, lens, table = decode_case([40, 90], sq=1)
    decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True)
    assert calls == [] and decoded.last_path == "kernel"
    qg = q.clone().requires_grad_()
    out = decoded.flash_attn_with_kvcache(qg, kc, vc, cache_seqlens=lens, block_table=table, causal=True)
    assert out.grad_fn is not None and calls == [1]


def test_kernels_sharing_one_cubin_load_as_themselves(tmp_path):
    """A campaign compiles kernels four to a translation unit: two buckets' winners may share one cubin (one
    sha256). Each entry must still load its own kernel (by name), not the first one loaded from that file."""
    paged = make_decode_record(bucket="d-b8-kv8k-p16", cubin=b"one unit", kernel_name="k_paged")
    dense = make_decode_record(layout="dense", bucket="d-b8-kv2k", cubin=b"one unit", kernel_name="k_dense")
    for r in (paged, dense):
        r.kernel_meta.update(name=r.kernel_name)
        r.kernel_meta["spec"] = {"causal": True, "d_qk": 128, "d_v": 128, "dtype": "bf16", "layout": r.layout}
    attn = _load(make_export(tmp_path / "shared", [paged, dense]))
    q, kc, vc, lens, table = decode_case([30, 50], seed=4)
    attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True)
    assert attn.last_path == "kernel"
    q, kc, vc, lens, _ = decode_case([30, 50], dense=True, seed=5)
    out = attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True)
    assert attn.last_path == "kernel" and attn.last_bucket == "d-b8-kv2k", attn.last_reason
    close(out, naive(q, kc, vc, lens, None, True)[0])
    names = sorted(k.meta["name"] for k in attn._kernels.values())
    assert names == ["k_dense", "k_paged"]


def test_v_cache_none_means_absorbed_mla_values_and_nothing_else(decoded):
    from tuner.serving.decode import absorbed_mla_values

    q, kc = torch.zeros(2, 1, 16, 576), torch.zeros(10, 64, 1, 576)
    v = absorbed_mla_values(q, kc)
    assert v.shape == (10, 64, 1, 512) and v.data_ptr() == kc.data_ptr() and v.stride() == kc.stride()
    q, kc, vc, lens, table = decode_case([30, 50], seed=6)
    with pytest.raises(ValueError, match="v_cache is required"):
        decoded.flash_attn_with_kvcache(q, kc, None, cache_seqlens=lens, block_table=table, causal=True)
