"""Host-side check programs of the translate tests: a C++ program that prints one OK/FAIL line per kernel
configuration, compiled by nvcc against CUTLASS and the kernels' helper headers (translate/include), then run."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from translate import nvcc

HELPER_INCLUDE = Path(nvcc.__file__).parent / "include"


def run_host_checks(source: str, name: str, tmp_path: Path, count: int, *, opt: str = "-O1",
                    arch: str | None = None) -> None:
    """Build ``source`` as ``name`` with nvcc (skip without nvcc or CUTLASS), run it, and assert it printed
    ``count`` result lines, every one OK, and exited 0."""
    try:
        exe_nvcc = nvcc.find_nvcc()
        cutlass = nvcc.cutlass_include_dir()
    except nvcc.ToolNotFound as exc:
        pytest.skip(str(exc))
    src, exe = tmp_path / f"{name}.cu", tmp_path / name
    src.write_text(source)
    # one device pass: -arch=sm_X would also run cicc for the compute_X PTX it embeds (~35 s of a 3-minute build)
    target = ["-gencode", f"arch=compute_{arch[3:]},code={arch}"] if arch else []
    build = subprocess.run([str(exe_nvcc), "-std=c++17", opt, "-x", "cu", *target, f"-I{cutlass}",
                            f"-I{HELPER_INCLUDE}", "--expt-relaxed-constexpr", "-w", "-o", str(exe), str(src)],
                           capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith(("OK", "FAIL"))]
    assert run.returncode == 0 and len(lines) == count and all(ln.startswith("OK") for ln in lines), \
        run.stdout[-4000:] + run.stderr[-2000:]
