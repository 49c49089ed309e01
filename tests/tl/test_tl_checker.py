"""The checker: the paper's two failure modes and the other errors, with codes and lines."""
import pytest

from tl import check_source, load_sketch

REFERENCE = load_sketch("mha", causal=False)


def lines_of(text):
    return text.splitlines()


def line_no(text, fragment):
    """1-based line of the first line containing ``fragment``."""
    return next(k for k, line in enumerate(lines_of(text), 1) if fragment in line)


def errors(text):
    program, diags = check_source(text, "t.tl")
    return [(d.code, d.line) for d in diags], diags


def test_reference_program_is_valid():
    assert errors(REFERENCE)[0] == []


def test_gemm_layout_error_without_transpose():
    bad = REFERENCE.replace("K_shared.T", "K_shared")
    found, diags = errors(bad)
    assert found == [("gemm-layout", line_no(bad, "GEMM Q_shared"))]
    assert "K_shared.T" in diags[0].hint


def test_gemm_layout_error_when_v_is_transposed():
    bad = REFERENCE.replace("S, V_shared", "S, V_shared.T")
    found, diags = errors(bad)
    assert found == [("gemm-layout", line_no(bad, "GEMM S, V_shared"))]
    assert "S, V_shared ..." in diags[0].hint


def test_reshape_omission():
    bad = "\n".join(l for l in lines_of(REFERENCE) if not l.strip().startswith("Reshape"))
    found, diags = errors(bad)
    assert found == [("missing-reshape", line_no(bad, "GEMM S, V_shared"))]
    assert "Reshape S from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N_new)" in diags[0].hint


@pytest.mark.parametrize("between", [
    ["Compute Multiply S, scale and get P"],
    ["Compute Exp S and get P"],
    ["Compute Mask S", "Compute Multiply S, scale and get new S", "Compute Convert S and get P"],
])
def test_reshape_omission_through_elementwise_ops(between):
    lines = [l for l in lines_of(REFERENCE) if not l.strip().startswith("Reshape")]
    at = next(k for k, l in enumerate(lines) if "Softmax" in l) + 1
    lines[at:at] = ["    " + b for b in between]
    consumer = "P" if any("get P" in b for b in between) else "S"
    lines = [l.replace("GEMM S, V_shared", f"GEMM {consumer}, V_shared") for l in lines]
    bad = "\n".join(lines)
    found, diags = errors(bad)
    assert found == [("missing-reshape", line_no(bad, f"GEMM {consumer}, V_shared"))]
    assert f"Reshape {consumer} from" in diags[0].hint


def test_reshape_before_the_last_write_does_not_count():
    lines = lines_of(REFERENCE)
    reshape = next(l for l in lines if "Reshape" in l)
    lines.remove(reshape)
    first_gemm = next(k for k, l in enumerate(lines) if "GEMM Q_shared" in l)
    lines.insert(first_gemm, reshape)  # reshaped, then overwritten by the first GEMM
    bad = "\n".join(lines)
    assert errors(bad)[0] == [("missing-reshape", line_no(bad, "GEMM S, V_shared"))]


def test_both_failure_modes_reported_together():
    bad = "\n".join(l for l in lines_of(REFERENCE) if "Reshape" not in l).replace("K_shared.T", "K_shared")
    codes = [c for c, _ in errors(bad)[0]]
    assert codes == ["gemm-layout", "missing-reshape"]


def test_undefined_tensor():
    bad = REFERENCE.replace("Copy V (BN, HeadDim) in coordinate [L = i] from global to shared\n", "")
    assert errors(bad)[0] == [("undefined-tensor", line_no(bad, "GEMM S, V_shared"))]


def test_use_before_definition_in_the_text_is_an_error():
    text = "Compute Multiply P, scale and get Q\nCompute Exp S and get P\nAllocate S in register (BM, BN)\n"
    found, _ = errors(text)
    assert ("undefined-tensor", 1) in found and ("undefined-tensor", 2) in found


def test_undefined_suffix_name_without_copy():
    text = "Allocate K in global (kv_len, D)\nCopy K_shared from shared to register\n"
    found, diags = errors(text)
    assert found == [("undefined-tensor", 2)]
    assert "Copy K from global to shared" in diags[0].hint


def test_definition_inside_loop_and_if_counts_after_it():
    text = ("Allocate X in global (M, D)\nfor i = 0:N\n  if i == 0\n    Copy X (BM, D) from global to shared\n  end\n"
            "end\nCopy X_shared from shared to register\nCompute Exp X_register and get Y\n")
    assert errors(text)[0] == []


