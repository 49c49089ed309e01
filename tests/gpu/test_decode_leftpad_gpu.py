"""FA2's cache_leftpad on the dense decode kernels (marker gpu; skipped elsewhere): the default export
(tuner.defaults.export: the decode gate, its leftpad cases included) of GQA d128 32/8 heads, plain and with a window
and sinks, then ``flash_attn_with_kvcache(..., cache_leftpad=)`` against the fp32 reference on random leftpads (0, the
length - 1, the length: no key), 1 and 4 query tokens, one split and the rule's, on the kernel path with no fallback.
Kernels: prebuilt into the nvcc cache that KERNEL_CACHE_DIR names (.kdec-lp)."""
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs a Hopper (sm_90) GPU")]

from kernel_abi.spec import KernelSpec  # noqa: E402
from tuner.serving import load_exported  # noqa: E402
from tuner.serving.decode_sdpa import decode_reference  # noqa: E402
from tuner.serving.options import ModelOptions  # noqa: E402

SPECS = [KernelSpec("gqa", 128, 128, True, "bf16", "dense", "decode"),
         KernelSpec("gqa", 128, 128, True, "bf16", "dense", "decode", local=True, sinks=True)]
ATOL = 2 ** -6   # bf16 output against fp32; a kernel reading the padding gives NaN or errs by 0.1 or more
HQ, HKV, D = 32, 8, 128


@pytest.fixture(scope="module")
def attn(tmp_path_factory):
    from tuner.defaults.export import export_defaults

    gpu = "h200" if "h200" in torch.cuda.get_device_name().lower() else "h100"
    out = tmp_path_factory.mktemp("decode-leftpad-export")
    cache = os.environ.get("KERNEL_CACHE_DIR") or os.environ.get("TUNER_CACHE_DIR")
    export_defaults(gpu, SPECS, out, cache_dir=Path(cache) if cache else None, study_dir=out.parent / "studies")
    served = load_exported(out)
    assert sorted(c.features for c in served.configs) == [(), ("local", "sinks")]
    return served


def _case(sq, seed):
    """q; a dense cache whose rows before each leftpad and from each length on hold NaN; lengths, leftpads (0, the
    length - 1, the length, random ones) int32."""
    g = torch.Generator().manual_seed(seed)
    lens = [3000, 200, 65, 1500, 129, 4097, 64]
    pads = [0, 199, 65] + [int(torch.randint(0, n, (1,), generator=g)) for n in lens[3:]]
    q = torch.randn(len(lens), sq, HQ, D, generator=g).to("cuda", torch.bfloat16)
    kc = torch.full((len(lens), max(lens) + 7, HKV, D), float("nan"), device="cuda", dtype=torch.bfloat16)
    vc = kc.clone()
    for i, (n, p) in enumerate(zip(lens, pads)):
        kc[i, p:n] = torch.randn(n - p, HKV, D, generator=g).to("cuda", torch.bfloat16)
        vc[i, p:n] = torch.randn(n - p, HKV, D, generator=g).to("cuda", torch.bfloat16)
    as_int = lambda x: torch.tensor(x, dtype=torch.int32, device="cuda")  # noqa: E731
    return q, kc, vc, as_int(lens), as_int(pads)


@pytest.mark.parametrize("options", [False, True], ids=["plain", "window+sinks"])
@pytest.mark.parametrize("sq", [1, 4])
def test_decode_with_a_leftpad_on_the_kernel(attn, sq, options):
    q, kc, vc, lens, pads = _case(sq, seed=sq + 10 * options)
    sinks = torch.tensor([30.0, -30.0] + [0.25 * (i % 7) - 0.75 for i in range(HQ - 2)], device="cuda")
    kwargs = {"window_size": (127, 0), "learnable_sink": sinks} if options else {}
    ref, ref_lse = decode_reference(q.float(), kc.float(), vc.float(), lens, None, True, D ** -0.5,
                                    ModelOptions(kwargs.get("window_size", (-1, -1)), 0.0, kwargs.get("learnable_sink")),
                                    pads)
    for splits in (1, 0):
        attn.reasons.clear()
        out, lse = attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, cache_leftpad=pads, causal=True,
                                                num_splits=splits, return_softmax_lse=True, **kwargs)
        torch.cuda.synchronize()
        assert attn.last_path == "kernel" and not attn.reasons, (attn.last_reason, attn.reasons)
        assert torch.isfinite(out).all()
        assert (out.float() - ref).abs().max().item() <= ATOL
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), finite)
        torch.testing.assert_close(lse[finite], ref_lse[finite], atol=1e-2, rtol=1e-3)
        if not options:   # the sequence whose leftpad is its length has no key: 0 and -inf
            assert not out[2].any() and torch.isinf(lse[2]).all()


