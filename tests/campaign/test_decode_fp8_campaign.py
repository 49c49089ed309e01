"""`tune --phase decode --kv-dtype fp8` campaigns without a GPU: the combinations and their specs, study names and
problems know the cache's dtype (its bytes, its inputs' scales, no FA4 baseline), the options refuse what is not a
decode cache, and a trial's cross-check reads the dequantised cache."""
import pytest

from hardware_profiles import load_profile
from tuner.campaign.combos import ComboError, expand_combinations, kv_dtype_combinations
from tuner.campaign.options import CampaignOptions, option_problems

H200 = load_profile("h200")


def _combos(variant="gqa", phase="decode", model=None):
    return expand_combinations(H200, None if model else variant, None, "bf16", "true", model,
                               "paged", 16 if phase == "decode" else None, phase, None, None, False, None)


def test_fp8_combinations_carry_the_kv_dtype_into_spec_name_and_problems():
    (c,) = kv_dtype_combinations(_combos(model="llama3-8b"), "fp8")
    assert c.spec().kv_dtype == "fp8" and c.kv_tag() == "-kvfp8" and "fp8 cache" in c.label()
    problems = c.problems()
    assert problems and all(p.kv_dtype == "fp8" for p in problems)
    p = problems[0]
    plain = _combos(model="llama3-8b")[0].problems()[0]
    assert p.kv_bytes * 2 == plain.kv_bytes and p.flops == plain.flops
    assert p.point().kv_dtype == "fp8" and p.bucket == plain.bucket and "kvfp8" in p.label()


def test_what_no_fp8_cache_kernel_serves_is_refused():
    with pytest.raises(ComboError, match="decode cache's dtype"):
        kv_dtype_combinations(_combos(phase="prefill"), "fp8")
    bad = option_problems(CampaignOptions(gpu="h200", variant="gqa", kv_dtype="fp8"))
    assert any("--kv-dtype fp8 is a decode cache's dtype" in b for b in bad)
    bad = option_problems(CampaignOptions(gpu="h200", variant="gqa", kv_dtype="e5m2", phase="decode",
                                          layout="paged", page_size=16))
    assert any("--kv-dtype must be one of fp8" in b for b in bad)


def test_the_fp8_trial_passes_the_scales_has_no_fa4_and_cross_checks_the_real_values():
    import torch

    from tuner.measure.decode import _sequence_kv, cross_check, measure_baselines, ours_call
    from tuner.measure.decode_problem import DecodeProblem
    from tuner.serving.kvcache_fp8 import dequantise, quantise

    p = DecodeProblem("gqa", 2, 40, 8, 2, 64, 64, True, "bf16", 1, 16, kv_dtype="fp8")
    g = torch.Generator().manual_seed(0)
    scale = torch.tensor([0.01, 0.05])
    k = quantise(torch.randn(6, 16, 2, 64, generator=g), scale)
    v = quantise(torch.randn(6, 16, 2, 64, generator=g), scale)
    table = torch.arange(6, dtype=torch.int32).view(2, 3)
    x = {"q": torch.randn(2, 1, 8, 64, generator=g).to(torch.bfloat16), "k": k, "v": v, "page_table": table,
         "seqused_k": torch.full((2,), 40, dtype=torch.int32), "kv_scales": (scale, scale)}
    seen = {}

    def kernel(q, k, v, **kw):
        seen.update(kw)
        from tuner.serving.decode_sdpa import decode_reference

        return decode_reference(q, k, v, kw["cache_seqlens"], kw["page_table"], True, kw["softmax_scale"],
                                kv_scales=(kw["k_scale"], kw["v_scale"]))[0]

    out = ours_call(kernel, p, x)()
    assert seen["k_scale"] is scale
    assert torch.equal(_sequence_kv(x, p, 1, "k"), dequantise(k[3:6].reshape(-1, 2, 64)[:40], scale))
    assert cross_check(out, x, p) < 1e-2
    assert cross_check(out * 3, x, p) > 0.5          # a wrong output is seen on the real values
    errors = {}
    row = measure_baselines(p, None, "cpu", errors) if torch.cuda.is_available() else None
    if row is None:   # (copy_bound needs a GPU: only FA4's refusal is checked here)
        from unittest import mock

        with mock.patch("tuner.measure.decode.copy_gbs", return_value=3000.0):
            row = measure_baselines(p, None, "cpu", errors)
    assert row["fa4"] is None and "fp8 KV cache" in errors["fa4"] and row["copy_bound"] > 0


