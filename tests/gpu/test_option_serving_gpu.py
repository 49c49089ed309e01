"""Kernels built with options served on a Hopper GPU (marker gpu; skipped elsewhere): an export of window,
soft-capping and sinks kernels (each through the campaign's gate first), the drop-ins' keywords reaching them
(windows at their edges, caps of 1 and 50, sink logits of +-30), packed sequences with a window, autograd through
the options op, and Gemma-2- and gpt-oss-shaped transformers models running every attention call on them, eager and
compiled, with the logits of transformers' eager attention."""
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs a Hopper (sm_90) GPU")]

from kernel_abi.spec import KernelSpec  # noqa: E402
from tuner.serving import load_exported  # noqa: E402
from tuner.serving.options import ModelOptions, reference_attention, reference_paged, reference_varlen  # noqa: E402


def _spec(d, *features, layout="dense"):
    return KernelSpec("gqa", d, d, True, "bf16", layout, **{f: True for f in features})


SPECS = [_spec(128), _spec(128, "local"), _spec(128, "softcap"), _spec(128, "local", "softcap"),
         _spec(128, "local", layout="varlen"), _spec(64, "local", "sinks"), _spec(64, "sinks"),
         _spec(64, "local", "sinks", layout="varlen"), _spec(64, "sinks", layout="varlen"),
         _spec(64, "local", "sinks", layout="paged"),
         _spec(256, "softcap"), _spec(256, "local", "softcap"),      # Gemma 2's global and local layers
         _spec(128, "softcap", layout="varlen"), _spec(128, "local", "softcap", layout="varlen"),   # padded batches
         _spec(256, "softcap", layout="varlen"), _spec(256, "local", "softcap", layout="varlen")]   # (d256: 48 keys)
# The bf16 output against the fp32 reference on the same inputs: a dropped window, cap or sink errs by 0.1 or more
ATOL = 2 ** -6


@pytest.fixture(scope="module")
def attn(tmp_path_factory):
    from tuner.defaults.export import export_defaults

    gpu = "h200" if "h200" in torch.cuda.get_device_name().lower() else "h100"
    out = tmp_path_factory.mktemp("export")
    cache = os.environ.get("KERNEL_CACHE_DIR")
    export_defaults(gpu, SPECS, out, cache_dir=Path(cache) if cache else None, buckets=("s4096",),
                    study_dir=out.parent / "studies")
    return load_exported(out)


def _qkv(b=2, s=1000, hq=16, hkv=4, d=128, seed=0, sk=None):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
                 for n, h in ((s, hq), (sk or s, hkv), (sk or s, hkv)))


def _err(out, q, k, v, causal=True, window=(-1, -1), softcap=0.0, sinks=None):
    scale = 1.0 / q.shape[-1] ** 0.5
    options = ModelOptions(window if not causal or window == (-1, -1) else (window[0], 0), softcap,
                           None if sinks is None else sinks.float())
    ref = reference_attention(q.float(), k.float(), v.float(), causal, scale, options)
    assert torch.isfinite(out).all()
    return (out.float() - ref).abs().max().item()


@pytest.mark.parametrize("window", [(0, 0), (1, 0), (127, 0), (128, 0), (129, 0), (4000, 0)])
def test_windows_at_their_edges_on_the_kernel(attn, window):
    q, k, v = _qkv(s=1000, sk=1300, seed=window[0])
    out = attn.flash_attn_func(q, k, v, causal=True, window_size=window)
    assert attn.last_path == "kernel", attn.last_reason
    assert _err(out, q, k, v, window=window) <= ATOL


@pytest.mark.parametrize("softcap, window", [(1.0, (-1, -1)), (50.0, (-1, -1)), (50.0, (511, 0))])
def test_caps_on_the_kernel(attn, softcap, window):
    q, k, v = _qkv(s=777)
    out = attn.flash_attn_func(q, k, v, causal=True, softcap=softcap, window_size=window)
    assert attn.last_path == "kernel", attn.last_reason
    assert _err(out, q, k, v, window=window, softcap=softcap) <= ATOL


