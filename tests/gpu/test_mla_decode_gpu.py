"""MLA absorbed decode on a GPU (marker gpu; skipped elsewhere): the split-d_v kernels of the MLA decode sketches
(tl/sketches/decode/mla_{paged,dense}.tl, V read from the latent cache's first 512 columns) pass the decode gate
(tuner/measure/verify_decode.py: 128 and 16 heads, KV lengths 1/63/64/65/4097, uneven batches, shuffled 64-token pages
beside NaN pages, NaN workspace, forced split counts, 1..16 causal query tokens, v_cache None or the view of K), a
kernel that drops the causal mask is caught, and a separate V tensor or more than one KV head is refused. On Hopper
the wgmma variants (DecodeParams.mma = "sm90_wgmma", translate/include/attn_decode_sm90.cuh, and "sm90_seesaw", its
warpgroups out of step: attn_decode_sm90_seesaw.cuh) pass the same gate: the 64-row tile serves 128 heads and,
padded, 16; with kv_load tma (whole tiles as TMA boxes) at pages of 64, 128 and 16 (gathered) and on dense
caches."""
import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8,
                                 reason="needs an sm80+ GPU")]

from test_decode_gpu import kernel_for, profile_here  # noqa: E402
from translate import nvcc  # noqa: E402
from translate.decode import DecodeParams, default_decode_params  # noqa: E402
from kernel_abi.spec import KernelSpec  # noqa: E402
from tuner.serving.launch.decode_kernel import load_decode_kernel  # noqa: E402
from tuner.measure.verify_decode import MLA_HEADS, DecodeCase, verify_decode  # noqa: E402

PAGED = KernelSpec("mla", 576, 512, True, "bf16", "paged", "decode")
CASES = [
    ("paged_h128_default", PAGED, default_decode_params(PAGED, 128)),
    ("paged_h16_default", PAGED, default_decode_params(PAGED, 16)),
    ("dense_h128_default", dataclasses.replace(PAGED, layout="dense"), default_decode_params(PAGED, 128)),
    ("paged_noncausal_fp16_bn32_s3", KernelSpec("mla", 576, 512, False, "fp16", "paged", "decode"),
     DecodeParams(block_m=64, block_n=32, warps_m=4, warps_n=2, kv_stages=3)),
    ("paged_w4x4", PAGED, DecodeParams(block_m=64, block_n=64, warps_m=4, warps_n=4, kv_stages=2)),
]
WGMMA = dataclasses.replace(default_decode_params(PAGED, 128), mma="sm90_wgmma")
WGMMA_CASES = [
    ("wgmma_paged", PAGED, WGMMA),
    ("wgmma_dense", dataclasses.replace(PAGED, layout="dense"), WGMMA),
    ("wgmma_paged_noncausal_fp16", KernelSpec("mla", 576, 512, False, "fp16", "paged", "decode"), WGMMA),
]
SEESAW = dataclasses.replace(WGMMA, mma="sm90_seesaw")
WGMMA_CASES += [
    ("seesaw_paged", PAGED, SEESAW),
    ("seesaw_dense", dataclasses.replace(PAGED, layout="dense"), SEESAW),
    ("seesaw_paged_noncausal_fp16", KernelSpec("mla", 576, 512, False, "fp16", "paged", "decode"), SEESAW),
]
SEESAW_TMA = dataclasses.replace(SEESAW, kv_load="tma")
WGMMA_CASES += [
    ("seesaw_tma_paged", PAGED, SEESAW_TMA),
    ("seesaw_tma_dense", dataclasses.replace(PAGED, layout="dense"), SEESAW_TMA),
    ("seesaw_tma_paged_noncausal_fp16", KernelSpec("mla", 576, 512, False, "fp16", "paged", "decode"), SEESAW_TMA),
]
# the conditional rescale (the Hopper default for 128 heads), on TMA tiles and on gathered ones; the gate's growing
# keys (verify_decode key_growth) move the max past the threshold every few tiles
SEESAW_RESCALE = dataclasses.replace(SEESAW_TMA, rescale_threshold=8)
WGMMA_CASES += [
    ("seesaw_rescale_tma_paged", PAGED, SEESAW_RESCALE),
    ("seesaw_rescale_tma_dense_noncausal_fp16", KernelSpec("mla", 576, 512, False, "fp16", "dense", "decode"),
     SEESAW_RESCALE),
    ("seesaw_rescale_gather_paged", PAGED, dataclasses.replace(SEESAW, rescale_threshold=8)),
]
hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                            reason="the wgmma kernel needs an sm90 GPU")


def compile_and_load(gk, profile):
    result = nvcc.compile_kernel(gk, profile.nvcc_arch, cache_dir=nvcc.default_cache_dir())
    assert result.ok, result.log[-2000:]
    assert result.spill_stores == 0, f"{gk.name} spills {result.spill_stores} B"
    return load_decode_kernel(result.cubin, gk.meta())


@pytest.mark.parametrize("name,spec,params", CASES, ids=[c[0] for c in CASES])
def test_mla_decode_kernels_pass_the_gate(name, spec, params):
    profile = profile_here()
    k = compile_and_load(kernel_for(spec, params, profile), profile)
    # kv_load tma: pages of one tile and of two by TMA, pages of 16 gathered by the same kernel
    pages = (64, 128, 16) if params.kv_load == "tma" else (64, 16)
    for page in (pages if spec.layout == "paged" else (None,)):
        report = verify_decode(k, spec, page_size=page)
        assert report.passed, report.reason


