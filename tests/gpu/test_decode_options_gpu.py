"""Decode kernels built with the options (marker gpu; skipped elsewhere): sliding windows, soft-capping and sinks in
the split-KV decode kernel against the fp32 reference (tuner.serving.options.reference_attention, one sequence at a
time over its gathered keys): windows at 0, 1, the tile size +-1 and longer than the cache, caps of 1 and 50, sink
logits of +-30, 1 and 4 query tokens, lengths 1 to 4097, one split and several, pages shuffled beside NaN pages; a
kernel that drops its window is caught, and a call whose options do not fit the kernel is refused before any launch.
"""
import dataclasses
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8,
                                 reason="needs an sm80+ GPU")]

import tl  # noqa: E402
from hardware_profiles import load_profile  # noqa: E402
from kernel_abi.spec import KernelSpec  # noqa: E402
from tl.options import with_options  # noqa: E402
from translate import nvcc  # noqa: E402
from translate.compiler import generate  # noqa: E402
from translate.decode.params import default_decode_params  # noqa: E402
from tuner.serving.launch.decode_kernel import load_decode_kernel  # noqa: E402
from tuner.serving.options import ModelOptions, reference_attention  # noqa: E402

# (spec, heads q/kv): gpt-oss's local and global layers (d64, 64/8), Mistral v0.1's window (d128), Gemma 2's local
# layers (d256, window + cap 50) on a dense cache
SPECS = {
    "gptoss_local": (KernelSpec("gqa", 64, 64, True, "bf16", "paged", "decode", local=True, sinks=True), 16, 2),
    "gptoss_global": (KernelSpec("gqa", 64, 64, True, "bf16", "paged", "decode", sinks=True), 16, 2),
    "mistral_window": (KernelSpec("gqa", 128, 128, True, "bf16", "paged", "decode", local=True), 8, 2),
    "gemma2_local": (KernelSpec("gqa", 256, 256, True, "bf16", "dense", "decode", local=True, softcap=True), 4, 2),
}
ATOL = 2 ** -6   # bf16 output against fp32: a dropped window, cap or sink errs by 0.1 or more
PAGE = 16


def _profile():
    name = torch.cuda.get_device_name().lower()
    return load_profile("h200" if "h200" in name else "h100" if "h100" in name else "a100")


def _generated(spec, heads_q, profile):
    program = with_options(tl.parse_program(tl.load_sketch(spec.variant, spec.causal, "decode", spec.layout)),
                           local=spec.local, softcap=spec.softcap, sinks=spec.sinks)
    return generate(program, default_decode_params(spec, heads_q, profile), profile, spec)


def _load(gen, profile):
    cache = os.environ.get("KERNEL_CACHE_DIR")
    result = nvcc.compile_kernel(gen, profile.nvcc_arch, cache_dir=Path(cache) if cache else nvcc.default_cache_dir())
    assert result.ok, result.log[-2000:]
    return load_decode_kernel(result.cubin, gen.meta())


@pytest.fixture(scope="module")
def kernels():
    profile = _profile()
    return {name: (_load(_generated(spec, hq, profile), profile), spec, hq, hkv)
            for name, (spec, hq, hkv) in SPECS.items()}


