"""The FP8 kernels' V transpose as a searched choice (KernelParams.v_transpose): "runtime" (the caller's per-call V^T,
every existing kernel as it was) or "producer" (the producer warpgroup transposes each V tile it loads as given). On the
CPU: the validation reasons, the TL statement and its diagnostics (tl/vtranspose.py), what the translator emits for
each, the runtime's plan (no V^T copy for a producer kernel); with nvcc (slow): a host replay of the transpose's
ldmatrix.trans / prmt / stmatrix lanes against the runtime's V^T image, and the producer kernel's SASS."""
from __future__ import annotations

from pathlib import Path

import pytest
from sass_counts import compiled_or_skip, sass_counts

import tl
import translate
from hardware_profiles import load_profile
from kernel_abi.spec import KernelSpec, Problem
from tl.checker import check
from tl.vtranspose import v_transpose_of, with_v_transpose
from translate.defaults import hopper_params
from translate.kernel import TranslationError
from translate.params import KernelParams, validate
from translate.params_sm90 import VT_PRODUCER_REGS, smem_bytes, vt_producer_regs

H100 = load_profile("h100")


def _spec(d=128, causal=True, variant="mha", layout="dense", dtype="fp8"):
    return KernelSpec(variant, d, d, causal, dtype, layout=layout)


def _problem(d=128, dtype="fp8", **kw):
    base = dict(variant="mha", batch=1, heads_q=16, heads_kv=16, seqlen_q=1024, seqlen_k=1024, d_qk=d, d_v=d,
                causal=True, dtype=dtype)
    base.update(kw)
    return Problem(**base)


def _params(spec, **changes) -> KernelParams:
    # (paged: built for pages of whole tiles, so K comes by TMA, as the producer transpose needs)
    base = hopper_params(H100, spec, page_size=128 if spec.layout == "paged" else None)
    if changes.get("v_transpose") == "producer":
        changes.setdefault("producer_regs", max(base.producer_regs, vt_producer_regs(base)))
    return KernelParams.from_dict({**base.to_dict(), **changes})


def _sketch(spec, schedule="ws_overlap"):
    return tl.parse_program(tl.load_sketch(spec.variant, spec.causal, schedule, spec.layout))


def _generate(spec, program=None, **changes):
    return translate.generate(program or _sketch(spec), _params(spec, **changes), H100, spec)


# ---- parameters ---------------------------------------------------------------------------------------------

def test_the_parameter_defaults_to_the_runtime_transpose_and_keys_only_the_producer():
    spec = _spec()
    assert KernelParams().v_transpose == "runtime"
    runtime, producer = _params(spec), _params(spec, v_transpose="producer")
    assert "vtp" not in runtime.key() and producer.key().endswith("_vtp")
    assert "v_transpose" not in repr(producer)
    assert KernelParams.from_dict(producer.to_dict()) == producer


@pytest.mark.parametrize("d, causal", [(64, True), (64, False), (128, True), (128, False)])
def test_producer_kernels_with_the_transposers_registers_are_valid(d, causal):
    for order in ("accumulator", "natural"):
        params = _params(_spec(d, causal), v_transpose="producer", vt_key_order=order)
        assert params.producer_regs >= vt_producer_regs(params) >= VT_PRODUCER_REGS
        assert not validate(params, H100, _problem(d, causal=causal), warp_specialized=True)


@pytest.mark.parametrize("change, problem, reason", [
    ({"v_transpose": "kernel"}, {}, "v_transpose 'kernel' must be one of runtime, producer"),
    ({"v_transpose": "producer", "producer_regs": 24}, {}, "producer_regs 24 < 40"),
    ({"v_transpose": "producer", "producer_regs": 32}, {}, "producer_regs 32 < 40, the registers the producer"),
    ({"v_transpose": "producer"}, {"dtype": "bf16"}, "a 16-bit kernel reads V as given"),
    ({"v_transpose": "producer", "block_n": 256, "kv_stages": 4}, {}, "V staging for the in-kernel transpose"),
])
def test_what_the_producer_transpose_cannot_take_is_refused_with_its_reason(change, problem, reason):
    dtype = problem.get("dtype", "fp8")
    spec = _spec(dtype=dtype)
    params = KernelParams.from_dict({**hopper_params(H100, spec).to_dict(), "producer_regs": 40, **change})
    errors = validate(params, H100, _problem(128, **problem), warp_specialized=True)
    assert any(reason in e for e in errors), errors


