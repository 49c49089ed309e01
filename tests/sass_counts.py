"""Compiled kernels for the tests that read their instructions: the build (skipped without nvcc or CUTLASS), and how
many of each opcode a kernel's SASS holds."""
import tempfile
from collections import Counter
from pathlib import Path

import pytest


def compiled_or_skip(gens, arch: str = "sm_90a", timeout: float = 900) -> list:
    """nvcc's results for ``gens`` (two jobs, one kernel a translation unit), each asserted built; the test is skipped
    without nvcc or the CUTLASS headers."""
    from translate import nvcc

    try:
        nvcc.find_nvcc()
        nvcc.cutlass_include_dir()
    except nvcc.ToolNotFound as exc:
        pytest.skip(str(exc))
    results = nvcc.compile_kernels(gens, arch, jobs=2, batch_size=1, timeout=timeout)
    for result in results:
        assert result.ok, result.log[-3000:]
    return results


def _sass_functions(cubin: bytes) -> dict:
    """{function name: its SASS lines} of ``cubin`` (translate.sass.sass_instructions); the test is skipped without
    cuobjdump."""
    from translate.sass import sass_instructions

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        functions = sass_instructions(path)
    if functions is None:
        pytest.skip("cuobjdump not installed")
    return functions


def sass_counts(name: str, cubin: bytes) -> Counter:
    """{base opcode (STSM, QGMMA, STL ...): count} of function ``name`` in ``cubin``; the test is skipped without
    cuobjdump."""
    functions = _sass_functions(cubin)
    counts: Counter = Counter()
    for line in functions[name]:
        words = line.split()
        opcode = words[1] if words[0].startswith("@") else words[0]
        counts[opcode.split(".")[0].rstrip(";")] += 1
    return counts


def local_memory_in_key_loop(name: str, cubin: bytes) -> int:
    """How many local-memory loads and stores (spills) function ``name`` in ``cubin`` holds between its first and last
    tensor-core MMA, where a spill costs once per key tile rather than once per tile; the test is skipped without
    cuobjdump."""
    functions = _sass_functions(cubin)
    opcodes = [(line.split()[1] if line.split()[0].startswith("@") else line.split()[0]).split(".")[0]
               for line in functions[name] if line.split()]
    mmas = [i for i, op in enumerate(opcodes) if op in ("HGMMA", "QGMMA", "HMMA")]
    return sum(op in ("STL", "LDL") for op in opcodes[mmas[0]:mmas[-1] + 1]) if mmas else 0


def sass_summary_of(result, name: str) -> dict:
    """translate.sass.sass_summary of function ``name`` in a compile result's cubin (tensor-core MMAs, LDSM, LDGSTS,
    MUFU.EX2, the total); the test is skipped without cuobjdump."""
    from translate.sass import find_cuobjdump, sass_summary

    try:
        find_cuobjdump()
    except Exception as exc:   # noqa: BLE001 (the tool's own not-found error)
        pytest.skip(str(exc))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(result.cubin)
        return sass_summary(path, name)
