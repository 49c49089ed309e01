"""An FP8 kernel's launch plan on the CPU (fake tensors, a fake TMA encoder): e4m3 maps of 128-byte boxes, V's map over
its transposed copy, a bf16 output map, the descales as per-call pointers; and the descales' checks."""
import struct

import pytest
import torch

from test_runtime import FakeTensor, _fake_encoding
from tuner.serving.launch import kernel as attention, plan as launch_plan, tma

E4M3 = torch.float8_e4m3fn


@pytest.fixture
def fp8_kernel():
    import tl
    import translate
    from hardware_profiles import load_profile
    from kernel_abi.spec import KernelSpec
    from translate.defaults import hopper_params

    profile = load_profile("h100")
    spec = KernelSpec("gqa", 128, 128, True, "fp8")
    program = tl.parse_program(tl.load_sketch(spec.variant, spec.causal, "ws_overlap"))
    gen = translate.generate(program, hopper_params(profile, spec), profile, spec)
    return attention.AttentionKernel(meta=gen.meta(), device_index=0, _module=None, _function=None, _sm_count=132)


def test_the_plan_maps_e4m3_boxes_a_transposed_v_and_a_bf16_output(fp8_kernel, monkeypatch):
    monkeypatch.setattr(tma, "encode_bytes", _fake_encoding)
    monkeypatch.setattr(tma, "_offsets", {})
    b, s, hq, hkv, d = 2, 1000, 16, 2, 128
    q = FakeTensor((b, s, hq, d), 0x1000_0000, dtype=E4M3)
    k = FakeTensor((b, s, hkv, d), 0x2000_0000, dtype=E4M3)
    v = FakeTensor((b, s, hkv, d), 0x3000_0000, dtype=E4M3)
    plan = launch_plan.build_plan(fp8_kernel, q, k, v, None, None)
    assert plan.out_dtype == torch.bfloat16 and plan.out_shape == (b, s, hq, d)
    maps = {"qkvo"[slot.index]: slot for slot in plan.maps}
    assert maps["q"].spec.element_bytes == 1 and maps["q"].spec.box == (128, 128, 1, 1)
    assert maps["q"].spec.swizzle_bytes == 128 and maps["q"].dtype == "fp8"
    skp = 1008   # keys rounded up to 16 (a TMA stride is a multiple of 16 bytes)
    vt = maps["v"].spec
    # the default's keys in accumulator order: the map spans the last group of 16 (a key of it may sit past 1000)
    assert launch_plan.vt_key_order(fp8_kernel.meta) == "accumulator"
    assert vt.dims == (skp, d, hkv, b) and vt.strides_bytes == (skp, d * skp, hkv * d * skp)
    assert vt.box == (128, d, 1, 1)      # 128 keys x d_v rows: the (d_v, keys) K-major tile of the P.V GEMM
    assert maps["o"].dtype == "bf16" and maps["o"].spec.element_bytes == 2 and maps["o"].spec.box == (64, 64, 1, 1)
    assert len(plan.dynamic_offsets) == 3   # q_descale, k_descale, v_descale: written per call
    names = [n for n, _ in fp8_kernel.args]
    assert [names.index(x) for x in launch_plan.FP8_DESCALES] == sorted(names.index(x) for x in launch_plan.FP8_DESCALES)
    raw = bytes(plan.params)
    at = plan.pointers[names.index("group")] - plan.pointers[0]
    assert struct.unpack_from("<i", raw, at)[0] == hq // hkv