def test_the_staging_tiles_count_in_the_shared_memory_budget():
    spec, problem = _spec(), _problem(128)
    runtime, producer = _params(spec), _params(spec, v_transpose="producer")
    extra = producer.kv_stages * (producer.block_n * 128 + 16) + 8
    assert smem_bytes(producer, problem, True) == smem_bytes(runtime, problem, True) + extra
    gen = _generate(spec, v_transpose="producer")
    assert gen.smem_bytes == _generate(spec).smem_bytes + extra


def test_sm80_candidates_leave_v_transpose_at_its_default():
    params = KernelParams(block_m=128, block_n=64, num_warps=4, kv_stages=2, v_transpose="producer")
    errors = validate(params, load_profile("a100"), _problem(128, dtype="bf16"))
    assert any("v_transpose" in e and "Hopper kernels" in e for e in errors), errors


# ---- TL ---------------------------------------------------------------------------------------------------

def test_with_v_transpose_states_the_producers_transpose_and_the_sketch_checks():
    plain = _sketch(_spec())
    assert v_transpose_of(plain) is None and with_v_transpose(plain, "runtime") == plain
    stated = with_v_transpose(plain, "producer")
    assert v_transpose_of(stated) == "producer" and with_v_transpose(stated, "producer") == stated
    text = tl.format_program(stated)
    assert "        Compute Transpose V_shared and get Vt_shared\n" in text
    assert "Compute GEMM P, Vt_shared.T and accumulate O_register" in text and "P, V_shared" not in text
    program, diags = tl.check_source(text)
    assert program == stated and diags == []
    assert check(stated) == []
    for variant, causal, schedule, layout in (("gqa", False, "ws_serial", "dense"), ("mqa", True, "ws_overlap", "varlen"),
                                              ("mha", True, "ws_overlap", "paged")):
        p = with_v_transpose(tl.parse_program(tl.load_sketch(variant, causal, schedule, layout)), "producer")
        assert v_transpose_of(p) == "producer" and check(p) == [], check(p)


RUNTIME_FORM = """\
Allocate Q in global (seq_len, HeadDim) with offset q_offset
Allocate K in global (kv_len, HeadDim) with offset kv_offset
Allocate Vt in global (HeadDim, kv_len) with offset kv_offset
Allocate O in global (seq_len, HeadDim) with offset q_offset
warpgroup producer
    Copy Q (BM, HeadDim) in coordinate [L = block_idx] from global to shared
    for j = 0:N with stages kv_stages
        Copy K (BN, HeadDim) in coordinate [L = j] from global to shared
        Copy Vt (HeadDim, BN) in coordinate [L = j] from global to shared
    end
end
warpgroup consumer
    Allocate O_register in register (BM, HeadDim)
    Allocate S in register (BM, BN)
    for i = 0:N
        Compute GEMM Q_shared, K_shared.T and get S
        Compute Mask S
        Compute Softmax S with Smax and Ssum
        Reshape S from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N_new) and get P
        Compute GEMM P, Vt_shared.T and accumulate O_register
    end
    Compute Divide O_register, Ssum and get new O_register
    Copy O_register from register to global
end
"""


def test_the_callers_transposed_v_is_the_runtime_form():
    program = tl.parse_program(RUNTIME_FORM)
    assert check(program) == [] and v_transpose_of(program) == "runtime"
    assert with_v_transpose(program, "producer") == program   # a stated form is kept


def _producer_text() -> str:
    return tl.format_program(with_v_transpose(_sketch(_spec()), "producer"))


@pytest.mark.parametrize("edit, code", [
    # a transpose in a consumer warpgroup
    (lambda t: t.replace("        Compute Transpose V_shared and get Vt_shared\n", "").replace(
        "    Allocate S in register (BM, BN)\n",
        "    Allocate S in register (BM, BN)\n    Compute Transpose V_shared and get Vt_shared\n"), "transpose-place"),
    # before the copy that fills its tile
    (lambda t: t.replace("        Copy V (BN, HeadDim) in coordinate [L = j] from global to shared\n"
                         "        Compute Transpose V_shared and get Vt_shared\n",
                         "        Compute Transpose V_shared and get Vt_shared\n"
                         "        Copy V (BN, HeadDim) in coordinate [L = j] from global to shared\n"), "transpose-place"),
    # of something that is not V: K
    (lambda t: t.replace("Compute Transpose V_shared and get Vt_shared", "Compute Transpose K_shared and get Vt_shared"),
     "transpose-operand"),
    # the P.V GEMM reads the transposed tile not K-major
    (lambda t: t.replace("Compute GEMM P, Vt_shared.T", "Compute GEMM P, Vt_shared"), "transpose-read"),
    # the P.V GEMM reads V although the producer transposes it
    (lambda t: t.replace("Compute GEMM P, Vt_shared.T", "Compute GEMM P, V_shared"), "transpose-read"),
])
def test_misplaced_transposes_and_wrong_reads_are_diagnosed_with_their_codes(edit, code):
    program, diags = tl.check_source(edit(_producer_text()))
    assert program is not None
    assert code in {d.code for d in diags}, [str(d) for d in diags]


