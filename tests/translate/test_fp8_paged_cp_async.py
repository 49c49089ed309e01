"""FP8 (e4m3) paged prefill with K copied by the producer warpgroup's cp.async (g2s_atom SM80_CP_ASYNC_CACHEGLOBAL,
v_transpose "runtime"): the e4m3 K rows go through the page table as the 16-bit rows of half the columns
(attn_sm90_copy.cuh cp_async_load_paged_8bit), V^T still comes by one thread's TMA from the runtime's packed copy. On
the CPU: the validation reasons, what the translator emits, the defaults (unchanged: TMA), the search spaces (both
copies in a paged space only), the runtime's plan; with nvcc (slow): a host replay of the copy's lanes against the e4m3
K tile's layout and TMA boxes, and the SASS against the TMA-K kernel's."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from sass_counts import compiled_or_skip, sass_counts

import tl
import translate
from hardware_profiles import load_profile
from kernel_abi.spec import KernelSpec, Problem
from search_spaces.feasible import layout_reasons
from translate.defaults import CP_ASYNC_PRODUCER_REGS, hopper_params
from translate.kernel import TranslationError
from translate.params import KernelParams, validate

H100 = load_profile("h100")
CP_ASYNC = "SM80_CP_ASYNC_CACHEGLOBAL"


def _spec(d=128, causal=True, variant="gqa", layout="paged", dtype="fp8"):
    return KernelSpec(variant, d, d, causal, dtype, layout=layout)


def _problem(d=128, variant="gqa", causal=True, dtype="fp8"):
    return Problem(variant, 1, 16, {"gqa": 4, "mqa": 1}.get(variant, 16), 1024, 1024, d, d, causal, dtype)


def _params(spec, **changes) -> KernelParams:
    """The FP8 paged default's TMA-K form (built for pages of whole tiles), with ``changes``."""
    return KernelParams.from_dict({**hopper_params(H100, spec, page_size=128).to_dict(), **changes})


def _cp_async(spec, **changes) -> KernelParams:
    return _params(spec, g2s_atom=CP_ASYNC, producer_regs=CP_ASYNC_PRODUCER_REGS, **changes)


def _generate(spec, params, schedule="ws_overlap"):
    program = tl.parse_program(tl.load_sketch(spec.variant, spec.causal, schedule, spec.layout))
    return translate.generate(program, params, H100, spec)


# ---- parameters ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("d, causal, variant", [(64, True, "gqa"), (64, False, "mha"), (128, True, "gqa"),
                                                (128, False, "mha")])
def test_a_paged_fp8_kernel_with_the_cp_async_producer_is_valid(d, causal, variant):
    spec = _spec(d, causal, variant)
    params = _cp_async(spec)
    assert validate(params, H100, _problem(d, variant, causal), warp_specialized=True) == []
    for page in (8, 16, 32, 48, 128, None):   # any multiple of 8 (the 16-bit cp.async producer's rule)
        assert layout_reasons(params, "ws_overlap", "paged", page) == []


@pytest.mark.parametrize("changes, layout, reason", [
    ({"v_transpose": "producer"}, "paged", "fp8 kernels with v_transpose 'producer' load K and V with TMA"),
    ({"producer_regs": 40}, "paged", f"producer_regs 40 < {CP_ASYNC_PRODUCER_REGS}: the cp.async producer"),
    ({}, "dense", "cp.async only from a paged cache; the dense layout loads them with TMA"),
    ({}, "varlen", "cp.async only from a paged cache; the varlen layout loads them with TMA"),
])
def test_what_the_fp8_cp_async_producer_cannot_take_is_refused_with_its_reason(changes, layout, reason):
    spec = _spec(128)
    params = KernelParams.from_dict({**_cp_async(spec).to_dict(), **changes})
    errors = validate(params, H100, _problem(128), warp_specialized=True) + \
        layout_reasons(params, "ws_overlap", layout, 16 if layout == "paged" else None)
    assert any(reason in e for e in errors), errors


def test_the_plain_schedule_still_refuses_fp8():
    params = KernelParams.from_dict({**_cp_async(_spec(128)).to_dict(), "persistent": False, "producer_regs": 24})
    errors = validate(params, H100, _problem(128), warp_specialized=False)
    assert any("fp8 kernels are warp-specialised" in e for e in errors), errors


def test_a_tma_k_kernel_still_reads_only_pages_that_fit_its_tile():
    params = _params(_spec(128))
    assert params.g2s_atom == "SM90_TMA" and params.block_n == 128
    assert any("page size 48 neither divides block_n 128" in e for e in layout_reasons(params, "ws_overlap", "paged", 48))


