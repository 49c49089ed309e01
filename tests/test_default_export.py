"""tuner.defaults.export without a GPU: which buckets the default kernels of each layout are stored under, and
the inputs a serving kernel is timed on (the timing itself replaced)."""
import pytest
import torch

from tuner.measure import dense
from tuner.measure import timer
from tuner.serving.buckets.names import bucket_errors
from tuner.defaults.export import SERVING_SPECS, _measurements, serving_call
from tuner.measure.mixes import serving_problems
from kernel_abi.spec import KernelSpec


class ShapeKernel:
    """Checks the arguments of AttentionKernel.varlen / .paged the way the runtime would and returns zeros."""

    def __init__(self):
        self.calls = []

    def varlen(self, q, k, v, cu_q, cu_k, max_q, max_k):
        assert q.dim() == k.dim() == 3 and cu_q.dtype == cu_k.dtype == torch.int32
        assert int(cu_q[-1]) == q.shape[0] and int(cu_k[-1]) == k.shape[0]
        self.calls.append(("varlen", q.shape[0], max_q, max_k))
        return torch.zeros(q.shape[0], q.shape[1], v.shape[2])

    def paged(self, q, kc, vc, cu_q, used, table, max_q):
        assert kc.dim() == 4 and table.dtype == torch.int32 and table.shape[0] == cu_q.shape[0] - 1
        assert int(table.max()) < kc.shape[0] and len(set(table.flatten().tolist())) == table.numel()
        assert (used <= table.shape[1] * kc.shape[1]).all()
        self.calls.append(("paged", q.shape[0], kc.shape[1], max_q))
        return torch.zeros(q.shape[0], q.shape[1], vc.shape[3])


@pytest.fixture
def untimed(monkeypatch):
    def once(fn, *args, **kwargs):
        fn()
        return 2.0

    monkeypatch.setattr(timer, "time_ms", once)


@pytest.mark.parametrize("spec", [pytest.param(s, marks=pytest.mark.slow) if s.layout == "paged" else s
                                  for s in SERVING_SPECS], ids=lambda s: s.layout)
def test_serving_defaults_are_stored_under_their_mixes_serving_buckets(spec, untimed, monkeypatch):
    import tuner.defaults.export as de

    real = de.serving_call
    monkeypatch.setattr(de, "serving_call", lambda kernel, problem, **kw: real(kernel, problem, device="cpu", **kw))
    kernel = ShapeKernel()
    rows = _measurements(kernel, spec, ("s1024",), (16, 64))
    buckets = sorted(b for b, _, _ in rows)
    if spec.layout == "paged":
        assert buckets == sorted(f"{b}-p{p}" for p in (16, 64)
                                 for b in ("t16k-even", "t16k-skewed", "t16k-short", "t4k-even"))
    else:
        assert buckets == ["t16k-even", "t16k-short", "t16k-skewed"]
    assert all(bucket_errors(b, spec.layout) == [] for b in buckets)
    assert len(kernel.calls) == len(rows) and all(kind == spec.layout for kind, *_ in kernel.calls)
    for bucket, value, problem in rows:
        assert value > 0 and problem["layout"] == spec.layout and bucket.startswith("t")


def test_dense_defaults_keep_their_key_length_buckets(untimed, monkeypatch):
    monkeypatch.setattr(dense, "measure_problem", lambda kernel, problem: 2.0)
    rows = _measurements(object(), KernelSpec("gqa", 128, 128, True, "bf16"), ("s1024", "s4096"), (16,))
    assert [(b, p) for b, _, p in rows] == [("s1024", {"seqlen_k": 4096}), ("s4096", {"seqlen_k": 4096})]


def test_the_paged_timing_inputs_hold_every_key():
    (problem,) = serving_problems("paged", "gqa", 16, 2, 128, 128, True, "bf16", 16, names=["2x(2k on 6k)"])
    kernel = ShapeKernel()
    serving_call(kernel, problem, device="cpu")()
    assert kernel.calls == [("paged", 4096, 16, 2048)]


def test_compile_changes_builds_each_specs_default_with_each_change_in_one_pool(monkeypatch):
    from translate import nvcc
    from tuner.defaults.export import compile_changes

    pools = []
    monkeypatch.setattr(nvcc, "compile_kernels",
                        lambda gens, arch, **kw: pools.append((arch, kw["batch_size"], [g.name for g in gens]))
                        or [f"result {g.name}" for g in gens])
    dense, paged = KernelSpec("gqa", 128, 128, True, "bf16"), KernelSpec("gqa", 128, 128, True, "bf16", "paged")
    built = compile_changes("h100", [(dense, {"default": {}, "n176": {"block_n": 176}}), (paged, {"default": {}})])
    assert len(pools) == 1 and pools[0][:2] == ("sm_90a", 1)          # one pool, a kernel a unit
    assert [list(b) for b in built] == [["default", "n176"], ["default"]]
    gen, result = built[0]["n176"]
    assert gen.params.block_n == 176 and result == f"result {gen.name}"
    assert built[0]["default"][0].params.block_n != 176 and built[1]["default"][0].spec.layout == "paged"


