"""SASS inspection of compiled kernels: cuobjdump found on PATH or in the CUDA wheels, each function's instructions
(to compare two builds) and counts of the instructions that show a kernel uses the hardware it should.
None where cuobjdump is not installed.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Optional

from translate.nvcc import ToolNotFound


class CuobjdumpNotFound(ToolNotFound):
    pass


def find_cuobjdump() -> Path:
    """cuobjdump from PATH or from the nvidia-cuda-cuobjdump wheel (site-packages/nvidia/cu13/bin)."""
    found = shutil.which("cuobjdump")
    if found:
        return Path(found)
    spec = importlib.util.find_spec("nvidia")
    for location in (spec.submodule_search_locations or []) if spec else []:
        for candidate in sorted(Path(location).glob("cu*/bin/cuobjdump")):
            for tool in candidate.parent.iterdir():  # wheels unpack without the executable bit
                if tool.is_file() and not os.access(tool, os.X_OK):
                    try:
                        tool.chmod(tool.stat().st_mode | 0o755)
                    except OSError:
                        pass
            if os.access(candidate, os.X_OK):
                return candidate
    raise CuobjdumpNotFound("cuobjdump not found on PATH nor in site-packages/nvidia/cu*/bin: "
                            "`pip install nvidia-cuda-cuobjdump==13.2.86 nvidia-cuda-nvdisasm==13.2.86`")


SASS_OPCODES = ("HMMA", "HGMMA", "QGMMA", "LDSM", "LDGSTS", "MUFU.EX2", "UTMALDG", "UTMASTG", "USETMAXREG")
_ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/")
_OPCODE = re.compile(r"(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)")   # after a predicate, if any
_SASS_LINE = re.compile(_ADDRESS.pattern + r"\s+" + _OPCODE.pattern)                  # an instruction's line
_FUNCTION = re.compile(r"^\s*Function : (\S+)")


def sass_instructions(cubin_path: Path, *, timeout: float = 120) -> Optional[dict[str, list[str]]]:
    """Each function's SASS instructions in order (predicate, opcode and operands; no addresses, no
    encodings), so two builds can be compared. None when cuobjdump is not installed."""
    try:
        tool = find_cuobjdump()
    except CuobjdumpNotFound:
        return None
    env = dict(os.environ)
    env["PATH"] = f"{tool.parent}{os.pathsep}{env.get('PATH', '')}"  # cuobjdump calls nvdisasm
    proc = subprocess.run([str(tool), "-sass", str(cubin_path)], capture_output=True, text=True, env=env,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"cuobjdump -sass {cubin_path} failed: {proc.stderr.strip() or proc.stdout[-500:]}")
    functions: dict[str, list[str]] = {}
    current: Optional[list[str]] = None
    for line in proc.stdout.splitlines():
        if m := _FUNCTION.match(line):
            current = functions.setdefault(m.group(1), [])
        elif current is not None and _SASS_LINE.search(line):
            current.append(_ADDRESS.sub("", line.split(";")[0]).strip() + ";")
    return functions


def sass_summary(cubin_path: Path, function: Optional[str] = None, *, timeout: float = 120) -> Optional[dict]:
    """Counts of the instructions that show the kernel uses the hardware it should: tensor-core MMAs
    (HMMA, HGMMA; QGMMA: the 8-bit wgmma), ldmatrix (LDSM), cp.async (LDGSTS) and exp2 (MUFU.EX2), plus the instruction total,
    over the whole cubin or one function. None when cuobjdump is not installed (find_cuobjdump() says why).
    """
    functions = sass_instructions(cubin_path, timeout=timeout)
    if functions is None:
        return None
    if function is not None and function not in functions:
        raise ValueError(f"no function {function!r} in {cubin_path}; it holds: {', '.join(functions)}")
    counts: Counter = Counter()
    for name, lines in functions.items():
        if function is not None and name != function:
            continue
        for line in lines:
            opcode = _OPCODE.match(line).group(1)
            counts["instructions"] += 1
            base = opcode.split(".")[0]
            if base in ("HMMA", "HGMMA", "QGMMA", "LDSM", "LDGSTS", "UTMALDG", "UTMASTG", "USETMAXREG"):
                counts[base] += 1
            if opcode.startswith("MUFU.EX2"):
                counts["MUFU.EX2"] += 1
    summary = {op: counts.get(op, 0) for op in SASS_OPCODES}
    summary["instructions"] = counts.get("instructions", 0)
    summary["functions"] = list(functions) if function is None else [function]
    return summary


def wgmmas_fed_by_r2ur(lines: list[str], window: int = 3) -> list[str]:
    """The wgmma instructions (HGMMA) with a move into a uniform register (R2UR) among the ``window`` instructions
    before them: a descriptor computed in ordinary registers, moved to a uniform one on the wgmma's issue path.
    A warp-uniform warpgroup index keeps the descriptors in uniform registers, and this list empty
    (translate/sm90/frame.py gmma_operand_line, the decode kernels' ``wg``)."""
    return [line for k, line in enumerate(lines)
            if "HGMMA" in line and any("R2UR" in before for before in lines[max(0, k - window):k])]
