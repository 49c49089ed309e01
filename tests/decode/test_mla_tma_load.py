"""Whole key tiles by TMA in the seesaw MLA decode kernel (DecodeParams.kv_load = "tma",
translate/include/attn_decode_sm90_seesaw.cuh) on the CPU: its validation reasons and key, the generated entry point
(a second, __grid_constant__ CUtensorMap parameter; the gather kernel's source untouched), the host's map of the
cache (tuner/serving/launch/decode_kernel.py k_map_spec: which caches get one, its box and strides) and the descriptor's address
kept pointing at the call's cache; with nvcc the compiled kernel issues TMA loads beside the gathers (a sequence's
last tile still gathers), without spills or wgmma serialisation; and (slow) a host check that a 128-byte-swizzled
TMA box of 64 x 64 lands exactly where the gathers' layout puts each element. The results are checked on a GPU by
tests/gpu/test_mla_decode_gpu.py (the decode gate: pages of 64, 128 and 16, dense caches, NaN page tails)."""
import ctypes
import dataclasses

import pytest

from translate.decode import DecodeParams, validate_decode
from translate.decode.generate import DECODE_ARGS, DECODE_TMA_ARGS
from translate.kernel import TranslationError
from tuner.serving.launch import tma
from tuner.serving.launch.decode_kernel import KMap, k_map_spec
from tuner.serving.launch.plan import MapSlot

from test_mla_seesaw import SEESAW, SEESAW_HGMMAS, clean_sass, compile_one, kernel  # noqa: E402
from test_mla_wgmma import A100, H100, MLA, host_program  # noqa: E402

TMA = dataclasses.replace(SEESAW, kv_load="tma")


def test_the_key_names_the_load_and_round_trips():
    assert SEESAW.kv_load == "gather" and DecodeParams().kv_load == "gather"
    assert TMA.key() == "dm64n64w4x2s2p_b2_sw3_ss_tma"
    assert SEESAW.key() == "dm64n64w4x2s2p_b2_sw3_ss"   # the gather kernels keep their names (and caches)
    assert DecodeParams.from_dict(TMA.to_dict()) == TMA
    with pytest.raises(ValueError, match="kv_load must be a string"):
        DecodeParams.from_dict({"kv_load": 1})


def test_tma_loads_are_the_seesaw_kernels_only():
    assert validate_decode(TMA, H100, MLA) == []
    assert validate_decode(TMA, H100, dataclasses.replace(MLA, layout="dense", causal=False, dtype="fp16")) == []
    for mma in ("sm80", "sm90_wgmma"):
        reasons = validate_decode(dataclasses.replace(TMA, mma=mma), H100, MLA)
        assert any("kv_load tma" in r and "sm90_seesaw" in r for r in reasons), reasons
    assert any("kv_load must be one of gather, tma" in r
               for r in validate_decode(dataclasses.replace(SEESAW, kv_load="bulk"), H100, MLA))
    with pytest.raises(TranslationError, match="sm_90a"):
        kernel(TMA, profile=A100)


def test_the_entry_point_takes_the_map_and_the_gather_source_is_unchanged():
    k, g = kernel(TMA), kernel(SEESAW)
    assert "const __grid_constant__ CUtensorMap k_map) {" in k.source
    assert "split_kv_seesaw<" in k.source and "(args, smem, &k_map);" in k.source
    assert "static constexpr bool kTmaLoad = true;" in k.source
    assert "kTmaLoad" not in g.source and "CUtensorMap" not in g.source and "(args, smem);" in g.source
    assert k.meta()["args"] == [list(a) for a in DECODE_TMA_ARGS]
    assert g.meta()["args"] == [list(a) for a in DECODE_ARGS]
    assert k.smem_bytes == g.smem_bytes == 230176   # the boxes land in the gathers' slots


class _Cache:
    """The shape, strides and address of a (pages or sequences, rows, heads, d) bf16 cache."""

    def __init__(self, shape, address=0x7F00_0000_0000):
        self.shape = shape
        n, r, h, d = shape
        self._stride = (r * h * d, h * d, d, 1)
        self.address = address

    def stride(self):
        return self._stride


