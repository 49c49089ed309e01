"""The serving bucket rule at call time (tuner/serving/rule.py) against tuner/measure/mixes.py's, and varlen calls
routed by it through an export (CPU stand-in kernels)."""
import itertools
import random

import pytest
import torch
from conftest import H100, StandInKernel, make_export
from store_fakes import make_record

from tuner.measure.mixes import load_mixes
from tuner.serving.buckets.serving import TOKEN_EDGES, nearest_serving_bucket, serving_bucket
from tuner.serving import DeviceFacts, load_exported, op
from tuner.serving.rule import ServingTable, call_class

VARLEN_BUCKETS = ("t4k-short", "t16k-even", "t16k-skewed", "t16k-short")
PAGED_BUCKETS = ("t4k-even-p16", "t16k-even-p16", "t16k-short-p64")


def _name(total_q, batch, max_q, max_k):
    edge, mix = call_class(total_q, batch, max_q, max_k)
    return f"t{edge // 1024}k-{mix}"


def test_call_class_is_the_rule_of_mixes():
    values = [0, 1, 511, 512, 513, 2047, 4096, 4097, 16384, 16385, 65536, 70000]
    for total_q, batch, max_q, max_k in itertools.product(values, [0, 1, 2, 8, 33], values, values):
        assert _name(total_q, batch, max_q, max_k) == serving_bucket(total_q, batch, max_q, max_k), \
            (total_q, batch, max_q, max_k)


