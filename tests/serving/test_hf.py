"""The transformers integration on the CPU: a small Llama-style model (GQA, d128) from a config with random
weights gives the same logits with our attention as with transformers' sdpa, eager and compiled, with no
graph break; masks and decode steps take the paths the module docstring states."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from tuner.serving.hf import register_transformers  # noqa: E402

# bf16 logits of two implementations that both compute attention in fp32 and round once: the same up to the
# rounding of the activations between layers (measured here: max |diff| 0.0078, one bf16 ulp at |x| ~ 1-2)
LOGIT_TOL = 3e-2


def _models(served, layers=2):
    from transformers import LlamaConfig, LlamaForCausalLM

    name = register_transformers(served)
    config = dict(vocab_size=320, hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=128, max_position_embeddings=1024)
    torch.manual_seed(0)
    ref = LlamaForCausalLM._from_config(LlamaConfig(**config), attn_implementation="sdpa").to(torch.bfloat16).eval()
    ours = LlamaForCausalLM._from_config(LlamaConfig(**config), attn_implementation=name).to(torch.bfloat16).eval()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


@pytest.mark.slow   # torch.compile of a model: seconds of Inductor
def test_logits_match_sdpa_eager_and_compiled_without_graph_breaks(served):
    ref, ours = _models(served)
    ids = torch.randint(0, 320, (2, 96), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(ids).logits.float()
        got = ours(ids).logits.float()
        assert served.stats == {"kernel": 2}                # one call per layer, the kernel each time
        assert (got - want).abs().max() < LOGIT_TOL
        explained = torch._dynamo.explain(ours)(ids)
        assert explained.graph_break_count == 0
        compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")
        got_compiled = compiled(ids).logits.float()
    assert (got_compiled - want).abs().max() < LOGIT_TOL
    assert served.reasons == {}                             # compiled too: no mask was materialised


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_batch_runs_the_packed_kernels(served, side):
    ref, ours = _models(served)
    ids = torch.randint(0, 320, (2, 40), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 40, dtype=torch.long)
    real = slice(7, None) if side == "left" else slice(None, 33)
    mask[0] = 0
    mask[0, real] = 1
    with torch.no_grad():
        want = ref(ids, attention_mask=mask).logits.float()
        got = ours(ids, attention_mask=mask).logits.float()
    assert (got[1] - want[1]).abs().max() < LOGIT_TOL and (got[0, real] - want[0, real]).abs().max() < LOGIT_TOL
    assert served.stats == {"kernel": 2} and not served.reasons     # the varlen kernel, once per layer
    assert served.last_reason == "gqa varlen"
    with torch.no_grad():
        ours(ids, attention_mask=torch.ones(2, 40, dtype=torch.long))   # all ones: no padding, the dense kernel
    assert served.last_reason == "gqa"


def test_padding_inside_a_sequence_runs_sdpa_with_the_mask(served):
    ref, ours = _models(served)
    ids = torch.randint(0, 320, (2, 40), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[0, 10:14] = 0
    with torch.no_grad():
        want = ref(ids, attention_mask=mask).logits.float()
        got = ours(ids, attention_mask=mask).logits.float()
    assert (got[1] - want[1]).abs().max() < LOGIT_TOL and (got[0, 14:] - want[0, 14:]).abs().max() < LOGIT_TOL
    assert served.reasons == {"mask": 2} and "kernel" not in served.stats


def test_a_left_padded_batch_generates_on_the_kernels(served):
    ref, ours = _models(served)
    ids = torch.randint(0, 320, (2, 24), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[1, :9] = 0
    with torch.no_grad():
        want = ref.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
        got = ours.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    assert torch.equal(got, want)
    assert served.stats == {"kernel": 2 * 6} and not served.reasons   # the prefill and 5 steps, packed


@pytest.mark.slow   # torch.compile of a model
def test_a_padded_batch_compiles_without_graph_breaks(served):
    ref, ours = _models(served)
    ids = torch.randint(0, 320, (2, 48), generator=torch.Generator().manual_seed(6))
    mask = torch.ones(2, 48, dtype=torch.long)
    mask[0, :11] = 0
    with torch.no_grad():
        want = ref(ids, attention_mask=mask).logits.float()
        assert torch._dynamo.explain(ours)(ids, attention_mask=mask).graph_break_count == 0
        got = torch.compile(ours, fullgraph=True, backend="aot_eager")(ids, attention_mask=mask).logits.float()
    assert (got[1] - want[1]).abs().max() < LOGIT_TOL and (got[0, 11:] - want[0, 11:]).abs().max() < LOGIT_TOL
    assert not served.reasons


def test_generation_decodes_with_the_kernels(served):
    ref, ours = _models(served)
    ids = torch.randint(0, 320, (1, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = ref.generate(ids, max_new_tokens=6, do_sample=False)
        got = ours.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(got, want)
    assert served.stats["kernel"] == 2 * 6 and "sdpa" not in served.stats   # prefill + 5 decode steps, 2 layers


def test_training_step_differentiates_through_the_op(served):
    _, ours = _models(served)
    ours.train()
    ids = torch.randint(0, 320, (2, 32), generator=torch.Generator().manual_seed(4))
    loss = ours(ids, labels=ids).loss
    loss.backward()
    grads = [p.grad for p in ours.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert ours.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