@pytest.mark.parametrize("copy,code", [
    ("Copy Q from global to the moon", "bad-copy"),
    ("Copy Q from global to global", "bad-copy"),
    ("Copy Q from disk to shared", "bad-copy"),
    ("Copy Q_shared from register to global", "bad-copy"),
])
def test_bad_copy_levels(copy, code):
    text = f"Allocate Q in global (M, D)\nCopy Q (BM, D) from global to shared\n{copy}\n"
    assert (code, 3) in errors(text)[0]


def test_bad_copy_reported_next_to_syntax_errors():
    found, _ = errors("Copy Q from global to the moon\nfor i = 0:N\n")
    assert found == [("bad-copy", 1), ("syntax", 2)]


def test_gemm_operand_in_global_memory():
    text = ("Allocate Q in global (M, D)\nAllocate K in global (N, D)\nCopy K (BN, D) from global to shared\n"
            "Compute GEMM Q, K_shared.T and get S\n")
    found, diags = errors(text)
    assert found == [("bad-operand", 4)]
    assert "copy it to shared first" in diags[0].hint


@pytest.mark.parametrize("stmt,code", [
    ("Compute Frobnicate S", "unknown-op"),
    ("Compute GEMM S and get T", "bad-arity"),
    ("Compute GEMM S, S", "bad-arity"),
    ("Compute Exp S, S, S and get T", "bad-arity"),
    ("Compute Softmax S with Smax", "bad-arity"),
])
def test_operator_table(stmt, code):
    text = f"Allocate S in register (BM, BM)\n{stmt}\n"
    assert (code, 2) in errors(text)[0]


def test_ops_are_case_insensitive_and_scalars_need_no_definition():
    text = "Allocate S in register (BM, BN)\ncompute multiply S, softmax_scale and get new S\nCOMPUTE exp S\n"
    assert errors(text)[0] == []


def test_empty_loop_body():
    assert errors("for i = 0:N\nend\n")[0] == [("bad-loop", 1)]


@pytest.mark.parametrize("text", ["", "\n\n   \n", "// a sketch to come\n\n// nothing yet\n"])
def test_a_program_without_statements_is_not_a_kernel(text):
    found, diags = errors(text)
    assert found == [("empty-program", 1)]
    assert str(diags[0]).startswith("t.tl:1:1: error[empty-program]: ") and diags[0].hint


def test_bad_allocate_level():
    assert errors("Allocate A in texture (M, K)\n")[0] == [("bad-level", 1)]


def test_every_error_is_reported_not_only_the_first():
    text = ("Compute Frobnicate A\nCopy B from global to the moon\nCompute GEMM X_shared, Y_shared and get S\n")
    found, _ = errors(text)
    assert ("unknown-op", 1) in found and ("bad-copy", 2) in found
    assert [c for c, l in found if l == 3] == ["undefined-tensor", "undefined-tensor"]


def test_sketch_stage_without_allocations_is_valid():
    # The paper's sketch stage: no shapes, inputs copied straight from global.
    text = """Copy Q from global to shared
for i = 0:N
    Copy K from global to shared
    Compute GEMM Q_shared, K_shared.T and get S
    Compute Softmax S with m and l
    Copy V from global to shared
    Reshape S from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N_new)
    Compute GEMM S, V_shared and accumulate O_register
end
Compute Divide O_register, l and get new O_register
Copy O_register from register to global
"""
    assert errors(text)[0] == []


def test_check_never_raises_on_odd_programs():
    from tl.ast import Compute, Program, Reshape, TensorRef
    from tl import check

    odd = Program((Reshape("S", (), ()), Compute("GEMM", (TensorRef("1"), TensorRef("S", True)), "S", "get")))
    assert all(d.code != "internal" for d in check(odd))


def test_copy_from_global_without_tile_shape_has_unknown_shape():
    # Q is (seq_len, D) in global, but the copied tile is not: no shape guess, no false gemm-layout.
    text = ("Allocate Q in global (seq_len, D)\nAllocate K in global (kv_len, D)\nAllocate S in register (BM, BN)\n"
            "Copy Q from global to shared\nCopy K from global to shared\nCompute GEMM Q_shared, K_shared.T and get S\n")
    assert errors(text)[0] == []


def test_tile_shape_follows_a_copy_from_shared_to_registers():
    text = ("Allocate Q in global (seq_len, D)\nAllocate K in global (kv_len, D)\n"
            "Copy Q (BM, D) from global to shared\nCopy K (BN, D) from global to shared\n"
            "Copy K_shared from shared to register\nCompute GEMM Q_shared, K_register and get S\n")
    assert errors(text)[0] == [("gemm-layout", 6)]
