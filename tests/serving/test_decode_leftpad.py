"""FA2's cache_leftpad in flash_attn_with_kvcache (no GPU): the fp32 reference against a per-sequence slice of the
cache (windows and sinks too), the refusals (a paged cache, a wrong dtype, shape or device; the launcher's for
paged, absorbed-MLA and pre-ABI-5 kernels), the routing (the dense kernel is given the leftpad, the reference
fallback honours it), appending with a leftpad, the ops' autograd and torch.compile (the kernels themselves:
tests/gpu/test_decode_leftpad_gpu.py)."""
import pytest
import torch
from conftest import serve_records
from store_fakes import make_decode_record
from test_decode_options_serving import close, close_lse, naive
from test_decode_serving import decode_case

from tuner.serving import op
from tuner.serving.decode_sdpa import decode_gradients, decode_reference
from tuner.serving.options import ModelOptions

HQ, HKV, D = 8, 2, 64


def leftpad_case(lens, pads, sq=1, seed=0, dtype=torch.bfloat16, extra=3):
    """q; a dense cache whose row b holds NaN before pads[b] and from lens[b] on, keys between; lens, pads int32."""
    g = torch.Generator().manual_seed(seed)
    b = len(lens)
    q = torch.randn(b, sq, HQ, D, generator=g).to(dtype)
    kc = torch.full((b, max(lens) + extra, HKV, D), float("nan"), dtype=dtype)
    vc = kc.clone()
    for i, (n, p) in enumerate(zip(lens, pads)):
        kc[i, p:n] = torch.randn(n - p, HKV, D, generator=g).to(dtype)
        vc[i, p:n] = torch.randn(n - p, HKV, D, generator=g).to(dtype)
    return q, kc, vc, torch.tensor(lens, dtype=torch.int32), torch.tensor(pads, dtype=torch.int32)


def sliced(q, kc, vc, lens, pads, causal, **options):
    """(out, lse) of each sequence alone on its rows [pad, len): the leftpad's meaning, from the definitions."""
    outs, lses = [], []
    for i in range(q.shape[0]):
        p, n = int(pads[i]), int(lens[i])
        o, lse = naive(q[i:i + 1], kc[i:i + 1, p:n], vc[i:i + 1, p:n], None, None, causal, **options)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def _sinks(seed=0):
    s = torch.randn(HQ, generator=torch.Generator().manual_seed(seed)) * 2
    s[0] = 30.0
    return s


def _record(features=(), layout="dense", bucket="d-b8-kv2k"):
    r = make_decode_record(layout=layout, d_qk=D, d_v=D, bucket=bucket,
                           cubin=f"{layout}-{'+'.join(features)}".encode())
    r.kernel_meta["spec"] = {"variant": "gqa", "d_qk": D, "d_v": D, "causal": True, "dtype": "bf16",
                             "layout": layout, "phase": "decode", **{f: True for f in features}}
    return r


@pytest.fixture
def decoded(tmp_path):
    """Causal gqa d64 bf16 decode configs: plain dense and paged, dense with window + sinks."""
    return serve_records(tmp_path / "export", [_record(), _record(layout="paged", bucket="d-b8-kv2k-p16"),
                                               _record(("local", "sinks"))])


# ---- the reference -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("window,sinks,sq", [((-1, -1), False, 1), ((-1, -1), True, 4), ((5, 0), False, 4),
                                             ((0, 0), True, 1), ((64, 0), True, 3)])
def test_the_reference_reads_each_sequence_from_its_leftpad(window, sinks, sq):
    # leftpads 0, 1, a tile - 1, one equal to the length (no key), one leaving fewer keys than tokens
    q, kc, vc, lens, pads = leftpad_case([40, 70, 130, 9, 12], [0, 1, 63, 9, 10], sq=sq, dtype=torch.float32)
    s = _sinks(1) if sinks else None
    out, lse = decode_reference(q, kc.nan_to_num(7.0), vc.nan_to_num(7.0), lens, None, True, None,
                                ModelOptions(window, 0.0, s), pads)
    want, want_lse = sliced(q, kc, vc, lens, pads, True, window=window, sinks=s)
    close(out, want, atol=1e-5)
    close_lse(lse, want_lse)
    if not sinks:   # the sequence with no key: 0 and -inf, as the kernels
        assert not out[3].any() and torch.isinf(lse[3]).all()


