"""Printing and re-parsing any program gives the same program (hypothesis-generated programs)."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tl import format_program, parse
from tl.ast import LEVELS, ROLES, Allocate, Compute, Copy, For, If, Program, Reshape, TensorRef, Warpgroup
from tl.expr import normalize

# Words the statement syntax gives a meaning; a generated name avoids them (any case).
RESERVED = {"allocate", "in", "with", "offset", "copy", "coordinate", "coordinates", "from", "to", "compute",
            "and", "or", "not", "get", "new", "accumulate", "reshape", "for", "if", "end", "endfor", "endif",
            "then", "range", "warpgroup", "stages"}

_POOL = ["S", "P", "Q_shared", "K_shared", "V_register", "O_register", "Smax", "Ssum", "BM", "BN", "HeadDim",
         "seq_len", "kv_len", "i", "x", "T", "t", "_", "a1", "MMA_C", "MMA_N_new", "Get", "TO_", "in_", "End2"]
names = st.one_of(
    st.sampled_from(_POOL),
    st.tuples(st.sampled_from("AbZ_q"), st.text("aZ09_", max_size=4)).map("".join),
).filter(lambda n: n.lower() not in RESERVED)
numbers = st.integers(0, 4096).map(str)


def _expr(leaf):
    return st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "%"]), inner).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
            inner.map(lambda e: f"( {e} )"),
            inner.map(lambda e: f"-{e}"),
            st.tuples(inner, inner).map(lambda t: f"min({t[0]}, {t[1]})"),
        ),
        max_leaves=5,
    ).map(normalize)


exprs = _expr(st.one_of(names, numbers))
conditions = st.tuples(exprs, st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), exprs).map(
    lambda t: normalize(f"{t[0]} {t[1]} {t[2]}"))
shapes = st.lists(exprs, min_size=1, max_size=3).map(tuple)
refs = st.builds(TensorRef, names, st.booleans())
levels = st.sampled_from(LEVELS)
odd_levels = st.one_of(levels, st.just("the moon"), names)

allocates = st.builds(Allocate, names, levels, st.one_of(st.just(()), shapes), st.none() | exprs)
copies = st.builds(Copy, refs, odd_levels, odd_levels, st.none() | shapes,
                   st.none() | st.lists(st.tuples(names, exprs), min_size=1, max_size=2).map(tuple))
results = st.one_of(st.tuples(st.none(), st.none()),
                    st.tuples(names, st.sampled_from(["get", "get new", "accumulate"])))
computes = st.builds(
    lambda op, args, res, with_: Compute(op, tuple(args), res[0], res[1], tuple(with_)),
    st.one_of(st.sampled_from(["GEMM", "Softmax", "Mask", "Exp", "Multiply"]), names),
    st.lists(st.one_of(refs, numbers.map(TensorRef)), max_size=3),
    results,
    st.lists(names, max_size=3),
)
reshapes = st.builds(Reshape, names, shapes, shapes, st.none() | names)
stage_counts = st.none() | st.one_of(names, st.integers(1, 4).map(str))
simple = st.one_of(allocates, copies, computes, reshapes)


def blocks(children):
    bodies = st.lists(children, max_size=4).map(tuple)
    return st.one_of(
        st.builds(lambda v, a, b, body, s: For(v, a, b, body, "end", s), names, exprs, exprs, bodies, stage_counts),
        st.builds(lambda v, a, b, body, s: For(v, a, b, body, "python", s), names, exprs, exprs,
                  st.lists(children, min_size=1, max_size=4).map(tuple), stage_counts),
        st.builds(If, conditions, bodies),
        st.builds(lambda r, body: Warpgroup(r, body, "end"), st.sampled_from(ROLES), bodies),
        st.builds(lambda r, body: Warpgroup(r, body, "python"), st.sampled_from(ROLES),
                  st.lists(children, min_size=1, max_size=4).map(tuple)),
    )


statements = st.recursive(simple, blocks, max_leaves=10)
programs = st.lists(statements, max_size=8).map(lambda s: Program(tuple(s)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs)
def test_print_then_parse_gives_the_same_program(program):
    text = format_program(program)
    result = parse(text)
    assert result.diagnostics == (), text + "\n" + "\n".join(map(str, result.diagnostics))
    assert result.program == program
    assert format_program(result.program) == text


@settings(max_examples=300, deadline=None)
@given(exprs)
def test_normalize_is_idempotent(expr):
    assert normalize(expr) == expr
