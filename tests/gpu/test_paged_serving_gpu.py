"""Paged and varlen prefill through an export on a Hopper GPU (marker gpu; skipped elsewhere): the default
varlen and paged kernels (tuner.defaults.export.SERVING_SPECS, stored under serving buckets) served by
flash_attn_varlen_func with block_table= / page_table=, against the fp32 reference; under
torch.compile(fullgraph=True); CUDA-graph capture and replay with new inputs; a page size no kernel tiles
falls back to SDPA over the gathered pages; autograd through the pages."""
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs a Hopper (sm_90) GPU")]

from test_decode_serving_gpu import capture  # noqa: E402
from test_serving_gpu import ATOL  # noqa: E402

from tuner.serving import load_exported  # noqa: E402
from tuner.serving.sdpa import varlen_sdpa  # noqa: E402

HQ, HKV, D = 16, 2, 128


@pytest.fixture(scope="module")
def attn(tmp_path_factory):
    from tuner.defaults.export import SERVING_SPECS, export_defaults

    gpu = "h200" if "h200" in torch.cuda.get_device_name().lower() else "h100"
    out = tmp_path_factory.mktemp("serving-export")
    cache = os.environ.get("KERNEL_CACHE_DIR")
    export_defaults(gpu, SERVING_SPECS, out, cache_dir=Path(cache) if cache else None, page_sizes=(16, 64, 128),
                    study_dir=out.parent / "serving-studies")
    served = load_exported(out)
    assert {c.layout: c.bucket_rule for c in served.configs} == {"varlen": "serving", "paged": "serving"}
    return served


