"""The exported kernels inside models, on a Hopper GPU (marker gpu; skipped elsewhere): the custom op under
torch.compile(fullgraph=True), CUDA-graph capture and replay with new inputs (by hand and by torch.compile's
mode="reduce-overhead"), two streams at once,
packed-qkv strides, autograd against the fp32 reference, any softmax scale, a cubin for another GPU
refused, and a Llama-style transformers model whose logits match SDPA's, eager and compiled."""
import os
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs a Hopper (sm_90) GPU")]

from kernel_abi.spec import KernelSpec  # noqa: E402
from tuner.serving import load_exported, sdpa_attention  # noqa: E402

SPECS = [KernelSpec("gqa", 128, 128, True, "bf16"), KernelSpec("gqa", 128, 128, False, "bf16")]
# A bf16 attention output against the fp32 reference: FlashAttention's yardstick, 2x what torch's own bf16
# SDPA errs plus one bf16 rounding step (tuner/measure/verify.py uses the same rule).
ATOL = 2 ** -7


@pytest.fixture(scope="module")
def attn(tmp_path_factory):
    from tuner.defaults.export import export_defaults

    gpu = "h200" if "h200" in torch.cuda.get_device_name().lower() else "h100"
    out = tmp_path_factory.mktemp("export")
    cache = os.environ.get("KERNEL_CACHE_DIR")
    export_defaults(gpu, SPECS, out, cache_dir=Path(cache) if cache else None, study_dir=out.parent / "studies")
    return load_exported(out)