def test_without_a_leftpad_the_padding_would_be_read():
    """The leftpad matters in these cases: without it the reference reads the padding rows as keys."""
    q, kc, vc, lens, pads = leftpad_case([40, 70], [5, 1], dtype=torch.float32)
    kc, vc = kc.nan_to_num(0.5), vc.nan_to_num(0.5)
    with_pad = decode_reference(q, kc, vc, lens, None, True, None, ModelOptions((-1, -1), 0.0, None), pads)[0]
    without = decode_reference(q, kc, vc, lens, None, True)[0]
    assert (with_pad - without).abs().max() > 1e-2


def test_the_written_out_backward_honours_the_leftpad():
    q, kc, vc, lens, pads = leftpad_case([33, 20, 16], [3, 0, 16], sq=4, dtype=torch.float32)
    kc, vc = kc.nan_to_num(0.0), vc.nan_to_num(0.0)
    leaves = [t.clone().requires_grad_() for t in (q, kc, vc)]
    out, lse = decode_reference(*leaves, lens, None, True, 0.3, ModelOptions((-1, -1), 0.0, None), pads)
    g_out, g_lse = torch.randn_like(out), torch.randn_like(lse)
    finite = torch.isfinite(lse)
    want = torch.autograd.grad((out * g_out).sum() + (lse[finite] * g_lse[finite]).sum(), leaves)
    got = decode_gradients(g_out, g_lse * finite, q, kc, vc, lens, None, True, 0.3, pads)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
    assert not got[1][0, :3].any() and not got[2][2].any()     # padding rows get no gradient


# ---- refusals ------------------------------------------------------------------------------------------------
def test_a_paged_cache_with_a_leftpad_is_refused_by_name(decoded):
    q, kc, vc, lens, table = decode_case([40, 9], hq=HQ, hkv=HKV, d=D)
    before = kc.clone()
    k_new = torch.randn(2, 1, HKV, D).to(q.dtype)
    for given in ({"block_table": table}, {"page_table": table}):
        with pytest.raises(ValueError, match=r"^flash_attn_with_kvcache: cache_leftpad does not go with a paged "
                                             r"cache \(block_table/page_table\), as in FlashAttention 2$"):
            decoded.flash_attn_with_kvcache(q, kc, vc, k_new, k_new, cache_seqlens=lens, causal=True,
                                            cache_leftpad=torch.zeros(2, dtype=torch.int32), **given)
    assert decoded.stats == {} and torch.equal(kc.nan_to_num(1.0), before.nan_to_num(1.0))   # nothing appended


@pytest.mark.parametrize("bad,fragment", [
    (torch.zeros(2, dtype=torch.int64), "torch.int64 (2,)"), (torch.zeros(3, dtype=torch.int32), "int32 (3,)"),
    (torch.zeros(2, 1, dtype=torch.int32), "(2, 1)"), (torch.zeros(2, dtype=torch.int32, device="meta"), "on meta"),
    ([0, 1], "list")])
def test_a_leftpad_of_the_wrong_dtype_shape_or_device_is_refused(decoded, bad, fragment):
    q, kc, vc, lens, _ = leftpad_case([40, 9], [0, 0])
    with pytest.raises(ValueError, match=r"cache_leftpad must be an int32 tensor of 2 rows \(one per sequence\) "
                                         r"on cpu, got .*" + fragment.replace("(", r"\(").replace(")", r"\)")):
        decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, cache_leftpad=bad)
    assert decoded.stats == {}


def _launcher(spec: dict, abi=5):
    """A DecodeKernel without a loaded module: its argument checks only."""
    from tuner.serving.launch.decode_kernel import DecodeKernel

    k = DecodeKernel.__new__(DecodeKernel)
    k.meta = {"name": "k", "abi": abi, "spec": spec}
    k.spec, k.params = spec, {}
    return k


