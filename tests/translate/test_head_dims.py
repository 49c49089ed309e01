"""Head dims 192 and 256 (d_qk = d_v: Gemma 2/3 take 256): specs, defaults per GPU and layout, search spaces and
decode defaults that the profiles accept (CPU; the builds are in test_codegen_compile.py, but for d256's serving
kernels with options, here)."""
from dataclasses import replace

import pytest

from hardware_profiles import load_profile
from kernel_abi.spec import HEAD_DIMS, KernelSpec, grid_problems, spec_for
from search_spaces import load_space
from search_spaces.feasible import default_sketches, feasible_space
from translate.decode.params import default_decode_params, validate_decode
from translate.defaults import default_params, probe_problem
from translate.params import validate


def test_the_head_dims_and_their_hopper_defaults_are_fa3_fa4s_tiles():
    assert HEAD_DIMS == (64, 96, 128, 192, 256)
    assert spec_for("gqa", 256, "bf16", True) == KernelSpec("gqa", 256, 256, True, "bf16")
    h100 = load_profile("h100")
    key = lambda spec, **kw: default_params(h100, spec, "ws_overlap", **kw).key()   # noqa: E731
    assert key(KernelSpec("mha", 192, 192, False, "bf16")).startswith("m128n112w8s2_sm90_tma")
    assert key(KernelSpec("mha", 256, 256, False, "bf16")).startswith("m128n80w8s2_sm90_tma")
    assert key(KernelSpec("mla", 192, 128, True, "bf16")).startswith("m128n128w8s2_sm90_tma")     # MLA unchanged
    # varlen and a window take 64-key tiles at 256 (ptxas spilled at 80)
    assert key(KernelSpec("gqa", 256, 256, True, "bf16", "varlen")).startswith("m128n64w8s2_sm90_tma_")
    assert key(KernelSpec("gqa", 256, 256, True, "bf16", local=True)).startswith("m128n64w8s2")
    # paged takes 64 too (its spills outside the key loop; 0.93-0.97x FA4 against 0.84-0.89x at 48); with a window or
    # a cap, paged and varlen (Gemma 2's padded batches) take 48-key tiles (ptxas spilled at 64)
    for page in (16, 128):
        paged = KernelSpec("gqa", 256, 256, True, "bf16", "paged")
        assert key(paged, page_size=page).startswith("m128n64w8s2_sm90_cpag")
    for layout, page in (("varlen", None), ("paged", 16)):
        for options in (dict(softcap=True), dict(local=True), dict(local=True, softcap=True)):
            spec = KernelSpec("gqa", 256, 256, True, "bf16", layout, **options)
            assert key(spec, page_size=page).startswith("m128n48w8s2"), (layout, options)


@pytest.mark.slow
def test_head_dim_256_serving_kernels_with_options_build_without_spills():
    """Gemma 2's layers in the serving layouts (a cap; a window and a cap) and the plain ones: no spill at their
    defaults (nvcc, sm_90a), but for the plain paged kernel's, none of them inside the key loop."""
    from sass_counts import compiled_or_skip, local_memory_in_key_loop

    import tl
    import translate
    from tl.options import with_options

    h100 = load_profile("h100")
    gens = []
    for layout, page in (("varlen", None), ("paged", 16)):
        for options in (dict(softcap=True), dict(local=True, softcap=True), {}):
            spec = KernelSpec("gqa", 256, 256, True, "bf16", layout, **options)
            program = with_options(tl.parse_program(tl.load_sketch("gqa", True, "ws_overlap", layout)),
                                   spec.local, spec.softcap, spec.sinks)
            gens.append(translate.generate(program, default_params(h100, spec, "ws_overlap", page_size=page), h100,
                                           spec))
    for gen, result in zip(gens, compiled_or_skip(gens)):
        assert local_memory_in_key_loop(gen.name, result.cubin) == 0, gen.name
        if "_paged_" in gen.name and "softcap" not in gen.name:
            continue    # 16 bytes in a tile's epilogue and the producer (translate/defaults.py)
        assert result.spill_stores == 0 and result.spill_loads == 0, (gen.name, result.resources())


@pytest.mark.parametrize("gpu, dtype", [("h100", "bf16"), ("t4", "fp16"), pytest.param("a100", "bf16", marks=pytest.mark.slow),
                                        pytest.param("l40s", "bf16", marks=pytest.mark.slow)])
@pytest.mark.parametrize("head_dim", [192, 256])
def test_every_profile_has_a_legal_default_and_a_search_space_at_the_new_head_dims(gpu, dtype, head_dim):
    profile = load_profile(gpu)
    spec = KernelSpec("gqa", head_dim, head_dim, True, dtype)
    schedule = "ws_overlap" if profile.sm >= 90 else "fa2"
    params = default_params(profile, spec, schedule)
    assert validate(params, profile, probe_problem(spec), warp_specialized=schedule == "ws_overlap") == []
    space = load_space("gqa")
    problems = grid_problems("gqa", head_dim, dtype, True)
    fs = feasible_space(space, profile, head_dim, dtype, problems, default_sketches(space, profile, head_dim, dtype))
    assert fs.points
    assert all(p.params.block_n <= (128 if head_dim == 192 else 112) for p in fs.points if p.sketch.startswith("ws_"))
    seeds = [s.source for s in space.seeds_for(head_dim)]
    assert any(f"hdim{head_dim}" in s for s in seeds)


@pytest.mark.parametrize("gpu", ["h100", "a100", "l40s"])
@pytest.mark.parametrize("head_dim", [64, 128, 192, 256])
def test_decode_defaults_fit_each_profiles_shared_memory(gpu, head_dim):
    profile = load_profile(gpu)
    spec = replace(KernelSpec("gqa", head_dim, head_dim, True, "bf16", "paged"), phase="decode")
    params = default_decode_params(spec, 16, profile)
    assert validate_decode(params, profile, spec) == []
    # three stages of 64 keys where they fit, else two, else two of 32 keys (over two warp groups)
    fewer = {("a100", 256): (2, 64), ("l40s", 128): (2, 64), ("l40s", 192): (2, 32), ("l40s", 256): (2, 32)}
    assert (params.kv_stages, params.block_n) == fewer.get((gpu, head_dim), (3, 64))
