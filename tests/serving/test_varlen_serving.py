"""flash_attn_varlen_func through an export on the CPU (stand-in kernels): the varlen op's schema, fake and
autograd, dispatch by layout and max_seqlen_k, the per-sequence SDPA fallback, torch.compile."""
import math

import pytest
import torch
from conftest import reference

from tuner.serving import op


def packed(lens_q, lens_k=None, hq=8, hkv=2, d=128, dtype=torch.bfloat16, seed=0, grad=False):
    lens_k = lens_k or lens_q
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), hq, d, generator=g).to(dtype)
    k = torch.randn(sum(lens_k), hkv, d, generator=g).to(dtype)
    v = torch.randn(sum(lens_k), hkv, d, generator=g).to(dtype)
    if grad:
        for t in (q, k, v):
            t.requires_grad_()
    cu = [torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32) for lens in (lens_q, lens_k)]
    return q, k, v, cu[0], cu[1]


def per_sequence_reference(q, k, v, cu_q, cu_k, causal, used=None, scale=None):
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float64)
    for b in range(len(cu_q) - 1):
        q0, q1, k0 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b])
        n = int(used[b]) if used is not None else int(cu_k[b + 1]) - k0
        if q1 > q0 and n > 0:
            out[q0:q1] = reference(q[None, q0:q1], k[None, k0:k0 + n], v[None, k0:k0 + n], causal, scale)[0]
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_varlen_calls_dispatch_to_the_varlen_kernels(served, causal):
    q, k, v, cu_q, cu_k = packed([0, 1, 129, 300, 7], [5, 1, 200, 300, 7])
    out = served.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 300, 300, causal=causal)
    want = per_sequence_reference(q, k, v, cu_q, cu_k, causal)
    if causal:
        assert served.last_path == "kernel" and served.last_bucket == "s1024"
    else:                                # only causal varlen kernels are exported: SDPA, sequence by sequence
        assert served.last_path == "sdpa" and served.reasons == {"no-shape-config": 1}
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
    served.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 300, 7000, causal=causal)
    assert served.last_bucket == ("s8192" if causal else None)


def test_seqused_k_and_a_custom_scale(served):
    q, k, v, cu_q, cu_k = packed([40, 64], [100, 90])
    used = torch.tensor([33, 0], dtype=torch.int32)
    out = served.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 64, 100, causal=True, softmax_scale=0.05,
                                        seqused_k=used)
    assert served.last_path == "kernel"
    want = per_sequence_reference(q, k, v, cu_q, cu_k, True, used=used, scale=0.05)
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
    assert out[40:].abs().max() == 0                     # no key used: zeros


def test_dense_calls_never_take_a_varlen_kernel(served):
    q = torch.randn(1, 64, 8, 128).to(torch.bfloat16)
    k = torch.randn(1, 64, 2, 128).to(torch.bfloat16)
    served(q, k, k, causal=True)
    assert served.last_path == "kernel" and "varlen" not in served.last_reason


def test_varlen_opcheck_and_gradients(served):
    q, k, v, cu_q, cu_k = packed([17, 0, 40], [30, 3, 40], grad=True)
    scale = 1 / math.sqrt(128)
    route = served.route_varlen(q, k, v, True, scale, 40, cu_q, 40)
    assert op._ROUTES[route].config is not None
    torch.library.opcheck(torch.ops.attn_tuner.varlen_attention.default,
                          (q, k, v, cu_q, cu_k, None, 40, 40, True, scale, route),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))
    out = served.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 40, 40, causal=True)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(per_sequence_reference(*leaves, cu_q, cu_k, True), leaves, grad.double())
    for g, w in zip(got, want):
        assert ((g.double() - w).norm() / w.norm()).item() < 2e-2


def test_varlen_under_torch_compile_fullgraph(served):
    def f(q, k, v, cu_q, cu_k):
        return served.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 300, 300, causal=True).float() * 2

    q, k, v, cu_q, cu_k = packed([100, 300, 1])
    assert torch._dynamo.explain(f)(q, k, v, cu_q, cu_k).graph_break_count == 0
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v, cu_q, cu_k), f(q, k, v, cu_q, cu_k))
    assert served.last_path == "kernel"


@pytest.mark.parametrize("kwargs,what", [({"dropout_p": 0.1}, "dropout"), ({"alibi_slopes": torch.ones(8)}, "alibi")])
def test_what_varlen_cannot_do_is_refused(served, kwargs, what):
    q, k, v, cu_q, cu_k = packed([10])
    with pytest.raises(NotImplementedError, match=what):
        served.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 10, 10, **kwargs)