@pytest.mark.parametrize("window", [(-1, -1), (63, 0), (64, 0), (4095, 0)])
def test_gemma_shaped_calls_at_head_dim_256_on_the_kernel(attn, window):
    """Gemma 2: 16/8 heads of 256, scores capped at 50, every other layer a 4096-key window (64-key tiles at 256:
    the window's edges at one tile and one past it too)."""
    q, k, v = _qkv(s=900, sk=1100, hq=16, hkv=8, d=256, seed=window[0] + 7)
    out = attn.flash_attn_func(q, k, v, causal=True, softcap=50.0, window_size=window)
    assert attn.last_path == "kernel", attn.last_reason
    assert _err(out, q, k, v, window=window, softcap=50.0) <= ATOL


@pytest.mark.parametrize("window", [(-1, -1), (127, 0)])
def test_sinks_of_plus_minus_30_on_the_kernel(attn, window):
    q, k, v = _qkv(s=600, hq=16, hkv=4, d=64)
    sinks = torch.tensor([30.0, -30.0] * 4 + [0.0, 1.0, -1.0, 2.0, -2.0, 0.5, 5.0, -5.0], device="cuda")
    out = attn.flash_attn_func(q, k, v, causal=True, window_size=window, learnable_sink=sinks.to(torch.bfloat16))
    assert attn.last_path == "kernel", attn.last_reason
    assert _err(out, q, k, v, window=window, sinks=sinks.to(torch.bfloat16)) <= ATOL


def test_varlen_window_on_the_kernel(attn):
    lengths = [700, 1, 0, 1500, 129]
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (torch.randn(sum(lengths), h, 128, device="cuda", dtype=torch.bfloat16, generator=g)
               for h in (16, 4, 4))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    out = attn.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True, window_size=(128, 0))
    assert attn.last_path == "kernel", attn.last_reason
    ref = reference_varlen(q.float(), k.float(), v.float(), cu, cu, None, True, 128 ** -0.5, ModelOptions((128, 0)))
    assert (out.float() - ref).abs().max().item() <= ATOL


