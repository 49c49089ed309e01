"""The reference sketches are valid, follow the conventions the translator relies on, and sketches in
the paper's style that the checker was not written against are accepted."""
import pytest

from tl import VARIANTS, check_source, format_program, load_sketch, parse, parse_program, sketch_path
from tl.ast import Compute, Copy, For, If, Reshape, walk

CASES = [(v, c) for v in VARIANTS for c in (False, True)]


@pytest.mark.parametrize("variant,causal", CASES)
def test_reference_sketch_is_valid_and_round_trips(variant, causal):
    path = sketch_path(variant, causal)
    assert path.is_file() and path.suffix == ".tl"
    text = load_sketch(variant, causal)
    assert text.startswith("//")
    program, diags = check_source(text, str(path))
    assert diags == [], [str(d) for d in diags]
    assert parse(format_program(program)).program == program


@pytest.mark.parametrize("variant,causal", CASES)
def test_reference_sketch_conventions(variant, causal):
    program = parse_program(load_sketch(variant, causal))
    (loop,) = [s for s in program.statements if isinstance(s, For)]
    assert (loop.var, loop.start, loop.stop, loop.style) == ("i", "0", "N", "end")
    body = list(loop.body)
    gemm_at = [k for k, s in enumerate(body) if isinstance(s, Compute) and s.op_key == "gemm"]
    assert len(gemm_at) == 2
    masks = [k for k, s in enumerate(body) if isinstance(s, Compute) and s.op_key == "mask"]
    assert masks == ([gemm_at[0] + 1] if causal else [])
    prefetch = next(k for k, s in enumerate(body) if isinstance(s, If))
    softmax = next(k for k, s in enumerate(body) if isinstance(s, Compute) and s.op_key == "softmax")
    assert body[prefetch].condition == "i<N-1" and prefetch < softmax
    assert body[softmax].with_ == ("Smax", "Ssum")
    assert any(isinstance(s, Reshape) and s.name == "S" for s in body)
    last_two = program.statements[-2:]
    assert last_two[0].op == "Divide" and last_two[0].result == "O_register"
    assert isinstance(last_two[1], Copy) and last_two[1].tensor.name == "O_register" and last_two[1].dst == "global"
    symbols = " ".join(str(s) for s in walk(program.statements))
    for name in ("seq_len", "kv_len", "BM", "BN", "block_idx", "q_offset", "kv_offset"):
        assert name in symbols
    if variant == "mla":
        assert "HeadDimQK" in symbols and "HeadDimV" in symbols and "'HeadDim'" not in symbols
    else:
        assert "'HeadDim'" in symbols


def test_unknown_variant_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown attention variant"):
        sketch_path("flash", True)


UNSEEN = {
    "python_style_upper_case": """
// FlashAttention forward, python-style loop, upper-case keywords
ALLOCATE Q IN GLOBAL (seq_len, HeadDim) WITH OFFSET q_offset
ALLOCATE K IN GLOBAL (kv_len, HeadDim) WITH OFFSET kv_offset
ALLOCATE V IN GLOBAL (kv_len, HeadDim) WITH OFFSET kv_offset
COPY Q (BM, HeadDim) IN COORDINATE [L = block_idx] FROM GLOBAL TO SHARED   // Q stays for the whole loop
ALLOCATE O_register IN REGISTER (BM, HeadDim)
for i in 0:N:
    COPY K (BN, HeadDim) IN COORDINATE [L = i] FROM GLOBAL TO SHARED
    COPY V (BN, HeadDim) IN COORDINATE [L = i] FROM GLOBAL TO SHARED
    COMPUTE GEMM Q_shared, K_shared.T AND GET S     // S = Q K^T
    COMPUTE SOFTMAX S WITH m_i AND l_i
    RESHAPE S FROM (MMA_C, MMA_M, MMA_N) TO (MMA_A, MMA_M, MMA_N_new)
    COMPUTE GEMM S, V_shared AND ACCUMULATE O_register
COMPUTE DIVIDE O_register, l_i AND GET NEW O_register
COPY O_register FROM REGISTER TO GLOBAL
""",
    "sketch_stage_with_scaling": """
// sketch: no shapes yet, the scores go through scale and exp before the second GEMM
copy Q from global to shared
for j = 0:(kv_len/BN)
  copy K from global to shared
  compute gemm Q_shared, K_shared.T and get S
  compute multiply S, softmax_scale and get new S
  compute max S and get row_max
  compute exp S and get P    // P = exp(S - m)
  copy V from global to shared
  reshape P from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N_new)
  compute gemm P, V_shared and accumulate O_register
end
copy O_register from register to global
""",
    "gqa_registers_and_prefetch": """
// GQA: KV head = query head // group
Allocate Q in global (seq_len, HeadDim) with offset q_offset
Allocate K in global (kv_len, HeadDim) with offset kv_offset
Allocate V in global (kv_len, HeadDim) with offset kv_offset
Copy Q (BM, HeadDim) in coordinate [L = block_idx] from global to shared
Copy Q_shared from shared to register
Copy K (BN, HeadDim) in coordinate [L = 0] from global to shared
Allocate acc in register (BM, HeadDim)
for i = 0:N
        Copy K_shared from shared to register
        Compute GEMM Q_register, K_register.T and get scores
        Compute Mask scores  // causal
    Copy V (BN, HeadDim) in coordinate [L = i] from global to shared
  if i < N - 1
    Copy K (BN, HeadDim) in coordinate [L = i + 1] from global to shared
  end
    Compute Softmax scores with mx and sm
    Reshape scores from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N_new)
    Compute GEMM scores, V_shared and accumulate acc
end
Compute Divide acc, sm and get new acc
Copy acc_register from register to global
""",
    "nested_python_blocks": """
Allocate S in register (BM, BN)
Allocate O in register (BM, D)
Copy Q (BM, D) from global to shared
for i in 0:N:
    Copy K (BN, D) in coordinate [L = i] from global to shared
    Copy V (BN, D) in coordinate [L = i] from global to shared
    Compute GEMM Q_shared, K_shared.T and get S
    if i == N - 1:
        Compute Mask S
    Compute Softmax S with Smax and Ssum
    Reshape S from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N_new)
    Compute GEMM S, V_shared and accumulate O
Compute Divide O, Ssum and get new O
Copy O_register from register to global
""",
}


@pytest.mark.parametrize("name", sorted(UNSEEN))
def test_unseen_paper_style_sketches_are_accepted(name):
    program, diags = check_source(UNSEEN[name], f"{name}.tl")
    assert diags == [], [str(d) for d in diags]
    assert parse(format_program(program)).program == program


def _line(text, fragment):
    return next(k for k, line in enumerate(text.split("\n"), 1) if fragment in line)


def test_unseen_sketch_failure_modes_are_caught():
    text = UNSEEN["python_style_upper_case"]
    no_reshape = "\n".join(l for l in text.split("\n") if "RESHAPE" not in l)
    _, diags = check_source(no_reshape)
    assert [(d.code, d.line) for d in diags] == [("missing-reshape", _line(no_reshape, "GEMM S, V_shared"))]
    no_transpose = text.replace("K_shared.T", "K_shared")
    _, diags = check_source(no_transpose)
    assert [(d.code, d.line) for d in diags] == [("gemm-layout", _line(no_transpose, "GEMM Q_shared"))]
