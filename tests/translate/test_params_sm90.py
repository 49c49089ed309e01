"""Hopper parameter validation: pure, before any compile, every reason stated."""
import re

import pytest

from hardware_profiles import load_profile
from translate.defaults import default_params, hopper_params
from translate.params import KernelParams, validate
from translate.params_sm90 import consumer_registers, tile_registers
from kernel_abi.spec import KernelSpec, Problem

H100, A100 = load_profile("h100"), load_profile("a100")


def problem(d_qk=128, d_v=128, variant="mha"):
    return Problem(variant, 1, 16, 16, 1024, 1024, d_qk, d_v, True, "bf16")


def ws(**changes):
    base = dict(block_m=128, block_n=128, num_warps=8, kv_stages=2, mma_atom="SM90_GMMA", g2s_atom="SM90_TMA")
    return KernelParams(**{**base, **changes})


@pytest.mark.parametrize("spec", [KernelSpec("mha", 64, 64, True, "bf16"), KernelSpec("mha", 128, 128, False, "fp16"),
                                  KernelSpec("mla", 192, 128, True, "bf16"), KernelSpec("gqa", 128, 128, True, "bf16")])
def test_the_hopper_defaults_are_legal(spec):
    p = Problem(spec.variant, 1, 16, 16 if spec.variant != "gqa" else 2, 1024, 1024, spec.d_qk, spec.d_v,
                spec.causal, spec.dtype)
    assert validate(default_params(H100, spec, "ws_overlap"), H100, p, warp_specialized=True) == []
    assert validate(hopper_params(H100, spec, warp_specialized=False), H100, p, warp_specialized=False) == []


def test_fa3_and_fa4_published_tiles_fit_the_register_model():
    # FA4 hdim 128: 128x128 RS (160 of 216), 128x192 RS (208); FA3: 128x176 RS; hdim 64: 192x128 RS on 3 WGs
    for bn in (128, 176, 192):
        assert validate(ws(block_n=bn), H100, problem(), warp_specialized=True) == [], bn
    assert validate(ws(block_m=192, num_warps=12, producer_regs=32), H100, problem(64, 64), warp_specialized=True) == []
    assert consumer_registers(ws()) == 240 and consumer_registers(ws(block_m=192, producer_regs=32)) == 160


@pytest.mark.parametrize("changes,warp_specialized,fragment", [
    (dict(block_m=256, num_warps=16), True, "block_m 256 must be 64 x consumer warpgroups"),
    (dict(num_warps=4), True, "num_warps 4 must be block_m / 16 = 8"),
    (dict(block_n=200), True, "block_n 200 must be a multiple of 16"),
    (dict(block_n=256), True, "needs about 280 registers"),
    (dict(block_m=192, num_warps=12, block_n=192), True, "but has the consumers' 160"),
    (dict(kv_stages=4), True, "exceeds the 227 KB per-block limit"),
    (dict(g2s_atom="UniversalCopy128"), True, "the warp-specialised producer loads K/V with TMA"),
    (dict(producer_regs=48), True, "producer_regs must be one of"),
    (dict(pingpong=True, block_m=64, num_warps=4), True, "ping-pong takes turns between two or three"),
    (dict(q_in_regs=True), True, "q_in_regs does not apply"),
    (dict(swizzle=2), True, "s2r_atom and swizzle do not apply"),
    (dict(), False, "without warpgroup roles every warpgroup loads with cp.async"),
    (dict(g2s_atom="SM80_CP_ASYNC_CACHEGLOBAL", persistent=True), False, "apply to warp-specialised sketches"),
    (dict(exp2_poly=5), True, "exp2_poly 5 must be one of (0, 1, 2, 3, 4)"),
    (dict(pv_wait="early"), True, "pv_wait 'early' must be one of after, mid, quarter, half"),
    (dict(pv_wait="half", pv_operand="ss"), True, "pv_wait 'half' moves the wait before P's conversion"),
    (dict(pv_wait="mid", pv_operand="ss"), True, "it needs pv_operand rs"),
])
def test_illegal_hopper_candidates_are_rejected_with_the_reason(changes, warp_specialized, fragment):
    errors = validate(ws(**changes), H100, problem(), warp_specialized=warp_specialized)
    assert any(fragment in e for e in errors), errors


def test_wgmma_needs_a_hopper_gpu_and_sm80_kernels_refuse_hopper_knobs():
    assert any("needs an sm_90a GPU" in e for e in validate(ws(), A100, problem(), warp_specialized=True))
    sm80 = KernelParams(block_m=128, block_n=64, num_warps=4, pingpong=True)
    assert any(e.startswith("pingpong applies to Hopper kernels") for e in validate(sm80, H100, problem()))
    both = KernelParams(block_m=128, block_n=64, num_warps=4, exp2_poly=2, pv_wait="mid")
    assert any(e.startswith("exp2_poly, pv_wait apply to Hopper kernels") for e in validate(both, H100, problem()))
    assert any("needs wgmma" in e for e in validate(KernelParams(), H100, problem(), warp_specialized=True))


def test_register_model_counts_the_operand_copy_only_for_rs():
    assert tile_registers(ws(), problem()) == 64 + 64 + 32 + 24
    assert tile_registers(ws(pv_operand="ss"), problem()) == 64 + 64 + 24