def test_a_packed_fp8_plan_maps_v_transposed_over_all_keys_and_takes_the_descales_after_the_lengths(monkeypatch):
    import tl
    import translate
    from hardware_profiles import load_profile
    from kernel_abi.spec import KernelSpec
    from translate.defaults import hopper_params

    monkeypatch.setattr(tma, "encode_bytes", _fake_encoding)
    monkeypatch.setattr(tma, "_offsets", {})
    profile = load_profile("h100")
    spec = KernelSpec("gqa", 128, 128, True, "fp8", layout="varlen")
    gen = translate.generate(tl.parse_program(tl.load_sketch("gqa", True, "ws_overlap", "varlen")),
                             hopper_params(profile, spec), profile, spec)
    kern = attention.AttentionKernel(meta=gen.meta(), device_index=0, _module=None, _function=None, _sm_count=132)
    total_q, total_k, hq, hkv, d = 700, 1001, 16, 2, 128
    q = FakeTensor((total_q, hq, d), 0x1000_0000, dtype=E4M3)
    k = FakeTensor((total_k, hkv, d), 0x2000_0000, dtype=E4M3)
    plan = launch_plan.build_varlen_plan(kern, q, k, k, None, None, 3, 400, 600)
    assert plan.out_dtype == torch.bfloat16 and plan.out_shape == (total_q, hq, d)
    maps = {"qkvo"[slot.index]: slot for slot in plan.maps}
    vt = maps["v"].spec   # one 'batch' of the packed keys, each sequence from a 16-key boundary, 16 keys apart
    keys = 1008 + 3 * 16
    assert vt.dims == (keys, d, hkv, 1) and vt.strides_bytes == (keys, d * keys, hkv * d * keys)
    assert maps["k"].spec.dims == (d, total_k, hkv, 1) and maps["o"].dtype == "bf16"
    names = [n for n, _ in kern.args]
    assert len(plan.dynamic_offsets) == 6   # cu_seqlens_q, cu_seqlens_k, seqused_k, then the three descales
    offsets = [plan.pointers[names.index(n)] - plan.pointers[0] for n in
               ("cu_seqlens_q", "cu_seqlens_k", "seqused_k", *launch_plan.FP8_DESCALES)]
    assert list(plan.dynamic_offsets) == offsets


def test_an_fp8_plan_refuses_16_bit_inputs(fp8_kernel, monkeypatch):
    monkeypatch.setattr(tma, "encode_bytes", _fake_encoding)
    q = FakeTensor((1, 64, 16, 128), 0x1000_0000)
    with pytest.raises(ValueError, match="this kernel was built for torch.float8_e4m3fn"):
        launch_plan.build_plan(fp8_kernel, q, q, q, None, None)


def test_transposed_v_holds_v_keys_along_rows_of_16_byte_strides():
    v = torch.randn(2, 37, 3, 64).to(E4M3)
    vt = launch_plan.transposed_v(v)
    assert tuple(vt.shape) == (2, 64, 3, 37) and vt.stride(-1) == 1 and vt.stride(1) == 48
    assert torch.equal(vt.permute(0, 3, 2, 1).float(), v.float())
    probe = launch_plan.transposed_v(v, alloc=False)
    assert probe.shape == tuple(vt.shape) and probe.stride() == tuple(vt.stride())


def _scales(b=2, h=4, **change):
    scales = {n: torch.ones(b, h) for n in launch_plan.FP8_DESCALES}
    scales.update(change)
    return scales


@pytest.mark.parametrize("change, message", [
    ({"k_descale": None}, "k_descale is missing"),
    ({"q_descale": torch.ones(2, 4, dtype=torch.float16)}, "q_descale must be fp32"),
    ({"v_descale": torch.ones(4, 2)}, r"v_descale must have shape \(2, 4\)"),
    ({"v_descale": torch.ones(2, 8)[:, ::2]}, "v_descale must be contiguous"),
    ({"k_descale": torch.tensor([[1.0, 2.0, float("inf"), 1.0]] * 2)}, "k_descale holds values that are not finite"),
    ({"q_descale": [[1.0] * 4] * 2}, "q_descale must be a torch tensor"),
])
def test_bad_descales_are_refused_by_name(change, message):
    with pytest.raises(ValueError, match=message):
        launch_plan.check_descales(_scales(**change), 2, 4, torch.device("cpu"))


def test_descales_on_another_device_are_refused():
    with pytest.raises(ValueError, match="q_descale is on cpu; the inputs are on cuda:0"):
        launch_plan.check_descales(_scales(), 2, 4, torch.device("cuda", 0))


def test_a_descale_written_in_place_is_checked_again():
    scales = _scales()
    launch_plan.check_descales(scales, 2, 4, torch.device("cpu"))
    scales["v_descale"][1, 1] = float("nan")
    with pytest.raises(ValueError, match="v_descale holds values that are not finite"):
        launch_plan.check_descales(scales, 2, 4, torch.device("cpu"))


