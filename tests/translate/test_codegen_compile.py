"""Real nvcc builds of translated sketches (slow: ~15-40 s per compile): the cubin exists and its SASS holds
the instructions the schedule stands for: tensor-core MMAs (HMMA) with cp.async (LDGSTS) and ldmatrix (LDSM)
on sm80+; on Hopper wgmma (HGMMA), TMA (UTMALDG/UTMASTG) and setmaxnreg (USETMAXREG)."""
import dataclasses
import re
import tempfile
from pathlib import Path

import pytest

import tl
import translate
from hardware_profiles import load_profile
from translate import nvcc
from translate.sass import find_cuobjdump, sass_instructions, sass_summary
from translate.defaults import default_params
from kernel_abi.spec import KernelSpec

pytestmark = pytest.mark.slow


def _need_toolchain(sass: bool = False) -> None:
    """Skip unless nvcc and the CUTLASS headers (and, for ``sass``, cuobjdump) are installed."""
    try:
        nvcc.find_nvcc()
        nvcc.cutlass_include_dir()
        if sass:
            find_cuobjdump()
    except nvcc.ToolNotFound as exc:
        pytest.skip(str(exc))


def _build(gpu: str, spec: KernelSpec):
    _need_toolchain()
    profile = load_profile(gpu)
    text = tl.sketch_path(spec.variant, spec.causal).read_text()
    gen = translate.generate(tl.parse_program(text), default_params(profile, spec), profile, spec)
    result = nvcc.compile_kernel(gen, profile.nvcc_arch, timeout=600)
    assert result.ok, result.log[-3000:]
    assert result.cubin and result.registers and result.registers <= 255
    return gen, result


def _sass(result, name):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(result.cubin)
        return sass_summary(path, name)


def test_mla_causal_builds_for_hopper_with_tensor_cores():
    gen, result = _build("h100", KernelSpec("mla", 192, 128, True, "bf16"))
    sass = _sass(result, gen.name)
    if sass is None:
        pytest.skip("cuobjdump not installed")
    counts = sass.get("counts", sass)
    assert counts.get("HMMA", 0) > 0 and counts.get("LDGSTS", 0) > 0 and counts.get("LDSM", 0) > 0, sass


def test_sm75_build_uses_turing_mma_without_cp_async():
    gen, result = _build("t4", KernelSpec("mha", 128, 128, False, "fp16"))
    sass = _sass(result, gen.name)
    if sass is None:
        pytest.skip("cuobjdump not installed")
    counts = sass.get("counts", sass)
    assert counts.get("HMMA", 0) > 0 and counts.get("LDGSTS", 0) == 0, sass


def _build_hopper(spec: KernelSpec, schedule: str, **changes):
    from translate.defaults import hopper_params
    from translate.params import KernelParams

    _need_toolchain()
    profile = load_profile("h100")
    ws = schedule.startswith("ws_")
    program = tl.parse_program(tl.load_sketch(spec.variant, spec.causal, schedule))
    params = KernelParams.from_dict({**hopper_params(profile, spec, warp_specialized=ws).to_dict(), **changes})
    gen = translate.generate(program, params, profile, spec)
    result = nvcc.compile_kernel(gen, profile.nvcc_arch, timeout=600)
    assert result.ok, result.log[-3000:]
    # ptxas says when it serialises wgmma (C7510) or ignores setmaxnreg (C7508): both cost the schedule
    assert "C7510" not in result.log and "C7508" not in result.log, result.log[-3000:]
    assert result.spill_stores == 0
    return gen, result


def test_warp_specialised_hopper_kernel_uses_wgmma_tma_and_register_reallocation():
    gen, result = _build_hopper(KernelSpec("mha", 128, 128, True, "bf16"), "ws_overlap")
    counts = _sass(result, gen.name)
    if counts is None:
        pytest.skip("cuobjdump not installed")
    assert counts["HGMMA"] == 32 and counts["HMMA"] == 0, counts      # 4 GEMM statements x 8 k-blocks of 16
    assert counts["UTMALDG"] > 0 and counts["UTMASTG"] > 0 and counts["USETMAXREG"] > 0, counts
    assert counts["LDGSTS"] == 0 and counts["LDSM"] == 0, counts


