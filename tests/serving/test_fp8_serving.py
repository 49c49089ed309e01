"""FP8 calls at the serving entry points on the CPU: an exported FP8 config (dtype fp8) served through
flash_attn_func and __call__ with FlashAttention-3's descales, the refusals of bad descales before any launch, the
fallback (SDPA on the dequantised inputs, counted) where no FP8 config matches, the op's schema, fake and missing
backward, and torch.compile."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import StandInKernel, serve_records

from tuner.serving.fp8_calls import dequantised

E4M3 = torch.float8_e4m3fn


class Fp8StandIn:
    """An FP8 kernel's contract on the CPU (tuner.serving.launch.kernel.AttentionKernel with an fp8 spec): e4m3 q, k, v,
    the three descales required, bf16 out; fp32 attention of the dequantised inputs."""

    def __init__(self, meta):
        self.meta, self.calls = meta, 0

    def __call__(self, q, k, v, out=None, softmax_scale=None, *, q_descale=None, k_descale=None, v_descale=None,
                 window_size=(-1, -1), softcap=0.0, sinks=None):
        from tuner.serving.launch.plan import check_descales
        from tuner.serving.options import PLAIN, reference_attention

        assert q.dtype == E4M3
        check_descales({"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}, q.shape[0],
                       k.shape[2], q.device)
        self.calls += 1
        group = q.shape[2] // k.shape[2]
        deq = [dequantised(q, q_descale, group), dequantised(k, k_descale), dequantised(v, v_descale)]
        scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[3])
        return reference_attention(*(t.float() for t in deq), self.meta["spec"]["causal"], scale, PLAIN).to(
            torch.bfloat16)


def _record(dtype, causal=True):
    from store_fakes import make_record

    r = make_record(variant="gqa", causal=causal, dtype=dtype, bucket="s1024", cubin=f"{dtype}-{causal}".encode())
    r.kernel_meta["spec"] = {"causal": causal, "d_qk": 128, "d_v": 128, "dtype": dtype, "layout": "dense"}
    r.problem["dtype"] = dtype
    return r


@pytest.fixture
def served(tmp_path):
    return serve_records(tmp_path / "export", [_record("fp8"), _record("bf16")],
                         lambda cubin, meta, index: Fp8StandIn(meta) if meta["spec"]["dtype"] == "fp8"
                         else StandInKernel(meta))


def _inputs(b=2, sq=40, sk=60, hq=8, hkv=2, d=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = ((torch.randn(b, s, h, d, generator=g) * 2).to(E4M3) for s, h in ((sq, hq), (sk, hkv), (sk, hkv)))
    scales = {n: torch.rand(b, hkv, generator=g) + 0.5 for n in ("q_descale", "k_descale", "v_descale")}
    return q, k, v, scales


def _expected(q, k, v, scales, causal):
    """fp32 attention of the inputs dequantised to bf16 (as the stand-in and the fallback take them)."""
    from tuner.measure.reference import reference

    group = q.shape[2] // k.shape[2]
    return reference(dequantised(q, scales["q_descale"], group), dequantised(k, scales["k_descale"]),
                     dequantised(v, scales["v_descale"]), causal)


def test_flash_attn_func_runs_the_fp8_kernel_with_the_descales(served):
    q, k, v, scales = _inputs()
    out = served.flash_attn_func(q, k, v, causal=True, **scales)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 40, 8, 128)
    assert served.stats["kernel"] == 1 and served.last_path == "kernel"
    fp8 = [kern for kern in served.stand_ins if isinstance(kern, Fp8StandIn)]
    assert len(fp8) == 1 and fp8[0].calls == 1
    torch.testing.assert_close(out.float(), _expected(q, k, v, scales, True), atol=2e-2, rtol=2e-2)


def test_sdpa_layout_and_call_take_fp8_too(served):
    q, k, v, scales = _inputs()
    out = served(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, layout="bhsd", **scales)
    torch.testing.assert_close(out.transpose(1, 2).float(), _expected(q, k, v, scales, True), atol=2e-2, rtol=2e-2)


def test_no_fp8_config_falls_back_to_sdpa_on_the_dequantised_inputs(served):
    q, k, v, scales = _inputs()
    out = served.flash_attn_func(q, k, v, causal=False, **scales)      # only a causal FP8 config was exported
    assert served.stats["sdpa"] == 1 and served.reasons["no-shape-config"] == 1
    torch.testing.assert_close(out.float(), _expected(q, k, v, scales, False), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("change, message", [
    (lambda s: s.pop("v_descale"), "v_descale is missing"),
    (lambda s: s.update(q_descale=torch.ones(2, 8)), r"q_descale must have shape \(2, 2\)"),
    (lambda s: s.update(k_descale=torch.ones(2, 2, dtype=torch.float64)), "k_descale must be fp32"),
    (lambda s: s.update(v_descale=torch.tensor([[1.0, float("nan")]] * 2)), "v_descale holds values that are not finite"),
])
def test_bad_descales_are_refused_before_any_launch(served, change, message):
    q, k, v, scales = _inputs()
    change(scales)
    with pytest.raises(ValueError, match=message):
        served.flash_attn_func(q, k, v, causal=True, **scales)
    assert served.stats["kernel"] == 0 and served.stats["sdpa"] == 0


def test_descales_with_16_bit_inputs_and_fp8_with_options_are_refused(served):
    q, k, v, scales = _inputs()
    with pytest.raises(ValueError, match="apply to torch.float8_e4m3fn inputs"):
        served.flash_attn_func(q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16), causal=True, **scales)
    with pytest.raises(NotImplementedError, match="FP8 calls take no window_size"):
        served.flash_attn_func(q, k, v, causal=True, window_size=(64, 0), **scales)


def test_the_fp8_op_has_no_backward_and_says_so(served):
    from tuner.serving import op_fp8

    q, k, v, scales = _inputs()
    route = served.route(q, k, v, True, 1 / math.sqrt(128))
    out = op_fp8.attention_fp8_op(q, k, v, scales["q_descale"], scales["k_descale"], scales["v_descale"], True,
                                  1 / math.sqrt(128), route)
    assert out.dtype == torch.bfloat16
    fake = op_fp8._attention_fp8_fake(q, k, v, *scales.values(), True, 0.1, route)
    assert fake.shape == out.shape and fake.dtype == torch.bfloat16
    scales["v_descale"].requires_grad_()
    out = op_fp8.attention_fp8_op(q, k, v, scales["q_descale"], scales["k_descale"], scales["v_descale"], True,
                                  1 / math.sqrt(128), route)
    with pytest.raises(NotImplementedError, match="has no backward"):
        out.float().sum().backward()


@pytest.mark.slow   # torch.compile: seconds of tracing
def test_an_fp8_call_traces_under_torch_compile_fullgraph(served):
    q, k, v, scales = _inputs()

    def f(q, k, v, qd, kd, vd):
        return served.flash_attn_func(q, k, v, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out = compiled(q, k, v, *scales.values())
    torch.testing.assert_close(out.float(), _expected(q, k, v, scales, True), atol=2e-2, rtol=2e-2)
