"""FP8 over a paged cache at the serving entry points on the CPU: flash_attn_varlen_func(block_table=...) with e4m3 q
and caches and a descale per (sequence, KV head) runs an exported FP8 paged config (a stand-in kernel), or where none
serves the call SDPA per sequence on the dequantised pages (counted); bad descales are refused before any launch; the
op's schema, fake and missing backward; torch.compile."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import StandInKernel, serve_records
from test_fp8_serving import Fp8StandIn, _expected_packed, _record
from test_paged_serving import paged_case

E4M3 = torch.float8_e4m3fn


class Fp8PagedStandIn(Fp8StandIn):
    """An FP8 paged kernel's contract on the CPU: e4m3 q and caches, the descales and max_seqlen_k (the V^T's bound)
    required; each sequence's pages gathered through the table, then the FP8 varlen stand-in's arithmetic."""

    def paged(self, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q, out=None,
              softmax_scale=None, *, q_descale=None, k_descale=None, v_descale=None, max_seqlen_k=None):
        assert self.meta["spec"]["layout"] == "paged" and k_cache.dtype == v_cache.dtype == E4M3
        used = seqused_k.tolist()
        assert max_seqlen_k is not None and max_seqlen_k >= max(used)
        page = k_cache.shape[1]
        ks, vs = [], []
        for b, n in enumerate(used):
            pages = page_table[b, :-(-n // page)].tolist() if n else []
            ks.append(torch.cat([k_cache[p] for p in pages])[:n] if n else k_cache[:0, 0])
            vs.append(torch.cat([v_cache[p] for p in pages])[:n] if n else v_cache[:0, 0])
        cu_k = torch.tensor([0, *torch.tensor(used).cumsum(0).tolist()], dtype=torch.int32)
        self.meta["spec"]["layout"] = "varlen"   # the packed arithmetic, once the keys are gathered
        try:
            return self.varlen(q, torch.cat(ks), torch.cat(vs), cu_seqlens_q, cu_k, max_seqlen_q, max(used),
                               softmax_scale=softmax_scale, q_descale=q_descale, k_descale=k_descale,
                               v_descale=v_descale)
        finally:
            self.meta["spec"]["layout"] = "paged"


@pytest.fixture
def served(tmp_path):
    import dataclasses

    records = [dataclasses.replace(_record(dtype, layout="paged"), bucket="t4k-even-p16") for dtype in ("fp8", "bf16")]
    records.append(_record("fp8", layout="varlen"))
    return serve_records(tmp_path / "export", records,
                         lambda cubin, meta, index: Fp8PagedStandIn(meta) if meta["spec"]["dtype"] == "fp8"
                         else StandInKernel(meta))


def _case(lens_q=(1, 100, 37), lens_k=(5, 300, 37), page=16, seed=0):
    q, k, v, kc, vc, cu_q, cu_k, table = paged_case(list(lens_q), list(lens_k), page, dtype=E4M3, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    scales = {n: torch.rand(len(lens_q), 2, generator=g) * 4 + 0.25 for n in ("q_descale", "k_descale", "v_descale")}
    return q, k, v, kc, vc, cu_q, cu_k, table, scales


def test_a_paged_fp8_call_runs_the_fp8_paged_kernel_with_per_sequence_descales(served):
    q, k, v, kc, vc, cu_q, cu_k, table, scales = _case()
    out = served.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 100, 300, causal=True, block_table=table, **scales)
    assert out.dtype == torch.bfloat16 and out.shape == (138, 8, 128)
    assert served.last_path == "kernel" and "paged" in served.last_reason, served.last_reason
    ran = [kern for kern in served.stand_ins if isinstance(kern, Fp8PagedStandIn) and kern.calls]
    assert len(ran) == 1 and ran[0].meta["spec"]["layout"] == "paged"
    torch.testing.assert_close(out.float(), _expected_packed(q, k, v, cu_q, cu_k, scales, True), atol=3e-2, rtol=3e-2)


def test_seqused_k_and_page_table_spellings_and_no_max_seqlen_k(served):
    q, k, v, kc, vc, cu_q, cu_k, table, scales = _case((40, 64), (100, 90), 16)
    used = (cu_k[1:] - cu_k[:-1]).to(torch.int32)
    out = served.flash_attn_varlen_func(q, kc, vc, cu_q, None, 64, None, causal=True, page_table=table,
                                        seqused_k=used, **scales)
    assert served.last_path == "kernel"
    torch.testing.assert_close(out.float(), _expected_packed(q, k, v, cu_q, cu_k, scales, True), atol=3e-2, rtol=3e-2)


def test_no_fp8_paged_config_falls_back_per_sequence_on_the_dequantised_pages(served):
    q, k, v, kc, vc, cu_q, cu_k, table, scales = _case((7, 50), (60, 50))
    out = served.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 50, 60, causal=False, block_table=table, **scales)
    assert served.last_path == "sdpa" and served.reasons["no-shape-config"] == 1   # a causal one only
    assert not any(kern.calls for kern in served.stand_ins if isinstance(kern, Fp8PagedStandIn))
    torch.testing.assert_close(out.float(), _expected_packed(q, k, v, cu_q, cu_k, scales, False), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("change, message", [
    (lambda s: s.pop("q_descale"), "q_descale is missing"),
    (lambda s: s.update(k_descale=torch.ones(2, 2)), r"k_descale must have shape \(3, 2\)"),   # one per sequence
    (lambda s: s.update(v_descale=torch.tensor([[1.0, float("nan")]] * 3)), "v_descale holds values that are not"),
])
def test_bad_paged_descales_are_refused_before_any_launch(served, change, message):
    q, k, v, kc, vc, cu_q, cu_k, table, scales = _case()
    change(scales)
    with pytest.raises(ValueError, match=message):
        served.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 100, 300, causal=True, block_table=table, **scales)
    assert served.stats["kernel"] == 0 and served.stats["sdpa"] == 0


def test_fp8_paged_refuses_options_and_descales_on_16_bit_caches(served):
    q, k, v, kc, vc, cu_q, cu_k, table, scales = _case()
    with pytest.raises(NotImplementedError, match="FP8 calls take no window_size"):
        served.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 100, 300, causal=True, block_table=table,
                                      window_size=(64, 0), **scales)
    with pytest.raises(ValueError, match="apply to torch.float8_e4m3fn inputs"):
        served.flash_attn_varlen_func(q.to(torch.bfloat16), kc.to(torch.bfloat16), vc.to(torch.bfloat16), cu_q, cu_k,
                                      100, 300, causal=True, block_table=table, **scales)
    with pytest.raises(ValueError, match="an FP8 call takes q, k and v in torch.float8_e4m3fn"):
        served.flash_attn_varlen_func(q, kc.to(torch.bfloat16), vc.to(torch.bfloat16), cu_q, cu_k, 100, 300,
                                      causal=True, block_table=table, **scales)


def test_the_paged_fp8_op_schema_fake_and_missing_backward(served):
    from tuner.serving import op_fp8

    q, k, v, kc, vc, cu_q, cu_k, table, scales = _case((17, 0, 40), (30, 3, 40))
    scale = 1 / math.sqrt(128)
    used = (cu_k[1:] - cu_k[:-1]).to(torch.int32)
    route = served.route_paged(q, kc, vc, True, scale, cu_q, 40, 40)
    args = (q, kc, vc, cu_q, used, table, 40, 40, *scales.values(), True, scale, route)
    out = op_fp8.paged_attention_fp8_op(*args)
    assert out.dtype == torch.bfloat16 and out.shape == (57, 8, 128)
    torch.testing.assert_close(out.float(), _expected_packed(q, k, v, cu_q, cu_k, scales, True), atol=3e-2, rtol=3e-2)
    fake = op_fp8._paged_fp8_fake(*args)
    assert fake.shape == out.shape and fake.dtype == torch.bfloat16
    scales["v_descale"].requires_grad_()
    out = op_fp8.paged_attention_fp8_op(q, kc, vc, cu_q, used, table, 40, 40, *scales.values(), True, scale, route)
    with pytest.raises(NotImplementedError, match="has no backward"):
        out.float().sum().backward()


@pytest.mark.slow   # torch.compile: seconds of tracing
def test_a_paged_fp8_call_traces_under_torch_compile_fullgraph(served):
    q, k, v, kc, vc, cu_q, cu_k, table, scales = _case()

    def f(q, kc, vc, cu_q, cu_k, table, qd, kd, vd):
        return served.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 100, 300, causal=True, block_table=table,
                                             q_descale=qd, k_descale=kd, v_descale=vd)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out = compiled(q, kc, vc, cu_q, cu_k, table, *scales.values())
    assert served.stats["kernel"] >= 1 and served.stats["sdpa"] == 0
    torch.testing.assert_close(out.float(), _expected_packed(q, k, v, cu_q, cu_k, scales, True), atol=3e-2, rtol=3e-2)
