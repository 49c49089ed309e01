"""Decode kernels built with options served through an export (marker gpu; skipped elsewhere): the default export
(tuner.defaults.export: `tune build --phase decode`'s kernels, the decode gate with its option cases, a record per
decode bucket) of gpt-oss's local layers (d64, a window and sinks; paged and dense) and Gemma 2's (d256, a window
and a cap of 50; dense), then ``flash_attn_with_kvcache`` with those options against the fp32 reference (out and
lse), on the kernel path with no fallback counted, eager and under torch.compile(fullgraph=True)."""
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


def _spec(d, layout, *features):
    return KernelSpec("gqa", d, d, True, "bf16", layout, "decode", **{f: True for f in features})


SPECS = [_spec(64, "paged", "local", "sinks"), _spec(64, "dense", "local", "sinks"),
         _spec(256, "dense", "local", "softcap")]
ATOL = 2 ** -6   # bf16 output against fp32: a dropped window, cap or sink errs by 0.1 or more
PAGE = 16


@pytest.fixture(scope="module")
def attn(tmp_path_factory):
    from tuner.defaults.export import export_defaults

    gpu = "h200" if "h200" in torch.cuda.get_device_name().lower() else "h100"
    out = tmp_path_factory.mktemp("decode-options-export")
    cache = os.environ.get("KERNEL_CACHE_DIR") or os.environ.get("TUNER_CACHE_DIR")
    export_defaults(gpu, SPECS, out, cache_dir=Path(cache) if cache else None, page_sizes=(PAGE,),
                    study_dir=out.parent / "studies")
    served = load_exported(out)
    assert sorted((c.layout, c.d_qk, c.features) for c in served.configs) == [
        ("dense", 64, ("local", "sinks")), ("dense", 256, ("local", "softcap")), ("paged", 64, ("local", "sinks"))]
    assert all(c.phase == "decode" for c in served.configs)
    return served


def _case(lens, sq, hq, hkv, d, paged, seed):
    """q, the cache (paged: shuffled pages, the spare ones and every row past a length NaN; dense: NaN past each
    length), int32 lengths, the table or None."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    b = len(lens)
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    if not paged:
        kc = torch.full((b, max(lens) + 3, hkv, d), float("nan"), device="cuda", dtype=torch.bfloat16)
        vc = kc.clone()
        for i, n in enumerate(lens):
            kc[i, :n] = torch.randn(n, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
            vc[i, :n] = torch.randn(n, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
        return q, kc, vc, torch.tensor(lens, dtype=torch.int32, device="cuda"), None
    counts = [-(-n // PAGE) for n in lens]
    order = torch.randperm(sum(counts) + 5, generator=torch.Generator().manual_seed(seed)).tolist()
    kc = torch.full((len(order), PAGE, hkv, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    vc = kc.clone()
    table = torch.zeros(b, max(counts), dtype=torch.int32)
    at = 0
    for i, n in enumerate(lens):
        for j in range(counts[i]):
            table[i, j], at = order[at], at + 1
            rows = min(PAGE, n - j * PAGE)
            kc[table[i, j], :rows] = torch.randn(rows, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
            vc[table[i, j], :rows] = torch.randn(rows, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, kc, vc, torch.tensor(lens, dtype=torch.int32, device="cuda"), table.cuda()


def _sinks(hq):
    return torch.tensor([30.0, -30.0] + [0.5 * (i % 5) - 1.0 for i in range(hq - 2)], device="cuda")


def _check(attn, out, lse, q, kc, vc, lens, table, window, softcap=0.0, sinks=None):
    assert attn.last_path == "kernel" and not attn.reasons, (attn.last_reason, attn.reasons)
    ref, ref_lse = decode_reference(q.float(), kc.float(), vc.float(), lens, table, True, q.shape[-1] ** -0.5,
                                    ModelOptions(window, softcap, None if sinks is None else sinks.float()))
    assert torch.isfinite(out).all()
    assert (out.float() - ref).abs().max().item() <= ATOL
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    torch.testing.assert_close(lse[finite], ref_lse[finite], atol=1e-2, rtol=1e-3)


@pytest.mark.parametrize("paged", [True, False], ids=["paged", "dense"])
@pytest.mark.parametrize("sq", [1, 4])
def test_gpt_oss_local_layers_decode_on_the_kernel(attn, paged, sq):
    """16 query heads over 2 KV heads of 64, window 127 (a 128-key sliding window), sinks of +-30 beside small ones;
    lengths shorter than the window, at a tile's edge and much longer; one split and the rule's."""
    q, kc, vc, lens, table = _case([1, 64, 3000, 129], sq, 16, 2, 64, paged, seed=sq + 10 * paged)
    sinks = _sinks(16)
    for splits in (1, 0):
        attn.reasons.clear()
        out, lse = attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True,
                                                window_size=(127, 0), learnable_sink=sinks, num_splits=splits,
                                                return_softmax_lse=True)
        _check(attn, out, lse, q, kc, vc, lens, table, (127, 0), sinks=sinks)


@pytest.mark.parametrize("window", [(63, 0), (64, 0), (4095, 0)])
def test_gemma2_local_layers_decode_on_the_kernel(attn, window):
    """16 query heads over 8 KV heads of 256, scores capped at 50, a window at a 64-key tile's edges and Gemma 2's
    4096-key one, over caches longer than it."""
    q, kc, vc, lens, table = _case([5000, 1, 300], 2, 16, 8, 256, False, seed=window[0])
    out, lse = attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, window_size=window,
                                            softcap=50.0, return_softmax_lse=True)
    _check(attn, out, lse, q, kc, vc, lens, None, window, softcap=50.0)


def test_decode_with_options_under_torch_compile_fullgraph(attn):
    def step(q, kc, vc, lens, table, sinks):
        out, lse = attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True,
                                                window_size=(127, 0), learnable_sink=sinks, return_softmax_lse=True)
        return out.float() * 0.5, lse

    args = (*_case([300, 4000, 1], 2, 16, 2, 64, True, seed=21), _sinks(16))
    assert torch._dynamo.explain(step)(*args).graph_break_count == 0
    compiled = torch.compile(step, fullgraph=True)
    attn.reasons.clear()
    before = attn.stats["kernel"]
    out, lse = compiled(*args)
    assert attn.stats["kernel"] == before + 1
    _check(attn, (out * 2).to(torch.bfloat16), lse, *args[:5], (127, 0), sinks=args[5])
