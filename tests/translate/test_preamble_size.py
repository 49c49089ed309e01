"""What nvcc's front end reads for each kind of kernel: the preambles' device-side preprocessed size, and the CUTLASS
headers translate/include/cutlass_trim keeps out (sm90 sparse GMMA, sm100, sm120: no kernel uses them).

cicc's cost per translation unit follows the bytes it parses: the Hopper preamble was 8.9 MB with every
architecture's CuTe traits and is 7.0 MB without them, 0.3-0.45 CPU seconds less per unit (nvcc 13.0, 2 cores;
BENCHMARKS.md, nvcc cost per kernel). One ``nvcc -E`` per preamble (~0.5 s each).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from translate import nvcc
from translate.decode.generate import PREAMBLE as DECODE_PREAMBLE
from translate.kernel import PREAMBLE
from translate.sm90.preamble import HOPPER_PREAMBLE

TRIM = Path(nvcc.__file__).parent / "include" / "cutlass_trim"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")

# (preamble, arch, bound in MB): measured 6.8-7.0 MB with the stand-ins, 8.7-8.9 MB without.
PREAMBLES = {
    "sm80": (PREAMBLE, "sm_80", 7.5),
    "hopper": (HOPPER_PREAMBLE, "sm_90a", 7.5),
    "decode": (DECODE_PREAMBLE, "sm_90a", 7.5),
    "decode_seesaw": (DECODE_PREAMBLE.replace('"attn_decode.cuh"', '"attn_decode_sm90_seesaw.cuh"'), "sm_90a", 7.5),
}
# Headers no kernel may pull in: other architectures' MMA/copy traits and the sparse GMMA ops.
LEFT_OUT = re.compile(r"cute/(arch|atom)/\w*(sm100|sm120|sparse)\w*\.hpp|cute/util/print_latex\.hpp")


def stand_ins() -> list[str]:
    return sorted(str(p.relative_to(TRIM)) for p in TRIM.rglob("*.hpp"))


def test_every_stand_in_shadows_a_cutlass_header_and_is_empty():
    try:
        cutlass = nvcc.cutlass_include_dir()
    except nvcc.ToolNotFound as exc:
        pytest.skip(str(exc))
    names = stand_ins()
    assert "cute/atom/mma_traits_sm100.hpp" in names and "cute/arch/mma_sm90_gmma_sparse.hpp" in names
    for name in names:
        assert (cutlass / name).is_file(), f"{name} shadows no CUTLASS header (renamed in a newer CUTLASS?)"
        code = [ln for ln in (TRIM / name).read_text().splitlines() if ln.strip() and not ln.startswith("//")]
        assert code == ["#pragma once"], f"{name}: a stand-in declares nothing"
        assert LEFT_OUT.search(name), f"{name}: only other architectures' headers are left out"


@needs_nvcc
def test_the_stand_ins_come_before_cutlass_on_the_include_path():
    flags = nvcc._toolchain("sm_90a", (), "cubin").flags
    includes = [f[2:] for f in flags if f.startswith("-I")]
    assert includes.index(str(TRIM)) < includes.index(str(nvcc.cutlass_include_dir()))


def _preprocessed(preamble: str, arch: str, tmp_path: Path) -> str:
    flags = [f for f in nvcc._toolchain(arch, (), "cubin").flags if f not in ("-cubin", "-Xptxas", "-v")]
    src = tmp_path / "p.cu"
    src.write_text(preamble + "\n__global__ void probe() {}\n")
    out = subprocess.run([str(nvcc.find_nvcc()), *flags, "-E", str(src)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@needs_nvcc
@pytest.mark.parametrize("kind", sorted(PREAMBLES))
def test_preamble_preprocesses_small_and_without_other_architectures(kind, tmp_path):
    preamble, arch, bound_mb = PREAMBLES[kind]
    text = _preprocessed(preamble, arch, tmp_path)
    headers = set(re.findall(r'^# \d+ "([^"]+)"', text, re.MULTILINE))
    assert any(h.endswith("cute/tensor.hpp") for h in headers)
    pulled = sorted(h for h in headers if LEFT_OUT.search(h) and "cutlass_trim" not in h)
    assert not pulled, f"{kind}: the preamble pulls in {pulled}"
    assert len(text) / 1e6 < bound_mb, f"{kind}: {len(text) / 1e6:.2f} MB of device code (bound {bound_mb} MB)"
