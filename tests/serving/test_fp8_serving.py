"""FP8 calls at the serving entry points on the CPU: an exported FP8 config (dtype fp8) served through
flash_attn_func and __call__ with FlashAttention-3's descales, the refusals of bad descales before any launch, the
fallback (SDPA on the dequantised inputs, counted) where no FP8 config matches, the op's schema, fake and missing
backward, and torch.compile."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import StandInKernel, serve_records

from tuner.serving.fp8_calls import dequantised, dequantised_packed

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

    def varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=None, out=None,
               softmax_scale=None, *, q_descale=None, k_descale=None, v_descale=None):
        from tuner.serving.launch.plan import check_descales
        from tuner.serving.options import PLAIN, reference_varlen

        assert q.dtype == E4M3 and self.meta["spec"]["layout"] == "varlen"
        check_descales({"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale},
                       cu_seqlens_q.shape[0] - 1, k.shape[1], q.device)
        self.calls += 1
        group = q.shape[1] // k.shape[1]
        deq = [dequantised_packed(q, q_descale, cu_seqlens_q, group), dequantised_packed(k, k_descale, cu_seqlens_k),
               dequantised_packed(v, v_descale, cu_seqlens_k)]
        scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[2])
        return reference_varlen(*(t.float() for t in deq), cu_seqlens_q, cu_seqlens_k, seqused_k,
                                self.meta["spec"]["causal"], scale, PLAIN).to(torch.bfloat16)


def _record(dtype, causal=True, layout="dense"):
    from store_fakes import make_record

    r = make_record(variant="gqa", causal=causal, dtype=dtype, bucket="s1024", cubin=f"{dtype}-{causal}-{layout}".encode(),
                    layout=layout)
    r.kernel_meta["spec"] = {"causal": causal, "d_qk": 128, "d_v": 128, "dtype": dtype, "layout": layout}
    r.problem["dtype"] = dtype
    return r


@pytest.fixture
def served(tmp_path):
    return serve_records(tmp_path / "export", [_record("fp8"), _record("bf16"), _record("fp8", layout="varlen")],
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



# ---- packed sequences: flash_attn_varlen_func with e4m3 tensors, a descale per (sequence, KV head) ----------


def _packed(lens_q, lens_k, hq=8, hkv=2, d=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(sum(lens_q), hq, d, generator=g) * 2).to(E4M3)
    k = (torch.randn(sum(lens_k), hkv, d, generator=g) * 2).to(E4M3)
    v = (torch.randn(sum(lens_k), hkv, d, generator=g) * 2).to(E4M3)
    cu = [torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32) for lens in (lens_q, lens_k)]
    scales = {n: torch.rand(len(lens_q), hkv, generator=g) * 4 + 0.25 for n in ("q_descale", "k_descale", "v_descale")}
    return q, k, v, cu[0], cu[1], scales


def _expected_packed(q, k, v, cu_q, cu_k, scales, causal):
    """Each sequence alone: fp32 attention of its inputs times its own descales."""
    from tuner.measure.reference import reference

    out = torch.zeros(q.shape[0], q.shape[1], v.shape[2])
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        if q1 > q0 and k1 > k0:
            own = {n: d[b:b + 1] for n, d in scales.items()}
            out[q0:q1] = reference(dequantised(q[None, q0:q1], own["q_descale"], q.shape[1] // k.shape[1]),
                                   dequantised(k[None, k0:k1], own["k_descale"]),
                                   dequantised(v[None, k0:k1], own["v_descale"]), causal)[0]
    return out


def test_dequantised_packed_takes_each_rows_sequence():
    x = torch.ones(7, 2, 3).to(E4M3)
    d = torch.tensor([[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]])
    out = dequantised_packed(x, d, torch.tensor([0, 2, 2, 7], dtype=torch.int32), dtype=torch.float32)
    assert out[:2, 0].eq(1).all() and out[2:, 0].eq(100).all() and out[2:, 1].eq(200).all()   # (sequence 1 is empty)


def test_flash_attn_varlen_func_runs_the_fp8_varlen_kernel_with_per_sequence_descales(served):
    q, k, v, cu_q, cu_k, scales = _packed([0, 1, 129, 40], [5, 1, 200, 300])
    out = served.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 129, 300, causal=True, **scales)
    assert out.dtype == torch.bfloat16 and out.shape == (170, 8, 128)
    assert served.last_path == "kernel" and "varlen" in served.last_reason
    torch.testing.assert_close(out.float(), _expected_packed(q, k, v, cu_q, cu_k, scales, True), atol=3e-2, rtol=3e-2)


def test_no_fp8_varlen_config_falls_back_per_sequence_on_the_dequantised_inputs(served):
    q, k, v, cu_q, cu_k, scales = _packed([3, 50], [60, 50])
    out = served.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 50, 60, causal=False, **scales)   # causal only exported
    assert served.last_path == "sdpa" and served.reasons["no-shape-config"] == 1
    torch.testing.assert_close(out.float(), _expected_packed(q, k, v, cu_q, cu_k, scales, False), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("change, message", [
    (lambda s: s.pop("k_descale"), "k_descale is missing"),
    (lambda s: s.update(q_descale=torch.ones(3, 2)), r"q_descale must have shape \(2, 2\)"),   # one per sequence
    (lambda s: s.update(v_descale=torch.tensor([[1.0, float("inf")]] * 2)), "v_descale holds values that are not"),
])
def test_bad_packed_descales_are_refused_before_any_launch(served, change, message):
    q, k, v, cu_q, cu_k, scales = _packed([3, 50], [60, 50])
    change(scales)
    with pytest.raises(ValueError, match=message):
        served.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 50, 60, causal=True, **scales)
    assert served.stats["kernel"] == 0 and served.stats["sdpa"] == 0


def test_fp8_varlen_refuses_options_and_descales_on_16_bit_inputs(served):
    """(A paged cache: tests/serving/test_fp8_paged_serving.py.)"""
    q, k, v, cu_q, cu_k, scales = _packed([3, 50], [60, 50])
    with pytest.raises(NotImplementedError, match="FP8 calls take no window_size"):
        served.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 50, 60, causal=True, softcap=30.0, **scales)
    with pytest.raises(ValueError, match="apply to torch.float8_e4m3fn inputs"):
        served.flash_attn_varlen_func(q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16), cu_q, cu_k,
                                      50, 60, causal=True, **scales)


def test_the_packed_fp8_op_schema_fake_and_missing_backward(served):
    from tuner.serving import op_fp8

    q, k, v, cu_q, cu_k, scales = _packed([17, 0, 40], [30, 3, 40])
    scale = 1 / math.sqrt(128)
    route = served.route_varlen(q, k, v, True, scale, 40, cu_q, 40)
    args = (q, k, v, cu_q, cu_k, None, 40, 40, *scales.values(), True, scale, route)
    out = op_fp8.varlen_attention_fp8_op(*args)
    assert out.dtype == torch.bfloat16 and out.shape == (57, 8, 128)
    torch.testing.assert_close(out.float(), _expected_packed(q, k, v, cu_q, cu_k, scales, True), atol=3e-2, rtol=3e-2)
    fake = op_fp8._varlen_fp8_fake(*args)
    assert fake.shape == out.shape and fake.dtype == torch.bfloat16
    scales["k_descale"].requires_grad_()
    out = op_fp8.varlen_attention_fp8_op(q, k, v, cu_q, cu_k, None, 40, 40, *scales.values(), True, scale, route)
    with pytest.raises(NotImplementedError, match="has no backward"):
        out.float().sum().backward()


@pytest.mark.slow   # torch.compile: seconds of tracing
def test_a_packed_fp8_call_traces_under_torch_compile_fullgraph(served):
    q, k, v, cu_q, cu_k, scales = _packed([3, 50], [60, 50])

    def f(q, k, v, cu_q, cu_k, qd, kd, vd):
        return served.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 50, 60, causal=True, q_descale=qd, k_descale=kd,
                                             v_descale=vd)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out = compiled(q, k, v, cu_q, cu_k, *scales.values())
    assert served.stats["kernel"] >= 1 and served.stats["sdpa"] == 0
    torch.testing.assert_close(out.float(), _expected_packed(q, k, v, cu_q, cu_k, scales, True), atol=3e-2, rtol=3e-2)


def test_the_descale_check_asks_no_untraceable_question_while_compiling(monkeypatch):
    """Under torch.compile the check must not ask CUDA whether the stream is capturing (Dynamo cannot trace it: a
    compiled FP8 call on a GPU failed that way); outside it, on CUDA tensors, it asks, and reads no values while a
    capture runs."""
    from types import SimpleNamespace

    from tuner.serving import fp8_calls

    asked, finite = [], []
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: asked.append(1) or True)
    monkeypatch.setattr(fp8_calls, "check_descales", lambda d, b, h, dev, check_finite: finite.append(check_finite))
    q = SimpleNamespace(is_cuda=True, device=torch.device("cpu"))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    fp8_calls._checked({}, 1, 1, q)
    assert asked == [] and finite == [False]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    fp8_calls._checked({}, 1, 1, q)
    assert asked == [1] and finite == [False, False]
