"""The decode gate over an FP8 (e4m3) absorbed-MLA latent cache (tuner/measure/verify_decode.py, no GPU): its cases
(the MLA cases with the latent's one scale far from 1 both ways, values near 448 x scale at 128 and 16 heads, one
split and several), the cache (e4m3 latent rows, V a view of them at the same scale, poisoned pages), and a stand-in
kernel on the CPU (the fp32 reference on the dequantised latent) that passes them while one that ignores the scale,
in the scores or in V, fails."""
import pytest

from kernel_abi.spec import KernelSpec

MLA8 = KernelSpec("mla", 576, 512, True, "bf16", "paged", "decode", kv_dtype="fp8")


def test_fp8_mla_cases_span_the_scale_both_ways_near_448_and_the_splits():
    from tuner.measure.verify_decode import FP8_MLA_AMPS, MLA_CHECK_CASES, MLA_HEADS, MLA_TP_HEADS, check_cases

    cases = check_cases(MLA8)
    assert len(cases) > len(MLA_CHECK_CASES) and all(c.kv_scale for c in cases)
    assert {c.kv_amp for c in cases} == set(FP8_MLA_AMPS)
    assert {c.heads for c in cases if c.near_max} == {MLA_HEADS, MLA_TP_HEADS}
    assert {c.kv_amp for c in cases if c.near_max} >= {1e-3, 1e3}
    assert {1, 3, 64} <= {c.num_splits for c in cases} and None in {c.num_splits for c in cases}
    assert any(c.v_view for c in cases) and any(not c.v_view for c in cases)
    assert {1, 63, 64, 65, 4097} <= {n for c in cases for n in c.cache_seqlens}
    assert {1, 2, 4, 16} <= {c.seqlen_q for c in cases}
    assert all(not c.kv_scale for c in check_cases(KernelSpec("mla", 576, 512, True, "bf16", "paged", "decode")))


def test_the_latent_cache_holds_e4m3_rows_whose_values_are_their_first_512_columns_at_one_scale():
    import torch

    from tuner.measure.verify_decode import DecodeCase, _build_cache, fp8_amplitudes

    gen = torch.Generator().manual_seed(3)
    case = DecodeCase((5, 70), heads=(16, 1), kv_scale="tensor", kv_amp=1e3, near_max=True)
    fp8 = fp8_amplitudes(case, 1, gen, "cpu", one_scale=True)
    amps, ks, vs = fp8
    assert vs is ks and float(ks) > 1 and tuple(ks.shape) == (1,)
    k, v, table, lens, seqs = _build_cache(case, 1, 576, 512, torch.bfloat16, True, 64, gen, "cpu", from_k=True,
                                           fp8=fp8)
    assert k.dtype == torch.float8_e4m3fn and v.data_ptr() == k.data_ptr() and v.shape[-1] == 512
    used = set(table[0, :1].tolist()) | set(table[1, :2].tolist())
    unused = [p for p in range(k.shape[0]) if p not in used]
    assert unused and all(bool((k[p].view(torch.uint8) == 0x7F).all()) for p in unused)
    page = int(table[1, 0])
    assert torch.equal(seqs[1][0][:64], k[page].float() * ks)
    assert torch.equal(seqs[1][1][:64], k[page, :, :, :512].float() * ks)
    assert float((k[page].float().abs() >= 128).float().mean()) > 0.5


class _StandIn:
    """An absorbed-MLA decode kernel over an e4m3 latent on the CPU: the fp32 reference on the latent dequantised
    with its scale (V the first 512 columns), or with a planted bug: "scale" (ignored everywhere), "k_scale" (the
    scores read the raw bytes), "v_scale" (the values do)."""

    def __init__(self, bug=None):
        self.bug = bug
        self.v_scales = []

    def split_plan(self, batch, heads_q, heads_kv, seqlen_q, capacity, num_splits=None):
        from types import SimpleNamespace

        return SimpleNamespace(num_splits=num_splits or 1), 1, 1

    def __call__(self, q, k_cache, v_cache, cache_seqlens=None, page_table=None, num_splits=None, return_lse=False,
                 out=None, workspace=None, k_scale=None, v_scale=None):
        import torch

        from tuner.serving.decode_sdpa import decode_reference

        self.v_scales.append(v_scale is k_scale)
        v_cache = k_cache[..., :512] if v_cache is None else v_cache
        one = torch.ones_like(k_scale)
        ks = one if self.bug in ("scale", "k_scale") else k_scale
        vs = one if self.bug in ("scale", "v_scale") else k_scale
        o, lse = decode_reference(q, k_cache, v_cache, cache_seqlens, page_table, True, 1.0 / q.shape[-1] ** 0.5,
                                  kv_scales=(ks, vs))
        out.copy_(o)
        return out, lse


def _cases():
    from tuner.measure.verify_decode import DecodeCase

    return (DecodeCase((1, 63, 65, 300), heads=(16, 1), kv_scale="tensor", kv_amp=1e3),
            DecodeCase((129, 7), seqlen_q=4, num_splits=2, heads=(128, 1), v_view=True, kv_scale="tensor",
                       kv_amp=1e-3, near_max=True),
            DecodeCase((70, 200), seqlen_q=2, heads=(16, 1), kv_scale="tensor", kv_amp=1e3, near_max=True))


@pytest.mark.parametrize("bug", [None, "scale", "k_scale", "v_scale"])
def test_the_gate_fails_a_latent_kernel_that_ignores_its_scale(bug):
    import torch

    from tuner.measure.verify_decode import check_case

    gen = torch.Generator().manual_seed(7)
    kernel = _StandIn(bug)
    checks = [check_case(kernel, MLA8, c, gen, 64, device="cpu") for c in _cases()]
    failed = [c for c in checks if not c.passed]
    assert all(kernel.v_scales)   # the gate gives v_scale = k_scale, the same tensor (the launcher's rule)
    if bug is None:
        assert not failed, failed[0]
    else:
        assert len(failed) == len(checks), [c.problem for c in checks if c.passed]
