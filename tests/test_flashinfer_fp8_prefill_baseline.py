"""FlashInfer's FP8 prefill as the dense FP8 bench's baseline (tuner/measure/flashinfer_fp8.py): a dense batch folded
into the heads of one request computes the same attention per (sequence, head), GQA included, with our descales as
its per-head scales; an output off the FP8 bound or a missing FlashInfer is a reason in the row, not a number."""
import sys
import types

import pytest

torch = pytest.importorskip("torch")

from kernel_abi.spec import Problem  # noqa: E402
from tuner.measure import dense, flashinfer_fp8  # noqa: E402


def _reference(q, k, v, causal, scale, group):
    """(b, s, h, d) fp32 attention, query head h on KV head h // group."""
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        n = q.shape[1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v)


def _fake_flashinfer(monkeypatch, wrong: bool = False):
    """A stand-in with FlashInfer's single-request contract: (s, heads, d) NHD, query head i on KV head i // group,
    per-head scales multiplying q, k, v."""
    calls = []

    def single_prefill_with_kv_cache(q, k, v, scale_q, scale_k, scale_v, o_dtype, causal, sm_scale, backend):
        calls.append(dict(backend=backend, o_dtype=o_dtype, heads=(q.shape[1], k.shape[1])))
        qf = q.float() * scale_q[None, :, None]
        kf, vf = k.float() * scale_k[None, :, None], v.float() * scale_v[None, :, None]
        out = _reference(qf[None], kf[None], vf[None], causal, sm_scale, q.shape[1] // k.shape[1])[0]
        return (out.flip(0) if wrong else out).to(o_dtype)

    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(
        single_prefill_with_kv_cache=single_prefill_with_kv_cache))
    return calls


def _inputs(problem, gen):
    def one(h, d):
        return (torch.randn(problem.batch, problem.seqlen_q, h, d, generator=gen)).to(torch.float8_e4m3fn)
    return one(problem.heads_q, problem.d_qk), one(problem.heads_kv, problem.d_qk), one(problem.heads_kv, problem.d_v)


@pytest.mark.parametrize("variant, hq, hkv, causal", [("mha", 4, 4, False), ("gqa", 8, 2, True), ("mqa", 4, 1, True)])
def test_a_batch_folded_into_heads_is_the_same_attention_with_our_descales_as_its_scales(monkeypatch, variant, hq,
                                                                                        hkv, causal):
    calls = _fake_flashinfer(monkeypatch)
    problem = Problem(variant, 3, hq, hkv, 24, 24, 64, 64, causal, "fp8")
    gen = torch.Generator().manual_seed(1)
    q, k, v = _inputs(problem, gen)
    descales = {"q_descale": torch.rand(3, hkv, generator=gen) + 0.5, "k_descale": torch.rand(3, hkv, generator=gen) + 0.5,
                "v_descale": torch.rand(3, hkv, generator=gen) + 0.5}
    call = flashinfer_fp8.dense_call(problem, descales, device="cpu")
    out = flashinfer_fp8.unfold(call(*flashinfer_fp8.fold(q, k, v)), problem.batch).float()
    group = hq // hkv
    want = _reference(q.float() * descales["q_descale"].repeat_interleave(group, 1)[:, None, :, None],
                      k.float() * descales["k_descale"][:, None, :, None],
                      v.float() * descales["v_descale"][:, None, :, None], causal, problem.softmax_scale, group)
    torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)
    assert calls[0]["backend"] == "fa3" and calls[0]["o_dtype"] == torch.bfloat16 and calls[0]["heads"] == (3 * hq,
                                                                                                            3 * hkv)


def _ref_of(problem, inputs):
    q, k, v = (t.float() for t in inputs[0])
    return ("flash", _reference(q, k, v, problem.causal, problem.softmax_scale, problem.group).to(torch.bfloat16))


def test_the_fp8_baseline_is_timed_checked_and_refused_with_its_reason(monkeypatch):
    problem = Problem("gqa", 2, 4, 2, 16, 16, 64, 64, True, "fp8")
    inputs = [_inputs(problem, torch.Generator().manual_seed(s)) for s in range(2)]
    monkeypatch.setattr(dense.timer, "time_ms", lambda call, timing=None: (call(), 1.0)[1])
    monkeypatch.setattr(dense.timer, "sync", lambda: None)
    _fake_flashinfer(monkeypatch)
    errors, outputs = {}, {}
    got = dense._fp8_baselines(problem, inputs, _ref_of(problem, inputs), errors, outputs, None)
    assert got["flashinfer_fp8"] == pytest.approx(problem.flops / 1e-3 / 1e12) and not errors
    assert outputs["flashinfer_fp8"].shape == inputs[0][0].shape
    _fake_flashinfer(monkeypatch, wrong=True)                 # a library called wrongly: no bar, the reason
    errors = {}
    got = dense._fp8_baselines(problem, inputs, _ref_of(problem, inputs), errors, {}, None)
    assert got["flashinfer_fp8"] is None and "differs from torch SDPA flash" in errors["flashinfer_fp8"]
    monkeypatch.setitem(sys.modules, "flashinfer", None)      # not installed
    errors = {}
    got = dense._fp8_baselines(problem, inputs, None, errors, {}, None)
    assert got["flashinfer_fp8"] is None and errors["flashinfer_fp8"].startswith("not installed")
    assert dense.baseline_names(problem)[-1] == "flashinfer_fp8"
    assert "flashinfer_fp8" not in dense.baseline_names(Problem("gqa", 2, 4, 2, 16, 16, 64, 64, True, "bf16"))
