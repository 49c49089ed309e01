"""TMA descriptors: the 4-D map of a (batch, seqlen, heads, dim) tensor, checked before the driver sees it."""
import pytest

from tuner.serving.launch.tma import TensorMapError, tensor_map_spec


def test_contiguous_tensor_map():
    # (b=2, s=1000, h=16, d=128) bf16, contiguous: strides (s*h*d, h*d, d, 1)
    spec = tensor_map_spec(0x10000, (2, 1000, 16, 128), (1000 * 16 * 128, 16 * 128, 128, 1), 2, rows=128)
    assert spec.dims == (128, 1000, 16, 2)                          # innermost first
    assert spec.strides_bytes == (16 * 128 * 2, 128 * 2, 1000 * 16 * 128 * 2)   # seqlen, heads, batch
    assert spec.box == (64, 128, 1, 1)                              # 64 columns: the 128-byte swizzle span


def test_a_transposed_view_keeps_its_strides():
    # (b, s, h, d) view of a (b, h, s, d) buffer: heads are the outer stride, not the row
    spec = tensor_map_spec(0x20000, (4, 512, 8, 64), (8 * 512 * 64, 64, 512 * 64, 1), 2, rows=64)
    assert spec.strides_bytes == (128, 512 * 64 * 2, 8 * 512 * 64 * 2)


@pytest.mark.parametrize("address,shape,strides,rows,fragment", [
    (0x10008, (1, 64, 1, 64), (64 * 64, 64, 64, 1), 64, "16-byte aligned"),
    (0x10000, (1, 64, 1, 96), (64 * 96, 96, 96, 1), 64, "not a multiple of 64"),
    (0x10000, (1, 64, 1, 64), (64 * 64, 64, 64, 2), 64, "must be contiguous"),
    (0x10000, (1, 64, 3, 64), (3 * 64 * 68, 3 * 68, 68, 1), 64, "multiple of 16"),
    (0x10000, (1, 64, 1, 64), (64 * 64, 64, 64, 1), 300, "box rows 300"),
])
def test_what_tma_cannot_address_is_refused_with_the_reason(address, shape, strides, rows, fragment):
    with pytest.raises(TensorMapError, match=fragment):
        tensor_map_spec(address, shape, strides, 2, rows)


def test_a_packed_heads_map_puts_the_heads_first():
    # pack_gqa: Q (b=2, s=1000, h=16, d=64); a box of 192 rows is the group's 8 heads x 24 tokens, heads fastest
    spec = tensor_map_spec(0x10000, (2, 1000, 16, 64), (1000 * 16 * 64, 16 * 64, 64, 1), 2, rows=192, heads_per_box=8)
    assert spec.dims == (64, 16, 1000, 2)                           # (dim, heads, seqlen, batch)
    assert spec.strides_bytes == (64 * 2, 16 * 64 * 2, 1000 * 16 * 64 * 2)   # heads, seqlen, batch
    assert spec.box == (64, 8, 24, 1)
    plain = tensor_map_spec(0x10000, (2, 1000, 16, 64), (1000 * 16 * 64, 16 * 64, 64, 1), 2, rows=192)
    assert plain.box == (64, 192, 1, 1) and plain.dims == (64, 1000, 16, 2)


@pytest.mark.parametrize("shape,rows,heads", [((1, 64, 6, 64), 64, 3), ((1, 64, 12, 64), 64, 12)])
def test_a_packed_box_holds_whole_tokens_of_whole_groups(shape, rows, heads):
    b, s, h, d = shape
    with pytest.raises(TensorMapError, match="whole tokens"):
        tensor_map_spec(0x10000, shape, (s * h * d, h * d, d, 1), 2, rows=rows, heads_per_box=heads)
