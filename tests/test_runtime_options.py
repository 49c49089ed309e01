"""A call's options at launch (tuner/serving/launch/plan.py): the window's sizes, the cap and the exponent scale in
the parameter buffer, the sinks pointer written per call, and every call a kernel cannot serve refused by name
before any launch."""
import ctypes
import math
import struct

import pytest
import torch

from test_runtime import FakeTensor, _fake_encoding
from tuner.serving.launch import kernel as attention, plan as launch_plan, tma


def _kernel(options=(True, True, True), causal=True):
    import tl
    import translate
    from hardware_profiles import load_profile
    from kernel_abi.spec import KernelSpec
    from tl.options import with_options
    from translate.defaults import default_params

    profile = load_profile("h100")
    spec = KernelSpec("gqa", 128, 128, causal, "bf16", local=options[0], softcap=options[1], sinks=options[2])
    program = with_options(tl.parse_program(tl.load_sketch("gqa", causal, "ws_overlap")), *options)
    gen = translate.generate(program, default_params(profile, spec, "ws_overlap"), profile, spec)
    return attention.AttentionKernel(meta=gen.meta(), device_index=0, _module=None, _function=None, _sm_count=132)


@pytest.fixture
def fake_maps(monkeypatch):
    monkeypatch.setattr(tma, "encode_bytes", _fake_encoding)
    monkeypatch.setattr(tma, "_offsets", {})


def _qkv():
    return (FakeTensor((1, 256, 8, 128), 0x1000_0000), FakeTensor((1, 256, 2, 128), 0x2000_0000),
            FakeTensor((1, 256, 2, 128), 0x3000_0000))


def _value(plan, kernel, name):
    offsets, _ = launch_plan._arg_slots(kernel.args)
    kind = dict(kernel.args)[name]
    return struct.unpack_from(launch_plan._SCALAR_FORMAT[kind], plan.params, offsets[name])[0]


class _Sinks:
    """What the plan checks of a sinks tensor, without a GPU."""

    def __init__(self, n, dtype=torch.float32):
        self.shape, self.dtype, self.device = torch.Size([n]), dtype, torch.device("cuda", 0)

    def stride(self, axis=0):
        return 1


def test_the_window_and_the_cap_are_packed_and_the_exponent_carries_the_cap(fake_maps, monkeypatch):
    monkeypatch.setattr(torch, "Tensor", _Sinks)   # the plan's isinstance check accepts the stand-in
    kernel = _kernel()
    q, k, v = _qkv()
    options = launch_plan.CallOptions((128, 0), 50.0, _Sinks(8))
    plan = launch_plan.build_plan(kernel, q, k, v, None, 0.125, options)
    assert (_value(plan, kernel, "window_left"), _value(plan, kernel, "window_right")) == (128, 0)
    assert _value(plan, kernel, "softcap_prescale") == pytest.approx(0.125 / 50.0)
    assert _value(plan, kernel, "softmax_scale_log2") == pytest.approx(50.0 * math.log2(math.e))
    offsets, _ = launch_plan._arg_slots(kernel.args)
    assert plan.dynamic_offsets == (offsets["sinks"],)       # written per call, as the data pointers


def test_a_causal_kernel_closes_the_right_side_and_a_plain_call_of_a_local_kernel_sees_every_key(fake_maps):
    kernel = _kernel((True, False, False), causal=False)
    q, k, v = _qkv()
    plan = launch_plan.build_plan(kernel, q, k, v, None, 0.1)
    assert (_value(plan, kernel, "window_left"), _value(plan, kernel, "window_right")) == (-1, -1)
    causal = _kernel((True, False, False), causal=True)
    plan = launch_plan.build_plan(causal, q, k, v, None, 0.1, launch_plan.CallOptions((7, -1)))
    assert (_value(plan, causal, "window_left"), _value(plan, causal, "window_right")) == (7, 0)


@pytest.mark.parametrize("options,kernel_options,words", [
    (launch_plan.CallOptions((64, 0)), (False, False, False), "was built without a sliding window"),
    (launch_plan.CallOptions(softcap=30.0), (False, False, False), "was built without soft-capping"),
    (launch_plan.CallOptions(), (False, True, False), "is built with soft-capping"),
    (launch_plan.CallOptions(), (False, False, True), "is built with attention sinks"),
    (launch_plan.CallOptions((-2, 0)), (True, False, False), "window_size must be"),
    (launch_plan.CallOptions(softcap=float("inf")), (False, True, False), "softcap must be"),
])
def test_a_call_the_kernel_cannot_serve_is_refused_by_name(fake_maps, options, kernel_options, words):
    kernel = _kernel(kernel_options)
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=words):
        launch_plan.build_plan(kernel, q, k, v, None, 0.1, options)


def test_sinks_of_the_wrong_shape_or_dtype_are_refused(fake_maps, monkeypatch):
    monkeypatch.setattr(torch, "Tensor", _Sinks)
    kernel = _kernel((False, False, True))
    q, k, v = _qkv()
    for bad in (_Sinks(4), _Sinks(8, torch.bfloat16)):
        with pytest.raises(ValueError, match="sinks .learnable_sink. must be a contiguous fp32 tensor of 8 logits"):
            launch_plan.build_plan(kernel, q, k, v, None, 0.1, launch_plan.CallOptions(sinks=bad))