def test_head_dim_256_builds_the_warp_specialised_default_without_spills():
    """Gemma's head dim: FA3/FA4's 128x80 tile, O (64x256) in 128 of a consumer thread's registers, S and P beside it:
    no spill, no serialised wgmma, and 16 k-blocks of the QK^T GEMM (d 256) plus 5 of P.V (block N 80) per tile."""
    gen, result = _build_hopper(KernelSpec("gqa", 256, 256, True, "bf16"), "ws_overlap")
    assert "n80" in gen.name
    counts = _sass(result, gen.name)
    if counts is None:
        pytest.skip("cuobjdump not installed")
    assert counts["HGMMA"] > 0 and counts["UTMALDG"] > 0 and counts["USETMAXREG"] > 0, counts


def test_a_packed_heads_kernel_keeps_the_gemms_and_tma_of_its_unpacked_twin():
    """pack_gqa changes only coordinates, the tile count and the mask's row -> token: the same 32 wgmma, TMA loads
    and stores, no spill and no serialised wgmma (_build_hopper checks the last two)."""
    gen, result = _build_hopper(KernelSpec("gqa", 128, 128, True, "bf16"), "ws_overlap", pack_gqa=True)
    counts = _sass(result, gen.name)
    if counts is None:
        pytest.skip("cuobjdump not installed")
    assert counts["HGMMA"] == 32 and counts["UTMALDG"] > 0 and counts["UTMASTG"] > 0, counts


def test_the_softmax_candidates_build_clean_and_the_polynomial_takes_exponentials_off_mufu():
    """exp2_poly 2 (2 of every 8 exponentials on the FMA pipe) with pv_wait "mid" (the softmax split around the wait
    for the P.V GEMM): no spill, no serialised wgmma (_build_hopper), the same GEMMs, and a quarter of the loops'
    MUFU.EX2 gone (the output factors' exponentials stay on MUFU)."""
    spec = KernelSpec("mha", 64, 64, False, "bf16")
    gen, result = _build_hopper(spec, "ws_overlap")
    base = _sass(result, gen.name)
    if base is None:
        pytest.skip("cuobjdump not installed")
    gen, result = _build_hopper(spec, "ws_overlap", exp2_poly=2, pv_wait="mid")
    both = _sass(result, gen.name)
    assert both["HGMMA"] == base["HGMMA"] and both["UTMALDG"] == base["UTMALDG"], (base, both)
    assert both["MUFU.EX2"] < 0.8 * base["MUFU.EX2"], (base, both)


def test_plain_hopper_kernel_uses_wgmma_with_cp_async():
    gen, result = _build_hopper(KernelSpec("mla", 192, 128, False, "bf16"), "fa2")
    counts = _sass(result, gen.name)
    if counts is None:
        pytest.skip("cuobjdump not installed")
    assert counts["HGMMA"] > 0 and counts["LDGSTS"] > 0 and counts["HMMA"] == 0, counts
    assert counts["UTMALDG"] == 0 and counts["USETMAXREG"] == 0, counts


def test_a_declared_wgmma_op_builds_the_sass_of_cutes_extended_shapes_and_shares_a_unit():
    # A kernel of block N 176 declares its wgmma op (translate/sm90/wgmma_ops.py) instead of defining
    # CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED (twice the cicc time). Two such kernels (the second declaration
    # skipped by its guard) and a base-shape one build in one unit, and the first builds the same SASS as
    # it did from CuTe's extended header.
    import dataclasses

    from translate.defaults import hopper_params
    from translate.params import KernelParams
    from translate.sm90.frame import wgmma_declarations

    _need_toolchain(sass=True)
    profile, spec = load_profile("h100"), KernelSpec("mha", 128, 128, True, "bf16")
    program = tl.parse_program(tl.load_sketch("mha", True, "ws_overlap"))
    base = hopper_params(profile, spec).to_dict()
    kernels = [translate.generate(program, KernelParams.from_dict({**base, **change}), profile, spec)
               for change in ({"block_n": 176}, {"block_n": 176, "producer_regs": 40}, {"block_n": 128})]
    assert len({k.preamble for k in kernels}) == 1
    together = nvcc.compile_kernels(kernels, profile.nvcc_arch, batch_size=3, jobs=1, timeout=600)
    assert all(r.ok for r in together) and together[0].batch_size == 3, together[0].log[-3000:]

    declared = "\n".join(wgmma_declarations(spec, kernels[0].params))
    op = "TL_MMA_64x176x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>{}"
    selector = "GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kHeadDimQK>>>()"
    assert declared in kernels[0].body and op in kernels[0].body
    from_cute = dataclasses.replace(
        kernels[0], preamble="#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED 1\n" + kernels[0].preamble,
        body=kernels[0].body.replace(declared, "").replace(op, selector))
    reference = nvcc.compile_kernel(from_cute, profile.nvcc_arch, timeout=600)
    assert reference.ok, reference.log[-3000:]
    with tempfile.TemporaryDirectory() as tmp:
        unit_cubin, reference_cubin = Path(tmp) / "unit.cubin", Path(tmp) / "reference.cubin"
        unit_cubin.write_bytes(together[0].cubin)
        reference_cubin.write_bytes(reference.cubin)
        in_unit = sass_instructions(unit_cubin)
        from_header = sass_instructions(reference_cubin)
    assert in_unit[kernels[0].name] == from_header[kernels[0].name]
    assert any(i.startswith("HGMMA.64x176x16") for i in in_unit[kernels[1].name])
    assert any(i.startswith("HGMMA.64x128x16") for i in in_unit[kernels[2].name])




