"""scripts/ on the CPU: every tool answers --help with its usage (quickly: torch and the GPU stack are imported where
a tool runs, not at its top), and uses the installed package's public names only: no sys.path edits, nothing of
tests/."""
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
TOOLS = ["bench_serving.py", "bucket_table.py", "compile_cost.py", "decode_serve_check.py", "decode_trace.py", "decode_window_time.py",
         "dense_profile.py", "grid_bench.sh", "grid_bench_summary.py", "grid_from_studies.py", "measure_grid.py",
         "ncu_sass_stalls.py", "nvcc_trace.py", "param_ab_check.py", "retime_check.py", "sass_compare.py", "serving_check.py", "table_ab.py"]


def _help(name: str) -> subprocess.CompletedProcess:
    cmd = ["bash", str(SCRIPTS / name), "--help"] if name.endswith(".sh") else [sys.executable, str(SCRIPTS / name),
                                                                                "--help"]
    # this checkout's package, as `pip install -e .` of it would give (another checkout may be the installed one)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def helps() -> dict:
    with ThreadPoolExecutor(max_workers=8) as pool:
        return dict(zip(TOOLS, pool.map(_help, TOOLS)))


def test_the_tools_are_the_listed_ones():
    assert sorted(p.name for p in SCRIPTS.iterdir() if p.is_file()) == sorted(TOOLS)


@pytest.mark.parametrize("name", TOOLS)
def test_each_tool_prints_its_usage(helps, name):
    proc = helps[name]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage:") and name in proc.stdout.splitlines()[0]
    assert len(proc.stdout.splitlines()) > 3     # what it is for, beyond the usage line


@pytest.mark.parametrize("name", TOOLS)
def test_each_tool_uses_the_installed_package_only(name):
    text = (SCRIPTS / name).read_text()
    assert "sys.path.insert" not in text and "sys.path.append" not in text
    assert not re.search(r"^\s*(from|import)\s+tests\b", text, re.M)
    assert not re.search(r"^\s*(from|import)\s+(" + "|".join(Path(t).stem for t in TOOLS) + r")\b", text, re.M), \
        "a tool imports another tool: shared code belongs in the package"
