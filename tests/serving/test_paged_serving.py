"""A paged KV cache through flash_attn_varlen_func (block_table= / page_table=) on the CPU: the paged config's
stand-in kernel and the SDPA fallback against the per-sequence reference, the op's schema, fake and autograd,
torch.compile, and the refusals."""
import math

import pytest
import torch
from conftest import H100, StandInKernel, make_export
from store_fakes import make_record
from test_varlen_serving import per_sequence_reference

from tuner.serving import DeviceFacts, load_exported, op
from tuner.serving.paged_sdpa import gather_pages, paged_sdpa


@pytest.fixture
def paged(tmp_path):
    """Paged gqa kernels (block N 64) of serving buckets, causal only; varlen ones beside them."""
    records = [make_record(variant="gqa", bucket=b, layout="paged", cubin=f"p-{b}".encode())
               for b in ("t4k-even-p16", "t4k-short-p16", "t16k-short-p64")]
    records.append(make_record(variant="gqa", bucket="t4k-short", layout="varlen", cubin=b"v"))
    for r in records:
        r.kernel_meta["spec"] = {"causal": r.causal, "d_qk": r.d_qk, "d_v": r.d_v, "dtype": r.dtype, "layout": r.layout}
    make_export(tmp_path / "paged", records)
    return load_exported(tmp_path / "paged", devices={("cpu", None): DeviceFacts(H100, (9, 0))},
                         kernel_loader=lambda cubin, meta, index: StandInKernel(meta))


