"""The options in decode (no GPU): tl.options.with_options states them in the decode sketches (the Sink before the
splits' Combine), the decode translator emits them only for a spec that asks for them and refuses a sketch/spec
mismatch or a kernel that cannot compute them, the launcher refuses a call whose options do not fit its kernel, the
decode gate's option cases catch a kernel that drops an option, and a campaign trial's cross-check applies them
(the kernels themselves: tests/gpu/test_decode_options_gpu.py)."""
import pytest

import tl
from hardware_profiles import load_profile
from kernel_abi.spec import KernelSpec
from tl.ast import Compute, walk
from tl.checker import check
from tl.options import options_of, with_options
from translate.compiler import generate
from translate.decode.params import default_decode_params
from translate.kernel import TranslationError


def _program(layout="paged", **options):
    return with_options(tl.parse_program(tl.load_sketch("gqa", True, "decode", layout)), **options)


def _spec(layout="paged", d=128, **features):
    return KernelSpec("gqa", d, d, True, "bf16", layout, "decode", **features)


@pytest.mark.parametrize("layout", ["paged", "dense"])
def test_with_options_states_every_option_in_a_decode_sketch(layout):
    program = _program(layout, local=True, softcap=True, sinks=True)
    assert options_of(program) == {"local", "softcap", "sinks"}
    assert check(program) == []
    order = [s.op_key for s in walk(program.statements) if isinstance(s, Compute)]
    assert order.index("softcap") < order.index("mask") < order.index("softmax")
    assert order.index("sink") == order.index("combine") - 1   # once, after the loop, before the merge by the sums


def test_the_translator_emits_the_options_only_for_a_spec_that_asks():
    profile = load_profile("h100")
    plain = generate(_program(), default_decode_params(_spec(), 8, profile), profile, _spec())
    assert "Opts" not in plain.body and "combine<" in plain.body and ", true>(args)" not in plain.body
    spec = _spec(d=64, local=True, sinks=True)
    gen = generate(_program(local=True, sinks=True), default_decode_params(spec, 16, profile), profile, spec)
    assert "kLocal = true, kSoftcap = false, kSinks = true" in gen.body
    assert ", 64, true>(args);" in gen.body   # the combine adds the sink to the merged sum
    assert "local_sinks" in gen.name


def test_a_sketch_and_spec_that_disagree_on_the_options_are_refused():
    profile = load_profile("h100")
    spec = _spec(local=True)
    with pytest.raises(TranslationError, match="with_options"):
        generate(_program(), default_decode_params(spec, 8, profile), profile, spec)
    with pytest.raises(TranslationError, match=r"states the options \(local\)"):
        generate(_program(local=True), default_decode_params(_spec(), 8, profile), profile, _spec())


def test_the_absorbed_mla_kernel_refuses_options():
    profile = load_profile("h100")
    spec = KernelSpec("mla", 576, 512, True, "bf16", "paged", "decode", sinks=True)
    program = with_options(tl.parse_program(tl.load_sketch("mla", True, "decode", "paged")), sinks=True)
    with pytest.raises(TranslationError, match="grouped decode kernel"):
        generate(program, default_decode_params(spec, 128, profile), profile, spec)


def test_call_options_that_do_not_fit_the_kernel_are_named():
    torch = pytest.importorskip("torch")
    from tuner.serving.launch.decode_kernel import option_errors

    cpu = torch.device("cpu")
    assert option_errors(("local",), (64, 0), 0.0, None, 8, cpu) == []
    assert option_errors(("local", "softcap", "sinks"), (-1, -1), 50.0, torch.zeros(8), 8, cpu) == []
    assert "no sliding window" in option_errors((), (64, 0), 0.0, None, 8, cpu)[0]
    assert "no soft-capping" in option_errors(("local",), (64, 0), 30.0, None, 8, cpu)[0]
    assert "pass softcap" in option_errors(("softcap",), (-1, -1), 0.0, None, 8, cpu)[0]
    assert "pass learnable_sink" in option_errors(("sinks",), (-1, -1), 0.0, None, 8, cpu)[0]
    assert "no sinks" in option_errors((), (-1, -1), 0.0, torch.zeros(8), 8, cpu)[0]
    assert "8 logits" in option_errors(("sinks",), (-1, -1), 0.0, torch.zeros(9), 8, cpu)[0]
    assert "fp32" in option_errors(("sinks",), (-1, -1), 0.0, torch.zeros(8, dtype=torch.float16), 8, cpu)[0]
    assert "two ints" in option_errors(("local",), (-2, 0), 0.0, None, 8, cpu)[0]
    assert "finite" in option_errors(("softcap",), (-1, -1), float("inf"), None, 8, cpu)[0]


