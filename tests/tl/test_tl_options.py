"""The options of today's models in TL (tl/options.py): where a sketch states soft-capping, the sliding window and
the sinks, the diagnostics for each misplaced statement, and the rewrite that adds them to the reference sketches."""
import pytest

import tl
from tl import check_source, format_program
from tl.options import option_diagnostics, options_of, with_options

BASE = """Allocate Q in global (seq_len, HeadDim) with offset q_offset
Allocate K in global (kv_len, HeadDim) with offset kv_offset
Allocate V in global (kv_len, HeadDim) with offset kv_offset
Allocate O in global (seq_len, HeadDim) with offset q_offset
Copy Q (BM, HeadDim) in coordinate [L = block_idx] from global to shared
Allocate O_register in register (BM, HeadDim)
Allocate S in register (BM, BN)
for j = 0:N
    Copy K (BN, HeadDim) in coordinate [L = j] from global to shared
    Copy V (BN, HeadDim) in coordinate [L = j] from global to shared
    Compute GEMM Q_shared, K_shared.T and get S
{loop}
    Reshape S from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N_new)
    Compute GEMM S, V_shared and accumulate O_register
end
{after}
Compute Divide O_register, Ssum and get new O_register
Copy O_register from register to global
"""
GOOD_LOOP = "    Compute Softcap S\n    Compute Mask S, Window\n    Compute Softmax S with Smax and Ssum"
GOOD_AFTER = "Compute Sink O_register with Smax and Ssum"


def codes(text):
    program, diagnostics = check_source(text, "t.tl")
    return [d.code for d in diagnostics]


def test_a_sketch_stating_all_three_checks_clean_and_says_so():
    program, diagnostics = check_source(BASE.format(loop=GOOD_LOOP, after=GOOD_AFTER), "t.tl")
    assert diagnostics == [] and options_of(program) == {"local", "softcap", "sinks"}
    assert options_of(check_source(BASE.format(loop="    Compute Softmax S with Smax and Ssum", after=""), "t")[0]) \
        == frozenset()


@pytest.mark.parametrize("loop,after,code,words", [
    ("    Compute Mask S, Causal\n    Compute Softmax S with Smax and Ssum", "", "mask-kind", "names the sliding window"),
    ("    Compute Mask S\n    Compute Softcap S\n    Compute Softmax S with Smax and Ssum", "", "softcap-order",
     "after its Mask or Softmax"),
    ("    Compute Softmax S with Smax and Ssum\n    Compute Softcap S", "", "softcap-order", "after its Mask or Softmax"),
    ("    Compute Softcap O_register\n    Compute Softmax S with Smax and Ssum", "", "softcap-order", "no score GEMM"),
    ("    Compute Softmax S with Smax and Ssum\n    Compute Sink O_register with Smax and Ssum", "", "sink-place",
     "inside a loop"),
    ("    Compute Softmax S with Smax and Ssum", "Compute Sink O_register with Smax and Srow", "sink-place",
     "the Softmax keeps Smax and Ssum"),
])
def test_each_misplaced_option_statement_has_its_code(loop, after, code, words):
    program, diagnostics = check_source(BASE.format(loop=loop, after=after), "t.tl")
    found = [d for d in diagnostics if d.code == code]
    assert found and words in found[0].message and found[0].hint, [str(d) for d in diagnostics]


def test_a_sink_after_the_division_and_one_before_any_softmax_are_misplaced():
    text = BASE.format(loop="    Compute Softmax S with Smax and Ssum", after="").replace(
        "Copy O_register from register to global", "Compute Sink O_register with Smax and Ssum\n"
                                                   "Copy O_register from register to global")
    assert "sink-place" in codes(text)
    early = BASE.format(loop="    Compute Softmax S with Smax and Ssum", after="").replace(
        "for j = 0:N", "Compute Sink O_register with Smax and Ssum\nfor j = 0:N")
    assert "sink-place" in codes(early)


def test_sink_and_softmax_take_two_running_values():
    text = BASE.format(loop="    Compute Softmax S with Smax and Ssum", after="Compute Sink O_register")
    assert "bad-arity" in codes(text)


@pytest.mark.parametrize("schedule,layout", [("ws_overlap", "dense"), ("ws_serial", "dense"), ("ws_overlap", "varlen"),
                                             ("ws_overlap", "paged"), ("fa2", "dense")])
@pytest.mark.parametrize("causal", [True, False])
def test_the_rewrite_adds_each_option_where_it_acts_to_every_reference_sketch(schedule, layout, causal):
    if schedule == "fa2" and layout != "dense":
        pytest.skip("no such sketch")
    base, _ = check_source(tl.load_sketch("gqa", causal, schedule, layout), "x")
    for options in ((True, False, False), (False, True, False), (False, False, True), (True, True, True)):
        program = with_options(base, *options)
        text = format_program(program)
        again, diagnostics = check_source(text, "y")
        assert diagnostics == [], [str(d) for d in diagnostics]
        wanted = {name for name, on in zip(("local", "softcap", "sinks"), options) if on}
        assert options_of(again) == wanted
        assert format_program(with_options(program, *options)) == text        # stated once: a second pass adds none
        lines = [ln.strip() for ln in text.splitlines()]
        if options[1]:   # before the tile's Mask (or its Softmax), once per score tile
            for i, ln in enumerate(lines):
                if ln == "Compute Softcap S":
                    assert lines[i + 1].startswith(("Compute Mask S", "Compute Softmax S"))
        if options[2]:
            at = lines.index("Compute Sink O_register with Smax and Ssum")
            assert lines[at + 1].startswith("Compute Divide O_register, Ssum")
        if options[0]:
            assert all(ln.endswith(", Window") for ln in lines if ln.startswith("Compute Mask"))


def test_diagnostics_of_a_program_without_options_are_none():
    program, _ = check_source(tl.load_sketch("mha", True, "ws_overlap", "dense"), "x")
    assert option_diagnostics(program, "x") == []
