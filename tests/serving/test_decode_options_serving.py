"""Sliding windows, soft-capping and sinks in decode (``flash_attn_with_kvcache``) on the CPU: the fp32 reference
against a float64 loop (out and lse, windows aligned to each sequence's length, sinks in the lse), the refusals of
bad values before anything runs, routing to the decode config built with exactly the call's options (else the
reference, counted), the options op (schema, fake, autograd: the sinks' gradient too) and torch.compile."""
from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import serve_records
from store_fakes import make_decode_record
from test_decode_serving import decode_case

from tuner.serving import ExportError, op, read_config
from tuner.serving.decode_sdpa import decode_reference
from tuner.serving.options import ModelOptions

HQ, HKV, D = 16, 2, 64          # gpt-oss-shaped: 8 query heads per KV head at head dim 64


def naive(q, kc, vc, lens, table, causal, scale=None, window=(-1, -1), softcap=0.0, sinks=None):
    """(out, lse) in float64 from the definitions, sequence by sequence and head by head: query i of a sequence of
    n keys and sq new tokens sees key j when j <= i + n - sq (causal), i + n - sq - left <= j (a left window) and
    j <= i + n - sq + right (a right window, non-causal); the sink joins the max and the sum."""
    b, sq, hq, d = q.shape
    hkv, dv = kc.shape[2], vc.shape[3]
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = torch.zeros(b, sq, hq, dv, dtype=torch.float64)
    lse = torch.full((b, hq, sq), float("-inf"), dtype=torch.float64)
    for i in range(b):
        n = int(lens[i]) if lens is not None else kc.shape[1]
        if table is not None:
            pids = table[i, :-(-n // kc.shape[1])].long()
            k, v = kc[pids].reshape(-1, hkv, d)[:n], vc[pids].reshape(-1, hkv, dv)[:n]
        else:
            k, v = kc[i, :n], vc[i, :n]
        row = torch.arange(sq)[:, None] + n - sq
        col = torch.arange(n)[None, :]
        keep = torch.ones(sq, n, dtype=torch.bool)
        if causal:
            keep &= col <= row
        if window[0] >= 0:
            keep &= col >= row - window[0]
        if window[1] >= 0 and not causal:
            keep &= col <= row + window[1]
        for h in range(hq):
            kh = h // (hq // hkv)
            s = q[i, :, h].double() @ k[:, kh].double().T * scale
            if softcap:
                s = softcap * torch.tanh(s / softcap)
            s = s.masked_fill(~keep, float("-inf"))
            if sinks is not None:
                s = torch.cat([s, sinks[h].double().expand(sq, 1)], dim=1)
            lse[i, h] = torch.logsumexp(s, dim=-1)
            p = torch.softmax(s, dim=-1).nan_to_num(0.0)[:, :n]
            out[i, :, h] = p @ v[:, kh].double()
    return out, lse


def _sinks(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(HQ, generator=g) * 2
    s[0], s[1] = 30.0, -30.0           # a sink that swamps its rows, one that vanishes
    return s.to(dtype)


def _case(lens, sq=1, dense=False, seed=0, dtype=torch.bfloat16):
    return decode_case(lens, sq=sq, hq=HQ, hkv=HKV, d=D, dense=dense, seed=seed, dtype=dtype)


def _decode_record(features, layout="paged", causal=True, bucket=None):
    r = make_decode_record(layout=layout, causal=causal, d_qk=D, d_v=D,
                           cubin=f"{layout}-{causal}-{'+'.join(features)}".encode(),
                           **({"bucket": bucket} if bucket else {}))
    r.kernel_meta["spec"] = {"variant": "gqa", "d_qk": D, "d_v": D, "causal": causal, "dtype": "bf16",
                             "layout": layout, "phase": "decode", **{f: True for f in features}}
    return r


def _serve(folder, records):
    return serve_records(folder, records)


@pytest.fixture
def decoded(tmp_path):
    """Causal gqa d64 bf16 decode configs: plain (paged and dense), window + sinks (paged and dense), soft-cap
    (paged): gpt-oss's local layers and a cap."""
    return _serve(tmp_path / "export", [_decode_record(()), _decode_record((), "dense", bucket="d-b8-kv2k"),
                                        _decode_record(("local", "sinks")),
                                        _decode_record(("local", "sinks"), "dense", bucket="d-b8-kv2k"),
                                        _decode_record(("softcap",))])


def close(got, want, atol=2e-2):
    torch.testing.assert_close(got.double(), want, atol=atol, rtol=atol)


def close_lse(got, want):
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    fin = torch.isfinite(want)
    torch.testing.assert_close(got[fin].double(), want[fin], atol=1e-4, rtol=1e-4)


# ---- the reference -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("window,softcap,sinks,causal,sq", [
    ((0, 0), 0.0, False, True, 1), ((1, 0), 0.0, True, True, 4), ((63, 0), 50.0, True, True, 4),
    ((64, 0), 1.0, False, True, 1), ((65, 0), 0.0, True, True, 1), ((10_000, 0), 0.0, True, True, 4),
    ((-1, -1), 50.0, True, True, 4), ((-1, -1), 0.0, True, False, 3), ((3, 2), 0.0, False, False, 4),
    ((-1, 1), 1.0, True, False, 2)])
@pytest.mark.parametrize("dense", [False, True])
def test_the_reference_with_options_matches_the_loop(window, softcap, sinks, causal, sq, dense):
    """Lengths shorter than the new tokens (rows that see no key: 0 and -inf, or the sink's lse), at and past the
    window's edges, a window longer than every cache, in float32 so that the lse is compared closely."""
    q, kc, vc, lens, table = _case([1, 3, 64, 130], sq=sq, dense=dense, seed=sq, dtype=torch.float32)
    s = _sinks(sq) if sinks else None
    out, lse = decode_reference(q, kc, vc, lens, table, causal, 0.2,
                                ModelOptions((window[0], 0) if causal and window != (-1, -1) else window, softcap, s))
    want, want_lse = naive(q, kc.nan_to_num(0.0), vc.nan_to_num(0.0), lens, table, causal, 0.2, window, softcap, s)
    close(out, want, atol=1e-5)
    close_lse(lse, want_lse)
    if sinks:       # a row that sees no key (4 new tokens over 1 key) still has the sink: its lse is the sink's
        assert torch.isfinite(lse).all()


def test_the_prefill_reference_shares_the_decode_math():
    """One sequence whose cache is exactly its keys: the decode reference and the prefill one agree (both run
    tuner/serving/options.py's masking and softmax)."""
    from tuner.serving.options import reference_attention

    q, kc, vc, lens, _ = _case([77], sq=4, dense=True, seed=3, dtype=torch.float32)
    options = ModelOptions((20, 0), 30.0, _sinks(3))
    out, _ = decode_reference(q, kc, vc, lens, None, True, 0.125, options)
    torch.testing.assert_close(out, reference_attention(q, kc, vc, True, 0.125, options), atol=1e-6, rtol=1e-6)


# ---- refusals ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,fragment", [
    ({"window_size": (-2, 0)}, "window_size"), ({"window_size": (1, 2, 3)}, "window_size"),
    ({"window_size": (1.5, 0)}, "window_size"), ({"softcap": -1.0}, "softcap"), ({"softcap": math.nan}, "softcap"),
    ({"softcap": math.inf}, "softcap"), ({"learnable_sink": torch.zeros(HQ + 1)}, "learnable_sink"),
    ({"learnable_sink": torch.zeros(HQ, 1)}, "learnable_sink"),
    ({"learnable_sink": torch.zeros(HQ, dtype=torch.float16)}, "learnable_sink must be"),
    ({"learnable_sink": torch.zeros(HQ, dtype=torch.int32)}, "learnable_sink"),
    ({"learnable_sink": torch.zeros(HQ, device="meta")}, "learnable_sink is on meta"),
])
def test_bad_option_values_are_refused_by_name_before_anything_runs(decoded, kwargs, fragment):
    q, kc, vc, lens, table = _case([40, 9])
    k_new = torch.ones(2, 1, HKV, D, dtype=q.dtype)
    before = kc.clone()
    with pytest.raises(ValueError, match=fragment) as info:
        decoded.flash_attn_with_kvcache(q, kc, vc, k_new, k_new, cache_seqlens=lens, block_table=table, causal=True,
                                        **kwargs)
    assert "flash_attn_with_kvcache" in str(info.value) and "\n" not in str(info.value)
    assert decoded.stats == {} and torch.equal(kc.nan_to_num(7.0), before.nan_to_num(7.0))   # nothing appended


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sinks_in_fp32_or_the_queries_dtype_are_taken(decoded, dtype):
    q, kc, vc, lens, table = _case([40, 90])
    sinks = _sinks(1, dtype)
    out = decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True,
                                          window_size=(31, 0), learnable_sink=sinks)
    assert decoded.last_path == "kernel"
    close(out, naive(q, kc, vc, lens, table, True, window=(31, 0), sinks=sinks.float())[0])