def test_packed_v_transposed_starts_each_sequence_at_an_aligned_key_with_zeros_between():
    """The V^T of packed sequences (CPU: torch's copy): sequence b's keys at 16 x ceil(cu_k[b] / 16) + 16 b, as
    attn_sm90::packed_vt_key0 reads them; every other column zero (P = 0 meets it: no e4m3 NaN may hide there)."""
    lens = [0, 1, 127, 5, 33]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    v = (torch.arange(sum(lens) * 2 * 32) % 200 + 1).float().view(sum(lens), 2, 32).to(E4M3)
    vt = launch_plan.transposed_packed_v(v, cu, len(lens), 16)
    assert tuple(vt.shape) == (1, 32, 2, launch_plan.packed_vt_keys(sum(lens), len(lens), 16)) and vt.stride(-1) == 1
    rows = vt[0].permute(2, 1, 0).view(torch.uint8)   # (keys, heads, d)
    seen = torch.zeros(rows.shape[0], dtype=torch.bool)
    for b, n in enumerate(lens):
        start = -(-int(cu[b]) // 16) * 16 + 16 * b
        assert torch.equal(rows[start:start + n], v[int(cu[b]):int(cu[b]) + n].view(torch.uint8))
        seen[start:start + n] = True
    assert not rows[~seen].any()
    probe = launch_plan.transposed_packed_v(v, None, len(lens), 16, alloc=False)
    assert tuple(probe.shape) == tuple(vt.shape) and probe.stride() == vt.stride()


@pytest.mark.parametrize("d", [64, 96, 256])
def test_transposed_v_in_accumulator_order_puts_each_key_at_its_column_and_zeros_past_the_keys(d):
    """The key order the FP8 defaults read (plan.vt_column): key 8h + 2q + b of each 16 at column 4q + 2h + b; the
    view spans the whole last 16 (37 keys -> 48 columns), the columns no key takes hold zeros, not e4m3 NaN."""
    v = (torch.arange(2 * 37 * 3 * d) % 200 + 1).float().view(2, 37, 3, d).to(E4M3)
    vt = launch_plan.transposed_v(v, order="accumulator")
    assert tuple(vt.shape) == (2, d, 3, 48) and vt.stride(-1) == 1
    cols = launch_plan.vt_column(torch.arange(37), "accumulator")
    assert cols[:16].tolist() == [0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15]
    assert torch.equal(vt[..., cols].permute(0, 3, 2, 1).view(torch.uint8), v.view(torch.uint8))
    unused = torch.ones(48, dtype=torch.bool)
    unused[cols] = False
    assert unused.sum() == 11 and not vt[..., unused].view(torch.uint8).any()
    probe = launch_plan.transposed_v(v, alloc=False, order="accumulator")
    assert probe.shape == tuple(vt.shape) and probe.stride() == tuple(vt.stride())


def test_packed_v_in_accumulator_order_permutes_within_each_sequences_groups_of_16():
    lens = [0, 1, 19, 5, 33]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    v = (torch.arange(sum(lens) * 2 * 32) % 200 + 1).float().view(sum(lens), 2, 32).to(E4M3)
    vt = launch_plan.transposed_packed_v(v, cu, len(lens), 16, order="accumulator")
    rows = vt[0].permute(2, 1, 0).view(torch.uint8)
    seen = torch.zeros(rows.shape[0], dtype=torch.bool)
    for b, n in enumerate(lens):
        start = -(-int(cu[b]) // 16) * 16 + 16 * b
        at = start + launch_plan.vt_column(torch.arange(n), "accumulator")
        assert all(start <= c < start + -(-n // 16) * 16 for c in at.tolist())   # within the sequence's groups
        assert torch.equal(rows[at], v[int(cu[b]):int(cu[b]) + n].view(torch.uint8))
        seen[at] = True
    assert not rows[~seen].any()
    with pytest.raises(ValueError, match="multiples of 16 keys"):
        launch_plan.transposed_packed_v(v, cu, len(lens), 8, order="accumulator")


def test_fa3s_block_n_224_maps_v_t_in_seven_32_byte_swizzled_boxes(monkeypatch):
    """FA3's FP8 d128 tile (block N 224): V^T's rows of 224 keys take the 32-byte swizzle (64 does not divide them),
    so the plan maps V^T in boxes of 32 keys x d_v rows with that swizzle, and Q/K keep their 128-byte boxes."""
    import tl
    import translate
    from hardware_profiles import load_profile
    from kernel_abi.spec import KernelSpec
    from translate.defaults import hopper_params
    from translate.params import KernelParams

    monkeypatch.setattr(tma, "encode_bytes", _fake_encoding)
    monkeypatch.setattr(tma, "_offsets", {})
    profile = load_profile("h200")
    spec = KernelSpec("mha", 128, 128, False, "fp8")
    params = KernelParams.from_dict({**hopper_params(profile, spec).to_dict(), "block_n": 224})
    gen = translate.generate(tl.parse_program(tl.load_sketch("mha", False, "ws_overlap")), params, profile, spec)
    assert "TL_MMA_64x224x32_F32E4M3E4M3_SS_TN<>{}" in gen.body and "constexpr int kChunkV = 32;" in gen.body
    kern = attention.AttentionKernel(meta=gen.meta(), device_index=0, _module=None, _function=None, _sm_count=132)
    q = FakeTensor((1, 4096, 16, 128), 0x1000_0000, dtype=E4M3)
    plan = launch_plan.build_plan(kern, q, q, q, None, None)
    maps = {"qkvo"[slot.index]: slot.spec for slot in plan.maps}
    assert maps["v"].box == (32, 128, 1, 1) and maps["v"].swizzle_bytes == 32
    assert maps["k"].box == (128, 224, 1, 1) and maps["k"].swizzle_bytes == 128
    with pytest.raises(tma.TensorMapError, match="not a 32-, 64- or 128-byte swizzle span"):
        tma.tensor_map_spec(0x1000, (1, 64, 1, 128), (8192, 128, 128, 1), 1, 64, box_columns=16)


@pytest.mark.parametrize("d, qk_box, o_box, o_swizzle", [(96, 32, 32, 64), (256, 128, 64, 128)])
def test_the_plan_maps_d96_and_d256_in_the_kernels_boxes(monkeypatch, d, qk_box, o_box, o_swizzle):
    """d96: e4m3 rows in 32-byte boxes (the 32-byte swizzle) and the bf16 O in 32-column boxes (the 64-byte swizzle:
    the kernel stores three a row, as the 16-bit d96 kernels); d256: two 128-byte boxes a row, O in 64-column ones;
    V^T over the 16-rounded keys, d rows a box."""
    import tl
    import translate
    from hardware_profiles import load_profile
    from kernel_abi.spec import KernelSpec
    from translate.defaults import hopper_params

    monkeypatch.setattr(tma, "encode_bytes", _fake_encoding)
    monkeypatch.setattr(tma, "_offsets", {})
    profile, spec = load_profile("h100"), KernelSpec("gqa", d, d, True, "fp8")
    program = tl.parse_program(tl.load_sketch(spec.variant, spec.causal, "ws_overlap"))
    gen = translate.generate(program, hopper_params(profile, spec), profile, spec)
    kernel = attention.AttentionKernel(meta=gen.meta(), device_index=0, _module=None, _function=None, _sm_count=132)
    b, s, hq, hkv = 2, 1000, 16, 2
    q = FakeTensor((b, s, hq, d), 0x1000_0000, dtype=E4M3)
    k = FakeTensor((b, s, hkv, d), 0x2000_0000, dtype=E4M3)
    v = FakeTensor((b, s, hkv, d), 0x3000_0000, dtype=E4M3)
    plan = launch_plan.build_plan(kernel, q, k, v, None, None)
    assert plan.out_shape == (b, s, hq, d)
    maps = {"qkvo"[slot.index]: slot.spec for slot in plan.maps}
    assert maps["q"].box == (qk_box, gen.params.block_m, 1, 1) and maps["q"].swizzle_bytes == qk_box
    assert maps["k"].box == (qk_box, gen.params.block_n, 1, 1)
    assert maps["v"].box == (gen.params.block_n, d, 1, 1) and maps["v"].dims == (1008, d, hkv, b)
    assert maps["o"].box == (o_box, 64, 1, 1) and maps["o"].swizzle_bytes == o_swizzle
    assert maps["o"].element_bytes == 2
