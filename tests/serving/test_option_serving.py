"""Sliding windows, soft-capping and sinks at the serving entry points: exported configs of kernels built with
options (their names, metadata and dispatch), the calls that reach them (flash_attn_func, __call__,
flash_attn_varlen_func, transformers' kwargs), the fp32 reference where no kernel is built for a call, the
refusals of bad values, autograd through the options op (the sinks' gradient too) and torch.compile."""
from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import StandInKernel, qkv, serve_records

from tuner.serving import ExportError, read_config


def _record(features=(), layout="dense", bucket="s1024", causal=True, cubin=None):
    from store_fakes import make_record

    r = make_record(variant="gqa", causal=causal, bucket=bucket, layout=layout,
                    cubin=cubin or f"{layout}-{causal}-{'+'.join(features)}".encode())
    r.kernel_meta["spec"] = {"causal": causal, "d_qk": 128, "d_v": 128, "dtype": "bf16", "layout": layout,
                             **{f: True for f in features}}
    return r


OPTION_RECORDS = [_record(), _record(("local",)), _record(("local", "sinks")), _record(("softcap",)),
                  _record(("local",), layout="varlen"), _record(("local", "sinks"), layout="paged", bucket="t4k-even-p16")]


def _serve(folder, records=OPTION_RECORDS):
    return serve_records(folder, records, lambda cubin, meta, device_index: StandInKernel(meta))


@pytest.fixture
def served_options(tmp_path):
    return _serve(tmp_path / "export")


def expected(q, k, v, causal, scale=None, window=(-1, -1), softcap=0.0, sinks=None):
    """The float64 attention of FlashAttention's options, one head at a time, written out from the definitions."""
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    left, right = window[0], (0 if causal else window[1])
    i = torch.arange(sq)[:, None] + (sk - sq)
    j = torch.arange(sk)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    out = torch.zeros(b, sq, hq, v.shape[3], dtype=torch.float64)
    for h in range(hq):
        kh = h // (hq // hkv)
        s = q[:, :, h].double() @ k[:, :, kh].double().transpose(1, 2) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        s = s.masked_fill(~keep, float("-inf"))
        m = s.amax(dim=-1, keepdim=True)
        if sinks is not None:
            m = torch.maximum(m, torch.full_like(m, float(sinks[h])))
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        e = torch.exp(s - m)
        denom = e.sum(dim=-1, keepdim=True)
        if sinks is not None:
            denom = denom + torch.exp(float(sinks[h]) - m)
        out[:, :, h] = torch.where(denom > 0, (e @ v[:, :, kh].double()) / denom.clamp_min(1e-300), 0.0)
    return out


def _close(out, ref, tol=2e-2):
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)


def test_configs_of_option_kernels_are_named_stated_and_kept_apart(tmp_path):
    served = _serve(tmp_path / "export")
    names = sorted(p.name for p in (tmp_path / "export").glob("variant=*.json"))
    assert len(names) == 6
    assert any(",features=local+sinks," in n for n in names) and any(",features=softcap," in n for n in names)
    assert sum(",features=" not in n for n in names) == 1
    by_features = {c.features: c for c in served.configs if c.layout == "dense"}
    assert set(by_features) == {(), ("local",), ("local", "sinks"), ("softcap",)}
    meta = json.loads(by_features[("local", "sinks")].path.read_text())["_metadata"]
    assert meta["features"] == ["local", "sinks"]
    assert "features" not in json.loads(by_features[()].path.read_text())["_metadata"]


def test_a_config_whose_kernels_disagree_with_its_features_is_refused(tmp_path):
    _serve(tmp_path / "export")
    path = next((tmp_path / "export").glob("variant=*features=local,*layout=*.json"), None) or \
        next(p for p in (tmp_path / "export").glob("variant=*.json") if ",features=local," in p.name)
    doc = json.loads(path.read_text())
    doc["_metadata"]["features"] = ["softcap"]
    path.write_text(json.dumps(doc))
    with pytest.raises(ExportError, match="built with \\(local\\) but the config states \\(softcap\\)"):
        read_config(path)
    doc["_metadata"]["features"] = ["sinks", "local"]
    path.write_text(json.dumps(doc))
    with pytest.raises(ExportError, match="in that order"):
        read_config(path)