@pytest.mark.parametrize("spec,abi,fragment", [
    ({"variant": "gqa", "layout": "paged", "d_qk": 128, "d_v": 128, "causal": True, "dtype": "bf16"}, 5,
     "a paged cache takes no leftpad"),
    ({"variant": "mla", "layout": "dense", "d_qk": 576, "d_v": 512, "causal": True, "dtype": "bf16"}, 5,
     "the absorbed-MLA decode kernels read no leftpad"),
    ({"variant": "gqa", "layout": "dense", "d_qk": 128, "d_v": 128, "causal": True, "dtype": "bf16"}, 4,
     r"this kernel \(ABI 4\) reads no leftpad; rebuild it"),
])
def test_the_launcher_refuses_a_leftpad_its_kernel_does_not_read(spec, abi, fragment):
    q = torch.zeros(2, 1, 8, spec["d_qk"])
    errors = _launcher(spec, abi).leftpad_errors(torch.zeros(2, dtype=torch.int32), q)
    assert len(errors) == 1 and __import__("re").search(fragment, errors[0]), errors


def test_the_launcher_checks_the_leftpad_tensor_without_reading_it():
    dense = _launcher({"variant": "gqa", "layout": "dense", "d_qk": 128, "d_v": 128, "causal": True,
                       "dtype": "bf16"})
    q = torch.zeros(3, 1, 8, 128)
    assert dense.leftpad_errors(torch.tensor([0, 5, 10**6], dtype=torch.int32), q) == []   # values: not read back
    for bad in (torch.zeros(3, dtype=torch.int64), torch.zeros(2, dtype=torch.int32),
                torch.zeros(6, dtype=torch.int32)[::2], torch.zeros(3, dtype=torch.int32, device="meta")):
        errors = dense.leftpad_errors(bad, q)
        assert errors and "cache_leftpad must be a contiguous int32 tensor of 3 rows" in errors[0]


def test_the_kernel_args_end_with_the_leftpad_pointer():
    """ABI 4 decode kernels read the fields before it at the same offsets (translate/include/attn_decode.cuh)."""
    from tuner.serving.launch.decode_kernel import DecodeArgs

    names = [n for n, _ in DecodeArgs._fields_]
    assert names[-1] == "leftpad_k" and names[-2] == "softcap_prescale"


# ---- routing -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sq", [1, 4])
def test_the_dense_kernel_is_given_the_leftpad(decoded, sq):
    q, kc, vc, lens, pads = leftpad_case([40, 70, 130, 9], [0, 1, 65, 9], sq=sq, seed=sq)
    out, lse = decoded.flash_attn_with_kvcache(q, kc, vc, None, None, None, None, lens, None, pads, causal=True,
                                               return_softmax_lse=True)   # FA2's positional order
    assert decoded.last_path == "kernel" and not decoded.reasons, decoded.last_reason
    ran = [k for k in decoded.stand_ins if k.leftpads]
    assert len(ran) == 1 and ran[0].meta["spec"]["layout"] == "dense" and ran[0].leftpads[-1] is pads
    want, want_lse = sliced(q, kc, vc, lens, pads, True)
    close(out, want)
    close_lse(lse, want_lse)


def test_a_window_and_sinks_with_a_leftpad_run_their_kernel(decoded):
    q, kc, vc, lens, pads = leftpad_case([40, 300, 12], [3, 129, 2], sq=4, seed=3)
    sinks = _sinks(3)
    out, lse = decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, cache_leftpad=pads, causal=True,
                                               window_size=(20, 0), learnable_sink=sinks, return_softmax_lse=True)
    assert decoded.last_path == "kernel" and not decoded.reasons
    ran = [k for k in decoded.stand_ins if k.leftpads]
    assert len(ran) == 1 and ran[0].meta["spec"].get("local") and ran[0].leftpads[-1] is pads
    want, want_lse = sliced(q, kc, vc, lens, pads, True, window=(20, 0), sinks=sinks)
    close(out, want)
    close_lse(lse, want_lse)


def test_the_reference_fallback_honours_the_leftpad(decoded):
    q, kc, vc, lens, pads = leftpad_case([40, 70], [5, 64], sq=2, seed=5)
    out = decoded.flash_attn_with_kvcache(q, kc.nan_to_num(3.0), vc.nan_to_num(3.0), cache_seqlens=lens,
                                          cache_leftpad=pads, causal=True, softcap=20.0)   # no cap config: reference
    assert decoded.last_path == "sdpa" and "no-option-config" in decoded.reasons
    close(out, sliced(q, kc, vc, lens, pads, True, softcap=20.0)[0])