# ---- routing -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dense", [False, True])
def test_a_window_and_sinks_run_the_config_built_with_them(decoded, dense):
    q, kc, vc, lens, table = _case([40, 300, 1], sq=4, dense=dense, seed=2)
    sinks = _sinks(2)
    out, lse = decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True,
                                               window_size=(127, 5), learnable_sink=sinks, return_softmax_lse=True)
    assert decoded.last_path == "kernel" and not decoded.reasons, decoded.last_reason
    ran = [k for k in decoded.stand_ins if k.seen]
    assert len(ran) == 1 and ran[0].meta["spec"].get("local") and ran[0].meta["spec"].get("sinks")
    assert ran[0].seen == [((127, 0), 0.0, True)]          # causal closed the window's right side
    want, want_lse = naive(q, kc, vc, lens, table, True, window=(127, 0), sinks=sinks)
    close(out, want)
    close_lse(lse, want_lse)


@pytest.mark.parametrize("kwargs,features", [
    ({"window_size": (127, 0)}, "local"), ({"learnable_sink": None, "softcap": 30.0, "window_size": (9, 0)},
                                           "local+softcap"), ({"learnable_sink": "sinks"}, "sinks")])
def test_options_no_config_is_built_with_run_the_reference_counted(decoded, kwargs, features):
    q, kc, vc, lens, table = _case([40, 90], sq=2, seed=5)
    kwargs = {k: (_sinks(5) if v == "sinks" else v) for k, v in kwargs.items()}
    out = decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True, **kwargs)
    assert decoded.last_path == "sdpa" and decoded.reasons == {"no-option-config": 1}, (features, decoded.reasons)
    assert not any(k.seen for k in decoded.stand_ins)
    window = kwargs.get("window_size", (-1, -1))
    close(out, naive(q, kc, vc, lens, table, True, window=window, softcap=kwargs.get("softcap", 0.0),
                     sinks=kwargs.get("learnable_sink"))[0])


