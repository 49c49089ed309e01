"""FlashInfer's FP8-KV decode as the FP8 cache bench's baseline (tuner.measure.decode.flashinfer_fp8_decode_call), on
the CPU with a stand-in flashinfer module: the page table it is planned with, the per-tensor scales it is given, and
the points it is not given, each with its reason."""
import sys
import types

import pytest

torch = pytest.importorskip("torch")

from tuner.measure.decode import (DecodePoint, FlashInferUnavailable, flashinfer_fp8_decode_call,  # noqa: E402
                                  make_decode_inputs)


class _Wrapper:
    made = []

    def __init__(self, workspace, layout, use_tensor_cores=False):
        self.layout, self.tensor_cores, self.planned, self.ran = layout, use_tensor_cores, None, None
        _Wrapper.made.append(self)

    def plan(self, indptr, indices, last_page_len, heads_q, heads_kv, head_dim, page_size, **kw):
        self.planned = dict(indptr=indptr.tolist(), indices=indices.tolist(), last=last_page_len.tolist(),
                            heads=(heads_q, heads_kv, head_dim, page_size), **kw)

    def run(self, q, kv, k_scale, v_scale):
        self.ran = dict(q=tuple(q.shape), k=kv[0].dtype, k_scale=k_scale, v_scale=v_scale)
        return torch.zeros(q.shape)


@pytest.fixture
def flashinfer(monkeypatch):
    _Wrapper.made.clear()
    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(BatchDecodeWithPagedKVCacheWrapper=_Wrapper))
    return _Wrapper


def _point(**kw):
    return DecodePoint(**{"batch": 3, "kv_len": 40, "heads_q": 8, "heads_kv": 2, "head_dim": 64, "page_size": 16,
                          "kv_dtype": "fp8", **kw})


def test_it_is_planned_over_the_points_own_pages_and_given_the_per_tensor_scales(flashinfer):
    p = _point()
    x = make_decode_inputs(p, device="cpu")
    out = flashinfer_fp8_decode_call(p, x)()
    w = flashinfer.made[0]
    table = x["page_table"]
    assert w.layout == "NHD" and w.tensor_cores       # group 4: FlashInfer's tensor-core decode
    assert w.planned["indptr"] == [0, 3, 6, 9] and w.planned["indices"] == table.reshape(-1).tolist()
    assert w.planned["last"] == [8, 8, 8] and w.planned["heads"] == (8, 2, 64, 16)   # 40 keys: 16 + 16 + 8
    assert w.planned["kv_data_type"] == torch.float8_e4m3fn and w.planned["q_data_type"] == torch.bfloat16
    assert w.planned["sm_scale"] == pytest.approx(64 ** -0.5)
    scale = float(x["kv_scales"][0][0])
    assert w.ran == {"q": (3, 8, 64), "k": torch.float8_e4m3fn, "k_scale": scale, "v_scale": scale}
    assert tuple(out.shape) == (3, 8, 64)


@pytest.mark.parametrize("change, reason", [
    ({"page_size": 0}, "paged caches, one new token, no options"),
    ({"seqlen_q": 4}, "paged caches, one new token, no options"),
    ({"softcap": 30.0}, "paged caches, one new token, no options"),
])
def test_what_it_is_not_given_says_why(flashinfer, change, reason):
    p = _point(**change)
    with pytest.raises(FlashInferUnavailable, match=reason):
        flashinfer_fp8_decode_call(p, make_decode_inputs(p, device="cpu"))
    assert not flashinfer.made


def test_scales_that_differ_per_kv_head_and_a_missing_install_are_reasons(flashinfer, monkeypatch):
    p = _point()
    x = make_decode_inputs(p, device="cpu")
    x["kv_scales"] = (torch.tensor([0.01, 0.02]), x["kv_scales"][1])
    with pytest.raises(FlashInferUnavailable, match="one k_scale and v_scale per call"):
        flashinfer_fp8_decode_call(p, x)
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    with pytest.raises(FlashInferUnavailable, match="not installed"):
        flashinfer_fp8_decode_call(p, make_decode_inputs(p, device="cpu"))