def _call_inputs(spec, hq, hkv, lens, sq, seed):
    """q, the caches (paged: shuffled pages, the unused ones NaN), lengths, table, and per-sequence dense keys."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    d, b = spec.d_qk, len(lens)
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    cap = max(lens)
    if spec.layout == "paged":
        per = (cap + PAGE - 1) // PAGE
        pages = b * per + 3
        k = torch.full((pages, PAGE, hkv, d), float("nan"), device="cuda", dtype=torch.bfloat16)
        v = torch.full_like(k, float("nan"))
        order = torch.randperm(pages, device="cuda", generator=g)[:b * per].view(b, per).to(torch.int32)
        dense_k = torch.randn(b, per * PAGE, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
        dense_v = torch.randn(b, per * PAGE, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
        for i in range(b):
            for p in range((lens[i] + PAGE - 1) // PAGE):
                k[order[i, p]] = dense_k[i, p * PAGE:(p + 1) * PAGE]
                v[order[i, p]] = dense_v[i, p * PAGE:(p + 1) * PAGE]
        table = order
    else:
        dense_k = torch.randn(b, cap, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
        dense_v = torch.randn(b, cap, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v, table = dense_k, dense_v, None
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    return q, k, v, seqlens, table, dense_k, dense_v


def _reference(q, dense_k, dense_v, lens, causal, scale, options):
    outs = []
    for i, n in enumerate(lens):
        outs.append(reference_attention(q[i:i + 1].float(), dense_k[i:i + 1, :n].float(), dense_v[i:i + 1, :n].float(),
                                        causal, scale, options))
    return torch.cat(outs)


def _cases(spec, hq):
    """(lens, seqlen_q, window, softcap, sinks or None, num_splits) over the spec's options."""
    g = torch.Generator(device="cuda").manual_seed(7)
    sink_sets = [None]
    if spec.sinks:
        sink_sets = [torch.randn(hq, device="cuda", generator=g) * 2,
                     torch.full((hq,), 30.0, device="cuda") * torch.tensor([1.0, -1.0], device="cuda").repeat(hq // 2)]
    windows = [(-1, -1)]
    if spec.local:
        windows = [(0, 0), (1, 0), (63, 0), (64, 0), (65, 0), (127, 0), (4096, 0), (8000, 0)]
    caps = [1.0, 50.0] if spec.softcap else [0.0]
    cases = []
    for i, window in enumerate(windows):
        for j, cap in enumerate(caps):
            for k, sinks in enumerate(sink_sets):
                lens = [(1, 700, 4097), (65, 2000, 129)][(i + j + k) % 2]
                sq = 4 if (i + k) % 3 == 1 else 1
                splits = (1, 3, 0)[(i + j + k) % 3]
                cases.append((list(lens), sq, window, cap, sinks, splits))
    return cases


@pytest.mark.parametrize("name", list(SPECS))
def test_decode_options_match_the_reference(kernels, name):
    kernel, spec, hq, hkv = kernels[name]
    scale = spec.d_qk ** -0.5
    for n, (lens, sq, window, cap, sinks, splits) in enumerate(_cases(spec, hq)):
        q, k, v, seqlens, table, dense_k, dense_v = _call_inputs(spec, hq, hkv, lens, sq, seed=n)
        out = kernel(q, k, v, seqlens, table, softmax_scale=scale, num_splits=splits or None, window_size=window,
                     softcap=cap, learnable_sink=sinks)
        ref = _reference(q, dense_k, dense_v, lens, True, scale, ModelOptions(window, cap, sinks))
        assert torch.isfinite(out).all(), (name, lens, sq, window, cap, splits)
        err = (out.float() - ref.float()).abs().max().item()
        assert err <= ATOL, (name, lens, sq, window, cap, None if sinks is None else sinks[:2].tolist(), splits, err)


@pytest.fixture(scope="module")
def windowless():
    """The window kernel's source with its window switched off."""
    profile = _profile()
    spec, hq, hkv = SPECS["mistral_window"]
    gen = _generated(spec, hq, profile)
    wrong = dataclasses.replace(gen, body=gen.body.replace("kLocal = true", "kLocal = false"), name=gen.name + "_x")
    wrong = dataclasses.replace(wrong, body=wrong.body.replace(gen.name, wrong.name))
    return _load(wrong, profile)


def test_a_kernel_that_drops_its_window_is_caught(windowless):
    """The test is not blind: the window kernel's source with its window switched off errs past the bound."""
    kernel = windowless
    spec, hq, hkv = SPECS["mistral_window"]
    lens, scale = [700, 2000], spec.d_qk ** -0.5
    q, k, v, seqlens, table, dense_k, dense_v = _call_inputs(spec, hq, hkv, lens, 1, seed=3)
    out = kernel(q, k, v, seqlens, table, softmax_scale=scale, window_size=(64, 0))
    ref = _reference(q, dense_k, dense_v, lens, True, scale, ModelOptions((64, 0), 0.0, None))
    assert (out.float() - ref.float()).abs().max().item() > 0.05


def test_options_that_do_not_fit_the_kernel_are_refused(kernels):
    kernel, spec, hq, hkv = kernels["mistral_window"]
    q, k, v, seqlens, table, _, _ = _call_inputs(spec, hq, hkv, [100, 200], 1, seed=1)
    with pytest.raises(ValueError, match="no soft-capping"):
        kernel(q, k, v, seqlens, table, window_size=(64, 0), softcap=50.0)
    with pytest.raises(ValueError, match="no sinks"):
        kernel(q, k, v, seqlens, table, learnable_sink=torch.zeros(hq, device="cuda"))
    sinks_kernel, sspec, shq, shkv = kernels["gptoss_global"]
    q, k, v, seqlens, table, _, _ = _call_inputs(sspec, shq, shkv, [100, 200], 1, seed=2)
    with pytest.raises(ValueError, match="learnable_sink"):
        sinks_kernel(q, k, v, seqlens, table)
    with pytest.raises(ValueError, match="learnable_sink must be"):
        sinks_kernel(q, k, v, seqlens, table, learnable_sink=torch.zeros(shq + 1, device="cuda"))


def test_the_decode_gate_passes_the_option_kernels_and_fails_the_windowless_one(kernels, windowless):
    """tuner.measure.verify_decode with its option cases (what `tune build`/`tune bench --phase decode` and a
    decode campaign run): every kernel built with options passes, the one that ignores its window does not."""
    from tuner.measure.verify_decode import verify_decode

    for name, (kernel, spec, _, _) in kernels.items():
        report = verify_decode(kernel, spec, page_size=PAGE)
        assert report.passed, (name, report.reason)
    report = verify_decode(windowless, SPECS["mistral_window"][0], page_size=PAGE)
    assert not report.passed and "window" in report.reason, report.reason