def test_a_cap_runs_the_cap_config_and_plain_calls_the_plain_one(decoded):
    q, kc, vc, lens, table = _case([40, 90], seed=6)
    out = decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True, softcap=1.0)
    assert decoded.last_path == "kernel"
    close(out, naive(q, kc, vc, lens, table, True, softcap=1.0)[0])
    plain = decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True)
    assert decoded.last_path == "kernel" and not decoded.reasons
    assert [(k.meta["spec"].get("softcap", False), k.seen) for k in decoded.stand_ins if k.seen] == \
        [(True, [((-1, -1), 1.0, False)]), (False, [((-1, -1), 0.0, False)])]
    assert (plain.float() - out.float()).abs().max() > 0.05     # the cap of 1 matters: the two calls differ


def test_a_window_wider_than_every_cache_still_needs_the_window_kernel(decoded):
    """The route is by the options the call names, not by whether they bound anything at these lengths: the
    memo of a routed signature never hands one call's route to a call with other options."""
    q, kc, vc, lens, table = _case([40, 90], seed=7)
    sinks = _sinks(7)
    decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True,
                                    window_size=(100_000, 0), learnable_sink=sinks)
    assert decoded.last_path == "kernel"
    decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True,
                                    learnable_sink=sinks)
    assert decoded.last_path == "sdpa" and decoded.reasons == {"no-option-config": 1}


