"""The parser accepts every statement form of docs/tl.md as written, and reports syntax errors precisely."""
import pytest

from tl import TLSyntaxError, parse, parse_program
from tl.ast import Allocate, Compute, Copy, For, If, Program, Reshape, TensorRef
from tl.expr import normalize


def only(text):
    result = parse(text)
    assert result.diagnostics == (), [str(d) for d in result.diagnostics]
    (stmt,) = result.program.statements
    return stmt


FORMS = [
    ("Allocate A in global (M, K) with offset batch_offset",
     Allocate("A", "global", ("M", "K"), "batch_offset")),
    ("Allocate C in register (BM, BN)", Allocate("C", "register", ("BM", "BN"))),
    ("Copy A from global to shared", Copy(TensorRef("A"), "global", "shared")),
    ("Copy A (BM, BK) in coordinate [L = i] from global to shared",
     Copy(TensorRef("A"), "global", "shared", ("BM", "BK"), (("L", "i"),))),
    ("Copy X (BM, HeadDim) in coordinate [L = i+1] from global to shared",
     Copy(TensorRef("X"), "global", "shared", ("BM", "HeadDim"), (("L", "i+1"),))),
    ("Copy O_register from register to global", Copy(TensorRef("O_register"), "register", "global")),
    ("Compute GEMM A, B and get S", Compute("GEMM", (TensorRef("A"), TensorRef("B")), "S", "get")),
    ("Compute GEMM A, B and accumulate S", Compute("GEMM", (TensorRef("A"), TensorRef("B")), "S", "accumulate")),
    ("Compute GEMM Q_shared, K_shared.T and get S",
     Compute("GEMM", (TensorRef("Q_shared"), TensorRef("K_shared", True)), "S", "get")),
    ("Compute Multiply A, x and get new A", Compute("Multiply", (TensorRef("A"), TensorRef("x")), "A", "get new")),
    ("Compute Multiply A, x and get B", Compute("Multiply", (TensorRef("A"), TensorRef("x")), "B", "get")),
    ("Compute Softmax A", Compute("Softmax", (TensorRef("A"),))),
    ("Compute Softmax S with Smax and Ssum", Compute("Softmax", (TensorRef("S"),), with_=("Smax", "Ssum"))),
    ("Compute Mask S", Compute("Mask", (TensorRef("S"),))),
    ("Compute Exp S and get P", Compute("Exp", (TensorRef("S"),), "P", "get")),
    ("Compute Divide O_register, Ssum and get new O_register",
     Compute("Divide", (TensorRef("O_register"), TensorRef("Ssum")), "O_register", "get new")),
    ("Reshape G from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N_new)",
     Reshape("G", ("MMA_C", "MMA_M", "MMA_N"), ("MMA_A", "MMA_M", "MMA_N_new"))),
    ("for i = 0:N\n    Compute Mask S\nend", For("i", "0", "N", (Compute("Mask", (TensorRef("S"),)),))),
    ("for i in 0:K:\n    Compute Mask S", For("i", "0", "K", (Compute("Mask", (TensorRef("S"),)),), "python")),
    ("if i < (kv_len/BN) - 1\n    Compute Mask S\nend", If("i<(kv_len/BN)-1", (Compute("Mask", (TensorRef("S"),)),))),
]


@pytest.mark.parametrize("text,expected", FORMS, ids=[f[0].split("\n")[0] for f in FORMS])
def test_every_statement_form_parses(text, expected):
    assert only(text) == expected


@pytest.mark.parametrize("keyword", ["COPY", "copy", "Copy", "cOpY"])
def test_keywords_are_case_insensitive(keyword):
    stmt = only(f"{keyword} A FROM Global TO SHARED")
    assert stmt == Copy(TensorRef("A"), "global", "shared")


def test_upper_case_block_keywords_and_compute_words():
    prog = parse_program("FOR i = 0:N\n  IF i < N\n COMPUTE GEMM A, B AND ACCUMULATE S\n  END\nEND")
    (loop,) = prog.statements
    assert isinstance(loop, For) and isinstance(loop.body[0], If)
    assert loop.body[0].body[0].mode == "accumulate"