def test_the_diagnostic_codes_are_listed():
    from tl.diagnostics import CODES

    assert {"transpose-place", "transpose-operand", "transpose-read"} <= set(CODES)


# ---- translation --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["dense", "varlen", "paged"])
def test_the_producer_kernel_transposes_v_in_its_producer_warpgroup(layout):
    spec = _spec(layout=layout)
    gen = _generate(spec, v_transpose="producer")
    body = gen.body
    assert "//           Compute Transpose V_shared and get Vt_shared" in body   # the kernel's TL program states it
    assert "attn_sm90::transpose_v_tile<kBlockN, kHeadDimV, kChunkVs, kChunkV, kVtAccumulatorOrder, 3, 0>" in body
    assert "vt_keys - (n_tiles - 1 - t) * kBlockN, tidx - 32);  // zeros past the sequence's keys" in body
    assert "vt_info[0] = n_tiles; vt_info[1] = seqlen_k;" in body
    assert "} else if (tidx >= 32) {  // warps 1-3: V's transpose" in body
    assert body.count("cutlass::arch::fence_view_async_shared();  // generic-proxy stores, read by the wgmma") == 1
    assert "attn_sm90::FullBarrier::arrive(&v_full[slot]);  // V^T to the consumers" in body
    assert "attn_sm90::EmptyBarrier::arrive(&vs_empty[slot]);" in body
    assert "attn_sm90::EmptyBarrier::init(q_empty, kConsumerWGs + 1);" in body
    assert "tma_load_vt" not in body and "&vs_full[slot], smem_vs + slot * kTileVElems" in body
    assert "constexpr bool kVtAccumulatorOrder = true;" in body   # the FP8 default's key order
    assert "attn_sm90::convert_p_fp8_in_place" in body
    maps = gen.tensor_maps["v"]
    assert "transposed" not in maps and "key_order" not in maps and maps["rows"] == gen.block_n
    assert maps["cols"] == 128


def test_the_natural_key_order_keeps_ps_exchange():
    body = _generate(_spec(64, False), v_transpose="producer", vt_key_order="natural").body
    assert "constexpr bool kVtAccumulatorOrder = false;" in body and "attn_sm90::convert_p_fp8(rP_" in body


def test_the_runtime_kernel_is_the_default_and_has_no_transposer():
    spec = _spec()
    default = translate.generate(_sketch(spec), hopper_params(H100, spec), H100, spec)
    explicit = _generate(spec, v_transpose="runtime")
    assert (explicit.name, explicit.body, explicit.smem_bytes, explicit.tensor_maps) == \
        (default.name, default.body, default.smem_bytes, default.tensor_maps)
    for token in ("transpose_v_tile", "vs_full", "Transpose", "kVtAccumulatorOrder", "tidx >= 32"):
        assert token not in default.body
    assert default.tensor_maps["v"]["transposed"] is True


def test_a_sketch_that_states_a_transpose_pins_the_parameter():
    spec = _spec()
    stated = with_v_transpose(_sketch(spec), "producer")
    with pytest.raises(TranslationError, match="pins v_transpose 'producer'"):
        _generate(spec, stated)
    assert "transpose_v_tile" in _generate(spec, stated, v_transpose="producer").body
    runtime = tl.parse_program(RUNTIME_FORM)
    with pytest.raises(TranslationError, match="pins v_transpose 'runtime'"):
        _generate(spec, runtime, v_transpose="producer")
    gen = _generate(spec, runtime)
    assert gen.tensor_maps["v"]["transposed"] is True and "transpose_v_tile" not in gen.body


def test_a_16_bit_kernel_refuses_a_sketch_that_transposes_v():
    spec = _spec(dtype="bf16")
    stated = with_v_transpose(_sketch(spec), "producer")
    with pytest.raises(TranslationError, match="a bf16 kernel reads V as given"):
        translate.generate(stated, hopper_params(H100, spec), H100, spec)


# ---- runtime ------------------------------------------------------------------------------------------------