def test_one_token_takes_the_option_kernel_of_the_other_causality(decoded):
    q, kc, vc, lens, table = _case([40, 90], seed=8)
    sinks = _sinks(8)
    out = decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=False,
                                          window_size=(15, 3), learnable_sink=sinks)
    assert decoded.last_path == "kernel" and not decoded.reasons
    ran = next(k for k in decoded.stand_ins if k.seen)
    assert ran.meta["spec"]["causal"] and ran.seen == [((15, 0), 0.0, True)]
    close(out, naive(q, kc, vc, lens, table, False, window=(15, 3), sinks=sinks)[0])


def test_an_export_without_decode_option_configs_says_no_option_config(tmp_path):
    attn = _serve(tmp_path / "plain", [_decode_record(())])
    q, kc, vc, lens, table = _case([40])
    attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True, window_size=(8, 0))
    assert attn.reasons == {"no-option-config": 1}
    q, kc, vc, lens, table = decode_case([40], hq=8, hkv=2, d=128)       # a shape with no decode config at all
    attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True, window_size=(8, 0))
    assert attn.reasons == {"no-option-config": 1, "no-shape-config": 1}


def test_appended_rows_are_seen_through_the_window(decoded):
    """k=/v= append first; the window then ends at each sequence's grown length."""
    q, kc, vc, lens, table = _case([40, 90], seed=9)
    kc, vc = kc.nan_to_num(0.0), vc.nan_to_num(0.0)
    k_new, v_new = torch.randn(2, 1, HKV, D).to(q.dtype), torch.randn(2, 1, HKV, D).to(q.dtype)
    sinks = _sinks(9)
    out = decoded.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, block_table=table,
                                          causal=True, window_size=(4, 0), learnable_sink=sinks)
    assert decoded.last_path == "kernel"
    close(out, naive(q, kc, vc, lens + 1, table, True, window=(4, 0), sinks=sinks)[0])


# ---- export --------------------------------------------------------------------------------------------------
def test_decode_option_configs_name_their_features_and_are_checked_at_load(decoded, tmp_path):
    by = {(c.layout, c.features): c for c in decoded.configs}
    assert set(by) == {("paged", ()), ("dense", ()), ("paged", ("local", "sinks")), ("dense", ("local", "sinks")),
                       ("paged", ("softcap",))}
    path = by[("paged", ("local", "sinks"))].path
    assert ",phase=decode,features=local+sinks," in path.name
    doc = json.loads(path.read_text())
    assert doc["_metadata"]["features"] == ["local", "sinks"] and doc["_metadata"]["phase"] == "decode"
    doc["_metadata"]["features"] = ["local"]
    bad = tmp_path / path.name
    bad.write_text(json.dumps(doc))
    with pytest.raises(ExportError, match=r"built with \(local, sinks\) but the config states \(local\)"):
        read_config(bad)


