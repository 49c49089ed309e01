"""A decode step of a left-padded batch on the decode kernel (tuner/serving/padded.py attend_decode_padded): the cache
read in place with each sequence's leftpad, against each sequence computed alone; which calls it leaves to packing
(right padding or holes in eager, more than 16 queries, an export without a dense decode kernel); without host reads
(compiled) the padding taken as left padding; and transformers' attention function taking it for decode steps."""
import types

import pytest
import torch
from conftest import H100, stand_in_loader
from store_fakes import make_decode_record, make_record
from test_option_serving import expected

from tuner.serving import DeviceFacts, load_exported
from tuner.serving.padded import attend_decode_padded, left_padding


def _record(layout, features=(), bucket="s1024"):
    if layout == "decode":
        r = make_decode_record(layout="dense", bucket="d-b8-kv2k", cubin=f"decode-{'+'.join(features)}".encode())
    else:
        r = make_record(variant="gqa", bucket=bucket, layout=layout, cubin=f"{layout}".encode())
    r.kernel_meta["spec"] = {"variant": "gqa", "causal": True, "d_qk": 128, "d_v": 128, "dtype": "bf16",
                             "layout": r.layout, **({"phase": "decode"} if layout == "decode" else {}),
                             **{f: True for f in features}}
    return r


def _load(folder, records):
    from hardware_profiles import load_profile

    from tuner.store.export import export_records

    export_records(records, load_profile("h100"), folder)
    return load_exported(folder, devices={("cpu", None): DeviceFacts(H100, (9, 0))}, kernel_loader=stand_in_loader)


SERVED = [_record("varlen"), _record("decode")]


def _decode_kernel(attn):
    return next(k for k in attn._kernels.values() if hasattr(k, "leftpads"))


def _batch(lengths, sk=40, sq=1, seed=0, left=True):
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    q = torch.randn(b, sq, 8, 128, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(b, sk, 2, 128, generator=g).to(torch.bfloat16) for _ in range(2))
    kept = torch.zeros(b, sk, dtype=torch.bool)
    for i, n in enumerate(lengths):
        kept[i, (sk - n if left else 0):(sk if left else n)] = True
    return q, k, v, kept


def test_left_padding_is_the_count_of_leading_pads_and_nothing_else_is():
    kept = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1]], dtype=torch.bool)
    assert left_padding(kept).tolist() == [2, 0, 3] and left_padding(kept).dtype == torch.int32
    for other in ([[1, 1, 0, 0]], [[0, 1, 0, 1]], [[1, 0, 1, 1]]):      # right padding, holes
        assert left_padding(torch.tensor(other, dtype=torch.bool)) is None


@pytest.mark.parametrize("sq", [1, 4])
@pytest.mark.parametrize("options", [{}, {"window_size": (7, 0), "learnable_sink": torch.linspace(-2, 2, 8)}])
def test_a_left_padded_decode_step_reads_the_cache_in_place(tmp_path, sq, options):
    # with options: a dense decode kernel built with the window and sinks
    attn = _load(tmp_path / "e", [_record("decode", ("local", "sinks") if options else ())])
    lengths = [40, 23, sq + 2]
    q, k, v, kept = _batch(lengths, sq=sq)
    out = attend_decode_padded(attn, q, k, v, kept, None, **options)
    assert out is not None and attn.stats == {"kernel": 1} and "decode dense" in attn.last_reason
    assert _decode_kernel(attn).leftpads[-1].tolist() == [40 - n for n in lengths]
    for i, n in enumerate(lengths):
        want = expected(q[i:i + 1], k[i:i + 1, 40 - n:], v[i:i + 1, 40 - n:], True,
                        window=options.get("window_size", (-1, -1)), sinks=options.get("learnable_sink"))
        torch.testing.assert_close(out[i:i + 1].double(), want, atol=2e-2, rtol=2e-2)