@pytest.mark.parametrize("page", [None, 16, 32, 64, 128, 256])
@pytest.mark.parametrize("d", [64, 128])
def test_the_fp8_paged_default_takes_cp_async_k_unless_its_pages_are_whole_tiles(page, d):
    """translate/defaults.py (pages of 16, H200: x1.33 over TMA K's 16-key boxes): K by the cp.async producer at its
    registers, TMA boxes where the page size is known and a multiple of block N; the 16-bit default as it was."""
    fp8 = hopper_params(H100, _spec(d), page_size=page)
    if page in (128, 256):
        assert fp8.g2s_atom == "SM90_TMA" and page % fp8.block_n == 0
    else:
        assert fp8.g2s_atom == CP_ASYNC and fp8.producer_regs == CP_ASYNC_PRODUCER_REGS
    assert validate(fp8, H100, _problem(d), warp_specialized=True) == []
    assert layout_reasons(fp8, "ws_overlap", "paged", page) == []
    if page in (None, 16, 32):
        assert hopper_params(H100, _spec(d, dtype="bf16"), page_size=page).g2s_atom == CP_ASYNC


# ---- translation --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule", ["ws_overlap", "ws_serial"])
@pytest.mark.parametrize("d, causal, variant", [(64, True, "gqa"), (64, False, "mha"), (128, True, "gqa"),
                                                (128, False, "mha")])
def test_the_kernel_copies_k_with_cp_async_and_loads_v_t_by_tma(d, causal, variant, schedule):
    spec = _spec(d, causal, variant)
    cp, tma = _generate(spec, _cp_async(spec), schedule), _generate(spec, _params(spec), schedule)
    body = cp.body
    k_copy = ("attn_sm90::cp_async_load_paged_8bit<kHeadDimQK, kBlockN>(smem_k + slot * kTileKElems, k_ptr + bidh_kv * "
              "k_head_stride, rows_at, k_row_stride, n_block * kBlockN, seqlen_k, tidx);")
    assert body.count(k_copy) == 1 and "attn_sm90::cp_async_arrive(&k_full[slot]);" in body
    assert "cp_async_load_paged<" not in body and "&v_full[slot]);  // this thread's part" not in body
    assert "tma_load_paged<" not in body and "tma_load_paged<" in tma.body   # K: no TMA box left
    vt_load = ("attn_sm90::tma_load_vt<kBlockN / kChunkV, kHeadDimV, kChunkV>(&tma_v, &v_full[slot], smem_v + slot * "
               "kTileVElems, attn_sm90::packed_vt_key0<kPackedVtAlign>(k_row0, vt.seq) + n_block * kBlockN, bidh_kv, "
               "bidb);")
    assert vt_load in body and vt_load in tma.body
    v_block = body.split("if (tidx == 0) {  // one thread loads V^T (TMA); the warpgroup copies K")[1].split("\n" + " " * 12 + "}")[0]
    assert vt_load in v_block and "arrive_and_expect_tx(&v_full[slot], kTileVBytes);" in v_block
    assert "if (tidx == 0) {  // one thread loads Q" in body
    assert "attn_sm90::FullBarrier::init(&k_full[s], kKVFullArrivals);" in body
    assert "attn_sm90::FullBarrier::init(&v_full[s], 1);  // V^T: one thread's TMA" in body
    assert "constexpr int kKVFullArrivals = 128;  // per K stage" in body
    # the same consumers, descriptors, maps, shared memory and launch arguments as the TMA-K kernel's
    consumers = lambda g: g.body.split("} else {  // consumer warpgroups")[1].replace(g.name, "NAME")
    assert consumers(cp) == consumers(tma)
    assert cp.tensor_maps == tma.tensor_maps and cp.smem_bytes == tma.smem_bytes and cp.extra_args == tma.extra_args
    assert cp.params.producer_regs == CP_ASYNC_PRODUCER_REGS and "_cpag_" in cp.name and "_tma_" in tma.name


def test_the_translator_refuses_the_cp_async_producer_beside_the_in_kernel_transpose_and_off_pages():
    spec = _spec(128)
    with pytest.raises(TranslationError, match="v_transpose 'producer' load K and V with TMA"):
        _generate(spec, _cp_async(spec, v_transpose="producer"))
    varlen = _spec(128, layout="varlen")
    with pytest.raises(TranslationError, match="only from a paged cache"):
        _generate(varlen, KernelParams.from_dict({**hopper_params(H100, varlen).to_dict(), "g2s_atom": CP_ASYNC,
                                                  "producer_regs": 56}))


# ---- search spaces ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["mha", "gqa", "mqa"])
def test_fp8_paged_spaces_search_both_k_copies_and_dense_and_varlen_keep_tma(variant):
    from search_spaces import load_space
    from search_spaces.feasible import default_sketches, feasible_space

    d = 128
    for layout in ("dense", "varlen", "paged"):
        space = load_space(variant).for_layout(layout)
        problem = _problem(d, variant)
        fs = feasible_space(space, H100, d, "fp8", [problem], default_sketches(space, H100, d, "fp8"), layout=layout,
                            page_size=16 if layout == "paged" else None)
        copies = Counter((p.params.g2s_atom, p.params.v_transpose) for p in fs.points)
        if layout == "paged":
            assert copies[("SM90_TMA", "runtime")] and copies[(CP_ASYNC, "runtime")], copies
            assert not copies[(CP_ASYNC, "producer")]
            assert min(p.params.producer_regs for p in fs.points if p.params.g2s_atom == CP_ASYNC) \
                >= CP_ASYNC_PRODUCER_REGS
        else:
            assert set(g for g, _ in copies) == {"SM90_TMA"}, copies


