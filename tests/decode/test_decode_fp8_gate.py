"""The decode gate over an FP8 (e4m3) KV cache (tuner/measure/verify_decode.py, no GPU): its cases (both scale
kinds, 1000x amplitudes across KV heads, values near 448 x scale, lengths 1..4097, poisoned pages), and a stand-in
kernel on the CPU (the fp32 reference on the dequantised cache) that passes them while one that ignores k_scale or
v_scale, or dequantises with the wrong head's scale, fails."""
import pytest

from kernel_abi.spec import KernelSpec

SPEC = KernelSpec("gqa", 128, 128, True, "bf16", "paged", "decode", kv_dtype="fp8")


def test_fp8_cases_cover_both_scale_kinds_the_spread_and_e4m3s_top():
    from tuner.measure.verify_decode import CHECK_CASES, FP8_SPREAD, check_cases

    cases = check_cases(SPEC)
    assert all(c.kv_scale in ("tensor", "head") for c in cases)
    assert {c.kv_scale for c in cases if c.kv_spread == FP8_SPREAD} == {"tensor", "head"}
    assert {c.kv_scale for c in cases if c.near_max} == {"tensor", "head"}
    lens = {n for c in cases for n in c.cache_seqlens}
    assert {1, 63, 64, 65, 4097} <= lens
    assert {1, 3} <= {c.num_splits for c in cases} and None in {c.num_splits for c in cases}
    assert any(c.heads == (32, 8) and c.kv_scale == "head" and c.kv_spread == FP8_SPREAD for c in cases)
    assert len(cases) > len(CHECK_CASES)
    assert all(not c.kv_scale for c in check_cases(KernelSpec("gqa", 128, 128, True, "bf16", "paged", "decode")))
    dense = check_cases(KernelSpec("gqa", 128, 128, True, "bf16", "dense", "decode", kv_dtype="fp8"))
    assert any(c.leftpad is not None and c.kv_scale for c in dense)


def test_an_fp8_kernel_with_options_gets_them_in_every_case():
    """A kernel built with soft-capping and sinks refuses a call without them: the FP8 cases added to the option
    cases (values near 448, llama3-8b's heads) carry them too, and windows where it is local."""
    import dataclasses

    from tuner.measure.verify_decode import check_cases

    spec = dataclasses.replace(SPEC, local=True, softcap=True, sinks=True)
    cases = check_cases(spec)
    assert all(c.softcap > 0 and c.sinks for c in cases)
    assert any(c.near_max for c in cases) and any(c.heads == (32, 8) for c in cases)
    assert len({c.window for c in cases if c.near_max or c.heads == (32, 8)}) > 1


def test_the_fp8_cache_holds_the_quantised_values_and_poisons_the_unused_pages():
    import torch

    from tuner.measure.verify_decode import DecodeCase, _build_cache, fp8_amplitudes

    gen = torch.Generator().manual_seed(1)
    case = DecodeCase((5, 40), kv_scale="head", kv_spread=1000.0, near_max=True)
    fp8 = fp8_amplitudes(case, 2, gen, "cpu")
    amps, ks, vs = fp8
    assert float(amps.max() / amps.min()) == pytest.approx(1000.0, rel=1e-4)
    k, v, table, lens, seqs = _build_cache(case, 2, 128, 128, torch.bfloat16, True, 16, gen, "cpu", fp8=fp8)
    assert k.dtype == torch.float8_e4m3fn and v.dtype == torch.float8_e4m3fn
    used = set(table[0, :1].tolist()) | set(table[1, :3].tolist())
    unused = [p for p in range(k.shape[0]) if p not in used]
    assert unused and all(bool(k[p].float().isnan().all()) for p in unused)
    # near 448: most bytes at the top two binades of e4m3 ([128, 448]); the reference is the dequantised cache
    page = int(table[1, 0])
    top = (k[page].float().abs() >= 128).float().mean()
    assert float(top) > 0.5 and float(k[page].float().abs().max()) <= 448
    assert torch.equal(seqs[1][0][:16], k[page].float() * ks[None, :, None])


class _StandIn:
    """An FP8 cache decode kernel on the CPU: the fp32 reference on the cache dequantised with its scales, or with a
    planted bug (``bug``: "k_scale" or "v_scale" ignored, or "heads": the per-head scales reversed)."""

    def __init__(self, bug=None):
        self.bug = bug

    def split_plan(self, batch, heads_q, heads_kv, seqlen_q, capacity, num_splits=None):
        from types import SimpleNamespace

        return SimpleNamespace(num_splits=num_splits or 1), 1, 1

    def __call__(self, q, k_cache, v_cache, cache_seqlens=None, page_table=None, num_splits=None, return_lse=False,
                 out=None, workspace=None, k_scale=None, v_scale=None):
        import torch

        from tuner.serving.decode_sdpa import decode_reference

        ks, vs = k_scale, v_scale
        if self.bug == "k_scale":
            ks = torch.ones_like(ks)
        elif self.bug == "v_scale":
            vs = torch.ones_like(vs)
        elif self.bug == "heads":
            ks, vs = ks.flip(0), vs.flip(0)
        o, lse = decode_reference(q, k_cache, v_cache, cache_seqlens, page_table, True, 1.0 / q.shape[-1] ** 0.5,
                                  kv_scales=(ks, vs))
        out.copy_(o)
        return out, lse


def _cases():
    from tuner.measure.verify_decode import DecodeCase, FP8_SPREAD

    return (DecodeCase((1, 63, 65, 300), kv_scale="head", kv_spread=FP8_SPREAD),
            DecodeCase((129, 7), seqlen_q=4, kv_scale="tensor", near_max=True),
            DecodeCase((200, 64), heads=(32, 8), kv_scale="head", kv_spread=FP8_SPREAD, near_max=True))


@pytest.mark.parametrize("bug", [None, "k_scale", "v_scale", "heads"])
def test_the_gate_fails_a_kernel_that_misapplies_a_scale(bug):
    import torch

    from tuner.measure.verify_decode import check_case

    gen = torch.Generator().manual_seed(5)
    checks = [check_case(_StandIn(bug), SPEC, c, gen, 16, device="cpu") for c in _cases()]
    failed = [c for c in checks if not c.passed]
    if bug is None:
        assert not failed, failed[0]
    elif bug == "heads":   # a per-tensor scale has no head order to get wrong
        assert [c.problem for c in failed] == [c.problem for c in checks if "head scales" in c.problem]
    else:
        assert len(failed) == len(checks), [c.problem for c in checks if c.passed]