def test_the_decode_spaces_seed_an_fp8_cache_with_its_default_and_only_there():
    from search_spaces import load_space
    from translate.decode import DecodeParams
    from translate.decode.params import default_decode_params

    fp8_default = default_decode_params(kv_dtype_combinations(_combos(), "fp8")[0].spec(), None, H200)
    for variant in ("gqa", "mha", "mqa"):
        space = load_space(variant, phase="decode")
        plain, fp8 = space.seeds_for(128), space.seeds_for(128, "fp8")
        own = [s for s in fp8 if s.kv_dtype == "fp8"]
        assert own and not [s for s in plain if s.kv_dtype] and len(fp8) == len(plain) + len(own)
        params = [DecodeParams(**{k: v for k, v in s.params if k != "schedule"}) for s in own]
        assert fp8_default in params


def test_the_feasible_space_judges_an_fp8_cache_by_its_own_rules():
    """An e4m3 ring is half the shared memory: 128 keys over four stages fit an FP8 cache's kernel, not a 16-bit
    one's; the FP8 gather's thread rule holds for every point."""
    from search_spaces import load_space
    from search_spaces.feasible import default_sketches, feasible_space
    from translate.decode import DecodeParams

    (c8,) = kv_dtype_combinations(_combos(model="llama3-8b"), "fp8")
    (c16,) = _combos(model="llama3-8b")
    space = load_space("gqa", phase="decode")
    sketches = default_sketches(space, H200, 128, "bf16")
    f8 = feasible_space(space, H200, 128, "bf16", c8.shapes(), sketches, "paged", 16, "fp8")
    f16 = feasible_space(space, H200, 128, "bf16", c16.shapes(), sketches, "paged", 16)
    deep = DecodeParams(block_n=128, kv_stages=4)
    assert deep in {p.params for p in f8.points} and deep not in {p.params for p in f16.points}
    assert len(f8.points) > len(f16.points)
    assert all(p.params.num_threads % 64 == 0 for p in f8.points)
    _, reasons = f16.project({"schedule": "decode", **deep.to_dict()}, H200, 128, "bf16", c16.shapes())
    assert reasons and not f8.project({"schedule": "decode", **deep.to_dict()}, H200, 128, "bf16", c8.shapes())[1]


def test_an_mla_campaign_over_an_fp8_latent_cache_has_its_problems_seeds_and_feasible_points():
    """`tune --variant mla --phase decode --kv-dtype fp8`: the latent's e4m3 bytes (half), its own seeds (the FP8
    latent defaults), and only mma.sync points feasible (the warpgroup kernels take no e4m3 cache)."""
    from search_spaces import load_space
    from search_spaces.feasible import default_sketches, feasible_space
    from translate.decode import DecodeParams
    from translate.decode.params import default_decode_params

    combos8 = kv_dtype_combinations(_combos("mla"), "fp8")
    c8 = combos8[0]
    (c16,) = [c for c in _combos("mla") if c.causal == c8.causal]
    assert c8.spec().kv_dtype == "fp8" and c8.spec().variant == "mla"
    p8, p16 = c8.problems()[0], c16.problems()[0]
    assert p8.kv_bytes * 2 == p16.kv_bytes and p8.flops == p16.flops
    assert p8.point().kv_dtype == "fp8" and p8.point().kv_bytes * 2 == p16.point().kv_bytes
    space = load_space("mla", phase="decode")
    own = [s for s in space.seeds_for(576, "fp8") if s.kv_dtype == "fp8"]
    params = [DecodeParams(**{k: v for k, v in s.params if k != "schedule"}) for s in own]
    assert {default_decode_params(c8.spec(), h, H200) for h in (16, 128)} <= set(params)
    sketches = default_sketches(space, H200, 576, "bf16")
    f8 = feasible_space(space, H200, 576, "bf16", c8.shapes(), sketches, "paged", 64, "fp8")
    f16 = feasible_space(space, H200, 576, "bf16", c16.shapes(), sketches, "paged", 64)
    assert f8.points and all(p.params.mma == "sm80" for p in f8.points)
    assert any(p.params.mma != "sm80" for p in f16.points)
    assert {p.params for p in f8.points} >= set(params)