def paged_case(lens_q, lens_k, page, hq=8, hkv=2, d=128, dtype=torch.bfloat16, seed=0, spare=3, grad=False):
    """Packed q, the keys and values packed (for the reference) and spread over the pages of a shuffled cache
    (spare pages and the last page's tail NaN; table rows padded with -1), the offsets and the table."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), hq, d, generator=g).to(dtype)
    k = torch.randn(sum(lens_k), hkv, d, generator=g).to(dtype)
    v = torch.randn(sum(lens_k), hkv, d, generator=g).to(dtype)
    counts = [-(-n // page) for n in lens_k]
    order = torch.randperm(sum(counts) + spare, generator=g).tolist()
    kc = torch.full((len(order), page, hkv, d), float("nan"), dtype=dtype)
    vc = kc.clone()
    table = torch.full((len(lens_k), max(1, max(counts))), -1, dtype=torch.int32)
    cu_k = [0, *torch.tensor(lens_k).cumsum(0).tolist()]
    at = 0
    for b, n in enumerate(counts):
        for j in range(n):
            pid, at = order[at], at + 1
            table[b, j] = pid
            rows = slice(cu_k[b] + j * page, min(cu_k[b] + (j + 1) * page, cu_k[b + 1]))
            kc[pid, :rows.stop - rows.start], vc[pid, :rows.stop - rows.start] = k[rows], v[rows]
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    if grad:
        for t in (q, kc, vc):
            t.requires_grad_()
    return q, k, v, kc, vc, cu_q, torch.tensor(cu_k, dtype=torch.int32), table


@pytest.mark.parametrize("keyword", ["block_table", "page_table"])
def test_a_paged_call_runs_the_paged_kernel_and_matches_the_reference(paged, keyword):
    q, k, v, kc, vc, cu_q, cu_k, table = paged_case([1, 100, 37], [5, 700, 37], 16)
    out = paged.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 100, 700, causal=True, **{keyword: table})
    assert paged.last_path == "kernel" and paged.last_bucket == "t4k-even-p16", paged.last_reason
    want = per_sequence_reference(q, k, v, cu_q, cu_k, True)
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)


def test_seqused_k_the_fa4_spelling_and_no_max_seqlen_k(paged):
    """FA4's call: page_table, seqused_k, no cu_seqlens_k and no max_seqlen_k (the table's capacity routes)."""
    q, k, v, kc, vc, cu_q, cu_k, table = paged_case([40, 64], [100, 90], 64)
    used = torch.tensor([33, 0], dtype=torch.int32)
    out = paged.flash_attn_varlen_func(q, kc, vc, cu_q, None, 64, None, causal=True, softmax_scale=0.05,
                                       page_table=table, seqused_k=used)
    assert paged.last_path == "kernel" and paged.last_bucket == "t16k-short-p64"   # capacity 128 keys: short
    want = per_sequence_reference(q, k, v, cu_q, cu_k, True, used=used, scale=0.05)
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
    assert out[40:].abs().max() == 0


@pytest.mark.parametrize("page,causal,code", [(96, True, "page-size"), (16, False, "no-shape-config")])
def test_what_no_paged_kernel_serves_runs_sdpa_over_the_gathered_pages(paged, page, causal, code):
    q, k, v, kc, vc, cu_q, cu_k, table = paged_case([7, 300], [200, 300], page)
    out = paged.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 300, 300, causal=causal, block_table=table)
    assert paged.last_path == "sdpa" and paged.reasons == {code: 1}
    torch.testing.assert_close(out.double(), per_sequence_reference(q, k, v, cu_q, cu_k, causal), atol=2e-2, rtol=2e-2)


def test_an_export_without_paged_configs_counts_its_reason(served):
    q, k, v, kc, vc, cu_q, cu_k, table = paged_case([50], [80], 32)
    out = served.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 50, 80, causal=True, block_table=table)
    assert served.last_path == "sdpa" and served.reasons == {"no-paged-config": 1}
    torch.testing.assert_close(out.double(), per_sequence_reference(q, k, v, cu_q, cu_k, True), atol=2e-2, rtol=2e-2)


def test_gather_reads_the_pages_in_table_order_on_the_device():
    q, k, v, kc, vc, cu_q, cu_k, table = paged_case([3, 4], [20, 33], 16)
    gk, gv, cu = gather_pages(kc, vc, table)
    assert cu.tolist() == [0, 48, 96] and gk.shape == (96, 2, 128)
    assert torch.equal(gk[:20], k[:20]) and torch.equal(gv[48:81], v[20:53])


def test_paged_opcheck_and_gradients(paged):
    q, k, v, kc, vc, cu_q, cu_k, table = paged_case([17, 0, 40], [30, 3, 40], 16, grad=True)
    used = (cu_k[1:] - cu_k[:-1]).to(torch.int32)
    scale = 1 / math.sqrt(128)
    route = paged.route_paged(q, kc, vc, True, scale, cu_q, 40, 40)
    assert op._ROUTES[route].config is not None
    finite = [t.detach().nan_to_num(0.0).requires_grad_() for t in (q, kc, vc)]   # opcheck compares NaN
    torch.library.opcheck(torch.ops.attn_tuner.paged_attention.default,
                          (*finite, cu_q, used, table, 40, 40, True, scale, route),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))
    out = paged.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 40, 40, causal=True, block_table=table)
    grad = torch.randn_like(out)
    dq, dkc, dvc = torch.autograd.grad(out, (q, kc, vc), grad)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(per_sequence_reference(*leaves, cu_q, cu_k, True), leaves, grad.double())
    # the cache gradients, read back through the table, are the packed keys' gradients; other rows get 0
    gk, gv, cu = gather_pages(dkc, dvc, table)
    got_k = torch.cat([gk[int(cu[b]):int(cu[b]) + int(used[b])] for b in range(3)])
    got_v = torch.cat([gv[int(cu[b]):int(cu[b]) + int(used[b])] for b in range(3)])
    for g, w in zip((dq, got_k, got_v), want):
        assert ((g.double() - w).norm() / w.norm()).item() < 2e-2
    rest = [dkc.clone(), dvc.clone()]
    for b in range(3):
        for j in range(int(used[b])):
            for t in rest:
                t[int(table[b, j // 16]), j % 16] = 0
    assert all(t.abs().max() == 0 for t in rest)         # no gradient lands on a row no sequence uses


def test_paged_under_torch_compile_fullgraph(paged):
    def f(q, kc, vc, cu_q, cu_k, table):
        return paged.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 100, 700, causal=True, block_table=table).float()

    q, k, v, kc, vc, cu_q, cu_k, table = paged_case([1, 100, 37], [5, 700, 37], 16)
    assert torch._dynamo.explain(f)(q, kc, vc, cu_q, cu_k, table).graph_break_count == 0
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, kc, vc, cu_q, cu_k, table), f(q, kc, vc, cu_q, cu_k, table))
    assert paged.last_path == "kernel" and paged.last_bucket == "t4k-even-p16"


@pytest.mark.parametrize("change,fragment", [
    ("3d", "k and v must be paged caches"),
    ("page-mismatch", "differ in pages, page size or heads"),
    ("table-int64", "2-D int32 tensor"),
    ("table-rows", "the page table has 2 rows for 3 sequences"),
    ("no-lengths", "give seqused_k or cu_seqlens_k"),
    ("two-tables", "block_table and page_table name the same thing"),
])
def test_bad_paged_inputs_are_refused_clearly(paged, change, fragment):
    q, k, v, kc, vc, cu_q, cu_k, table = paged_case([10, 20, 5], [30, 20, 5], 16)
    kwargs = {"block_table": table}
    if change == "3d":
        kc, vc = k, v
    elif change == "page-mismatch":
        vc = vc.reshape(vc.shape[0] * 2, 8, *vc.shape[2:])
    elif change == "table-int64":
        kwargs["block_table"] = table.long()
    elif change == "table-rows":
        kwargs["block_table"] = table[:2]
    elif change == "no-lengths":
        cu_k = None
    elif change == "two-tables":
        kwargs["page_table"] = table.clone()
    with pytest.raises(ValueError, match=fragment):
        paged.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 20, 30, causal=True, **kwargs)


def test_a_paged_cache_without_a_table_is_told_to_pass_one(paged):
    q, k, v, kc, vc, cu_q, cu_k, table = paged_case([10], [30], 16)
    with pytest.raises(ValueError, match="a paged cache needs block_table= or page_table="):
        paged.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 10, 30, causal=True)


def test_keys_past_the_pages_are_refused_by_the_fallback():
    q, k, v, kc, vc, cu_q, cu_k, table = paged_case([10], [30], 16)
    with pytest.raises(ValueError, match=r"seqused_k\[0\] = 40"):
        paged_sdpa(q, kc, vc, cu_q, torch.tensor([40], dtype=torch.int32), table, True)
