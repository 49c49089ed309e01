"""GPU tests (marker gpu; skipped without CUDA): every problem kind verifies, a planted wrong kernel is
rejected, the moved-prefetch schedule verifies, and an sm75 kernel is cross-checked through compute_75
PTX that the driver JIT-compiles. Kernels are built with translate.nvcc on all cores in one go."""
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

import tl  # noqa: E402
import translate  # noqa: E402
from hardware_profiles import load_profile  # noqa: E402
from translate import nvcc  # noqa: E402
from translate.defaults import default_params  # noqa: E402
from kernel_abi.spec import KernelSpec  # noqa: E402
from sketch_edits import moved_prefetch  # noqa: E402

KINDS = [KernelSpec(v, d, 128 if v == "mla" else d, c, dt)
         for v, d, dts in (("mha", 128, ("bf16", "fp16")), ("mha", 64, ("bf16", "fp16")), ("gqa", 128, ("bf16",)),
                           ("mqa", 128, ("bf16",)), ("mla", 192, ("bf16",)))
         for c in (False, True) for dt in dts]


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


def _profile():
    name = torch.cuda.get_device_name()
    for gpu in ("h200", "h100", "a100", "l40s"):
        if gpu in name.lower().replace(" ", ""):
            return load_profile(gpu)
    return load_profile("h100")


@pytest.fixture(scope="module")
def built():
    profile = _profile()
    gens = {}
    for spec in KINDS:
        text = tl.sketch_path(spec.variant, spec.causal).read_text()
        gens[("kind", spec)] = translate.generate(tl.parse_program(text), default_params(profile, spec), profile, spec)
    spec = KernelSpec("mha", 128, 128, False, "bf16")
    moved = moved_prefetch(tl.sketch_path("mha", False).read_text())
    gens[("moved", spec)] = translate.generate(tl.parse_program(moved), default_params(profile, spec), profile, spec)
    keys = list(gens)
    cache = os.environ.get("KERNEL_CACHE_DIR")
    results = nvcc.compile_kernels([gens[k] for k in keys], _arch(), jobs=os.cpu_count() or 4, batch_size=2,
                                   cache_dir=Path(cache) if cache else None)
    return {k: (gens[k], r) for k, r in zip(keys, results)}


def _load(gen, result):
    from tuner.serving.launch import load_kernel

    assert result.ok, result.log[-3000:]
    return load_kernel(result.cubin, gen.meta())


@pytest.mark.parametrize("spec", KINDS, ids=lambda s: s.label())
def test_every_problem_kind_verifies(built, spec):
    from tuner.measure.verify import verify

    gen, result = built[("kind", spec)]
    report = verify(_load(gen, result), spec)
    assert report.passed, report.reason
    # the default check shapes include ragged tiles, seqlen 1, sq > sk and sq < sk
    labels = " ".join(c.problem for c in report.checks)
    assert "sq1 " in labels and "sq300 sk100" in labels and "sq100 sk300" in labels


def test_moved_prefetch_schedule_verifies(built):
    from tuner.measure.verify import verify

    gen, result = built[("moved", KernelSpec("mha", 128, 128, False, "bf16"))]
    assert verify(_load(gen, result), gen.spec).passed


def test_planted_wrong_kernel_is_rejected(built):
    from tuner.measure.verify import verify

    spec = KernelSpec("mha", 128, 128, True, "bf16")
    kern = _load(*built[("kind", spec)])

    def off_by_one_row(q, k, v, out=None):   # writes every element, but one row is wrong
        o = kern(q, k, v, out=out)
        o[:, -1] = o[:, 0]
        return o

    def skips_a_row(q, k, v, out=None):      # leaves the NaN poison in one row
        full = kern(q, k, v)
        out[:, :-1] = full[:, :-1]
        return out

    for wrong in (off_by_one_row, skips_a_row):
        report = verify(wrong, spec, seed=3)
        assert not report.passed and report.reason


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_sm75_kernel_cross_checked_through_ptx_jit(causal):
    from tuner.serving.launch import load_kernel
    from tuner.measure.verify import verify

    t4 = load_profile("t4")
    spec = KernelSpec("mha", 128, 128, causal, "fp16")
    gen = translate.generate(tl.parse_program(tl.sketch_path("mha", causal).read_text()), default_params(t4, spec),
                             t4, spec)
    assert "SM75_16x8x8" in gen.body
    cache = os.environ.get("KERNEL_CACHE_DIR")
    result = nvcc.compile_ptx(gen, "compute_75", cache_dir=Path(cache) if cache else None)
    assert result.ok, result.log[-3000:]
    report = verify(load_kernel(result.ptx.encode(), gen.meta()), spec)
    assert report.passed, report.reason