def test_the_fp8_mla_trial_passes_one_scale_and_cross_checks_the_dequantised_latent():
    import torch

    from tuner.measure.decode import cross_check, ours_call, problem_inputs
    from tuner.measure.decode_problem import DecodeProblem
    from tuner.serving.kvcache_fp8 import dequantise

    p = DecodeProblem("mla", 2, 100, 16, 1, 576, 512, True, "bf16", 1, 64, kv_dtype="fp8")
    x = problem_inputs(p, "cpu")
    ks, vs = x["kv_scales"]
    assert x["k"].dtype == torch.float8_e4m3fn and x["v"] is None and vs is ks and tuple(ks.shape) == (1,)
    seen = {}

    def kernel(q, k, v, **kw):
        from tuner.serving.decode_sdpa import decode_reference

        seen.update(kw)
        return decode_reference(q, k, k[..., :512], kw["cache_seqlens"], kw["page_table"], True, kw["softmax_scale"],
                                kv_scales=(kw["k_scale"], kw["k_scale"]))[0]

    out = ours_call(kernel, p, x)()
    assert seen["k_scale"] is ks and seen["v_scale"] is ks
    assert cross_check(out, x, p) < 1e-2
    unscaled = ours_call(lambda q, k, v, **kw: kernel(q, k, v, **{**kw, "k_scale": torch.ones(1)}), p, x)()
    assert cross_check(unscaled, x, p) > 0.5          # a kernel that ignores the scale is seen on the real values
    real = dequantise(x["k"], ks)
    assert float(real.abs().max()) <= 448 * float(ks) + 1e-6


def test_the_fp8_mla_bench_point_times_both_kernels_on_the_same_values():
    """measure_fp8_mla_point (tune bench --variant mla --kv-dtype fp8), its timer stubbed and its inputs on the CPU:
    the 16-bit kernel reads the e4m3 latent dequantised, with the same queries and table, so the outputs agree; the
    rows' bytes are e4m3's and the 16-bit cache's."""
    from types import SimpleNamespace
    from unittest import mock

    import torch

    from tuner.measure import decode
    from tuner.serving.decode_sdpa import decode_reference

    seen = {}

    class Kernel:
        def __init__(self, name):
            self.name = name

        def split_plan(self, *args):
            return SimpleNamespace(num_splits=2), 1, 1

        def __call__(self, q, k, v, cache_seqlens=None, page_table=None, k_scale=None):
            seen[self.name] = (q, k, page_table, k_scale)
            scales = None if k_scale is None else (k_scale, k_scale)
            k = k if k_scale is not None else k.float()
            return decode_reference(q.float(), k, k[..., :512], cache_seqlens, page_table, True, None,
                                    kv_scales=scales)[0].to(q.dtype)

    cpu_inputs = decode.make_mla_inputs
    p = decode.MLAPoint(2, 200, heads_q=16, kv_dtype="fp8")
    with mock.patch.object(decode, "time_ms", side_effect=[2.0, 4.0, 4.0, 2.0]), \
            mock.patch.object(decode, "make_mla_inputs", lambda point: cpu_inputs(point, device="cpu")), \
            mock.patch("torch.cuda.empty_cache"):
        row = decode.measure_fp8_mla_point(Kernel("fp8"), Kernel("bf16"), p)
    q8, k8, t8, s8 = seen["fp8"]
    q16, k16, t16, s16 = seen["bf16"]
    assert q8 is q16 and t8 is t16 and s16 is None and k8.dtype == torch.float8_e4m3fn and k16.dtype == torch.bfloat16
    assert row["rel_diff"] < 1e-2 and row["speedup"] == 2.0 and row["fp8_us"] == 2000.0
    # half the bytes (e4m3) in half the time: the same GB/s
    assert row["fp8_gbs"] == pytest.approx(row["base_gbs"]) and row["splits"] == 2