def test_a_left_padded_generate_runs_its_decode_steps_on_the_decode_kernel(attn):
    """transformers' generate() over a left-padded batch (Llama-shaped, 32/8 heads of 128, 2 layers): each decode step
    reads the dense cache in place through the decode kernel with the batch's leftpads (the prefill has no varlen
    kernel in this export: it runs SDPA, counted); each decode step's logits are the SDPA model's while the two
    have generated the same tokens."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    from tuner.serving.hf import register_transformers

    name = register_transformers(attn)
    def config():   # one each: a model sets its config's attention implementation
        return LlamaConfig(vocab_size=1000, hidden_size=HQ * D, intermediate_size=512, num_hidden_layers=2,
                           num_attention_heads=HQ, num_key_value_heads=HKV, head_dim=D)

    torch.manual_seed(0)
    ref = LlamaForCausalLM._from_config(config(), attn_implementation="sdpa").to("cuda", torch.bfloat16).eval()
    ours = LlamaForCausalLM._from_config(config(), attn_implementation=name).to("cuda", torch.bfloat16).eval()
    ours.load_state_dict(ref.state_dict())
    ids = torch.randint(0, 1000, (3, 300), device="cuda", generator=torch.Generator(device="cuda").manual_seed(3))
    mask = torch.ones_like(ids)
    mask[0, :57] = 0
    mask[2, :299] = 0                      # one real token
    attn.stats.clear()
    attn.reasons.clear()
    run = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, output_scores=True,
               return_dict_in_generate=True)
    with torch.no_grad():
        want = ref.generate(ids, **run)
        got = ours.generate(ids, **run)
    assert attn.stats["kernel"] == 2 * 4, (attn.stats, attn.reasons)      # 4 decode steps x 2 layers
    assert "decode dense" in attn.last_reason, attn.last_reason
    assert not {"no-decode-config", "inputs-refused", "kernel-unloadable"} & set(attn.reasons), attn.reasons
    new = ids.shape[1]
    for step in range(1, 5):     # step 0 is the prefill's (SDPA in both)
        if not torch.equal(got.sequences[:, new:new + step], want.sequences[:, new:new + step]):
            break
        tol = 0.05 * max(1.0, want.scores[step].abs().max().item())
        assert (got.scores[step].float() - want.scores[step].float()).abs().max().item() < tol, step


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_a_compiled_padded_decode_step_takes_the_decode_kernel(attn, mode):
    """Under torch.compile (and its CUDA graphs) a left-padded decode step has no host read: the padding is taken as
    left padding and the decode kernel reads the cache in place with the leftpads computed on the device; the same
    as the eager call, which reads the mask and checks it is left padding."""
    from tuner.serving.padded import attend_decode_padded

    g = torch.Generator().manual_seed(5)
    b, sk = 3, 700
    q = torch.randn(b, 1, HQ, D, generator=g).to("cuda", torch.bfloat16)
    k, v = (torch.randn(b, sk, HKV, D, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
    kept = torch.ones(b, sk, dtype=torch.bool, device="cuda")
    kept[0, :57] = False
    kept[2, :sk - 1] = False
    eager = attend_decode_padded(attn, q, k, v, kept, None)
    assert eager is not None and "decode dense" in attn.last_reason
    step = torch.compile(lambda q, k, v, kept: attend_decode_padded(attn, q, k, v, kept, None), fullgraph=True,
                         mode=mode)
    before = attn.stats["kernel"]
    for _ in range(3):   # cudagraph trees record on the second call and replay from the third
        out = step(q, k, v, kept)
    torch.cuda.synchronize()
    assert attn.stats["kernel"] > before and "decode dense" in attn.last_reason
    torch.testing.assert_close(out, eager)
