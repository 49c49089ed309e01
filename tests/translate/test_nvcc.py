"""translate/nvcc.py: toolchain discovery, failures as results, cache, batching with fallback, ptxas parsing.

Plain-CUDA kernels (no CuTe include) compile in ~0.3 s, so they carry the behaviour tests; one real CuTe
compile (marked slow) checks the ptxas parsing and SASS inspection end to end.
"""
from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

from translate import nvcc, sass
from translate.nvcc import (CompileResult, compile_kernel, compile_kernels, compile_ptx, find_nvcc,
                            parse_ptxas_resources)

HAVE_NVCC = shutil.which("nvcc") is not None
needs_nvcc = pytest.mark.skipif(not HAVE_NVCC, reason="nvcc not on PATH")


@dataclass(frozen=True)
class FakeKernel:
    """The parts of translate.GeneratedKernel that the compiler reads."""

    name: str
    preamble: str
    body: str

    @property
    def source(self) -> str:
        return self.preamble + self.body


PREAMBLE = "#include <cstdint>\n"


def plain_kernel(i: int, broken: bool = False, scale: float = 1.0) -> FakeKernel:
    body = (f"namespace cfg{i} {{\n"
            f"extern \"C\" __global__ void plain_{i}(float* x, int n) {{\n"
            f"  if (threadIdx.x < n) x[threadIdx.x] *= {scale + i}f;\n"
            + ("  this_is_not_declared(x);\n" if broken else "")
            + "}\n}  // namespace\n")
    return FakeKernel(f"plain_{i}", PREAMBLE, body)


CUTE_PREAMBLE = "#include <cute/tensor.hpp>\n"
CUTE_BODY = r"""
namespace cute_mma_cfg {
using namespace cute;
// One SM80 16x8x16 MMA per warp: enough for HMMA in the SASS and real ptxas figures.
extern "C" __global__ void cute_one_mma(const cute::half_t* a, const cute::half_t* b, float* c) {
  __shared__ float pad[64];
  pad[threadIdx.x % 64] = 1.0f;
  __syncthreads();
  TiledMMA mma = make_tiled_mma(SM80_16x8x16_F32F16F16F32_TN{});
  Tensor A = make_tensor(make_gmem_ptr(a), make_shape(Int<16>{}, Int<16>{}), make_stride(Int<16>{}, Int<1>{}));
  Tensor B = make_tensor(make_gmem_ptr(b), make_shape(Int<8>{}, Int<16>{}), make_stride(Int<16>{}, Int<1>{}));
  Tensor C = make_tensor(make_gmem_ptr(c), make_shape(Int<16>{}, Int<8>{}), make_stride(Int<8>{}, Int<1>{}));
  auto thr = mma.get_slice(threadIdx.x);
  Tensor tA = thr.partition_fragment_A(A);
  Tensor tB = thr.partition_fragment_B(B);
  copy(thr.partition_A(A), tA);
  copy(thr.partition_B(B), tB);
  Tensor tC = thr.partition_fragment_C(C);
  clear(tC);
  gemm(mma, tA, tB, tC);
  tC(0) += pad[(threadIdx.x + 1) % 64];
  copy(tC, thr.partition_C(C));
}
}  // namespace cute_mma_cfg
"""


class CountingRuns:
    """Wraps nvcc._run_nvcc to count real nvcc invocations."""

    def __init__(self, monkeypatch):
        self.calls: list[list[str]] = []
        real = nvcc._run_nvcc

        def run(cmd, timeout, cwd):
            self.calls.append(list(cmd))
            return real(cmd, timeout, cwd)

        monkeypatch.setattr(nvcc, "_run_nvcc", run)