def test_each_option_call_runs_the_kernel_built_with_exactly_its_options(served_options):
    q, k, v = qkv(hq=8, hkv=2, sq=40, sk=100)
    sinks = torch.tensor([-30.0, 30.0, 0.5, -1.0, 2.0, 0.0, 1.0, -2.0])
    _close(served_options(q, k, v, causal=True), expected(q, k, v, True))
    _close(served_options.flash_attn_func(q, k, v, causal=True, window_size=(16, 0)),
           expected(q, k, v, True, window=(16, 0)))
    _close(served_options.flash_attn_func(q, k, v, causal=True, window_size=(16, 7), learnable_sink=sinks),
           expected(q, k, v, True, window=(16, 0), sinks=sinks))
    _close(served_options.flash_attn_func(q, k, v, causal=True, softcap=1.0), expected(q, k, v, True, softcap=1.0))
    assert served_options.stats == {"kernel": 4} and not served_options.reasons
    seen = sorted((tuple(s.meta["spec"].get(f, False) for f in ("local", "softcap", "sinks")), s.seen)
                  for s in served_options.stand_ins)
    assert seen == [((False, False, False), [((-1, -1), 0.0, False)]),
                    ((False, True, False), [((-1, -1), 1.0, False)]),
                    ((True, False, False), [((16, 0), 0.0, False)]),
                    ((True, False, True), [((16, 0), 0.0, True)])]


def test_options_no_kernel_is_built_for_run_the_reference_and_say_why(served_options):
    q, k, v = qkv(hq=8, hkv=2, sq=33, sk=33)
    sinks = torch.randn(8)
    # softcap with a window: no config has both; sinks alone: none either; non-causal windows: none
    _close(served_options.flash_attn_func(q, k, v, causal=True, window_size=(8, 0), softcap=50.0),
           expected(q, k, v, True, window=(8, 0), softcap=50.0))
    assert "no exported kernel built with local+softcap" in served_options.last_reason
    _close(served_options(q, k, v, causal=True, learnable_sink=sinks), expected(q, k, v, True, sinks=sinks))
    _close(served_options(q, k, v, causal=False, window_size=(4, 4)), expected(q, k, v, False, window=(4, 4)))
    assert served_options.reasons == {"no-option-config": 2, "no-shape-config": 1}
    assert served_options.stats == {"sdpa": 3}


@pytest.mark.parametrize("window", [(0, 0), (1, 0), (63, 0), (64, 0), (65, 0), (500, 0)])
def test_windows_at_the_edges_match_the_definition(served_options, window):
    q, k, v = qkv(hq=4, hkv=2, sq=70, sk=90, seed=window[0])
    _close(served_options(q, k, v, causal=True, window_size=window), expected(q, k, v, True, window=window))
    assert served_options.last_path == "kernel"


def test_a_one_row_call_takes_the_causal_kernel_of_its_window(served_options):
    q, k, v = qkv(hq=8, hkv=2, sq=1, sk=80)
    out = served_options(q, k, v, causal=False, window_size=(10, -1))
    _close(out, expected(q, k, v, False, window=(10, -1)))
    assert served_options.last_path == "kernel"
    local = [s for s in served_options.stand_ins if s.meta["spec"].get("local")]
    assert local and local[0].seen == [((10, 0), 0.0, False)]


@pytest.mark.parametrize("kwargs, message", [
    ({"window_size": (1, 2, 3)}, "window_size must be a \\(left, right\\) pair"),
    ({"window_size": (-2, 0)}, "window_size must be a \\(left, right\\) pair"),
    ({"window_size": "wide"}, "window_size"),
    ({"softcap": -1.0}, "softcap must be a finite number >= 0"),
    ({"softcap": float("nan")}, "softcap must be a finite number >= 0"),
    ({"learnable_sink": torch.zeros(3)}, "learnable_sink must be a float tensor of 8 logits"),
    ({"learnable_sink": torch.zeros(8, dtype=torch.int32)}, "learnable_sink must be a float tensor"),
    ({"learnable_sink": torch.zeros(8, device="meta")}, "learnable_sink is on meta"),
])
def test_bad_option_values_are_refused_naming_the_argument(served_options, kwargs, message):
    q, k, v = qkv(hq=8, hkv=2, sq=16)
    with pytest.raises(ValueError, match=message):
        served_options.flash_attn_func(q, k, v, causal=True, **kwargs)
    assert not served_options.stats