# ---- the op --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("route_kind", ["kernel", "reference"])
@pytest.mark.parametrize("return_lse", [False, True])
def test_the_decode_options_op_passes_opcheck(decoded, route_kind, return_lse):
    q, kc, vc, lens, table = _case([37], sq=3, seed=4)
    q, kc, vc = (t.nan_to_num(0.0).requires_grad_() for t in (q, kc, vc))     # opcheck compares NaN
    table = table.clamp(min=0)
    sinks = _sinks(4).requires_grad_()
    options = ModelOptions((31, 0), 0.0, sinks)
    route = decoded.route_decode(q, kc, vc, table, True, 0.125, options)
    assert op._ROUTES[route].config is not None
    if route_kind == "reference":
        route = decoded._fallback["no-option-config"]
    torch.library.opcheck(torch.ops.attn_tuner.decode_kvcache_options.default,
                          (q, kc, vc, lens, table, True, 0.125, 0, return_lse, 31, 0, 0.0, sinks, route),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("dense", [False, True])
def test_gradients_reach_q_the_caches_and_the_sinks(decoded, dense):
    """Under autograd the options op is differentiable: its backward recomputes the reference, and q, k_cache,
    v_cache and the sinks (a bf16 parameter, converted on the way in) match float64 autograd of the loop, the lse
    included."""
    q, kc, vc, lens, table = _case([40, 23], sq=3, seed=6, dense=dense)
    kc, vc = kc.nan_to_num(0.0), vc.nan_to_num(0.0)
    if table is not None:
        table = table.clamp(min=0)
    leaves = [t.detach().clone().requires_grad_() for t in (q, kc, vc)]
    sinks = _sinks(6, torch.bfloat16).requires_grad_()
    out, lse = decoded.flash_attn_with_kvcache(*leaves, cache_seqlens=lens, block_table=table, causal=True,
                                               window_size=(9, 0), learnable_sink=sinks, return_softmax_lse=True)
    assert decoded.last_path == "kernel" and out.grad_fn is not None
    g_out, g_lse = torch.randn_like(out.float()), torch.randn_like(lse)
    got = torch.autograd.grad((out.float() * g_out).sum() + (lse * g_lse).sum(), leaves + [sinks])
    ref = [t.detach().double().requires_grad_() for t in (q, kc, vc, sinks)]
    w_out, w_lse = naive(*ref[:3], lens, table, True, window=(9, 0), sinks=ref[3])
    want = torch.autograd.grad((w_out * g_out.double()).sum() + (w_lse * g_lse.double()).sum(), ref)
    for name, g, w in zip(("q", "k_cache", "v_cache", "sinks"), got, want):
        assert g.dtype == torch.bfloat16 and g.shape == w.shape, name
        err = ((g.double() - w).norm() / w.norm()).item()
        assert err < 2e-2, (name, err)


def test_eager_inference_skips_the_dispatcher_unless_the_sinks_need_grad(decoded, monkeypatch):
    from tuner.serving import op_options

    calls = []
    real = op_options.decode_kvcache_options_op
    monkeypatch.setattr(op_options, "decode_kvcache_options_op", lambda *a: calls.append(1) or real(*a))
    q, kc, vc, lens, table = _case([40, 90])
    sinks = _sinks(0)
    decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True,
                                    window_size=(7, 0), learnable_sink=sinks)
    assert calls == [] and decoded.last_path == "kernel"
    out = decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True,
                                          window_size=(7, 0), learnable_sink=sinks.requires_grad_())
    assert out.grad_fn is not None and calls == [1]


def _step(attn):
    def f(q, kc, vc, lens, table, sinks):
        out, lse = attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True,
                                                window_size=(63, 0), learnable_sink=sinks, return_softmax_lse=True)
        return out.float() * 2, lse
    return f


def test_decode_with_options_traces_under_torch_compile_fullgraph(decoded):
    args = (*_case([70, 5], sq=2, seed=10), _sinks(10))
    f = _step(decoded)
    explained = torch._dynamo.explain(f)(*args)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    before = decoded.stats["kernel"]
    got, want = compiled(*args), f(*args)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    assert decoded.stats["kernel"] == before + 2 and not decoded.reasons


def test_compiled_option_fallbacks_are_counted_per_call(decoded):
    def f(q, kc, vc, lens, table):
        return decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True,
                                               window_size=(63, 0))
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    args = _case([40, 90], seed=11)
    for _ in range(3):
        compiled(*args)
    assert decoded.reasons == {"no-option-config": 3}