def _qkv(b=2, s=1000, hq=16, hkv=4, d=128, seed=0, grad=False, sk=None):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(b, sk or s, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(b, sk or s, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    if grad:
        for t in (q, k, v):
            t.requires_grad_()
    return q, k, v


def _check(out, q, k, v, causal, scale=None):
    ref = sdpa_attention(q.float(), k.float(), v.float(), causal=causal, softmax_scale=scale)
    lowp = sdpa_attention(q, k, v, causal=causal, softmax_scale=scale).float()
    err = (out.float() - ref).abs().max().item()
    assert torch.isfinite(out).all()
    assert err <= 2 * (lowp - ref).abs().max().item() + ATOL, err


def test_the_op_under_torch_compile_fullgraph(attn):
    def f(q, k, v):
        return attn(q, k, v, causal=True).float() * 0.5

    q, k, v = _qkv()
    explained = torch._dynamo.explain(f)(q, k, v)
    assert explained.graph_break_count == 0
    compiled = torch.compile(f, fullgraph=True)
    before = attn.stats["kernel"]
    out = compiled(q, k, v)
    assert attn.stats["kernel"] == before + 1 and attn.last_path == "kernel"
    _check(out * 2, q, k, v, True)
    dyn = torch.compile(f, fullgraph=True, dynamic=True)
    for s in (300, 2500):
        q, k, v = _qkv(b=1, s=s, seed=s)
        _check(dyn(q, k, v) * 2, q, k, v, True)
        assert attn.last_path == "kernel"


def test_cuda_graph_capture_and_replay_with_new_inputs(attn):
    q, k, v = _qkv(b=1, s=777)
    static = [t.clone() for t in (q, k, v)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            attn(*static, causal=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attn(*static, causal=True)
    assert attn.last_path == "kernel"
    for seed in (1, 2):
        fresh = _qkv(b=1, s=777, seed=seed)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(out, *fresh, True)


def test_torch_compile_with_cuda_graphs_replays_new_inputs(attn):
    """mode="reduce-overhead": torch.compile's CUDA graphs (cudagraph trees) capture the op on a stream of their
    own and replay it with each call's inputs copied in. Nothing the op allocates while captured may outlive
    the capture: a persistent kernel's tile counter for the capture stream once did ("tensor(s) in the
    cudagraph pool not tracked as outputs")."""
    def f(q, k, v):
        return attn(q, k, v, causal=True) * 1.0

    compiled = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    for seed in range(4):                       # warm-up, capture, then replays
        q, k, v = _qkv(b=1, s=777, seed=20 + seed)
        out = compiled(q, k, v).clone()
        torch.cuda.synchronize()
        _check(out, q, k, v, True)
    assert attn.last_path == "kernel"


def test_two_streams_at_once(attn):
    """Persistent kernels keep a tile counter per stream: two launches in flight must not share one."""
    a, b = _qkv(b=4, s=2048, seed=3), _qkv(b=4, s=2048, seed=4)
    attn(*a, causal=True)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    outs = []
    for stream, inputs in ((s1, a), (s2, b)):
        with torch.cuda.stream(stream):
            outs.append([attn(*inputs, causal=True) for _ in range(3)])
    torch.cuda.synchronize()
    for inputs, results in zip((a, b), outs):
        for out in results:
            _check(out, *inputs, True)


def test_packed_qkv_views_reach_the_kernel(attn):
    packed = torch.randn(2, 900, 16 + 2 * 4, 128, device="cuda", dtype=torch.bfloat16)
    q, k, v = packed.split([16, 4, 4], dim=2)
    out = attn(q, k, v, causal=True)
    assert attn.last_path == "kernel", attn.last_reason
    _check(out, q, k, v, True)
    sdpa_layout = attn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, layout="bhsd")
    torch.testing.assert_close(sdpa_layout.transpose(1, 2), out)


@pytest.mark.parametrize("scale", [None, 0.05, 0.3])
def test_any_softmax_scale(attn, scale):
    q, k, v = _qkv(b=1, s=1500, sk=2100, seed=7)
    out = attn(q, k, v, causal=True, softmax_scale=scale)
    assert attn.last_path == "kernel"
    _check(out, q, k, v, True, scale)


@pytest.mark.parametrize("causal", [True, False])
def test_autograd_against_the_fp32_reference(attn, causal):
    q, k, v = _qkv(b=2, s=512, grad=True, seed=11)
    out = attn(q, k, v, causal=causal, softmax_scale=0.1)
    assert attn.last_path == "kernel" and out.grad_fn is not None
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(sdpa_attention(*leaves, causal=causal, softmax_scale=0.1), leaves, grad.float())
    for g, w in zip(got, want):
        assert ((g.float() - w).norm() / w.norm()).item() < 1e-2


def test_a_cubin_for_another_gpu_is_refused_with_the_gpu_named(tmp_path):
    from translate import nvcc
    from tuner.serving.launch import KernelLoadError, load_kernel

    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.f; }\n')
    subprocess.run([str(nvcc.find_nvcc()), "-cubin", "-gencode=arch=compute_80,code=sm_80", "-o",
                    str(tmp_path / "k.cubin"), str(src)], check=True)
    meta = {"abi": 2, "name": "k", "num_threads": 32, "smem_bytes": 0, "block_m": 64, "spec": {}}
    with pytest.raises(KernelLoadError, match=f"sm_80.*{torch.cuda.get_device_name()}.*sm_90"):
        load_kernel(tmp_path / "k.cubin", meta)


def _llama_pair(layers=3):
    transformers = pytest.importorskip("transformers")
    config = dict(vocab_size=2048, hidden_size=1024, intermediate_size=2816, num_hidden_layers=layers,
                  num_attention_heads=8, num_key_value_heads=2, head_dim=128, max_position_embeddings=4096)
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM._from_config(transformers.LlamaConfig(**config), attn_implementation="sdpa")
    ref = ref.to("cuda", torch.bfloat16).eval()
    return transformers, config, ref


def test_a_llama_model_gives_sdpas_logits_eager_and_compiled(attn):
    """The same model, weights and tokens with our attention and with transformers' sdpa, in bf16, against
    the model run in fp32 (sdpa): our logits must err no more than 2x what sdpa's bf16 logits err, plus
    1/64 (FlashAttention's yardstick of tuner/measure/verify.py applied to a whole model), eager and compiled."""
    from tuner.serving.hf import register_transformers

    transformers, config, ref = _llama_pair()
    name = register_transformers(attn)
    ours = transformers.LlamaForCausalLM._from_config(transformers.LlamaConfig(**config), attn_implementation=name)
    ours = ours.to("cuda", torch.bfloat16).eval()
    ours.load_state_dict(ref.state_dict())
    fp32 = transformers.LlamaForCausalLM._from_config(transformers.LlamaConfig(**config), attn_implementation="sdpa")
    fp32 = fp32.to("cuda").eval()
    fp32.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    ids = torch.randint(0, 2048, (2, 1024), device="cuda", generator=torch.Generator(device="cuda").manual_seed(5))
    before = attn.stats["kernel"]
    with torch.no_grad():
        exact = fp32(ids).logits
        sdpa_err = (ref(ids).logits.float() - exact).abs().max().item()
        got = ours(ids).logits.float()
        assert attn.stats["kernel"] == before + 3
        explained = torch._dynamo.explain(ours)(ids)
        assert explained.graph_break_count == 0
        got_compiled = torch.compile(ours, fullgraph=True)(ids).logits.float()
    errors = [(logits - exact).abs().max().item() for logits in (got, got_compiled)]
    print(f"max |logit - fp32 logit|: sdpa bf16 {sdpa_err:.4f}, ours eager {errors[0]:.4f}, compiled {errors[1]:.4f}")
    assert all(e <= 2 * sdpa_err + 1 / 64 for e in errors), (errors, sdpa_err)
    assert "mask" not in attn.reasons


def test_opcheck_with_the_real_kernel(attn):
    """torch.library.opcheck of attn_tuner::attention on the GPU, the route naming the exported kernel."""
    q, k, v = _qkv(b=1, s=300, grad=True)
    route = attn.route(q, k, v, True, 0.1)
    from tuner.serving import op

    assert op._ROUTES[route].config is not None
    torch.library.opcheck(torch.ops.attn_tuner.attention.default, (q, k, v, None, True, 0.1, route),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))
    grad = torch.randn(1, 300, 16, 128, device="cuda", dtype=torch.bfloat16)
    # torch's GPU SDPA backward accumulates dq with atomics: two runs agree to bf16 rounding, not bitwise
    torch.library.opcheck(torch.ops.attn_tuner.attention_backward.default, (grad, q.detach(), k.detach(),
                                                                             v.detach(), None, True, 0.1),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"),
                          atol=2e-2, rtol=2e-2)


def test_descriptor_addresses_are_rewritten_in_place(attn):
    """The driver's encoding of the kernels' TMA descriptors keeps the global address where tuner.serving.launch.tma's probe
    proved it (else every new tensor costs four full encodes: still correct, slower); and a launch on new
    tensors of the same signature reads them."""
    q, k, v = _qkv(b=1, s=640, seed=21)
    out = attn(q, k, v, causal=True)
    route = attn.route(q, k, v, True, 1 / 128 ** 0.5)
    from tuner.serving import op

    entry = op._ROUTES[route].config.kernels[op._ROUTES[route].bucket]
    kernel = attn.kernel(entry, 0)
    maps = [slot for plan in kernel._plans.values() for slot in plan.maps]
    assert maps and all(slot.address_offset is not None for slot in maps), [s.address_offset for s in maps]
    fresh = _qkv(b=1, s=640, seed=22)
    _check(attn(*fresh, causal=True), *fresh, True)
    _check(out, q, k, v, True)