# ---- the decode gate's option cases (tuner/measure/verify_decode.py) -----------------------------------------
def test_the_gate_checks_an_option_kernel_at_the_edges_of_its_options():
    from tuner.measure.verify_decode import CHECK_CASES, check_cases

    cases = check_cases(_spec(local=True, softcap=True, sinks=True))
    windows = {c.window for c in cases}
    assert {(0, 0), (1, 0), (63, 0), (64, 0), (65, 0), (127, 0), (128, 0), (129, 0), (-1, 0)} <= windows
    assert any(c.window[0] > max(c.cache_seqlens) for c in cases)           # longer than every sequence's cache
    assert {c.softcap for c in cases} == {1.0, 50.0} and all(c.sinks for c in cases)
    for w in windows:                  # every window on one new token and on several
        tokens = {c.seqlen_q for c in cases if c.window == w}
        assert 1 in tokens and max(tokens) > 1, (w, tokens)
    assert any(c.num_splits == 1 for c in cases) and any((c.num_splits or 0) > 1 for c in cases)
    assert check_cases(_spec()) == CHECK_CASES
    assert all(c.window == (-1, -1) and not c.softcap and c.sinks for c in check_cases(_spec(sinks=True)))


class _StandIn:
    """A decode kernel on the CPU: the fp32 reference with the options it is given, or with one of them dropped
    (``drop``) as a kernel that ignores its window, cap or sinks would."""

    def __init__(self, spec, drop=None):
        self.spec, self.drop = spec, drop

    def split_plan(self, batch, heads_q, heads_kv, seqlen_q, capacity, num_splits=None):
        from types import SimpleNamespace

        return SimpleNamespace(num_splits=num_splits or 1), 1, 1

    def __call__(self, q, k_cache, v_cache, cache_seqlens=None, page_table=None, num_splits=None, return_lse=False,
                 out=None, workspace=None, window_size=(-1, -1), softcap=0.0, learnable_sink=None):
        import torch

        from tuner.serving.decode_sdpa import decode_reference
        from tuner.serving.options import ModelOptions

        window = (-1, -1) if self.drop == "window" else (window_size[0], 0 if self.spec.causal else window_size[1])
        options = ModelOptions(window, 0.0 if self.drop == "softcap" else softcap,
                               None if self.drop == "sinks" else learnable_sink)
        o, lse = decode_reference(q, k_cache.nan_to_num(0.0), v_cache.nan_to_num(0.0), cache_seqlens, page_table,
                                  self.spec.causal, 1.0 / q.shape[-1] ** 0.5, options)
        out.copy_(o.to(torch.bfloat16))
        return out, lse


@pytest.mark.parametrize("drop", [None, "window", "softcap", "sinks"])
def test_the_gate_passes_a_kernel_that_computes_its_options_and_fails_one_that_drops_one(drop):
    import torch

    from tuner.measure.verify_decode import check_case, check_cases

    spec = _spec(local=True, softcap=True, sinks=True)
    gen = torch.Generator().manual_seed(1)
    checks = [check_case(_StandIn(spec, drop), spec, c, gen, 16, device="cpu") for c in check_cases(spec)]
    failed = [c for c in checks if not c.passed]
    if drop is None:
        assert not failed, failed[0]
    else:
        assert failed, drop


@pytest.mark.parametrize("layout", ["paged", "dense"])
def test_a_campaign_trial_cross_checks_the_options_of_its_problem(layout):
    """tuner.measure.decode.cross_check (a trial's check at benchmark size) applies the problem's window, cap and
    sinks: the reference with them passes, the same call without its window does not."""
    import torch

    from tuner.measure.decode import cross_check, decode_options, make_decode_inputs
    from tuner.measure.decode_problem import DecodeProblem
    from tuner.serving.decode_sdpa import decode_reference
    from tuner.serving.options import ModelOptions

    problem = DecodeProblem("gqa", 2, 300, 16, 2, 64, 64, True, "bf16", 2, 16 if layout == "paged" else 0,
                            window=(40, 0), softcap=30.0, sinks=True)
    x = make_decode_inputs(problem.point(), device="cpu")
    given = decode_options(problem, "cpu")
    assert given["window_size"] == (40, 0) and given["softcap"] == 30.0 and given["learnable_sink"].shape == (16,)

    def out(window):
        o, _ = decode_reference(x["q"], x["k"], x["v"], x["seqused_k"], x["page_table"], True,
                                problem.softmax_scale, ModelOptions(window, 30.0, given["learnable_sink"]))
        return o

    assert cross_check(out((40, 0)), x, problem) < 2e-2
    assert cross_check(out((-1, -1)), x, problem) > 5e-2


@pytest.mark.parametrize("window, causal, capacity, want", [
    ((-1, -1), True, 32768, 32768),          # no window: the cache's capacity
    ((127, 0), True, 32768, 127 + 1 + 64),   # a 128-key window: its keys, the query, one tile of slack
    ((127, 0), True, 100, 100),              # a cache shorter than the window bounds it
    ((100, -1), False, 32768, 32768),        # open to the right and not causal: every key
    ((100, 5), False, 32768, 100 + 1 + 5 + 64),
])
def test_the_splits_divide_the_keys_a_window_shows(window, causal, capacity, want):
    """DecodeKernel.visible_keys: what the call's split plan and `tune bench --phase decode`'s splits column divide
    (a 128-key window over 32k keys: 192 keys to divide, not 32k)."""
    from types import SimpleNamespace

    from tuner.serving.launch.decode_kernel import DecodeKernel

    kernel = SimpleNamespace(spec={"causal": causal}, params={"block_n": 64})
    assert DecodeKernel.visible_keys(kernel, capacity, 1, window) == want
