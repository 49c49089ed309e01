"""The drop-in entry points: FlashAttention's and SDPA's layouts, scale names, enable_gqa, the
scaled_dot_product_attention and flash_attn_func signatures, and what each sends to SDPA (counted)."""
import pytest
import torch
import torch.nn.functional as F
from conftest import qkv, reference


def _close(out, ref, tol=2e-2):
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)


def test_both_layouts_and_both_scale_names(served):
    q, k, v = qkv(hq=8, hkv=2, sq=50, sk=90)
    ref = reference(q, k, v, True, 0.07)
    _close(served(q, k, v, causal=True, softmax_scale=0.07), ref)
    _close(served(q, k, v, causal=True, scale=0.07), ref)
    bhsd = served(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, scale=0.07, layout="bhsd")
    assert bhsd.shape == (2, 8, 50, 128)
    _close(bhsd.transpose(1, 2), ref)
    assert served.stats == {"kernel": 3}
    with pytest.raises(ValueError, match="differ; give one"):
        served(q, k, v, scale=0.1, softmax_scale=0.2)
    with pytest.raises(ValueError, match="layout must be"):
        served(q, k, v, layout="sbhd")


@pytest.mark.parametrize("scale", [0.0, -0.1, float("inf"), float("nan")])
def test_a_scale_the_kernels_cannot_use_runs_sdpa(served, scale):
    q, k, v = qkv(hq=4, hkv=4, sq=32, dtype=torch.float32)
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    served(q, k, v, causal=True, softmax_scale=scale)
    assert served.last_path == "sdpa" and served.reasons == {"scale": 1}


def test_sdpa_drop_in_matches_torch_sdpa_on_every_path(served):
    q, k, v = (t.transpose(1, 2) for t in qkv(hq=8, hkv=2, sq=64, sk=64))
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True)
    _close(served.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), want.double())
    assert served.last_path == "kernel"
    with pytest.raises(ValueError, match="enable_gqa=True"):
        served.scaled_dot_product_attention(q, k, v, is_causal=True)
    # SDPA's is_causal is top-left when sq != sk: the kernels' bottom-right would differ, so SDPA runs
    qs = q[:, :, :20]
    want = F.scaled_dot_product_attention(qs.float(), k.float(), v.float(), is_causal=True, enable_gqa=True)
    _close(served.scaled_dot_product_attention(qs, k, v, is_causal=True, enable_gqa=True), want.double())
    mask = torch.rand(64, 64) > 0.5
    mask[:, 0] = True
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True)
    _close(served.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True), want.double())
    torch.manual_seed(0)
    out = served.scaled_dot_product_attention(q, k, v, dropout_p=0.5, enable_gqa=True)
    assert out.shape == q.shape
    three_d = served.scaled_dot_product_attention(q[0], k[0].repeat_interleave(4, 0), v[0].repeat_interleave(4, 0))
    _close(three_d, F.scaled_dot_product_attention(q[0].float(), k[0].float().repeat_interleave(4, 0),
                                                   v[0].float().repeat_interleave(4, 0)).double())
    assert served.reasons == {"sdpa-causal-top-left": 1, "mask": 1, "dropout": 1, "layout": 1}


def test_flash_attn_func_signature_and_semantics(served):
    q, k, v = qkv(hq=8, hkv=2, sq=40, sk=100)
    _close(served.flash_attn_func(q, k, v, causal=True), reference(q, k, v, True))
    _close(served.flash_attn_func(q, k, v, 0.0, 0.05, True), reference(q, k, v, True, 0.05))   # positional
    assert served.stats["kernel"] == 2
    rows = torch.arange(40)[:, None] + 60
    cols = torch.arange(100)[None, :]
    window = (cols >= rows - 16) & (cols <= rows)
    _close(served.flash_attn_func(q, k, v, causal=True, window_size=(16, 0)), reference(q, k, v, False, mask=window))
    _close(served.flash_attn_func(q, k, v, causal=True, window_size=(16, 5)), reference(q, k, v, False, mask=window))
    # this export has no kernel built with a window: the fp32 reference serves it, counted
    assert served.reasons == {"no-option-config": 2}
    for kwargs, fragment in (({"alibi_slopes": torch.ones(8)}, "ALiBi"),
                             ({"return_attn_probs": True}, "return_attn_probs"),
                             ({"softcap": 30.0, "dropout_p": 0.1}, "dropout with softcap")):
        with pytest.raises(NotImplementedError, match=fragment):
            served.flash_attn_func(q, k, v, **kwargs)


def test_packed_qkv_views_run_the_kernel_without_copies(served):
    """q, k, v sliced from one (b, s, 3, h, d) projection: strided views, as models make them."""
    qkv_packed = torch.randn(2, 70, 3, 4, 128).to(torch.bfloat16)
    q, k, v = qkv_packed.unbind(dim=2)
    out = served(q, k, v, causal=True)
    assert served.last_path == "kernel"
    _close(out, reference(q, k, v, True))


def test_inputs_are_never_mutated(served):
    q, k, v = qkv(hq=4, hkv=4, sq=33)
    before = [t.clone() for t in (q, k, v)]
    served(q, k, v, causal=True)
    served.flash_attn_func(q, k, v, window_size=(8, 8))
    for t, b in zip((q, k, v), before):
        assert torch.equal(t, b)
