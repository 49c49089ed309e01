"""The custom op on the CPU with a stand-in kernel: schema, fake and autograd (opcheck), gradients against
the fp32 reference, torch.compile without graph breaks (static and dynamic shapes), the eager fast path."""
import math

import pytest
import torch
from conftest import qkv, reference

from tuner.serving import op


def _route(served, q, k, v, causal):
    return served.route(q, k, v, causal, 1.0 / math.sqrt(q.shape[3]))


@pytest.mark.parametrize("case", ["kernel", "kernel-gqa", "bucket-per-call", "sdpa", "mask"])
def test_opcheck_schema_fake_and_autograd(served, case):
    q, k, v = qkv(hq=4, hkv=4 if case != "kernel-gqa" else 2, sq=40, grad=True)
    mask = None
    if case == "sdpa":
        q, k, v = (t.detach()[..., :64].requires_grad_() for t in (q, k, v))   # d64: nothing exported
    route = _route(served, q, k, v, True) if case != "mask" else served._fallback["mask"]
    assert (op._ROUTES[route].config is None) == (case in ("sdpa", "mask"))
    if case == "bucket-per-call":
        config = op._ROUTES[route].config
        route = served._routes[(id(config), None)]
    if case == "mask":
        mask = torch.rand(40, 40) > 0.3
        mask[:, 0] = True
    causal = case != "mask"
    torch.library.opcheck(torch.ops.attn_tuner.attention.default, (q, k, v, mask, causal, 0.11, route),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_opcheck_of_the_backward_op():
    # float64: opcheck compares eager (autograd of SDPA) with tracing (the written-out backward, where autograd
    # cannot record) at the dtype's tolerance; in fp32 their rounding differed past it for some gradients
    q, k, v = qkv(hq=4, hkv=2, sq=24, dtype=torch.float64)
    grad = torch.randn(2, 24, 4, 128, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch.library.opcheck(torch.ops.attn_tuner.attention_backward.default, (grad, q, k, v, None, True, 0.2),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("sq,sk,hq,hkv,causal,scale", [(48, 48, 4, 4, True, None), (30, 70, 8, 2, True, 0.05),
                                                        (70, 30, 4, 1, True, None), (33, 33, 4, 2, False, 0.3)])
def test_gradients_match_the_fp32_reference(served, sq, sk, hq, hkv, causal, scale):
    """bf16 through the kernel's route; the gradients (SDPA's backward from the saved inputs, the same scale,
    causality and head groups) against float64 autograd of the reference: within bf16's error."""
    q, k, v = qkv(sq=sq, sk=sk, hq=hq, hkv=hkv, grad=True, seed=sq + sk)
    out = served(q, k, v, causal=causal, softmax_scale=scale)
    assert served.last_path == "kernel" and out.grad_fn is not None
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref_out = reference(*leaves, causal, scale)
    want = torch.autograd.grad(ref_out, leaves, grad.double())
    for name, g, w in zip("qkv", got, want):
        assert g.dtype == torch.bfloat16 and g.shape == w.shape
        err = ((g.double() - w).norm() / w.norm()).item()
        assert err < 2e-2, (name, err)


def test_bf16_gradients_flow_into_a_model(served):
    q, k, v = qkv(hq=4, hkv=4, sq=64, grad=True)
    served(q, k, v, causal=True).float().square().sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


def _model(served):
    def f(q, k, v):
        return served(q, k, v, causal=True).float().sum(dim=-1) * 2
    return f


def test_torch_compile_fullgraph_has_no_graph_break(served):
    q, k, v = qkv(hq=8, hkv=2, sq=300)
    explained = torch._dynamo.explain(_model(served))(q, k, v)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(_model(served), fullgraph=True, backend="aot_eager")
    before = served.stats["kernel"]
    torch.testing.assert_close(compiled(q, k, v), _model(served)(q, k, v))
    assert served.stats["kernel"] == before + 2 and served.last_bucket == "s1024"


@pytest.mark.slow   # torch.compile: seconds of Inductor
def test_dynamic_seqlen_picks_the_bucket_per_call_inside_one_graph(served):
    """With seqlen symbolic the graph holds the config's route; the bucket follows the concrete length."""
    compiled = torch.compile(_model(served), fullgraph=True, backend="aot_eager", dynamic=True)
    buckets = []
    for s in (100, 700, 3000, 9000):
        q, k, v = qkv(b=1, hq=4, hkv=4, sq=s)
        torch.testing.assert_close(compiled(q, k, v), _model(served)(q, k, v))
        buckets.append(served.last_bucket)
    assert buckets == ["s512", "s512", "s4096", "s4096"]


@pytest.mark.slow   # torch.compile: seconds of Inductor
def test_inductor_compiles_a_model_around_the_op(served):
    q, k, v = qkv(b=1, hq=4, hkv=4, sq=128)
    compiled = torch.compile(_model(served), fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), _model(served)(q, k, v), atol=1e-2, rtol=1e-2)


def test_compiled_fallbacks_are_counted_per_call(served):
    q, k, v = qkv(hq=4, hkv=4, sq=64, d=64)          # no d64 export: SDPA, inside the graph
    compiled = torch.compile(_model(served), fullgraph=True, backend="aot_eager")
    for _ in range(3):
        compiled(q, k, v)
    assert served.reasons["no-shape-config"] == 3


def test_the_eager_fast_path_skips_the_dispatcher_only_when_nothing_observes(served, monkeypatch):
    calls = []
    real = op.attention_op
    monkeypatch.setattr(op, "attention_op", lambda *a: calls.append(1) or real(*a))
    q, k, v = qkv(hq=4, hkv=4, sq=32)
    served(q, k, v, causal=True)
    assert calls == []                                   # plain eager inference: the route directly
    with torch.no_grad():
        served(q, k, v, causal=True)
    assert calls == []
    qg = q.clone().requires_grad_()
    assert served(qg, k, v, causal=True).grad_fn is not None and calls == [1]    # autograd sees the op
    from torch.utils._python_dispatch import TorchDispatchMode

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Watch():
        served(q, k, v, causal=True)
    assert calls == [1, 1]                               # a dispatch mode sees the op too


def test_the_route_is_memoised_in_eager_and_decided_again_for_new_shapes(served):
    q, k, v = qkv(hq=4, hkv=4, sq=32)
    r1 = _route(served, q, k, v, True)
    assert _route(served, q, k, v, True) == r1 and len(served._memo) == 1
    q2, k2, v2 = qkv(hq=4, hkv=4, sq=3000)
    assert _route(served, q2, k2, v2, True) != r1


@pytest.mark.parametrize("sq,sk,hq,hkv,causal,masked", [(300, 300, 4, 2, True, False), (70, 130, 4, 1, True, False),
                                                        (130, 70, 2, 2, True, False), (90, 90, 4, 4, False, True)])
def test_the_explicit_backward_equals_sdpa_autograd(sq, sk, hq, hkv, causal, masked):
    """The gradients used where a dispatch mode hides autograd (chunked in blocks of 64 rows here)."""
    from tuner.serving.sdpa import _gradients_by_rows, sdpa_attention

    q, k, v = qkv(sq=sq, sk=sk, hq=hq, hkv=hkv, d=64, dv=32, dtype=torch.float32, seed=sq, grad=True)
    mask = (torch.rand(sq, sk, generator=torch.Generator().manual_seed(1)) > 0.4) if masked else None
    if mask is not None:
        mask[:, 0] = True
    out = sdpa_attention(q, k, v, causal=causal, softmax_scale=0.07, attn_mask=mask)
    grad = torch.randn_like(out)
    want = torch.autograd.grad(out, (q, k, v), grad)
    got = _gradients_by_rows(grad, q.detach(), k.detach(), v.detach(), causal, 0.07, mask, rows=64)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


def test_backward_under_a_flop_counter(served):
    from torch.utils.flop_counter import FlopCounterMode

    q, k, v = qkv(hq=4, hkv=4, sq=64, grad=True)
    with FlopCounterMode(display=False):
        out = served(q, k, v, causal=True)
        out.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


class PreparedStandIn:
    """A stand-in that, like the runtime's kernels, hands out launchers bound to a call signature."""

    def __init__(self, meta):
        from conftest import StandInKernel

        self.inner = StandInKernel(meta)
        self.prepared = []
        self.refuse = False

    def __call__(self, q, k, v, out=None, softmax_scale=None):
        return self.inner(q, k, v, softmax_scale=softmax_scale)

    def prepare(self, q, k, v, softmax_scale=None):
        self.prepared.append(tuple(q.shape))
        signature = (q.shape, q.stride())

        def launcher(q, k, v):
            assert (q.shape, q.stride()) == signature
            if self.refuse:
                raise ValueError("data pointers must be 16-byte aligned")
            return self.inner(q, k, v, softmax_scale=softmax_scale)

        return launcher


def test_an_eager_signature_is_remembered_and_launched_without_dispatch(exported, monkeypatch):
    from conftest import H100

    from tuner.serving import DeviceFacts, load_exported

    kernels = []

    def loader(cubin, meta, device_index):
        kernels.append(PreparedStandIn(meta))
        return kernels[-1]

    attn = load_exported(exported, devices={("cpu", None): DeviceFacts(H100, (9, 0))}, kernel_loader=loader)
    q, k, v = qkv(hq=4, hkv=4, sq=48)
    first = attn(q, k, v, causal=True)
    assert kernels[0].prepared == [(2, 48, 4, 128)]
    monkeypatch.setattr(attn, "route", lambda *a: pytest.fail("a remembered signature was dispatched again"))
    fresh = qkv(hq=4, hkv=4, sq=48, seed=9)                 # same signature, new tensors
    torch.testing.assert_close(attn(*fresh, causal=True).double(), reference(*fresh, True), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(attn(q, k, v, causal=True), first)
    assert attn.stats["kernel"] == 3 and attn.last_bucket == "s512"
    bhsd = [t.transpose(1, 2) for t in (q, k, v)]
    monkeypatch.undo()
    torch.testing.assert_close(attn(*bhsd, causal=True, layout="bhsd").transpose(1, 2), first)
    torch.testing.assert_close(attn(*bhsd, causal=True, layout="bhsd").transpose(1, 2), first)   # remembered
    kernels[0].refuse = True           # a per-call refusal of the launcher: the slow path decides instead
    torch.testing.assert_close(attn(q, k, v, causal=True), first)
    assert attn.last_path == "kernel"
    qg = q.clone().requires_grad_()
    assert attn(qg, k, v, causal=True).grad_fn is not None   # autograd: never the remembered launcher
