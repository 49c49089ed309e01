"""The Triton V^T copies build for sm_90 with the Triton installed here (no GPU needed: compiled to PTX for a stated
target), at binary-search depths 1 to 4 (batches of 1 to 16), both key orders and every FP8 head dim (96: the last
64-column tile masked at the head dim), and move 16 bytes an instruction.
Why here: Triton 3.6's layout pass fails on some forms of the paged copy that 3.5 builds (its columns as a (T,) vector
at some depths and orders), and a copy that does not build makes every paged FP8 call raise.
Marked slow (each build takes seconds); skipped where Triton is absent (CPU torch wheels do not bring it)."""
import re

import pytest

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.slow

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kernel_abi.spec import FP8_HEAD_DIMS  # noqa: E402
from tuner.serving.launch import vt_kernels  # noqa: E402
from tuner.serving.launch.transpose_triton import READ_PAST_END, TILE  # noqa: E402

SM90 = GPUTarget("cuda", 90, 32)


def _ptx(fn, signature: dict, aligned: list, constexprs: dict) -> str:
    names = list(signature)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    return triton.compile(ASTSource(fn, signature, constexprs=constexprs, attrs=attrs), target=SM90).asm["ptx"]


def _vector_moves(ptx: str) -> tuple[int, int, int]:
    return (len(re.findall(r"ld\.global\.v4", ptx)), len(re.findall(r"st\.global\.v4", ptx)),
            len(re.findall(r"(ld|st)\.global(\.[a-z]+)?\.(b8|u8)", ptx)))


@pytest.mark.parametrize("steps", [1, 2, 3, 4])
@pytest.mark.parametrize("accumulator_order", [True, False])
@pytest.mark.parametrize("d", FP8_HEAD_DIMS)
def test_the_paged_copy_builds_for_sm90_with_16_byte_moves(steps, accumulator_order, d):
    signature = {"src": "*u8", "dst": "*u8", "table": "*i32", "cu": "*i32", "batch": "i32", "keys_t": "i32",
                 "page_size": "i32", "t_b": "i32", "s_p": "i32", "s_r": "i32", "s_h": "i32", "d_h": "i32",
                 "d_d": "i32", "D": "constexpr", "T": "constexpr", "A": "constexpr", "STEPS": "constexpr",
                 "ACC": "constexpr", "PAST": "constexpr"}
    ptx = _ptx(vt_kernels.transpose_paged_v, signature, ["src", "dst", "table", "cu", "keys_t", "d_h", "d_d"],
               {"D": d, "T": TILE, "A": 16, "STEPS": steps, "ACC": accumulator_order, "PAST": READ_PAST_END})
    loads, stores, bytewise = _vector_moves(ptx)
    # a tile of T columns a step, the last one masked at d96 (its head-dim mask uniform over 16-byte groups)
    tiles = -(-d // TILE)
    assert loads >= tiles and stores >= tiles and bytewise == 0, (loads, stores, bytewise)


def test_the_runtime_searches_as_deep_as_the_batch_needs():
    from tuner.serving.launch.transpose_triton import search_steps

    assert [search_steps(b) for b in (1, 2, 3, 4, 5, 9, 16, 17)] == [1, 1, 2, 2, 3, 4, 4, 5]


@pytest.mark.parametrize("steps", [1, 2, 3])
@pytest.mark.parametrize("accumulator_order", [True, False])
@pytest.mark.parametrize("d", [96, 128, 192, 256])
def test_the_packed_copy_builds_for_sm90_with_16_byte_moves(steps, accumulator_order, d):
    signature = {"src": "*u8", "dst": "*u8", "cu": "*i32", "batch": "i32", "keys_t": "i32", "s_s": "i32",
                 "s_h": "i32", "d_h": "i32", "d_d": "i32", "D": "constexpr", "T": "constexpr", "A": "constexpr",
                 "STEPS": "constexpr", "ACC": "constexpr"}
    ptx = _ptx(vt_kernels.transpose_packed_v, signature, ["src", "dst", "cu", "keys_t", "s_s", "s_h", "d_h", "d_d"],
               {"D": d, "T": TILE, "A": 16, "STEPS": steps, "ACC": accumulator_order})
    loads, stores, bytewise = _vector_moves(ptx)
    assert loads >= 1 and stores >= 1 and bytewise == 0, (loads, stores, bytewise)