def test_paged_kernel_with_the_cp_async_producer_copies_k_and_v_by_row():
    """The indexed paged producer (g2s_atom SM80_CP_ASYNC_CACHEGLOBAL): K and V come by cp.async from the
    whole producer warpgroup, each thread's copies signalled on the stage's barrier (cp.async.mbarrier.arrive,
    ARRIVES.LDGSTSBAR); only Q is still a TMA load; the consumers' wgmma are those of the TMA kernel."""
    from translate.defaults import CP_ASYNC_PRODUCER_REGS, hopper_params

    _need_toolchain(sass=True)
    profile, spec = load_profile("h100"), KernelSpec("gqa", 128, 128, True, "bf16", "paged")
    program = tl.parse_program(tl.load_sketch("gqa", True, "ws_overlap", "paged"))
    params = dataclasses.replace(hopper_params(profile, spec), g2s_atom="SM80_CP_ASYNC_CACHEGLOBAL",
                                 producer_regs=CP_ASYNC_PRODUCER_REGS)
    gen = translate.generate(program, params, profile, spec)
    assert "cp_async_load_paged<kHeadDimQK, kBlockN>" in gen.body and "kKVFullArrivals = 128" in gen.body
    # one page lookup a tile, before K's wait, serves K's and V's copies (each with its own strides); a page size
    # that is a power of two is a shift there, found once per kernel
    lookups = re.findall(r"const attn_sm90::PagedGroup (\w+) = attn_sm90::paged_group_rows<kBlockN>\(", gen.body)
    assert len(lookups) == 1, lookups
    for x in "kv":
        assert f"paged_group_offset({lookups[0]}, {x}_batch_stride, {x}_row_stride)" in gen.body
    assert gen.body.index("paged_group_rows<kBlockN>(") < gen.body.index("wait_barrier(&k_empty[slot]")
    assert "const int page_shift = attn_sm90::page_shift_of(page_size);" in gen.body
    result = nvcc.compile_kernel(gen, profile.nvcc_arch, timeout=600)
    assert result.ok, result.log[-3000:]
    assert "C7510" not in result.log and "C7508" not in result.log, result.log[-3000:]
    # ptxas keeps a few producer values per tile in local memory at 56 registers (none inside the copies)
    assert result.spill_stores <= 32, result.spill_stores
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(result.cubin)
        lines = sass_instructions(path)[gen.name]
        counts = sass_summary(path, gen.name)
    # unrolled: 16 copies a thread per 128-row tile of K and of V, twice (tiles of keys only, without a predicate
    # per copy, and a sequence's last tile; ptxas merges a few tails)
    assert counts["HGMMA"] == 32 and 96 <= counts["LDGSTS"] <= 128, counts
    assert counts["UTMALDG"] == 2, counts                                # Q's two 64-column boxes
    assert sum("ARRIVES.LDGSTSBAR" in ln for ln in lines) == 2           # one per K and per V stage filled


def test_the_cp_async_producer_reads_paged_caches_only():
    from translate.defaults import hopper_params

    profile, spec = load_profile("h100"), KernelSpec("gqa", 128, 128, True, "bf16", "varlen")
    program = tl.parse_program(tl.load_sketch("gqa", True, "ws_overlap", "varlen"))
    params = dataclasses.replace(hopper_params(profile, spec), g2s_atom="SM80_CP_ASYNC_CACHEGLOBAL", producer_regs=56)
    with pytest.raises(translate.TranslationError, match="only from a paged cache"):
        translate.generate(program, params, profile, spec)