def _fake_nvcc(directory: Path, script_body: str) -> Path:
    """An executable called nvcc that answers --version like nvcc 13 and otherwise runs script_body."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "nvcc"
    path.write_text("#!/bin/sh\n"
                    "if [ \"$1\" = \"--version\" ]; then\n"
                    "  echo 'Cuda compilation tools, release 13.0, V13.0.88'; echo 'Build fake_nvcc_for_tests'; exit 0\n"
                    "fi\n" + script_body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


# -- toolchain discovery -----------------------------------------------------------------------------


def test_missing_nvcc_is_a_result_with_a_clear_message(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    with pytest.raises(nvcc.NvccNotFound, match="nvcc not found.*CUDA_HOME"):
        find_nvcc()
    results = compile_kernels([plain_kernel(0), plain_kernel(1)], "sm_80", cache_dir=tmp_path / "cache")
    assert [r.ok for r in results] == [False, False]
    assert {r.error_kind for r in results} == {"nvcc-missing"}
    assert "nvcc not found" in results[0].log and results[1].name == "plain_1"
    assert compile_ptx(plain_kernel(0)).error_kind == "nvcc-missing"


@needs_nvcc
def test_nvcc_found_through_cuda_home_when_not_on_path(monkeypatch, tmp_path):
    real = Path(shutil.which("nvcc")).resolve()
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "nvcc").symlink_to(real)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(home))
    assert find_nvcc() == home / "bin" / "nvcc"


def test_cutlass_headers_are_located_without_importing_the_package():
    include = nvcc.cutlass_include_dir()
    assert (include / "cute" / "tensor.hpp").is_file()
    assert nvcc.cutlass_version(include).startswith("4.")


def test_missing_cutlass_wheel_gives_install_hint(monkeypatch):
    monkeypatch.setattr(nvcc.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(nvcc.CutlassNotFound, match="pip install nvidia-cutlass"):
        nvcc.cutlass_include_dir()


@needs_nvcc
def test_nvcc_version_names_the_release():
    assert nvcc.nvcc_version().startswith("V1")


# -- failures are results ----------------------------------------------------------------------------


@needs_nvcc
def test_compile_error_is_a_result_with_the_log(tmp_path):
    result = compile_kernel(plain_kernel(0, broken=True), "sm_80", cache_dir=tmp_path)
    assert not result.ok and result.error_kind == "compile-error"
    assert "this_is_not_declared" in result.log and result.cubin is None


@needs_nvcc
def test_timeout_kills_nvcc_and_reports_timeout(tmp_path):
    result = compile_kernel(plain_kernel(0), "sm_80", cache_dir=tmp_path, timeout=0.01)
    assert not result.ok and result.error_kind == "timeout"
    assert "timed out" in result.log
    # a timeout may not recur: it is not cached
    assert compile_kernel(plain_kernel(0), "sm_80", cache_dir=tmp_path).ok


def test_compiler_killed_by_a_signal_is_a_crash(monkeypatch, tmp_path):
    _fake_nvcc(tmp_path / "bin", "kill -SEGV $$")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    result = compile_kernel(plain_kernel(0), "sm_80", cache_dir=tmp_path / "cache")
    assert not result.ok and result.error_kind == "crash"


def test_cicc_death_reported_by_nvcc_is_a_crash(monkeypatch, tmp_path):
    _fake_nvcc(tmp_path / "bin", "echo \"nvcc error   : 'cicc' died due to signal 11 (Invalid memory reference)\"; exit 1")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    results = compile_kernels([plain_kernel(0), plain_kernel(1)], "sm_80", cache_dir=tmp_path / "cache")
    assert [r.error_kind for r in results] == ["crash", "crash"]
    assert "died due to signal 11" in results[1].log


# -- cache -------------------------------------------------------------------------------------------


@needs_nvcc
def test_second_compile_is_a_cache_hit_without_nvcc(monkeypatch, tmp_path):
    runs = CountingRuns(monkeypatch)
    kernels = [plain_kernel(0), plain_kernel(1, broken=True)]
    first = compile_kernels(kernels, "sm_80", cache_dir=tmp_path)
    n_first = len(runs.calls)
    assert n_first >= 1 and [r.ok for r in first] == [True, False] and not any(r.cached for r in first)
    second = compile_kernels(kernels, "sm_80", cache_dir=tmp_path)
    assert len(runs.calls) == n_first, "a cache hit must not run nvcc"
    assert all(r.cached for r in second)
    assert second[0].cubin == first[0].cubin and second[0].registers == first[0].registers
    assert second[1].error_kind == "compile-error" and "this_is_not_declared" in second[1].log
    # a different flag or source is a different key
    compile_kernels([plain_kernel(0)], "sm_80", cache_dir=tmp_path, extra_flags=["-DVARIANT=1"])
    compile_kernels([plain_kernel(0, scale=2.0)], "sm_80", cache_dir=tmp_path)
    assert len(runs.calls) == n_first + 2


@needs_nvcc
def test_duplicate_kernels_compile_once(monkeypatch, tmp_path):
    runs = CountingRuns(monkeypatch)
    results = compile_kernels([plain_kernel(3), plain_kernel(3)], "sm_80", cache_dir=None)
    assert len(runs.calls) == 1 and results[0] == results[1] and results[0].ok


# -- batching ----------------------------------------------------------------------------------------


def test_translation_unit_dedupes_preambles_and_keeps_every_body():
    kernels = [plain_kernel(0), plain_kernel(1), plain_kernel(2)]
    unit = nvcc.build_translation_unit(kernels)
    assert unit.count("#include <cstdint>") == 1
    for k in kernels:
        assert k.body.strip() in unit
    assert unit.index("#include <cstdint>") < unit.index("plain_0")


@needs_nvcc
def test_batch_with_one_broken_config_still_builds_the_others(monkeypatch, tmp_path):
    runs = CountingRuns(monkeypatch)
    kernels = [plain_kernel(0), plain_kernel(1, broken=True), plain_kernel(2), plain_kernel(3)]
    results = compile_kernels(kernels, "sm_80", cache_dir=tmp_path, batch_size=8, jobs=1)
    assert [r.name for r in results] == [k.name for k in kernels]
    assert [r.ok for r in results] == [True, False, True, True]
    broken = results[1]
    assert broken.error_kind == "compile-error" and "this_is_not_declared" in broken.log
    assert broken.batch_size == 1  # its log is its own
    # the error log pointed at kernel 1: it is compiled alone, the other three together again
    assert len(runs.calls) == 3
    assert {r.batch_size for r in results if r.ok} == {3}
    assert all(r.registers is not None and r.registers > 0 for r in results if r.ok)


def test_blame_falls_back_to_one_by_one_when_errors_point_outside_bodies():
    kernels = [plain_kernel(0), plain_kernel(1), plain_kernel(2)]
    unit = nvcc._make_unit(kernels)
    body_line = unit.spans[2][0] + 1
    assert nvcc._blamed(f'batch.cu({body_line}): error: x', unit, "batch.cu") == {2}
    chain = f'include/cute/x.hpp(12): error: y\n  detected during instantiation of "f" at line {body_line} of batch.cu'
    assert nvcc._blamed(chain, unit, "batch.cu") == {2}
    assert nvcc._blamed("batch.cu(1): error: in the preamble", unit, "batch.cu") is None
    # warnings blame no one, wherever they are
    warn = f"batch.cu(1): warning #177-D: unused\nbatch.cu({unit.spans[0][0]}): warning #177-D: unused\n"
    assert nvcc._blamed(warn + f"/tmp/x/batch.cu({body_line}): error: y\n", unit, "batch.cu") == {2}
    assert nvcc._blamed(warn, unit, "batch.cu") is None
    assert nvcc._blamed("ptxas fatal: something", unit, "batch.cu") is None


@needs_nvcc
def test_batches_split_by_size_and_run_in_parallel(monkeypatch, tmp_path):
    runs = CountingRuns(monkeypatch)
    results = compile_kernels([plain_kernel(i) for i in range(5)], "sm_80", cache_dir=None, batch_size=2, jobs=2)
    assert all(r.ok for r in results)
    assert len(runs.calls) == 3 and sorted(r.batch_size for r in results) == [1, 2, 2, 2, 2]


@needs_nvcc
def test_ptx_for_the_sm75_cross_check(tmp_path):
    result = compile_ptx(plain_kernel(0), "compute_75", cache_dir=tmp_path)
    assert result.ok and ".target sm_75" in result.ptx and ".entry plain_0" in result.ptx
    again = compile_ptx(plain_kernel(0), "compute_75", cache_dir=tmp_path)
    assert again.cached and again.ptx == result.ptx


# -- ptxas -v parsing --------------------------------------------------------------------------------

# Recorded from nvcc 13.0 (-Xptxas -v, two entries in one unit, one non-entry device function).
RECORDED_PTXAS_LOG = """\
ptxas info    : 11 bytes gmem
ptxas info    : Function properties for _ZN4cute6detail6helperEv
    24 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'fa_fwd_m128n64' for 'sm_80'