def _kernel(spec, **changes):
    from tuner.serving.launch import kernel as attention

    gen = _generate(spec, **changes)
    return attention.AttentionKernel(meta=gen.meta(), device_index=0, _module=None, _function=None, _sm_count=132)


def test_the_plan_maps_v_as_given_for_a_producer_kernel(monkeypatch):
    import torch

    from test_runtime import FakeTensor, _fake_encoding
    from tuner.serving.launch import plan as launch_plan, tma

    monkeypatch.setattr(tma, "encode_bytes", _fake_encoding)
    monkeypatch.setattr(tma, "_offsets", {})
    kern = _kernel(_spec(), v_transpose="producer")
    assert not launch_plan.transposes_v(kern.meta)
    monkeypatch.setattr(launch_plan, "transposed_v", lambda *a, **k: pytest.fail("a producer kernel's plan copied V"))
    b, s, h, d = 2, 1000, 4, 128
    q = FakeTensor((b, s, h, d), 0x1000_0000, dtype=torch.float8_e4m3fn)
    v = FakeTensor((b, s, h, d), 0x3000_0000, dtype=torch.float8_e4m3fn)
    plan = launch_plan.build_plan(kern, q, q, v, None, None)
    maps = {"qkvo"[slot.index]: slot.spec for slot in plan.maps}
    assert maps["v"].dims == maps["k"].dims == (d, s, h, b) and maps["v"].box == (128, 128, 1, 1)
    assert maps["v"].address == 0x3000_0000


def test_packed_and_paged_plans_map_v_as_k_for_a_producer_kernel(monkeypatch):
    import torch

    from test_runtime import FakeTensor, _fake_encoding
    from tuner.serving.launch import plan as launch_plan, tma

    monkeypatch.setattr(tma, "encode_bytes", _fake_encoding)
    monkeypatch.setattr(tma, "_offsets", {})
    e4m3 = torch.float8_e4m3fn
    for name in ("transposed_packed_v", "packed_vt_probe"):
        monkeypatch.setattr(launch_plan, name, lambda *a, **k: pytest.fail("a producer kernel's plan made V^T"))
    d, hq, hkv = 128, 16, 2
    varlen = _kernel(_spec(variant="gqa", layout="varlen"), v_transpose="producer")
    q = FakeTensor((700, hq, d), 0x1000_0000, dtype=e4m3)
    k = FakeTensor((1001, hkv, d), 0x2000_0000, dtype=e4m3)
    v = FakeTensor((1001, hkv, d), 0x3000_0000, dtype=e4m3)
    plan = launch_plan.build_varlen_plan(varlen, q, k, v, None, None, 3, 400, 600)
    maps = {"qkvo"[slot.index]: slot.spec for slot in plan.maps}
    assert maps["v"].dims == maps["k"].dims == (d, 1001, hkv, 1) and maps["v"].box == maps["k"].box
    paged = _kernel(_spec(variant="gqa", layout="paged"), v_transpose="producer")
    kc = FakeTensor((40, 16, hkv, d), 0x2000_0000, dtype=e4m3)
    vc = FakeTensor((40, 16, hkv, d), 0x3000_0000, dtype=e4m3)
    plan = launch_plan.build_paged_plan(paged, q, kc, vc, None, None, 3, 128, 8)   # no vt_keys: none needed
    maps = {"qkvo"[slot.index]: slot.spec for slot in plan.maps}
    assert maps["v"].dims == maps["k"].dims == (d, 16, hkv, 40) and maps["v"].box == maps["k"].box == (128, 16, 1, 1)
    with pytest.raises(ValueError, match="not a multiple of 8"):   # K's and V's e4m3 boxes a page
        launch_plan.build_paged_plan(paged, q, FakeTensor((40, 4, hkv, d), 0x2000_0000, dtype=e4m3),
                                     FakeTensor((40, 4, hkv, d), 0x3000_0000, dtype=e4m3), None, None, 3, 128, 8)