def paged_case(lens_q, lens_k, page, seed=0, spare=5):
    """Packed q and keys/values (for the reference), the keys spread over the pages of a shuffled cache beside
    NaN spare pages (never to be read), cu_seqlens and the table (int32, rows padded with page 0)."""
    g = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)

    q, k, v = randn(sum(lens_q), HQ, D), randn(sum(lens_k), HKV, D), randn(sum(lens_k), HKV, D)
    counts = [-(-n // page) for n in lens_k]
    order = torch.randperm(sum(counts) + spare, generator=torch.Generator().manual_seed(seed)).tolist()
    kc = torch.full((len(order), page, HKV, D), float("nan"), device="cuda", dtype=torch.bfloat16)
    vc = kc.clone()
    table = torch.zeros(len(lens_k), max(counts), dtype=torch.int32)
    cu_k = [0, *torch.tensor(lens_k).cumsum(0).tolist()]
    at = 0
    for b, n in enumerate(counts):
        for j in range(n):
            pid, at = order[at], at + 1
            table[b, j] = pid
            lo, hi = cu_k[b] + j * page, min(cu_k[b] + (j + 1) * page, cu_k[b + 1])
            kc[pid, :hi - lo], vc[pid, :hi - lo] = k[lo:hi], v[lo:hi]
            kc[pid, hi - lo:], vc[pid, hi - lo:] = 0, 0     # the last page's tail: finite, past seqused_k
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    return q, k, v, kc, vc, cu_q, torch.tensor(cu_k, dtype=torch.int32, device="cuda"), table.cuda()


def _check(out, q, k, v, cu_q, cu_k, causal=True, scale=None):
    ref = varlen_sdpa(q.float(), k.float(), v.float(), cu_q, cu_k, None, causal, scale)
    lowp = varlen_sdpa(q, k, v, cu_q, cu_k, None, causal, scale).float()
    err = (out.float() - ref).abs().max().item()
    assert torch.isfinite(out).all()
    assert err <= 2 * (lowp - ref).abs().max().item() + ATOL, err


ISSUE_PAGED = ([2048, 2048], [8192, 8192])        # 2 x (2k on 6k): t4k-even-p<page>


@pytest.mark.parametrize("page", [16, 64, 128])
@pytest.mark.parametrize("keyword", ["block_table", "page_table"])
def test_a_paged_call_through_the_export(attn, page, keyword):
    lens_q, lens_k = ISSUE_PAGED
    q, k, v, kc, vc, cu_q, cu_k, table = paged_case(lens_q, lens_k, page, seed=page)
    out = attn.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                      **{keyword: table})
    assert attn.last_path == "kernel", attn.last_reason
    assert attn.last_bucket == f"t4k-even-p{page}"
    _check(out, q, k, v, cu_q, cu_k)


def test_pages_of_whole_tiles_are_served_by_the_tma_kernel(attn):
    """The export per page size (translate.defaults.WHOLE_TILE_PAGES): the p128 buckets hold the TMA producer with
    pv_wait "half", the p16 and p64 ones the cp.async kernel."""
    (paged,) = [c for c in attn.configs if c.layout == "paged"]
    for bucket, entry in paged.kernels.items():
        tma = entry.params["g2s_atom"] == "SM90_TMA"
        assert tma == bucket.endswith("-p128"), (bucket, entry.kernel_name)
        assert entry.params["pv_wait"] == ("half" if tma else "after")


def test_mixed_lengths_and_seqused_k(attn):
    lens_q, lens_k = [1, 300, 17, 0, 129], [700, 300, 2000, 64, 129]
    q, k, v, kc, vc, cu_q, cu_k, table = paged_case(lens_q, lens_k, 16, seed=3)
    used = (cu_k[1:] - cu_k[:-1]).to(torch.int32)
    out = attn.flash_attn_varlen_func(q, kc, vc, cu_q, None, max(lens_q), None, causal=True, page_table=table,
                                      seqused_k=used, softmax_scale=0.07)
    assert attn.last_path == "kernel", attn.last_reason
    _check(out, q, k, v, cu_q, cu_k, scale=0.07)


def test_varlen_calls_route_by_the_serving_rule(attn):
    lens = [8192] + [256] * 32                          # the issue's skewed mix
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(sum(lens), HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(sum(lens), HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(sum(lens), HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    out = attn.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    assert attn.last_path == "kernel" and attn.last_bucket == "t16k-skewed", attn.last_reason
    _check(out, q, k, v, cu, cu)


def test_paged_under_torch_compile_fullgraph(attn):
    def f(q, kc, vc, cu_q, cu_k, table):
        return attn.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 2048, 8192, causal=True,
                                           block_table=table).float() * 0.5

    q, k, v, kc, vc, cu_q, cu_k, table = paged_case(*ISSUE_PAGED, 16, seed=5)
    assert torch._dynamo.explain(f)(q, kc, vc, cu_q, cu_k, table).graph_break_count == 0
    compiled = torch.compile(f, fullgraph=True)
    before = attn.stats["kernel"]
    out = compiled(q, kc, vc, cu_q, cu_k, table)
    assert attn.stats["kernel"] == before + 1 and attn.last_path == "kernel"
    _check(out * 2, q, k, v, cu_q, cu_k)
    dyn = torch.compile(f, fullgraph=True, dynamic=True)
    for lens_q, lens_k in (([2048, 1000], [8192, 3000]), ([2048, 2048, 5], [4000, 8192, 5])):
        q, k, v, kc, vc, cu_q, cu_k, table = paged_case(lens_q, lens_k, 16, seed=len(lens_q))
        _check(dyn(q, kc, vc, cu_q, cu_k, table) * 2, q, k, v, cu_q, cu_k)
        assert attn.last_path == "kernel"


def test_paged_cuda_graph_capture_and_replay_with_new_inputs(attn):
    """The route is settled on the host, the used keys derived from cu_seqlens_k on the device: the capture
    holds the kernel; replays read new queries, caches, tables and lengths."""
    lens_q, lens_k = [1000, 1000], [5000, 5000]
    static = list(paged_case(lens_q, lens_k, 16, seed=7))
    q, _, _, kc, vc, cu_q, cu_k, table = static

    def call():
        return attn.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 1000, 5000, causal=True, block_table=table)

    graph, out = capture(call)
    assert attn.last_path == "kernel"
    for seed, new_k in ((8, [5000, 5000]), (9, [4321, 1500])):    # new contents, then new key lengths
        fresh = paged_case(lens_q, new_k, 16, seed=seed)
        for name, dst, src in zip(("q", "k", "v", "kc", "vc", "cu_q", "cu_k", "table"), static, fresh):
            if name in ("k", "v"):
                continue
            if name == "table":
                dst.zero_()
                dst[:, :src.shape[1]] = src
            elif name in ("kc", "vc"):
                dst.fill_(float("nan"))
                dst[:src.shape[0]] = src
            else:
                dst.copy_(src)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(out, fresh[0], fresh[1], fresh[2], fresh[5], fresh[6])


def test_a_page_size_no_kernel_tiles_runs_sdpa_over_the_pages(attn):
    q, k, v, kc, vc, cu_q, cu_k, table = paged_case([300, 40], [900, 40], 48, seed=11)   # 48: not a tile of 128
    before = attn.reasons["page-size"]
    out = attn.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 300, 900, causal=True, block_table=table)
    assert attn.last_path == "sdpa" and attn.reasons["page-size"] == before + 1
    _check(out, q, k, v, cu_q, cu_k)


def test_paged_autograd_against_the_fp32_reference(attn):
    lens_q, lens_k = [200, 77], [600, 77]
    q, k, v, kc, vc, cu_q, cu_k, table = paged_case(lens_q, lens_k, 16, seed=13)
    for t in (q, kc, vc):
        t.requires_grad_()
    out = attn.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 200, 600, causal=True, block_table=table)
    assert attn.last_path == "kernel" and out.grad_fn is not None
    grad = torch.randn_like(out)
    dq, dkc, dvc = torch.autograd.grad(out, (q, kc, vc), grad)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(varlen_sdpa(*leaves, cu_q, cu_k, None, True, None), leaves, grad.float())
    from tuner.serving.paged_sdpa import gather_pages

    gk, gv, span = gather_pages(dkc, dvc, table)
    offs = span.tolist()
    got_k = torch.cat([gk[offs[b]:offs[b] + n] for b, n in enumerate(lens_k)])
    got_v = torch.cat([gv[offs[b]:offs[b] + n] for b, n in enumerate(lens_k)])
    for g, w in zip((dq, got_k, got_v), want):
        assert ((g.float() - w).norm() / w.norm()).item() < 1e-2
