"""Hopper sketches: warpgroup roles, pipelined loops and the reshape that names its copy — parsing,
printing and the checker's diagnostics for the mistakes these constructs make possible."""
import pytest

from tl import VARIANTS, CheckLimits, check_source, format_program, load_sketch, parse, parse_program
from tl.ast import For, Reshape, Warpgroup, walk

CASES = [(v, c, s) for v in VARIANTS for c in (False, True) for s in ("ws_overlap", "ws_serial")]


def load(variant="mha", causal=True, schedule="ws_overlap"):
    return load_sketch(variant, causal, schedule)


def codes(text, limits=None):
    _, diags = check_source(text, "h.tl", limits)
    return [(d.code, d.line) for d in diags], diags


def line_no(text, fragment, nth=0):
    return [k for k, line in enumerate(text.splitlines(), 1) if fragment in line][nth]


@pytest.mark.parametrize("variant,causal,schedule", CASES)
def test_hopper_sketches_are_valid_and_round_trip(variant, causal, schedule):
    text = load(variant, causal, schedule)
    program, diags = check_source(text)
    assert diags == [], [str(d) for d in diags]
    assert parse(format_program(program)).program == program
    roles = [s.role for s in program.statements if isinstance(s, Warpgroup)]
    assert roles == ["producer", "consumer"]
    (pipe,) = [s for s in walk(program.statements) if isinstance(s, For) and s.stages]
    assert pipe.stages == "kv_stages"


def test_new_forms_parse_in_both_block_styles():
    text = ("warpgroup producer:\n"
            "    for j in 0:N with stages 2:\n"
            "        Copy K (BN, D) in coordinate [L = j] from global to shared\n"
            "warpgroup consumer\n"
            "    Reshape S from (MMA_C) to (MMA_A) and get P\n"
            "end warpgroup\n")
    program = parse_program(text)
    producer, consumer = program.statements
    assert (producer.role, producer.style, consumer.style) == ("producer", "python", "end")
    assert producer.body[0].stages == "2" and producer.body[0].style == "python"
    assert consumer.body[0] == Reshape("S", ("MMA_C",), ("MMA_A",), "P")
    assert parse(format_program(program)).program == program


@pytest.mark.parametrize("line,message", [
    ("for j = 0:N with stage 2", "'with stages S'"),
    ("for j = 0:N with stages", "one number or symbol"),
    ("warpgroup", "names one role"),
    ("warpgroup producer consumer", "names one role"),
    ("Reshape S from (MMA_C) to (MMA_A) and P", "expected 'get'"),
])
def test_malformed_new_forms_are_syntax_errors(line, message):
    result = parse(line + "\nend\n" if line.startswith(("for", "warpgroup")) else line)
    assert result.program is None
    assert any(message in d.message for d in result.diagnostics), [str(d) for d in result.diagnostics]


def test_the_order_of_role_blocks_does_not_matter():
    text = load()
    lines = text.splitlines()
    start = line_no(text, "warpgroup producer") - 1
    stop = line_no(text, "warpgroup consumer") - 1
    swapped = "\n".join(lines[:start] + lines[stop:] + lines[start:stop])
    assert codes(swapped)[0] == []


def test_consumer_reading_a_buffer_no_producer_fills():
    text = load().replace("        Copy V (BN, HeadDim) in coordinate [L = j] from global to shared\n", "")
    found, diags = codes(text)
    assert ("unfilled-buffer", line_no(text, "GEMM P, V_shared")) in found
    assert not any(code == "undefined-tensor" for code, _ in found)
    assert "Copy V" in next(d for d in diags if d.code == "unfilled-buffer").hint


def test_unbalanced_pipeline_would_deadlock():
    text = load().replace("for i = 1:N", "for i = 0:N")
    found, diags = codes(text)
    assert found and {c for c, _ in found} == {"pipeline-balance"}
    assert "with N = 1 tile(s) the producer fills K_shared once but the consumers read it twice" in diags[0].message


def test_pipeline_that_does_not_fit_shared_memory():
    text = load()
    symbols = {"BM": 128, "BN": 128, "HeadDim": 128}
    found, diags = codes(text, CheckLimits(227 * 1024, {**symbols, "kv_stages": 4}))
    assert found == [("pipeline-smem", line_no(text, "with stages"))]
    assert "288 KB" in diags[0].message and "227 KB" in diags[0].message
    assert codes(text, CheckLimits(227 * 1024, {**symbols, "kv_stages": 2}))[0] == []
    assert codes(text, CheckLimits(227 * 1024, {"kv_stages": 4}))[0] == []   # tile sizes unknown: no verdict


@pytest.mark.parametrize("edit,code,fragment", [
    (("warpgroup consumer", "warpgroup worker"), "bad-role", "warpgroup worker"),
    (("    Copy Q (BM, HeadDim) in coordinate [L = block_idx] from global to shared\n",
      "    Copy Q (BM, HeadDim) in coordinate [L = block_idx] from global to shared\n    Compute Mask S\n"),
     "bad-role", "    Compute Mask S"),
    (("    Allocate S in register (BM, BN)\n",
      "    Allocate S in register (BM, BN)\n    Copy K (BN, HeadDim) in coordinate [L = 0] from global to shared\n"),
     "bad-role", "in coordinate [L = 0]"),
    (("Allocate O in global (seq_len, HeadDim) with offset q_offset\n",
      "Allocate O in global (seq_len, HeadDim) with offset q_offset\nAllocate X in register (BM, BN)\n"),
     "bad-role", "Allocate X"),
    (("    Allocate O_register in register (BM, HeadDim)\n",
      "    Allocate O_register in register (BM, HeadDim)\n    for k = 0:2 with stages 2\n        Compute Mask S\n    end\n"),
     "bad-pipeline", "for k = 0:2"),
])
def test_role_and_pipeline_mistakes(edit, code, fragment):
    text = load().replace(*edit)
    assert text != load()
    found, diags = codes(text)
    assert (code, line_no(text, fragment)) in found, [str(d) for d in diags]
    assert all(d.hint for d in diags)


def test_missing_producer_is_reported():
    text = load()
    lines = text.splitlines()
    start = line_no(text, "warpgroup producer") - 1
    stop = line_no(text, "warpgroup consumer") - 1
    found, diags = codes("\n".join(lines[:start] + lines[stop:]))
    assert any(c == "bad-role" and "no producer" in d.message for (c, _), d in zip(found, diags))


def test_reshape_with_a_name_keeps_the_source_an_accumulator():
    text = load().replace("Compute GEMM P, V_shared and accumulate O_register",
                          "Compute GEMM S, V_shared and accumulate O_register", 1)
    found, _ = codes(text)
    assert ("missing-reshape", line_no(text, "GEMM S, V_shared")) in found