def test_gradients_through_the_options_op_include_the_sinks(served_options):
    q, k, v = qkv(hq=8, hkv=2, sq=24, sk=24, dtype=torch.float64, grad=True)
    sinks = torch.randn(8, dtype=torch.float64, requires_grad=True)
    out = served_options(q, k, v, causal=True, window_size=(6, 0), learnable_sink=sinks)
    grad = torch.randn_like(out)
    out.backward(grad)
    got = [t.grad.clone() for t in (q, k, v, sinks)]
    for t in (q, k, v, sinks):
        t.grad = None

    def autograd_reference(q, k, v, sinks):
        b, sq, hq, d = q.shape
        kk, vv = (t.repeat_interleave(hq // t.shape[2], dim=2) for t in (k, v))
        s = torch.einsum("bqhd,bkhd->bhqk", q, kk) / math.sqrt(d)
        i, j = torch.arange(sq)[:, None], torch.arange(sq)[None, :]
        s = s.masked_fill(~((j <= i) & (j >= i - 6)), float("-inf"))
        s = torch.cat([s, sinks.view(1, hq, 1, 1).expand(b, hq, sq, 1)], dim=-1)
        p = torch.softmax(s, dim=-1)[..., :sq]
        return torch.einsum("bhqk,bkhd->bqhd", p, vv)

    autograd_reference(q, k, v, sinks).backward(grad)
    for g, t in zip(got, (q, k, v, sinks)):
        torch.testing.assert_close(g, t.grad, atol=1e-6, rtol=1e-5)   # the sinks enter in fp32, as kernels take them


def test_varlen_windows_run_the_varlen_kernel(served_options):
    lengths = [30, 1, 50]
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(sum(lengths), h, 128, generator=g).to(torch.bfloat16) for h in (8, 2, 2))
    cu = torch.tensor([0, 30, 31, 81], dtype=torch.int32)
    out = served_options.flash_attn_varlen_func(q, k, v, cu, cu, 50, 50, causal=True, window_size=(9, 0))
    assert served_options.last_path == "kernel" and served_options.last_reason == "gqa varlen"
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        _close(out[a:b][None], expected(q[a:b][None], k[a:b][None], v[a:b][None], True, window=(9, 0)))
    out = served_options.flash_attn_varlen_func(q, k, v, cu, cu, 50, 50, causal=True, softcap=5.0)
    assert served_options.reasons == {"no-shape-config": 1}
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        _close(out[a:b][None], expected(q[a:b][None], k[a:b][None], v[a:b][None], True, softcap=5.0))



def test_option_calls_trace_without_graph_breaks(served_options):
    sinks = torch.randn(8)

    def f(q, k, v):
        return served_options.flash_attn_func(q, k, v, causal=True, window_size=(12, 0), learnable_sink=sinks) * 2

    q, k, v = qkv(hq=8, hkv=2, sq=48)
    assert torch._dynamo.explain(f)(q, k, v).graph_break_count == 0
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), f(q, k, v))
    assert served_options.last_path == "kernel" and not served_options.reasons


def test_a_paged_cache_with_a_window_and_sinks_runs_the_paged_kernel_and_differentiates(served_options):
    """Pages of 16 in a shuffled table: the paged kernel built with local+sinks, its output against each sequence
    computed alone; without such a kernel (a cap) the reference over the gathered pages; gradients reach q, the
    caches and the sinks."""
    g = torch.Generator().manual_seed(9)
    lengths, page = [40, 7], 16
    q = torch.randn(sum(lengths), 8, 128, generator=g, dtype=torch.float64).to(torch.bfloat16)
    k_cache, v_cache = (torch.randn(8, page, 2, 128, generator=g).to(torch.bfloat16) for _ in range(2))
    table = torch.tensor([[5, 2, 7], [0, 3, 1]], dtype=torch.int32)
    cu_q = torch.tensor([0, 40, 47], dtype=torch.int32)
    used = torch.tensor(lengths, dtype=torch.int32)
    sinks = torch.linspace(-3, 3, 8)
    out = served_options.flash_attn_varlen_func(q, k_cache, v_cache, cu_q, None, 40, 48, causal=True,
                                                window_size=(9, 0), learnable_sink=sinks, block_table=table,
                                                seqused_k=used)
    assert served_options.last_path == "kernel" and served_options.last_reason == "gqa paged"
    for b, (start, n) in enumerate(((0, 40), (40, 7))):
        rows = table[b].long()[:, None] * page + torch.arange(page)
        keys = rows.reshape(-1)[:n]
        k, v = (c.reshape(-1, 2, 128)[keys][None] for c in (k_cache, v_cache))
        _close(out[start:start + n][None], expected(q[start:start + n][None], k, v, True, window=(9, 0), sinks=sinks))
    out = served_options.flash_attn_varlen_func(q, k_cache, v_cache, cu_q, None, 40, 48, causal=True, softcap=5.0,
                                                block_table=table, seqused_k=used)
    assert served_options.last_path == "sdpa"
    leaves = [t.detach().double().requires_grad_() for t in (q, k_cache, v_cache)]
    sink_leaf = sinks.clone().double().requires_grad_()
    served_options.flash_attn_varlen_func(*leaves, cu_q, None, 40, 48, causal=True, window_size=(9, 0),
                                          learnable_sink=sink_leaf, block_table=table, seqused_k=used).sum().backward()
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in (*leaves, sink_leaf))
    assert not leaves[1].grad[4].any()      # a page no sequence uses