@hopper
@pytest.mark.parametrize("name,spec,params", WGMMA_CASES, ids=[c[0] for c in WGMMA_CASES])
def test_wgmma_mla_decode_kernels_pass_the_gate(name, spec, params):
    # verify_decode's MLA cases run 128 heads and 16 (one padded 64-row tile), pages of 64 and 16
    test_mla_decode_kernels_pass_the_gate(name, spec, params)


@hopper
def test_the_rescale_moves_the_max_where_keys_grow_and_a_stuck_one_is_caught():
    # a threshold no tile exceeds keeps the first tile's max (exact while P = exp2(S - m) stays finite): with keys
    # grown 31-fold over one CTA's 4097 keys the scores rise by ~180 log2 units and P overflows; the kernel that
    # moves its max past 8 units stays finite and accurate, and both pass unit-normal keys
    profile = profile_here()
    gk = kernel_for(PAGED, SEESAW_RESCALE, profile)
    good = compile_and_load(gk, profile)
    stuck = compile_and_load(_broken(gk, "kRescaleThreshold = 8;", "kRescaleThreshold = 100000;", "_stuck"), profile)
    plain, grown = DecodeCase((4097, 65), heads=MLA_HEADS), DecodeCase((4097, 65), num_splits=1, heads=MLA_HEADS,
                                                                       key_growth=30.0)
    assert verify_decode(stuck, PAGED, cases=[plain]).passed
    assert verify_decode(good, PAGED, cases=[grown]).passed
    report = verify_decode(stuck, PAGED, cases=[grown])
    assert not report.passed and "NaN/Inf" in report.reason, report.reason


@hopper
@pytest.mark.parametrize("params", [WGMMA, SEESAW], ids=["wgmma", "seesaw"])
def test_a_wgmma_kernel_that_drops_the_causal_mask_is_caught(params):
    profile = profile_here()
    gk = kernel_for(PAGED, params, profile)
    k = compile_and_load(_broken(gk, "kCausal = true", "kCausal = false", "_nomask"), profile)
    report = verify_decode(k, PAGED, cases=[DecodeCase((700, 16, 9), seqlen_q=4, heads=MLA_HEADS)])
    assert not report.passed and "error" in report.reason


def _broken(gk, old, new, tag):
    assert old in gk.body
    wrong = dataclasses.replace(gk, body=gk.body.replace(old, new), name=gk.name + tag)
    return dataclasses.replace(wrong, body=wrong.body.replace(gk.name, wrong.name))


def test_a_kernel_that_drops_the_causal_mask_is_caught():
    profile = profile_here()
    gk = kernel_for(PAGED, default_decode_params(PAGED, 128), profile)
    k = compile_and_load(_broken(gk, "kCausal = true", "kCausal = false", "_nomask"), profile)
    report = verify_decode(k, PAGED, cases=[DecodeCase((700, 16, 9), seqlen_q=4, heads=MLA_HEADS)])
    assert not report.passed and "error" in report.reason


def test_a_separate_v_tensor_and_wrong_heads_are_refused():
    profile = profile_here()
    k = compile_and_load(kernel_for(PAGED, default_decode_params(PAGED, 16), profile), profile)
    q = torch.randn(2, 1, 16, 576, device="cuda", dtype=torch.bfloat16)
    cache = torch.randn(4, 64, 1, 576, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([70, 30], dtype=torch.int32, device="cuda")
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="first 512 columns"):
        k(q, cache, cache[..., :512].clone(), lens, table)
    with pytest.raises(ValueError, match="one latent KV head"):
        two = torch.randn(4, 64, 2, 576, device="cuda", dtype=torch.bfloat16)
        k(torch.randn(2, 1, 16, 576, device="cuda", dtype=torch.bfloat16), two, None, lens, table)
    a = k(q, cache, None, lens, table)
    b = k(q, cache, cache[..., :512], lens, table)
    assert a.shape == (2, 1, 16, 512) and torch.equal(a, b)


@hopper
def test_the_tma_kernel_follows_each_calls_cache_and_replays_in_a_cuda_graph():
    """kv_load tma: the launch writes the call's cache address into the descriptor (tuner/serving/launch/decode_kernel.py KMap), so
    two caches of one shape, called in turn, each give their own result; a captured graph replays the descriptor it
    captured, reading the cache's new contents."""
    from tuner.measure.decode import MLAPoint, make_mla_inputs
    from tuner.serving.decode_sdpa import decode_reference

    profile = profile_here()
    k = compile_and_load(kernel_for(PAGED, SEESAW_TMA, profile), profile)
    point = MLAPoint(batch=3, kv_len=1000, heads_q=128)
    xs = [make_mla_inputs(point, seed=s) for s in (1, 2)]
    assert xs[0]["k"].shape == xs[1]["k"].shape and xs[0]["k"].data_ptr() != xs[1]["k"].data_ptr()

    def call(x, out=None):
        return k(x["q"], x["k"], None, cache_seqlens=x["seqused_k"], page_table=x["page_table"], out=out)

    def check(out, x):
        ref, _ = decode_reference(x["q"].float(), x["k"].float(), x["k"][..., :512].float(), x["seqused_k"],
                                  x["page_table"], causal=True)
        assert (out.float() - ref.float()).abs().max().item() <= 2e-2

    for x in (xs[0], xs[1], xs[0]):   # one plan, its descriptor re-pointed per call
        check(call(x), x)
    x = xs[0]
    out = torch.empty(3, 1, 128, 512, device="cuda", dtype=torch.bfloat16)
    call(x, out)   # the plan exists before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(x, out)
    x["k"].copy_(torch.randn_like(x["k"]))
    x["q"].copy_(torch.randn_like(x["q"]))
    graph.replay()
    torch.cuda.synchronize()
    check(out, x)