@pytest.mark.parametrize("shape,paged,mapped", [
    ((40, 64, 1, 576), True, True),      # DeepSeek-V3's pages: a tile a page
    ((20, 256, 1, 576), True, True),     # four tiles a page
    ((160, 16, 1, 576), True, False),    # a page is a quarter tile: the kernel gathers every tile
    ((4, 4097, 1, 576), False, True),    # a dense cache: boxes of a sequence's rows
    ((4, 63, 1, 576), False, False),     # no whole tile fits
])
def test_which_caches_get_a_map(shape, paged, mapped):
    c = _Cache(shape)
    spec = k_map_spec(c.address, c.shape, c.stride(), 2, paged, 64)
    assert (spec is not None) == mapped
    if spec is not None:
        n, rows, h, d = shape
        assert spec.dims == (d, rows, h, n) and spec.box == (64, 64, 1, 1)
        assert spec.strides_bytes == (h * d * 2, d * 2, rows * h * d * 2)


def test_a_cache_the_tma_unit_cannot_address_is_refused():
    with pytest.raises(tma.TensorMapError, match="16-byte aligned"):
        k_map_spec(0x1008, (40, 64, 1, 576), (64 * 576, 576, 576, 1), 2, True, 64)


def test_the_map_follows_the_calls_cache_by_one_write():
    spec = tma.tensor_map_spec(0x1000, (40, 64, 1, 576), (64 * 576, 576, 576, 1), 2, 64)
    buffer = (ctypes.c_uint64 * 16)(*range(16))
    m = KMap(buffer, MapSlot(offset=0, index=1, spec=spec, dtype="bf16", address=0x1000, address_offset=16))
    m.point(0x1000)   # the address it holds: nothing written
    assert list(buffer) == list(range(16))
    m.point(0xABCDE000)
    assert buffer[2] == 0xABCDE000 and [buffer[i] for i in range(16) if i != 2] == [i for i in range(16) if i != 2]
    assert m.slot.address == 0xABCDE000
    unmapped = KMap((ctypes.c_uint64 * 16)(), None)
    unmapped.point(0x2000)   # no map (pages smaller than a tile): nothing to keep
    assert list(unmapped.buffer) == [0] * 16


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return compile_one(tmp_path_factory, kernel(TMA), "mla_tma")


@pytest.mark.slow
def test_the_tma_kernel_compiles_to_tma_loads_beside_the_gathers(compiled):
    from translate.sass import sass_instructions

    k = compiled[1]
    sass, cubin = clean_sass(compiled, "tma")
    assert sass["HGMMA"] == SEESAW_HGMMAS, sass   # the GEMMs are the gather kernel's
    lines = sass_instructions(cubin)[k.name]
    assert sum("UTMALDG" in line for line in lines) >= 9, "no TMA loads of a tile's 9 chunks"
    assert sass["LDGSTS"] > 0, "the last, partial tile must still gather (zero-filled)"


HOST_CHECK = r"""
using namespace cute;
using Element = Cfg::Element;
alignas(1024) static Element buf[1 << 17];
int main() {
  // a TMA box of 64 rows x 64 16-bit columns with the 128-byte swizzle, at chunk c of a slot: row r at 128 r bytes,
  // its 16-byte unit u at unit u ^ (r % 8) (the smem base is 1024-aligned); the gathers' layout must agree
  int bad = 0;
  auto wk = make_tensor(make_smem_ptr(buf), Cfg::SmemLayoutK{});
  for (int c = 0; c < Cfg::kHeadDimQK / 64; ++c)
    for (int r = 0; r < Cfg::kBlockN; ++r)
      for (int col = 0; col < 64; ++col) {
        const long box = long(c) * Cfg::kBlockN * 64 + r * 64 + (((col / 8) ^ (r % 8)) * 8) + col % 8;
        bad += &wk(r, 64 * c + col) - buf != box;
      }
  std::printf("%s TMA boxes in the gather layout (%d mismatches)\n", bad ? "FAIL" : "OK", bad);
  return bad ? 1 : 0;
}
"""


@pytest.mark.slow
def test_a_tma_box_lands_where_the_gathers_put_each_element(tmp_path):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "translate"))
    from host_checks import run_host_checks

    run_host_checks(host_program(kernel(TMA), HOST_CHECK), "mla_tma_box_layout", tmp_path, 1, opt="-O0",
                    arch="sm_90a")