# ---- runtime ------------------------------------------------------------------------------------------------

def test_the_paged_plan_reads_pages_of_any_multiple_of_8_and_maps_the_gathered_v_t(monkeypatch):
    import torch

    from test_runtime import FakeTensor, _fake_encoding
    from tuner.serving.launch import kernel as attention, plan as launch_plan, tma

    monkeypatch.setattr(tma, "encode_bytes", _fake_encoding)
    monkeypatch.setattr(tma, "_offsets", {})
    e4m3 = torch.float8_e4m3fn
    spec = _spec(128)
    gen = _generate(spec, _cp_async(spec))
    kern = attention.AttentionKernel(meta=gen.meta(), device_index=0, _module=None, _function=None, _sm_count=132)
    assert launch_plan.transposes_v(kern.meta)
    d, hq, hkv = 128, 16, 2
    q = FakeTensor((700, hq, d), 0x1000_0000, dtype=e4m3)
    for page in (16, 32, 48):   # 48: not a divisor of block N 128 (a TMA-K kernel refuses it)
        kc = FakeTensor((40, page, hkv, d), 0x2000_0000, dtype=e4m3)
        vc = FakeTensor((40, page, hkv, d), 0x3000_0000, dtype=e4m3)
        plan = launch_plan.build_paged_plan(kern, q, kc, vc, None, None, 3, 128, 8, vt_keys=4096)
        maps = {"qkvo"[slot.index]: slot.spec for slot in plan.maps}
        assert maps["v"].dims[0] == 4096 and maps["k"].dims == (d, page, hkv, 40)
    with pytest.raises(ValueError, match="not a multiple of 8"):
        launch_plan.build_paged_plan(kern, q, FakeTensor((40, 4, hkv, d), 0x2000_0000, dtype=e4m3),
                                     FakeTensor((40, 4, hkv, d), 0x3000_0000, dtype=e4m3), None, None, 3, 128, 8,
                                     vt_keys=4096)
    tma_kern = attention.AttentionKernel(meta=_generate(spec, _params(spec)).meta(), device_index=0, _module=None,
                                         _function=None, _sm_count=132)
    with pytest.raises(ValueError, match="page size 48 does not fit block N 128"):
        launch_plan.build_paged_plan(tma_kern, q, FakeTensor((40, 48, hkv, d), 0x2000_0000, dtype=e4m3),
                                     FakeTensor((40, 48, hkv, d), 0x3000_0000, dtype=e4m3), None, None, 3, 128, 8,
                                     vt_keys=4096)


# ---- nvcc (slow) --------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_cp_async_lanes_put_e4m3_k_where_the_tma_boxes_and_the_wgmma_layout_do(tmp_path):
    """Every FP8 block N at d64 and d128, pages of 8-256, sequences ending inside and past the tile: each 16-byte chunk
    once, at CuTe's e4m3 K-major offset (= the TMA box's), from its row's page, zero-filled iff past the keys."""
    from host_checks import run_host_checks

    source = (Path(__file__).parent / "fp8_cp_async_k_check.cpp").read_text()
    run_host_checks(source, "fp8_cp_async_k_check", tmp_path, count=12, arch="sm_90a")


# (The page size is a run-time argument: one cubin reads pages of 16, 32 or any multiple of 8.)
@pytest.mark.slow
@pytest.mark.parametrize("d, causal, variant", [(64, True, "gqa"), (64, False, "mha"), (128, True, "gqa"),
                                                (128, False, "mha")])
def test_the_cp_async_kernels_sass_copies_k_by_ldgsts_without_spills(d, causal, variant):
    spec = _spec(d, causal, variant)
    cp, tma = _generate(spec, _cp_async(spec)), _generate(spec, _params(spec))
    built = compiled_or_skip([cp, tma], H100.nvcc_arch)
    for r in built:
        assert r.spill_stores == 0 and r.spill_loads == 0 and not r.stack_bytes, (r.spill_stores, r.spill_loads)
    c, t = sass_counts(cp.name, built[0].cubin), sass_counts(tma.name, built[1].cubin)
    assert c["STL"] == c["LDL"] == 0
    assert c["QGMMA"] == t["QGMMA"] > 0                    # the same GEMMs
    # K by cp.async: a warp-wide copy per row group of 8 (two of 4 rows at 128 bytes), the full-tile and last-tile paths
    groups = cp.params.block_n // 8 // 4
    assert c["LDGSTS"] >= groups * (2 if d == 128 else 1) * 2 and t["LDGSTS"] == 0, (c["LDGSTS"], groups)
    assert c["UTMALDG"] == t["UTMALDG"] - 1 >= 2           # Q and V^T by TMA; K's box gone
    assert c["USETMAXREG"] == t["USETMAXREG"] == 2