ptxas info    : Function properties for fa_fwd_m128n64
    56 bytes stack frame, 56 bytes spill stores, 48 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 56 bytes cumulative stack size, 384 bytes cmem[0]
ptxas info    : Compile time = 812.519 ms
ptxas info    : Compiling entry function 'fa_fwd_m64n64' for 'sm_80'
ptxas info    : Function properties for fa_fwd_m64n64
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 167 registers, used 1 barriers, 1024 bytes smem, 384 bytes cmem[0]
ptxas info    : Compile time = 401.2 ms
"""


def test_ptxas_log_parsed_per_kernel():
    res = parse_ptxas_resources(RECORDED_PTXAS_LOG)
    assert set(res) == {"fa_fwd_m128n64", "fa_fwd_m64n64"}
    a, b = res["fa_fwd_m128n64"], res["fa_fwd_m64n64"]
    assert (a.registers, a.spill_stores, a.spill_loads, a.stack_bytes, a.smem_static) == (255, 56, 48, 56, 0)
    assert (b.registers, b.spill_stores, b.spill_loads, b.stack_bytes, b.smem_static) == (167, 0, 0, 0, 1024)


@pytest.mark.slow
@needs_nvcc
def test_real_cute_compile_parses_resources_and_sass_has_hmma(tmp_path):
    cute = FakeKernel("cute_one_mma", CUTE_PREAMBLE, CUTE_BODY)
    plain = plain_kernel(7)
    # Two preambles: separate units; the CuTe unit's ptxas lines are parsed for its own kernel.
    results = compile_kernels([cute, plain], "sm_90a", cache_dir=tmp_path)
    assert all(r.ok for r in results), results[0].log[-2000:]
    r = results[0]
    assert isinstance(r, CompileResult) and r.registers and r.registers > 0
    assert r.smem_static == 64 * 4 and r.spill_stores == 0 and r.compile_seconds > 0
    assert "Compiling entry function 'cute_one_mma' for 'sm_90a'" in r.log
    path = tmp_path / "k.cubin"
    path.write_bytes(r.cubin)
    summary = sass.sass_summary(path)
    if summary is None:
        pytest.skip("cuobjdump not installed")
    assert summary["HMMA"] >= 1 and summary["instructions"] > summary["HMMA"]
    assert summary["functions"] == ["cute_one_mma"]
    assert sass.sass_summary(path, "cute_one_mma")["HMMA"] == summary["HMMA"]
    with pytest.raises(ValueError, match="no function"):
        sass.sass_summary(path, "nope")


def test_sass_summary_none_without_cuobjdump(monkeypatch, tmp_path):
    def missing():
        raise sass.CuobjdumpNotFound("cuobjdump not found")

    monkeypatch.setattr(sass, "find_cuobjdump", missing)
    assert sass.sass_summary(tmp_path / "x.cubin") is None
