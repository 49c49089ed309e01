"""Packing a padded batch (tuner/serving/padded.py): the order and lengths, which masks it serves, and the
result against each sequence computed alone, left and right padding, with a window and sinks, with gradients."""
import pytest
import torch
from test_option_serving import _record, _serve, expected

from tuner.serving.padded import attend_padded, dense_mask, is_edge_padding, pack_order


def test_pack_order_puts_each_sequences_tokens_first_in_order():
    kept = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    order, cu = pack_order(kept)
    assert order.tolist()[:9] == [2, 3, 4, 5, 6, 8, 9, 10, 11] and sorted(order.tolist()[9:]) == [0, 1, 7]
    assert cu.tolist() == [0, 2, 5, 9] and cu.dtype == torch.int32


def test_only_padding_at_the_edges_is_packed():
    assert is_edge_padding(torch.tensor([[0, 0, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool))
    assert not is_edge_padding(torch.tensor([[1, 0, 1, 1]], dtype=torch.bool))


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("options", [{}, {"window_size": (5, 0), "learnable_sink": torch.tensor([1.0, -2.0, 0.5, 3.0])}])
def test_each_sequence_is_computed_as_if_alone(tmp_path, side, options):
    served = _serve(tmp_path / "e", [_record(layout="varlen"), _record(("local", "sinks"), layout="varlen")])
    g = torch.Generator().manual_seed(1)
    b, s = 3, 20
    q, k, v = (torch.randn(b, s, h, 128, generator=g).to(torch.bfloat16) for h in (4, 2, 2))
    lengths = [20, 13, 1]
    kept = torch.zeros(b, s, dtype=torch.bool)
    for i, n in enumerate(lengths):
        kept[i, (s - n if side == "left" else 0):(s if side == "left" else n)] = True
    out = attend_padded(served, q, k, v, kept, True, None, **options)
    assert served.stats == {"kernel": 1}
    for i, n in enumerate(lengths):
        rows = slice(s - n, s) if side == "left" else slice(0, n)
        want = expected(q[i:i + 1, rows], k[i:i + 1, rows], v[i:i + 1, rows], True,
                        window=options.get("window_size", (-1, -1)), sinks=options.get("learnable_sink"))
        torch.testing.assert_close(out[i:i + 1, rows].double(), want, atol=2e-2, rtol=2e-2)
        assert not out[i][~kept[i]].any()                     # padded positions: 0
    assert dense_mask(kept, s, True).shape == (b, 1, s, s)


def test_gradients_reach_q_k_v_through_the_packing(tmp_path):
    served = _serve(tmp_path / "e", [_record(layout="varlen")])
    q, k, v = (torch.randn(2, 12, h, 128, dtype=torch.float64, requires_grad=True) for h in (4, 2, 2))
    kept = torch.ones(2, 12, dtype=torch.bool)
    kept[0, :4] = False
    attend_padded(served, q, k, v, kept, True, None).sum().backward()
    assert q.grad[0, 4:].abs().sum() > 0 and not q.grad[0, :4].any() and not k.grad[0, :4].any()


def test_a_mask_of_the_wrong_shape_is_refused(tmp_path):
    served = _serve(tmp_path / "e", [_record(layout="varlen")])
    q, k, v = (torch.randn(2, 8, h, 128) for h in (4, 2, 2))
    with pytest.raises(ValueError, match="the keys need \\(2, 8\\)"):
        attend_padded(served, q, k, v, torch.ones(2, 7, dtype=torch.bool), True, None)