def test_a_paged_cache_with_a_window_and_sinks_on_the_kernel(attn):
    g = torch.Generator(device="cuda").manual_seed(11)
    lengths, page = [700, 129, 1], 16
    pages_each = [-(-n // page) for n in lengths]
    q = torch.randn(sum(lengths), 16, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    k_cache, v_cache = (torch.randn(sum(pages_each) + 3, page, 4, 64, device="cuda", dtype=torch.bfloat16,
                                    generator=g) for _ in range(2))
    order = torch.randperm(sum(pages_each) + 3, device="cuda", generator=g)[:sum(pages_each)].to(torch.int32)
    table = torch.zeros(len(lengths), max(pages_each), dtype=torch.int32, device="cuda")
    at = 0
    for b, n in enumerate(pages_each):
        table[b, :n] = order[at:at + n]
        at += n
    cu_q = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    used = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    sinks = torch.linspace(-30, 30, 16, device="cuda")
    out = attn.flash_attn_varlen_func(q, k_cache, v_cache, cu_q, None, max(lengths), max(pages_each) * page,
                                      causal=True, window_size=(127, 0), learnable_sink=sinks, block_table=table,
                                      seqused_k=used)
    assert attn.last_path == "kernel" and attn.last_reason == "gqa paged", attn.last_reason
    ref = reference_paged(q.float(), k_cache.float(), v_cache.float(), cu_q, used, table, True, 64 ** -0.5,
                          ModelOptions((127, 0), 0.0, sinks))
    assert (out.float() - ref).abs().max().item() <= ATOL


def test_gradients_through_the_options_op(attn):
    q, k, v = (t.requires_grad_() for t in _qkv(b=1, s=256, hq=16, hkv=4, d=64))
    sinks = torch.randn(16, device="cuda", requires_grad=True)
    out = attn.flash_attn_func(q, k, v, causal=True, window_size=(64, 0), learnable_sink=sinks)
    assert attn.last_path == "kernel"
    grad = torch.randn_like(out)
    out.backward(grad)
    got = [t.grad for t in (q, k, v, sinks)]
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v, sinks)]
    ref = reference_attention(*leaves[:3], True, 64 ** -0.5, ModelOptions((64, 0), 0.0, leaves[3]))
    ref.backward(grad.float())
    for g, want in zip(got, leaves):
        assert (g.float() - want.grad).abs().max().item() <= 2 ** -5 * max(1.0, want.grad.abs().max().item())


def _pair(attn, family):
    from tuner.serving.hf import register_transformers

    name = register_transformers(attn)
    if family == "gemma2":
        from transformers import Gemma2Config as Config, Gemma2ForCausalLM as Model

        config = dict(vocab_size=1000, hidden_size=1024, intermediate_size=2048, num_hidden_layers=4,
                      num_attention_heads=16, num_key_value_heads=4, head_dim=128, sliding_window=256)
    else:
        from transformers import GptOssConfig as Config, GptOssForCausalLM as Model

        config = dict(vocab_size=1000, hidden_size=512, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=16, num_key_value_heads=4, head_dim=64, sliding_window=128,
                      num_local_experts=1, num_experts_per_tok=1)
    torch.manual_seed(0)
    ref = Model._from_config(Config(**config), attn_implementation="eager").to("cuda", torch.bfloat16).eval()
    if family == "gpt-oss":
        with torch.no_grad():
            for layer in ref.model.layers:
                layer.self_attn.sinks.normal_(std=2.0)
    ours = Model._from_config(Config(**config), attn_implementation=name).to("cuda", torch.bfloat16).eval()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


@pytest.mark.parametrize("family", ["gemma2", "gpt-oss"])
def test_models_run_every_attention_call_on_the_kernels(attn, family):
    pytest.importorskip("transformers")
    ref, ours = _pair(attn, family)
    ids = torch.randint(0, 1000, (2, 700), device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    attn.stats.clear()
    attn.reasons.clear()
    with torch.no_grad():
        want = ref(ids).logits.float()
        got = ours(ids).logits.float()
        assert attn.stats == {"kernel": 4} and not attn.reasons, (attn.stats, attn.reasons)
        compiled = torch.compile(ours, fullgraph=True)
        got_compiled = compiled(ids).logits.float()
    assert not attn.reasons
    # eager transformers computes in bf16 between fp32 softmaxes: a few bf16 ulps of the logits' scale
    tol = 0.05 * max(1.0, want.abs().max().item())
    assert (got - want).abs().max().item() < tol and (got_compiled - want).abs().max().item() < tol


@pytest.mark.parametrize("family", ["gemma2", "gpt-oss"])
def test_a_left_padded_batch_packs_onto_the_kernels_and_generates(attn, family):
    """Left padding, as generate() makes it: the prefill and every decode step packed onto the varlen kernels
    built with the layers' options (Gemma 2's here: d128, a cap on every layer, a window on the local ones)."""
    pytest.importorskip("transformers")
    ref, ours = _pair(attn, family)
    ids = torch.randint(0, 1000, (2, 300), device="cuda", generator=torch.Generator(device="cuda").manual_seed(2))
    mask = torch.ones(2, 300, dtype=torch.long, device="cuda")
    mask[0, :57] = 0
    attn.stats.clear()
    attn.reasons.clear()
    with torch.no_grad():
        want = ref(ids, attention_mask=mask).logits.float()
        got = ours(ids, attention_mask=mask).logits.float()
    tol = 0.05 * max(1.0, want.abs().max().item())
    assert (got[1] - want[1]).abs().max().item() < tol and (got[0, 57:] - want[0, 57:]).abs().max().item() < tol
    assert attn.stats == {"kernel": 4} and not attn.reasons, (attn.stats, attn.reasons)
    with torch.no_grad():
        ours.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    assert not attn.reasons and attn.stats["kernel"] == 4 + 4 * 4, (attn.stats, attn.reasons)