def test_what_the_decode_kernel_cannot_take_is_left_to_packing(tmp_path):
    attn = _load(tmp_path / "e", SERVED)
    q, k, v, kept = _batch([40, 30], left=False)                               # right padding
    assert attend_decode_padded(attn, q, k, v, kept, None) is None
    q, k, v, kept = _batch([40, 30], sq=17)                                    # more queries than a decode tile
    assert attend_decode_padded(attn, q, k, v, kept, None) is None
    q, k, v, kept = _batch([40, 30])
    assert attend_decode_padded(attn, q, k, v, kept, None, window_size=(7, 0)) is None   # no kernel with a window
    assert attend_decode_padded(_load(tmp_path / "v", SERVED[:1]), q, k, v, kept, None) is None
    assert not attn.stats and not attn.reasons                                  # asking counted nothing


def test_without_host_reads_a_decode_steps_padding_is_taken_as_left_padding(tmp_path, monkeypatch):
    """No host read (torch.compile, CUDA-graph capture): each sequence's leftpad is its count of padded keys, as
    generate() pads; a right-padded sequence's new token is a padded position (its row is discarded), the others are
    exact."""
    import tuner.serving.rule as rule

    attn = _load(tmp_path / "e", SERVED)
    monkeypatch.setattr(rule, "host_reads_allowed", lambda: False)
    q, k, v, kept = _batch([40, 30])
    out = attend_decode_padded(attn, q, k, v, kept, None)
    assert _decode_kernel(attn).leftpads[-1].tolist() == [0, 10]
    torch.testing.assert_close(out[1:].double(), expected(q[1:], k[1:, 10:], v[1:, 10:], True), atol=2e-2, rtol=2e-2)
    q, k, v, kept = _batch([40, 30], left=False)          # right padding: the unpadded sequence stays exact
    out = attend_decode_padded(attn, q, k, v, kept, None)
    torch.testing.assert_close(out[:1].double(), expected(q[:1], k[:1], v[:1], True), atol=2e-2, rtol=2e-2)
    assert bool(torch.isfinite(out).all())


@pytest.mark.slow   # torch.compile: seconds of tracing
def test_a_compiled_decode_step_of_a_left_padded_batch_takes_the_decode_kernel(tmp_path):
    attn = _load(tmp_path / "e", SERVED)
    compiled = torch.compile(lambda q, k, v, kept: attend_decode_padded(attn, q, k, v, kept, None), fullgraph=True,
                             backend="aot_eager")
    q, k, v, kept = _batch([40, 23])
    out = compiled(q, k, v, kept)
    assert "decode dense" in attn.last_reason and _decode_kernel(attn).leftpads[-1].tolist() == [0, 17]
    torch.testing.assert_close(out[1:].double(), expected(q[1:], k[1:, 17:], v[1:, 17:], True), atol=2e-2, rtol=2e-2)


def test_transformers_decode_steps_take_the_decode_kernel_and_prefill_packs(tmp_path):
    from tuner.serving.hf import attention_function

    attn = _load(tmp_path / "e", SERVED)
    forward = attention_function(attn)
    module = types.SimpleNamespace(is_causal=True)
    q, k, v, kept = _batch([40, 23])
    # transformers' layout: (b, heads, s, d)
    out, _ = forward(module, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), kept, scaling=None)
    assert "decode dense" in attn.last_reason and _decode_kernel(attn).leftpads[-1].tolist() == [0, 17]
    want = expected(q[1:], k[1:, 17:], v[1:, 17:], True)
    torch.testing.assert_close(out[1:].double(), want, atol=2e-2, rtol=2e-2)
    qp, kp, vp, keptp = _batch([40, 23], sq=40)                                   # a prefill: packed
    forward(module, qp.transpose(1, 2), kp.transpose(1, 2), vp.transpose(1, 2), keptp, scaling=None)
    assert "varlen" in attn.last_reason, attn.last_reason
