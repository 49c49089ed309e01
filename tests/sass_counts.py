"""How many of each opcode a compiled kernel's SASS holds, for the tests that read a kernel's instructions."""
import tempfile
from collections import Counter
from pathlib import Path

import pytest


def sass_counts(name: str, cubin: bytes) -> Counter:
    """{base opcode (STSM, QGMMA, STL ...): count} of function ``name`` in ``cubin``; the test is skipped without
    cuobjdump."""
    from translate.sass import sass_instructions

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        functions = sass_instructions(path)
    if functions is None:
        pytest.skip("cuobjdump not installed")
    counts: Counter = Counter()
    for line in functions[name]:
        words = line.split()
        opcode = words[1] if words[0].startswith("@") else words[0]
        counts[opcode.split(".")[0].rstrip(";")] += 1
    return counts
