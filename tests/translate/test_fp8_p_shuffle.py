"""The FP8 kernels' P exchange (attn_sm90.cuh fp8_p_lanes / convert_p_fp8), replayed lane by lane on the CPU.

The accumulator of the QK^T wgmma gives lane (g, t) of a warp columns {8j + 2t, 8j + 2t + 1} of rows g and g + 8 for
each 8-column group j; the e4m3 A operand of the P.V wgmma wants columns 4t..4t + 3 and 16 + 4t..19 + 4t of the same
rows. The constants are read out of the header, so a change there that breaks the exchange fails here.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

HEADER = Path(__file__).resolve().parents[2] / "translate" / "include" / "attn_sm90.cuh"


def _lanes_source() -> str:
    text = HEADER.read_text()
    start = text.index("Fp8PLanes fp8_p_lanes(int lane)")
    return text[start:text.index("};", text.index("return", start)) + 2]


def lanes(lane: int) -> dict:
    """fp8_p_lanes(lane), evaluated from the header's own expressions."""
    src = _lanes_source()
    ret = re.search(r"return \{(.*)\};", src, re.S).group(1)
    t = lane % 4
    swap = ((t ^ (t >> 1)) & 1) != 0
    quad = lane & ~3
    # each field is either "quad | ((0xABCD >> (4 * t)) & 3)" or "swap ? X : Y"
    fields = [f.strip() for f in re.split(r",\s*(?![^(]*\))", ret.replace("\n", " "))]
    assert len(fields) == 6, fields
    values = []
    for f in fields:
        m = re.fullmatch(r"quad \| \(\((0x[0-9a-fA-F]+) >> \(4 \* t\)\) & 3\)", f)
        if m:
            values.append(quad | ((int(m.group(1), 16) >> (4 * t)) & 3))
            continue
        m = re.fullmatch(r"swap \? (0x[0-9a-fA-F]+)u : (0x[0-9a-fA-F]+)u", f)
        assert m, f"unexpected field {f!r} in fp8_p_lanes"
        values.append(int(m.group(1), 16) if swap else int(m.group(2), 16))
    return dict(zip(("src_a", "src_b", "give_a", "give_b", "lo", "hi"), values))


def prmt(a: int, b: int, sel: int) -> int:
    """PTX prmt.b32 (default mode): byte i of the result is byte (sel >> 4i) & 7 of b:a."""
    pool = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    return sum(pool[(sel >> (4 * i)) & 7] << (8 * i) for i in range(4))


def pack(bytes4) -> int:
    return sum(b << (8 * i) for i, b in enumerate(bytes4))


def exchange(S):
    """convert_p_fp8 for one 32-column k-block of a warp: S[row][col] are byte codes (0..255) standing for the e4m3
    values; returns out[lane] = the four A registers."""
    regs_out = {}
    offered = {}
    for lane in range(32):
        g, t = lane // 4, lane % 4
        ln = lanes(lane)
        for r in range(2):
            row = g + 8 * r
            cols = lambda j: (S[row][8 * j + 2 * t], S[row][8 * j + 2 * t + 1])   # noqa: E731
            x = pack([*cols(0), *cols(1)])
            y = pack([*cols(2), *cols(3)])
            offered[(lane, r, "a")] = prmt(x, y, ln["give_a"])
            offered[(lane, r, "b")] = prmt(x, y, ln["give_b"])
    for lane in range(32):
        ln = lanes(lane)
        regs = [0] * 4
        for r in range(2):
            a = offered[(ln["src_a"], r, "a")]
            b = offered[(ln["src_b"], r, "b")]
            regs[r] = prmt(a, b, ln["lo"])
            regs[2 + r] = prmt(a, b, ln["hi"])
        regs_out[lane] = regs
    return regs_out


def expected_a(S, lane: int) -> list[int]:
    """The PTX ISA's A fragment of wgmma m64nNk32 (8-bit): a0-a3 row g, k 4t..; a4-a7 row g + 8; a8-a11 row g,
    k 16 + 4t..; a12-a15 row g + 8."""
    g, t = lane // 4, lane % 4
    return [pack(S[g + 8 * r][16 * h + 4 * t + i] for i in range(4)) for h in range(2) for r in range(2)]


def test_prmt_matches_ptx():
    assert prmt(0x33221100, 0x77665544, 0x5410) == 0x55441100
    assert prmt(0x33221100, 0x77665544, 0x7632) == 0x77663322


@pytest.mark.parametrize("seed", range(3))
def test_every_lane_gets_its_a_operand(seed):
    import random

    rng = random.Random(seed)
    S = [[rng.randrange(256) for _ in range(32)] for _ in range(16)]
    got = exchange(S)
    for lane in range(32):
        assert got[lane] == expected_a(S, lane), f"lane {lane}"


def test_shuffle_sources_stay_in_the_quad():
    for lane in range(32):
        ln = lanes(lane)
        assert ln["src_a"] // 4 == lane // 4 and ln["src_b"] // 4 == lane // 4


def _in_place_words() -> list[list[int]]:
    """The accumulator offsets (from g = s + 16 kb + 2 r) of the two words convert_p_fp8_in_place writes per row
    and k-block, read out of the header: [[low-k word], [high-k word]]."""
    text = HEADER.read_text()
    start = text.index("void convert_p_fp8_in_place(")
    body = text[start:text.index("\n}\n", start)]
    words = re.findall(r"e4m3x4\(g\[(\d+)\], g\[(\d+)\], g\[(\d+)\], g\[(\d+)\]\)", body)
    assert len(words) == 2, words
    return [[int(i) for i in w] for w in words]


def test_in_place_conversion_meets_v_t_in_accumulator_order():
    """With V^T's keys in "accumulator" order (the runtime's plan.vt_column), the A operand's byte at k of every
    lane and row holds the score of the key V^T keeps at column k: the P.V sum pairs each P with its own V row."""
    from tuner.serving.launch.plan import vt_column

    words = _in_place_words()
    for lane in range(32):
        t = lane % 4
        for h, offsets in enumerate(words):        # low-k word (k 4t..4t+3), high-k word (16 + 4t..)
            for i, off in enumerate(offsets):      # accumulator value g[off]: group j = off // 4, column 2t + off % 2
                j, odd = off // 4, off % 2
                assert off % 4 in (0, 1), "the row's own values (r = 0: offsets 4j, 4j + 1)"
                key = 8 * j + 2 * t + odd          # of the 32-key k-block
                k = 16 * h + 4 * t + i             # the A operand's k of this byte (expected_a's order)
                assert vt_column(key, "accumulator") == k, (lane, h, i, key, k)


def test_accumulator_order_permutes_within_16_keys():
    import torch

    from tuner.serving.launch.plan import vt_column

    keys = torch.arange(64)
    cols = vt_column(keys, "accumulator")
    assert sorted(cols.tolist()) == keys.tolist()
    assert torch.equal(cols // 16, keys // 16)
    assert torch.equal(vt_column(keys, "natural"), keys)