@pytest.mark.parametrize("variant,hd", [("mha", 128), pytest.param("mha", 64, marks=pytest.mark.slow), ("mla", None)])
def test_setmaxnreg_never_asks_for_more_than_the_cta_got_at_launch(variant, hd):
    """setmaxnreg moves registers within the CTA's launch allocation (threads x the __launch_bounds__ share):
    a consumer share past it never completes and the kernel hangs, as every 2-warpgroup kernel with a
    32-register producer did on the H100 (2026-11-23). Over every warp-specialised point of the space."""
    import tl
    import translate
    from search_spaces import load_space
    from search_spaces.feasible import feasible_space
    from translate.params_sm90 import consumer_registers, launch_registers
    from kernel_abi.spec import grid_problems, spec_for

    profile = load_profile("h100")
    spec = spec_for(variant, hd, "bf16", True)
    fs = feasible_space(load_space(variant), profile, spec.d_qk, "bf16", grid_problems(variant, spec.d_qk, "bf16", True))
    ws = [p.params for p in fs.points if fs.base_of(p.sketch).startswith("ws_") and p.params.block_m > 64]
    assert ws
    for params in ws:
        wgs = params.block_m // 64
        threads = 128 * (wgs + 1)
        assert params.producer_regs * 128 + consumer_registers(params) * 128 * wgs <= launch_registers(threads) * threads
    program = tl.parse_program(tl.load_sketch(variant, True, "ws_overlap"))
    pr32 = next(p for p in ws if p.block_m == 128 and p.producer_regs == 32)
    source = translate.generate(program, pr32, profile, spec).source
    assert "kConsumerRegs = 232" in source and "kProducerRegs = 32" in source   # 32 x 128 + 2 x 232 x 128 <= 64512


def test_plain_wgmma_tiles_must_fit_the_cp_async_copy_steps():
    """Every warpgroup loads with cp.async, threads / 8 rows a step: 256 threads cannot copy a 112-row tile
    (the H100 campaign's wrong results and illegal addresses came from such kernels)."""
    base = dict(mma_atom="SM90_GMMA", g2s_atom="SM80_CP_ASYNC_CACHEGLOBAL", kv_stages=2)
    profile, problem = load_profile("h100"), Problem("mha", 1, 16, 16, 1024, 1024, 128, 128, True, "bf16")
    bad = validate(KernelParams(block_m=128, block_n=112, num_warps=8, **base), profile, problem)
    assert any("block_n 112 must be a multiple of 32" in e for e in bad)
    bad = validate(KernelParams(block_m=192, block_n=128, num_warps=12, **base), profile, problem)
    assert any("block_n 128 must be a multiple of 48" in e for e in bad)
    assert not validate(KernelParams(block_m=128, block_n=128, num_warps=8, **base), profile, problem)
    assert not validate(KernelParams(block_m=192, block_n=144, num_warps=12, **base), profile, problem)


def test_the_conditional_rescale_is_a_hopper_knob_with_legal_thresholds():
    assert not validate(ws(rescale_threshold=8), H100, problem(), warp_specialized=True)
    why = validate(ws(rescale_threshold=9), H100, problem(), warp_specialized=True)
    assert why and "rescale_threshold 9 must be one of (0, 2, 4, 8)" in why[0]
    fa2 = KernelParams(rescale_threshold=8)
    assert any("rescale_threshold applies to Hopper kernels" in e for e in validate(fa2, H100, problem()))
    assert KernelParams(rescale_threshold=8).key().endswith("_rt8") and "_rt" not in KernelParams().key()
    assert "rescale_threshold" not in repr(KernelParams())


@pytest.mark.parametrize("variant,hq,hkv,fragment", [
    ("mha", 16, 16, "GQA or MQA only"),
    ("gqa", 12, 4, "group 3 .* must divide 64"),
    ("mqa", 96, 1, "group 96 .* must divide 64"),
])
def test_packed_heads_need_a_group_that_divides_a_warpgroups_rows(variant, hq, hkv, fragment):
    p = Problem(variant, 1, hq, hkv, 1024, 1024, 128, 128, True, "bf16")
    errors = validate(ws(pack_gqa=True), H100, p, warp_specialized=True)
    assert len(errors) == 1 and re.search(fragment, errors[0]), errors


@pytest.mark.parametrize("hq,hkv", [(16, 2), (16, 1), (32, 8), (64, 1), (8, 4)])
def test_packed_heads_are_legal_for_groups_dividing_64(hq, hkv):
    p = Problem("mqa" if hkv == 1 else "gqa", 1, hq, hkv, 1024, 1024, 128, 128, True, "bf16")
    assert validate(ws(pack_gqa=True), H100, p, warp_specialized=True) == []


def test_packed_heads_belong_to_the_warp_specialised_hopper_kernels():
    p = Problem("gqa", 1, 16, 2, 1024, 1024, 128, 128, True, "bf16")
    plain = KernelParams(block_m=128, block_n=128, num_warps=8, mma_atom="SM90_GMMA", pack_gqa=True)
    assert any("pack_gqa apply to warp-specialised" in e for e in validate(plain, H100, p, warp_specialized=False))
    sm80 = KernelParams(block_m=128, block_n=64, num_warps=4, pack_gqa=True)
    assert any(e.startswith("pack_gqa applies to Hopper") for e in validate(sm80, A100, p))
    assert ws(pack_gqa=True).key().endswith("_pk") and not ws().key().endswith("_pk")
