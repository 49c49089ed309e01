"""Decode sketches in TL: the phase a sketch states, its diagnostics, and the layouts a decode kernel may mix."""
from pathlib import Path

import pytest

from tl.checker import check_source
from tl.layout import layout_of
from tl.phase import phase_of

SKETCHES = Path(__file__).resolve().parents[2] / "tl" / "sketches" / "decode"
PAGED = (SKETCHES / "gqa_paged.tl").read_text()


def codes(text):
    program, diags = check_source(text)
    return program, [d.code for d in diags]


@pytest.mark.parametrize("name,layout", [("gqa_paged.tl", "paged"), ("gqa_dense.tl", "dense"),
                                         ("mla_paged.tl", "paged"), ("mla_dense.tl", "dense")])
def test_reference_decode_sketches_check_clean_and_state_their_phase_and_cache(name, layout):
    program, found = codes((SKETCHES / name).read_text())
    assert found == []
    assert phase_of(program) == "decode"
    assert layout_of(program) == layout


def test_prefill_sketches_stay_prefill():
    program, found = codes((SKETCHES.parent / "hopper" / "gqa_causal.tl").read_text())
    assert found == [] and phase_of(program) == "prefill"


def test_split_without_combine_is_reported_with_its_fix():
    text = PAGED.replace("Compute Combine O_register, Smax, Ssum and get new O_register\n", "")
    program, diags = check_source(text)
    [d] = [d for d in diags if d.code == "decode-combine"]
    assert "never combined" in d.message and "Compute Combine" in d.hint


def test_combine_inside_the_split_loop_is_reported():
    text = PAGED.replace("    Compute GEMM P, V_shared and accumulate O_register\n",
                         "    Compute GEMM P, V_shared and accumulate O_register\n"
                         "    Compute Combine O_register, Smax, Ssum and get new O_register\n")
    _, found = codes(text)
    assert "decode-combine" in found


def test_combine_without_a_split_loop_is_reported():
    text = PAGED.replace("for j = split_begin:split_end", "for j = 0:N")
    _, found = codes(text)
    assert "decode-combine" in found


def test_a_split_loop_must_run_over_the_whole_split():
    text = PAGED.replace("for j = split_begin:split_end", "for j = split_begin:split_end - 1")
    program, found = codes(text)
    assert "decode-split" in found


def test_decode_queries_are_dense_and_keys_not_by_cumulative_lengths():
    text = PAGED.replace("Allocate Q in global (q_rows, HeadDim) with offset q_offset",
                         "Allocate Q in global (q_rows, HeadDim) with offset cu_seqlens_q")
    _, found = codes(text)
    assert found.count("layout-offset") == 1
    text = PAGED.replace("offset page_table", "offset cu_seqlens_k")
    _, found = codes(text)
    assert found.count("layout-offset") == 2
    assert "layout-mixed" not in found    # dense queries beside a paged cache is the decode layout