def test_load_verified_keeps_the_kernels_that_build_and_pass_the_gate(monkeypatch, capsys):
    """The A/B scripts (dense_profile, bench_serving --variants) time only kernels that built and passed tuner.measure.verify;
    every verdict is printed under the caller's label."""
    from types import SimpleNamespace

    import tuner.serving.launch
    import tuner.measure.verify
    from tuner.defaults.export import load_verified

    def gen(name):
        return SimpleNamespace(name=name, meta=lambda: {"name": name})

    def res(ok):
        return SimpleNamespace(ok=ok, cubin=b"x" if ok else None, log="ptxas error", registers=128, spill_stores=0)

    monkeypatch.setattr(tuner.serving.launch, "load_kernel", lambda cubin, meta: meta["name"])
    monkeypatch.setattr(tuner.measure.verify, "verify", lambda kernel, spec: SimpleNamespace(
        passed=kernel != "k_wrong", reason="max abs err 1.0" if kernel == "k_wrong" else ""))
    built = {"default": (gen("k_ok"), res(True)), "wrong": (gen("k_wrong"), res(True)), "broken": (gen("k_x"), res(False))}
    assert load_verified(built, None, "mha64n_8192") == {"default": "k_ok"}
    out = capsys.readouterr().out
    assert "mha64n_8192 wrong: k_wrong regs 128 spills 0 verified=False max abs err 1.0" in out
    assert "mha64n_8192 broken: k_x did not compile: ptxas error" in out


DECODE_OPTION_SPEC = KernelSpec("gqa", 64, 64, True, "bf16", "paged", "decode", local=True, sinks=True)


def test_decode_defaults_are_stored_under_decode_buckets_and_timed_with_their_options(untimed, monkeypatch):
    """A decode spec built with options: one record per decode bucket of each page size, every timed call given
    the options the kernel computes (a window, fp32 sinks of its query heads)."""
    from tuner.measure import decode
    from tuner.serving.buckets.decode import decode_bucket_errors

    calls = []

    def kernel(q, k, v, cache_seqlens=None, page_table=None, softmax_scale=None, **options):
        calls.append(options)
        return q

    monkeypatch.setattr(decode, "problem_inputs", lambda p, device: {
        "q": torch.zeros(1), "k": None, "v": None, "seqused_k": None, "page_table": None})
    rows = _measurements(kernel, DECODE_OPTION_SPEC, ("s1024",), (16, 64))
    assert rows and all(decode_bucket_errors(b, "paged") == [] for b, _, _ in rows)
    assert {b.rsplit("-", 1)[1] for b, _, _ in rows} == {"p16", "p64"} and len({b for b, _, _ in rows}) == len(rows)
    assert len(calls) == len(rows)
    for options in calls:
        assert options["window_size"] == (1024, 0) and options["softcap"] == 0.0
        assert options["learnable_sink"].dtype == torch.float32 and options["learnable_sink"].shape == (16,)
    assert all(problem["window"] == (1024, 0) and problem["sinks"] for _, _, problem in rows)


def test_compile_defaults_builds_a_decode_option_kernel_as_tune_build_does(monkeypatch):
    """The decode sketch with the statements of the spec's options and the default decode parameters: the same
    source `tune build --phase decode --window ... --sinks` compiles (one nvcc cache entry serves both)."""
    from types import SimpleNamespace

    import tl
    from hardware_profiles import load_profile
    from translate import nvcc
    from translate.compiler import generate
    from translate.decode.params import default_decode_params
    from tuner.build import load_checked_program
    from tuner.defaults.export import compile_defaults

    monkeypatch.setattr(nvcc, "compile_kernels", lambda gens, arch, **kw: [
        SimpleNamespace(ok=True, cubin=b"x", log="") for _ in gens])
    (built,) = compile_defaults("h200", [DECODE_OPTION_SPEC])
    assert built.generated.meta()["grid"] == "decode"
    assert built.generated.meta()["spec"]["local"] and built.generated.meta()["spec"]["sinks"]
    program, _, _, _ = load_checked_program("gqa", True, None, "decode", "paged", DECODE_OPTION_SPEC)
    profile = load_profile("h200")
    by_build = generate(program, default_decode_params(DECODE_OPTION_SPEC, None, profile), profile,
                        DECODE_OPTION_SPEC)
    assert built.generated.source == by_build.source and tl.parse_program(built.tl_text) == program