def test_comments_alone_and_after_statements_and_blank_lines():
    prog = parse_program("// header\n\nCopy A from global to shared // tile of A\n   // indented comment\n\n")
    assert prog == Program((Copy(TensorRef("A"), "global", "shared"),))


def test_free_indentation_inside_end_blocks():
    prog = parse_program("for i = 0:N\nCompute Mask S\n        Compute Exp S and get P\n  end")
    assert len(prog.statements[0].body) == 2


def test_python_style_body_ends_at_dedent_and_nests():
    prog = parse_program(
        "for i in 0:K:\n    Compute Mask S\n    for j in 0:2:\n        Compute Exp S and get P\nCompute Softmax S\n")
    outer, after = prog.statements
    assert outer.style == "python" and len(outer.body) == 2 and outer.body[1].body[0].op == "Exp"
    assert after.op == "Softmax"


def test_positions_are_one_based_line_and_column():
    prog = parse_program("// c\nfor i = 0:N\n    Compute GEMM Q_shared, K_shared.T and get S\nend\n")
    loop = prog.statements[0]
    gemm = loop.body[0]
    assert (loop.line, loop.col) == (2, 1)
    assert (gemm.line, gemm.col) == (3, 5)
    assert (gemm.args[1].line, gemm.args[1].col) == (3, 28)


def test_positions_do_not_take_part_in_equality():
    assert parse_program("Compute Mask S") == parse_program("\n\n    Compute   Mask   S")


@pytest.mark.parametrize("text,line,fragment", [
    ("Copy A from global to shared\nfor i = 0:N\n    Compute Mask S\n", 2, "no matching 'end'"),
    ("Compute Mask S\nend\n", 2, "'end' without"),
    ("for i in 0:K:\nCompute Mask S\n", 1, "no indented body"),
    ("Copy A from global to shared\nfor i in 0:K:\n", 2, "no indented body"),
    ("Compute Mask S\nCopy from global to shared\n", 2, "expected"),
    ("Fetch A from global\n", 1, "unknown statement"),
    ("for i = 0:N:3\nend\n", 1, "START:STOP"),
    ("Copy A (BM, from global to shared\n", 1, "unclosed"),
    ("Allocate A in global (M, K) with offset (a +\n", 1, "offset"),
    ("if\nend\n", 1, "if condition"),
    ("Compute GEMM A, B and get\n", 1, "result"),
    ("Copy A € from global to shared\n", 1, "unexpected character"),
])
def test_syntax_errors_name_the_line(text, line, fragment):
    result = parse(text, "f.tl")
    assert result.program is None
    assert any(d.code == "syntax" and d.line == line and fragment in d.message for d in result.diagnostics), \
        [str(d) for d in result.diagnostics]
    assert all(str(d).startswith("f.tl:") for d in result.diagnostics)


def test_every_bad_line_is_reported_and_parsing_goes_on():
    text = "Copy A from global to\nCompute Mask S\nBogus line\nfor i = 0:N\n"
    lines = sorted(d.line for d in parse(text).diagnostics)
    assert lines == [1, 3, 4]


def test_parse_program_raises_with_all_diagnostics():
    with pytest.raises(TLSyntaxError) as info:
        parse_program("end\nend\n", "p.tl")
    assert [d.line for d in info.value.diagnostics] == [1, 2]
    assert "p.tl:1:1: error[syntax]" in str(info.value)


def test_diagnostic_format_has_hint_line():
    (diag,) = parse("for i = 0:N\n", "x.tl").diagnostics
    head, hint = str(diag).split("\n")
    assert head == "x.tl:1:1: error[syntax]: 'for' at line 1 has no matching 'end'"
    assert hint.startswith("  hint: ")


@pytest.mark.parametrize("raw,canonical", [
    ("i < N - 1", "i<N-1"), ("i+1", "i+1"), ("( kv_len / BN ) - 1", "(kv_len/BN)-1"),
    ("i < N and j > 0", "i<N and j>0"), ("min(a , b)", "min(a,b)"),
])
def test_expression_normalisation(raw, canonical):
    assert normalize(raw) == canonical
    assert normalize(canonical) == canonical
