"""Real nvcc builds of translated sketches (slow: two compiles, ~15-40 s each): the cubin exists and its
SASS holds tensor-core MMAs (HMMA) and, on sm80+, cp.async (LDGSTS) and ldmatrix (LDSM)."""
import tempfile
from pathlib import Path

import pytest

import tl
import translate
from hardware_profiles import load_profile
from translate import nvcc
from translate.defaults import default_params
from tuner.problem import KernelSpec

pytestmark = pytest.mark.slow


def _build(gpu: str, spec: KernelSpec):
    try:
        nvcc.find_nvcc()
        nvcc.cutlass_include_dir()
    except nvcc.ToolNotFound as exc:
        pytest.skip(str(exc))
    profile = load_profile(gpu)
    text = tl.sketch_path(spec.variant, spec.causal).read_text()
    gen = translate.generate(tl.parse_program(text), default_params(profile, spec), profile, spec)
    result = nvcc.compile_kernel(gen, profile.nvcc_arch, timeout=600)
    assert result.ok, result.log[-3000:]
    assert result.cubin and result.registers and result.registers <= 255
    return gen, result


def _sass(result, name):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(result.cubin)
        return nvcc.sass_summary(path, name)


def test_mla_causal_builds_for_hopper_with_tensor_cores():
    gen, result = _build("h100", KernelSpec("mla", 192, 128, True, "bf16"))
    sass = _sass(result, gen.name)
    if sass is None:
        pytest.skip("cuobjdump not installed")
    counts = sass.get("counts", sass)
    assert counts.get("HMMA", 0) > 0 and counts.get("LDGSTS", 0) > 0 and counts.get("LDSM", 0) > 0, sass


def test_sm75_build_uses_turing_mma_without_cp_async():
    gen, result = _build("t4", KernelSpec("mha", 128, 128, False, "fp16"))
    sass = _sass(result, gen.name)
    if sass is None:
        pytest.skip("cuobjdump not installed")
    counts = sass.get("counts", sass)
    assert counts.get("HMMA", 0) > 0 and counts.get("LDGSTS", 0) == 0, sass