def test_a_producer_call_launches_no_v_t_copy(monkeypatch):
    """The kernel's call passes V itself to its launch (no Triton V^T copy, no v_t)."""
    import types

    from tuner.serving.launch import kernel as attention

    kern = _kernel(_spec(), v_transpose="producer")
    launched = []
    monkeypatch.setattr(attention, "transposed_v", lambda *a, **k: pytest.fail("a producer kernel copied V^T"))
    monkeypatch.setattr(attention.AttentionKernel, "_plan_for",
                        lambda self, *a, **k: types.SimpleNamespace(out_shape=(1,), out_dtype=None))
    monkeypatch.setattr(attention.AttentionKernel, "_descales", lambda self, *a, **k: ())
    monkeypatch.setattr(attention.AttentionKernel, "_launch", lambda self, plan, q, k, v, out, extra=(): launched.append(v))
    v = object()
    q = types.SimpleNamespace(shape=(1, 8, 4, 128), device="cpu")
    kern(q, q, v, out=object(), q_descale=1, k_descale=1, v_descale=1)
    assert launched == [v]
    with pytest.raises(ValueError, match="reads V as given"):
        kern(q, q, v, out=object(), q_descale=1, k_descale=1, v_descale=1, v_t=object())


# ---- nvcc (slow) --------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_transposes_lanes_write_the_runtimes_v_t_image(tmp_path):
    """Every FP8 block N at d64 and d128, both key orders, whole tiles and tiles with 1, 17, N - 6 and N - 1 keys (zeros
    past them), and the three swizzles."""
    from host_checks import run_host_checks

    source = (Path(__file__).parent / "vt_transpose_check.cpp").read_text()
    run_host_checks(source, "vt_transpose_check", tmp_path, count=15)


@pytest.mark.slow
@pytest.mark.parametrize("d, causal, order", [(128, True, "accumulator"), (64, False, "natural"), (64, True, "accumulator")])
def test_the_producer_kernels_sass_transposes_without_spills(d, causal, order):
    spec = _spec(d, causal)
    producer = _generate(spec, v_transpose="producer", vt_key_order=order)
    runtime = _generate(spec, v_transpose="runtime", vt_key_order=order,
                        producer_regs=producer.params.producer_regs)
    built = compiled_or_skip([producer, runtime], H100.nvcc_arch)
    for r in built:
        assert r.spill_stores == 0 and r.spill_loads == 0 and not r.stack_bytes, (r.spill_stores, r.spill_loads)
    p, rt = sass_counts(producer.name, built[0].cubin), sass_counts(runtime.name, built[1].cubin)
    assert p["STL"] == p["LDL"] == 0
    assert p["QGMMA"] == rt["QGMMA"] > 0                    # the same GEMMs
    assert p["LDSM"] == 1 and rt["LDSM"] == 0               # the transposer's loop: one ldmatrix.x4.trans a step
    assert p["STSM"] == rt["STSM"] + 1                      # ... and one stmatrix.x4 (beside the epilogue's)
    assert p["PRMT"] >= rt["PRMT"] + 4                      # four byte permutes a step
    assert p["UTMALDG"] == rt["UTMALDG"]                    # V by TMA either way (as given, or V^T)
    assert p["USETMAXREG"] == rt["USETMAXREG"] == 2


# ---- search space -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant, layout", [("mha", "dense"), ("gqa", "varlen"), ("mqa", "paged")])
def test_the_fp8_spaces_search_the_transpose_and_16_bit_spaces_do_not(variant, layout):
    from search_spaces import load_space
    from search_spaces.feasible import feasible_space

    space = load_space(variant, layout=layout)
    heads_kv = {"mha": 16, "gqa": 2, "mqa": 1}[variant]
    page = 16 if layout == "paged" else None
    for dtype in ("fp8", "bf16"):
        shape = Problem(variant, 1, 16, heads_kv, 1024, 1024, 128, 128, True, dtype)
        points = feasible_space(space, H100, 128, dtype, [shape], layout=layout, page_size=page).points
        producers = [p.params for p in points if p.params.v_transpose == "producer"]
        if dtype == "fp8":
            assert producers and any(p.params.v_transpose == "runtime" for p in points)
            assert all(p.producer_regs >= vt_producer_regs(p) for p in producers)
        else:
            assert not producers


@pytest.mark.parametrize("d", [64, 128])
def test_the_fp8_default_and_its_producer_form_are_points_of_the_fp8_space(d):
    """Both key orders are listed (a [dtype] table only narrows a parameter's choices): the FP8 default's "accumulator"
    order and its in-kernel-transpose form project onto the space."""
    from search_spaces import load_space
    from search_spaces.feasible import feasible_space

    spec, shape = _spec(d), _problem(d)
    space = feasible_space(load_space("mha"), H100, d, "fp8", [shape])
    for params in (_params(spec), _params(spec, v_transpose="producer")):
        chosen, reasons = space.project({**params.to_dict(), "schedule": "ws_overlap"}, H100, d, "fp8", [shape])
        assert not reasons, reasons
