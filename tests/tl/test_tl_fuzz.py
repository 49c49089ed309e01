"""Fuzz: mutated sketches only ever give diagnostics, never an exception or an internal error."""
import random

import pytest

from tl import VARIANTS, Diagnostic, check, check_source, format_program, load_sketch, parse

SEEDS = [load_sketch(v, c) for v in VARIANTS for c in (False, True)]
GARBAGE = ["\x00", "\xff", "€", "\t", "(", ")", "[", "]", ":", ",", ".T", "//", "#", "=", "end", "for i = 0:N",
           "for i in 0:K:", "if", "Copy", "and get", "with", "\u2028", "\x85", "\r", "0:N:2", "MMA_C", "-", "'"]


def mutate(text: str, rng: random.Random) -> str:
    lines = text.split("\n")
    for _ in range(rng.randint(1, 4)):
        k = rng.randrange(len(lines))
        kind = rng.randrange(7)
        if kind == 0:  # drop a token
            words = lines[k].split(" ")
            del words[rng.randrange(len(words))]
            lines[k] = " ".join(words)
        elif kind == 1:  # swap two lines
            j = rng.randrange(len(lines))
            lines[k], lines[j] = lines[j], lines[k]
        elif kind == 2:  # garbage characters or fragments
            at = rng.randint(0, len(lines[k]))
            lines[k] = lines[k][:at] + rng.choice(GARBAGE) + lines[k][at:]
        elif kind == 3:  # truncate the line
            lines[k] = lines[k][: rng.randint(0, len(lines[k]))]
        elif kind == 4:  # delete the line
            del lines[k]
            if not lines:
                lines = [""]
        elif kind == 5:  # duplicate the line elsewhere, re-indented
            lines.insert(rng.randrange(len(lines) + 1), " " * rng.randrange(9) + lines[k].strip())
        else:  # random bytes read as latin-1
            lines[k] += bytes(rng.randrange(256) for _ in range(rng.randint(1, 6))).decode("latin-1")
    return "\n".join(lines)


def test_fuzzed_sketches_give_only_diagnostics():
    rng = random.Random(20250612)
    valid = invalid = 0
    for n in range(1200):
        text = mutate(rng.choice(SEEDS), rng)
        result = parse(text, "fuzz.tl")
        program, diags = check_source(text, "fuzz.tl")
        assert all(isinstance(d, Diagnostic) for d in diags)
        assert all(d.code != "internal" for d in diags), (text, [str(d) for d in diags])
        assert all(1 <= d.line <= text.count("\n") + 1 + text.count("\r") and d.col >= 1 for d in diags), text
        assert (result.program is None) == bool(result.diagnostics)
        if program is not None:
            # whatever parsed must print and re-parse to itself, and check consistently
            assert parse(format_program(program)).program == program
            assert check(program, "fuzz.tl") == diags
        valid += not diags
        invalid += bool(diags)
    # the mutations must actually produce both outcomes for the test to mean anything
    assert valid > 50 and invalid > 500, (valid, invalid)


@pytest.mark.parametrize("text", ["", "\n\n", "end", ":", "for", "for i in 0:K:", "\x00" * 10, "(((((", "Copy .T",
                                  "Compute", "Reshape S from () to ()", "if i<\nend", "Compute GEMM 1, 2 and get 3"])
def test_degenerate_inputs(text):
    program, diags = check_source(text)
    assert all(d.code != "internal" for d in diags)


def test_binary_garbage():
    rng = random.Random(7)
    for _ in range(200):
        text = bytes(rng.randrange(256) for _ in range(rng.randint(0, 300))).decode("latin-1")
        _, diags = check_source(text)
        assert all(d.code != "internal" for d in diags)