def test_appended_rows_land_at_cache_seqlens_and_are_read_from_the_leftpad(decoded):
    """FA2: k=/v= rows go to cache rows cache_seqlens[b] + i (counted from row 0, the padding included), and the
    attention then reads rows [leftpad, cache_seqlens + new)."""
    q, kc, vc, lens, pads = leftpad_case([40, 70], [4, 30], sq=2, seed=6, extra=4)
    k_new, v_new = torch.randn(2, 2, HKV, D).to(q.dtype), torch.randn(2, 2, HKV, D).to(q.dtype)
    out = decoded.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, cache_leftpad=pads,
                                          causal=True)
    assert decoded.last_path == "kernel"
    for i in range(2):
        assert torch.equal(kc[i, int(lens[i]):int(lens[i]) + 2], k_new[i])
        assert torch.isnan(kc[i, :int(pads[i])]).all()            # the padding is not written
    close(out, sliced(q, kc, vc, lens + 2, pads, True)[0])


# ---- the ops -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("route_kind", ["kernel", "reference"])
def test_the_decode_op_passes_opcheck_with_a_leftpad(decoded, route_kind):
    q, kc, vc, lens, pads = leftpad_case([37, 20], [4, 20], sq=3, seed=4)
    q, kc, vc = (t.nan_to_num(0.0).requires_grad_() for t in (q, kc, vc))
    route = decoded.route_decode(q, kc, vc, None, True, 0.125)
    assert op._ROUTES[route].config is not None
    if route_kind == "reference":
        route = decoded._fallback["no-decode-config"]
    torch.library.opcheck(torch.ops.attn_tuner.decode_kvcache.default,
                          (q, kc, vc, lens, None, True, 0.125, 0, True, route, pads))
    sinks = _sinks(4).requires_grad_()
    route = decoded.route_decode(q, kc, vc, None, True, 0.125, ModelOptions((31, 0), 0.0, sinks))
    torch.library.opcheck(torch.ops.attn_tuner.decode_kvcache_options.default,
                          (q, kc, vc, lens, None, True, 0.125, 0, True, 31, 0, 0.0, sinks, route, pads))


@pytest.mark.parametrize("options", [False, True])
def test_gradients_through_the_op_match_the_sliced_reference(decoded, options):
    q, kc, vc, lens, pads = leftpad_case([33, 20], [3, 7], sq=2, seed=8)
    kc, vc = kc.nan_to_num(0.0), vc.nan_to_num(0.0)
    leaves = [t.float().clone().requires_grad_() for t in (q, kc, vc)]
    kwargs = {"window_size": (9, 0), "learnable_sink": _sinks(8)} if options else {}
    out, lse = decoded.flash_attn_with_kvcache(*(t.to(torch.bfloat16) for t in leaves), cache_seqlens=lens,
                                               cache_leftpad=pads, causal=True, return_softmax_lse=True, **kwargs)
    g = torch.randn(out.shape)
    got = torch.autograd.grad((out.float() * g).sum() + lse.sum(), leaves)
    ref = [t.float().clone().requires_grad_() for t in (q, kc, vc)]
    opts = ModelOptions(kwargs.get("window_size", (-1, -1)), 0.0, kwargs.get("learnable_sink"))
    want_out, want_lse = decode_reference(*(t.to(torch.bfloat16) for t in ref), lens, None, True, None, opts, pads)
    want = torch.autograd.grad((want_out.float() * g).sum() + want_lse.sum(), ref)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)
    assert not got[1][0, :3].any() and not got[1][1, :7].any()   # the padding rows get none


@pytest.mark.slow   # torch.compile: seconds of Inductor
def test_a_leftpad_call_traces_under_torch_compile_fullgraph(decoded):
    def f(q, kc, vc, lens, pads):
        out, lse = decoded.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, cache_leftpad=pads, causal=True,
                                                   return_softmax_lse=True)
        return out.float() * 2, lse

    q, kc, vc, lens, pads = leftpad_case([40, 70], [5, 64], sq=2, seed=9)
    kc, vc = kc.nan_to_num(0.0), vc.nan_to_num(0.0)
    explained = torch._dynamo.explain(f)(q, kc, vc, lens, pads)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    before = decoded.stats["kernel"]
    got = compiled(q, kc, vc, lens, pads)
    assert decoded.stats["kernel"] == before + 1
    want, want_lse = sliced(q, kc, vc, lens, pads, True)
    close(got[0] / 2, want)
    close_lse(got[1], want_lse)