def test_the_table_prefers_what_nearest_serving_bucket_prefers():
    rng = random.Random(0)
    universe = [f"t{t}k-{m}{p}" for t in (4, 16, 64) for m in ("short", "even", "skewed")
                for p in ("", "-p16", "-p64", "-p256")]
    for _ in range(200):
        names = rng.sample(universe, rng.randint(1, 6))
        paged = [n for n in names if "-p" in n]
        names = paged or names          # a config is all paged or all varlen
        table = ServingTable.build({n: None for n in names})
        for edge, mix, page in itertools.product(TOKEN_EDGES, ("short", "even", "skewed"),
                                                 (16, 32, 64, 256) if paged else (None,)):
            call = f"t{edge // 1024}k-{mix}" + (f"-p{page}" if page else "")
            # ties between mix classes at one edge go to the first given: the table gives them sorted
            want = nearest_serving_bucket(call, sorted(names))
            # lengths that fall into (edge, mix): tokens at the edge; short/even/skewed by keys and queries
            max_k = 100 if mix == "short" else 4096
            batch, max_q = (8, edge) if mix == "skewed" else (8, max(1, edge // 8))
            assert table.bucket(edge, batch, max_q, max_k, page) == want, (names, call)


def _served(folder, records):
    for r in records:
        r.kernel_meta["spec"] = {"causal": r.causal, "d_qk": r.d_qk, "d_v": r.d_v, "dtype": r.dtype, "layout": r.layout}
    make_export(folder, records)
    return load_exported(folder, devices={("cpu", None): DeviceFacts(H100, (9, 0))},
                         kernel_loader=lambda cubin, meta, index: StandInKernel(meta))


@pytest.fixture
def serving(tmp_path):
    """An export whose varlen and paged configs are bucketed by the serving rule (block N 64)."""
    records = [make_record(variant="gqa", bucket=b, layout="varlen", cubin=f"v-{b}".encode()) for b in VARLEN_BUCKETS]
    records += [make_record(variant="gqa", bucket=b, layout="paged", cubin=f"p-{b}".encode()) for b in PAGED_BUCKETS]
    return _served(tmp_path / "serving", records)


def _varlen_route(attn, seqlens_q, seqlens_k, hq=8, hkv=2, d=128):
    q = torch.empty(sum(seqlens_q), hq, d, dtype=torch.bfloat16)
    k = torch.empty(sum(seqlens_k), hkv, d, dtype=torch.bfloat16)
    cu = torch.zeros(len(seqlens_q) + 1, dtype=torch.int32)
    return op._ROUTES[attn.route_varlen(q, k, k, True, d ** -0.5, max(seqlens_k), cu, max(seqlens_q))]


def _paged_route(attn, seqlens_q, seqlens_k, page, hq=8, hkv=2, d=128, max_seqlen_k="max"):
    q = torch.empty(sum(seqlens_q), hq, d, dtype=torch.bfloat16)
    cache = torch.empty(4, page, hkv, d, dtype=torch.bfloat16)
    cu = torch.zeros(len(seqlens_q) + 1, dtype=torch.int32)
    max_k = max(seqlens_k) if max_seqlen_k == "max" else max_seqlen_k
    return op._ROUTES[attn.route_paged(q, cache, cache, True, d ** -0.5, cu, max(seqlens_q), max_k)]


@pytest.mark.parametrize("mix,layout,bucket", [("8x2k", "varlen", "t16k-even"),
                                               ("1x8k+32x256", "varlen", "t16k-skewed"),
                                               ("64 random 1-512", "varlen", "t16k-short"),
                                               ("2x(2k on 6k)", "paged", "t4k-even-p16")])
def test_the_issue_mixes_route_to_their_buckets(serving, mix, layout, bucket):
    lengths = load_mixes()[mix]
    q, k = lengths["seqlens_q"], lengths["seqlens_k"]
    assert serving_bucket(sum(q), len(q), max(q), max(k), 16 if layout == "paged" else None) == bucket
    route = _paged_route(serving, q, k, 16) if layout == "paged" else _varlen_route(serving, q, k)
    assert (route.config.layout, route.bucket) == (layout, bucket)


def test_a_call_without_its_bucket_takes_the_nearest(serving):
    # 64k tokens, even: no t64k bucket; the same mix class first, then the nearest token edge
    assert _varlen_route(serving, [8192] * 8, [8192] * 8).bucket == "t16k-even"
    # t4k-even: no even bucket at 4k; t16k-even (same class) before t4k-short (same edge)
    assert _varlen_route(serving, [1000] * 3, [1000] * 3).bucket == "t16k-even"
    # paged with a page size no bucket names but the kernels tile (128 = 2 x block N 64)
    assert _paged_route(serving, [1000] * 3, [3000] * 3, 128).bucket in ("t4k-even-p16", "t16k-even-p16")
    assert _paged_route(serving, [100], [300], 64).bucket == "t16k-short-p64"     # same class and page


def test_a_page_size_no_kernel_tiles_is_routed_to_sdpa(serving):
    route = _paged_route(serving, [100], [3000], 96)        # neither divides nor is a multiple of 64
    assert route.config is None and route.code == "page-size"


def test_key_length_varlen_configs_keep_routing_by_max_seqlen_k(served):
    (config,) = [c for c in served.configs if c.layout == "varlen"]
    assert config.bucket_rule == "seqlen" and config.serving is None
    assert _varlen_route(served, [100] * 40, [100] * 40).bucket == "s1024"        # 4000 tokens change nothing
    assert _varlen_route(served, [10], [7000]).bucket == "s8192"


@pytest.mark.slow   # torch.compile: seconds of Inductor
def test_serving_buckets_under_torch_compile(serving):
    """Plain ints: the bucket is settled while tracing, no graph break; dynamic=True makes the lengths SymInts
    and the bucket is chosen per call from the concrete values."""
    def f(q, k, v, cu_q, cu_k, max_q, max_k):
        return serving.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True).float() * 2

    def inputs(lens):
        g = torch.Generator().manual_seed(len(lens))
        q = torch.randn(sum(lens), 8, 128, generator=g).to(torch.bfloat16)
        k = torch.randn(sum(lens), 2, 128, generator=g).to(torch.bfloat16)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
        return q, k, k.clone(), cu, cu, max(lens), max(lens)

    args = inputs([100, 300, 1])
    assert torch._dynamo.explain(f)(*args).graph_break_count == 0
    torch.testing.assert_close(torch.compile(f, fullgraph=True, backend="aot_eager")(*args), f(*args))
    assert serving.last_bucket == "t4k-short"      # 401 tokens, no sequence over 512 keys
    dyn = torch.compile(f, fullgraph=True, backend="aot_eager", dynamic=True)
    for lens, bucket in (([2000, 20, 20, 20, 20], "t16k-skewed"), ([700, 650, 680], "t16k-even"),
                         ([30, 40], "t4k-short")):
        args = inputs(lens)
        torch.testing.assert_close(dyn(*args), f(*args))
        assert serving.last_bucket == bucket, lens
