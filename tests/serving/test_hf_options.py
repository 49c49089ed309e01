"""transformers models whose attention has options, on the CPU with stand-in kernels: a Gemma-2-shaped model
(sliding-window layers, soft-capping 50 on every layer) and a gpt-oss-shaped one (sliding-window layers, sinks on
every layer) run every attention call on a kernel built with the layer's options, with the logits of
transformers' eager attention; padding masks, decode steps and training keep the options."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_option_serving import _record, _serve  # noqa: E402

from tuner.serving.hf import register_transformers, sliding_window_mask  # noqa: E402

# bf16 logits of two implementations that both round once per layer (measured: max |diff| 0.0117 Gemma-2, 0.0098
# gpt-oss): as tests/serving/test_hf.py
LOGIT_TOL = 3e-2
WINDOW = 16
COMMON = dict(vocab_size=320, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=128, max_position_embeddings=1024, sliding_window=WINDOW)


@pytest.fixture
def served_models(tmp_path):
    records = [_record(), _record(("local", "softcap")), _record(("softcap",)), _record(("local", "sinks")),
               _record(("sinks",)), _record(("local", "sinks"), layout="varlen"), _record(("sinks",), layout="varlen"),
               _record(("local", "softcap"), layout="varlen"), _record(("softcap",), layout="varlen")]
    return _serve(tmp_path / "export", records)


def _pair(served, family):
    """(transformers' eager model, ours) with the same random weights; gpt-oss with one expert, so that the
    router cannot turn a rounding difference into another expert's output."""
    name = register_transformers(served)
    if family == "gemma2":
        from transformers import Gemma2Config as Config, Gemma2ForCausalLM as Model

        config = dict(COMMON, intermediate_size=512)
    else:
        from transformers import GptOssConfig as Config, GptOssForCausalLM as Model

        config = dict(COMMON, intermediate_size=256, num_local_experts=1, num_experts_per_tok=1)
    torch.manual_seed(0)
    ref = Model._from_config(Config(**config), attn_implementation="eager").to(torch.bfloat16).eval()
    if family == "gpt-oss":
        with torch.no_grad():
            for layer in ref.model.layers:      # sinks that matter (they start at zero)
                layer.self_attn.sinks.normal_(std=2.0)
    ours = Model._from_config(Config(**config), attn_implementation=name).to(torch.bfloat16).eval()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _same_greedy(ref, ours, ids, **kwargs):
    """Both models generate greedily; where the tokens part, the reference's logits there must have ours' token
    within LOGIT_TOL of its best (a near-tie of random weights that one bf16 rounding tips), else they differ."""
    with torch.no_grad():
        want = ref.generate(ids, do_sample=False, output_logits=True, return_dict_in_generate=True, **kwargs)
        got = ours.generate(ids, do_sample=False, output_logits=True, return_dict_in_generate=True, **kwargs)
    new_want, new_got = want.sequences[:, ids.shape[1]:], got.sequences[:, ids.shape[1]:]
    for row in range(ids.shape[0]):
        differ = (new_want[row] != new_got[row]).nonzero()
        if len(differ):
            step = int(differ[0])
            logits = want.logits[step][row].float()
            assert logits.max() - logits[new_got[row, step]] < LOGIT_TOL, (row, step)
    return new_want, new_got


def _seen(served):
    """The (features, (window, softcap, sinks given)) of every stand-in call."""
    return sorted((s.meta["spec"].get("local", False), s.meta["spec"].get("softcap", False),
                   s.meta["spec"].get("sinks", False), call) for s in served.stand_ins for call in s.seen)


@pytest.mark.parametrize("family", ["gemma2", "gpt-oss"])
def test_every_attention_call_runs_a_kernel_of_its_options(served_models, family):
    ref, ours = _pair(served_models, family)
    ids = torch.randint(0, 320, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(ids).logits.float()
        got = ours(ids).logits.float()
    assert (got - want).abs().max() < LOGIT_TOL
    assert served_models.stats == {"kernel": 2} and not served_models.reasons
    if family == "gemma2":      # layer 0 slides, layer 1 is global; both cap at 50
        assert _seen(served_models) == [(False, True, False, ((-1, -1), 50.0, False)),
                                        (True, True, False, ((WINDOW - 1, 0), 50.0, False))]
    else:
        assert _seen(served_models) == [(False, False, True, ((-1, -1), 0.0, True)),
                                        (True, False, True, ((WINDOW - 1, 0), 0.0, True))]


@pytest.mark.parametrize("family", ["gemma2", "gpt-oss"])
def test_a_left_padded_batch_keeps_its_options_packed(served_models, family):
    """Packed through the varlen kernels built with the options (a window on the local layer; sinks or a cap on
    both), the options reaching them."""
    ref, ours = _pair(served_models, family)
    ids = torch.randint(0, 320, (2, 40), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[0, :7] = 0
    with torch.no_grad():
        want = ref(ids, attention_mask=mask).logits.float()
        got = ours(ids, attention_mask=mask).logits.float()
    assert (got[1] - want[1]).abs().max() < LOGIT_TOL and (got[0, 7:] - want[0, 7:]).abs().max() < LOGIT_TOL
    assert served_models.stats == {"kernel": 2} and served_models.last_reason == "gqa varlen"
    seen = [call for s in served_models.stand_ins if s.meta["spec"].get("layout") == "varlen" for call in s.seen]
    cap, sinks = (50.0, False) if family == "gemma2" else (0.0, True)
    assert sorted(seen) == [((-1, -1), cap, sinks), ((WINDOW - 1, 0), cap, sinks)]


@pytest.mark.parametrize("family", ["gemma2", "gpt-oss"])
def test_a_left_padded_batch_generates_on_the_kernels(served_models, family):
    ref, ours = _pair(served_models, family)
    ids = torch.randint(0, 320, (2, 24), generator=torch.Generator().manual_seed(7))
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[0, :5] = 0
    _same_greedy(ref, ours, ids, attention_mask=mask, max_new_tokens=6)   # (row 1 meets a near-tie at its first token)
    assert served_models.stats == {"kernel": 2 * 6} and not served_models.reasons


@pytest.mark.parametrize("family", ["gemma2", "gpt-oss"])
def test_generation_matches_eager(served_models, family):
    ref, ours = _pair(served_models, family)
    ids = torch.randint(0, 320, (1, 24), generator=torch.Generator().manual_seed(3))
    _same_greedy(ref, ours, ids, max_new_tokens=6)
    if family == "gpt-oss":   # a dynamic cache: the prefill and each step on kernels (Gemma 2's static cache
        assert served_models.stats == {"kernel": 2 * 6}   # materialises its empty tail: the masked fallback)


def test_training_reaches_the_sinks(served_models):
    _, ours = _pair(served_models, "gpt-oss")
    ours.train()
    ids = torch.randint(0, 320, (2, 32), generator=torch.Generator().manual_seed(4))
    ours(ids, labels=ids).loss.backward()
    sinks_grad = ours.model.layers[0].self_attn.sinks.grad
    assert sinks_grad is not None and torch.isfinite(sinks_grad).all() and sinks_grad.abs().sum() > 0
    assert ours.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


def test_only_the_models_sliding_window_skips_the_mask():
    from types import SimpleNamespace

    assert sliding_window_mask(4096, SimpleNamespace(sliding_window=4096))
    assert not sliding_window_mask(None, SimpleNamespace(sliding_window=4096))       # a full layer's causal mask
    assert not sliding_window_mask(8192, SimpleNamespace(attention_chunk_size=8192))  # chunked attention
    assert not sliding_window_mask(64, SimpleNamespace(sliding_window=64, attention_chunk_size=64))
    assert not sliding_window_mask(4096, None)


@pytest.mark.slow   # torch.compile of a model: seconds of Inductor's front end
def test_a_compiled_gemma2_has_no_graph_break_and_no_materialised_mask(served_models):
    ref, ours = _pair(served_models, "gemma2")
    ids = torch.randint(0, 320, (2, 48), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = ref(ids).logits.float()
        assert torch._dynamo.explain(ours)(ids).graph_break_count == 0
        got = torch.compile(ours, fullgraph=True, backend="aot_eager")(ids).logits.float()
    assert (got - want).abs().max() < LOGIT_TOL
    assert not served_models.reasons
