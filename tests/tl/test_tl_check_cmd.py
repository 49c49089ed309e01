"""`tune check FILE...`: one verdict per file, exit 0/1/2, never a traceback."""
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tl import load_sketch, sketch_path
from tuner.commands.cli import app

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def runner():
    return CliRunner()


def write(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def test_valid_files_exit_0_with_ok_lines(runner):
    paths = [str(sketch_path("mha", True)), str(sketch_path("mla", False))]
    result = runner.invoke(app, ["check", *paths])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [f"{p}: ok" for p in paths]


def test_diagnostics_exit_1_with_code_and_line(runner, tmp_path):
    bad = write(tmp_path, "bad.tl", load_sketch("mha", False).replace("K_shared.T", "K_shared"))
    good = write(tmp_path, "good.tl", load_sketch("gqa", False))
    result = runner.invoke(app, ["check", str(good), str(bad)])
    assert result.exit_code == 1
    line = next(k for k, l in enumerate(bad.read_text().splitlines(), 1) if "GEMM Q_shared" in l)
    assert f"{good}: ok" in result.output
    assert f"{bad}:{line}:" in result.output and "error[gemm-layout]" in result.output
    assert "  hint: " in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("content", [b"\x00\x01\x02 garbage \xc3(", b"\xff\xfe\x00\x00", "Copy A from global to the moon\n"])
def test_garbage_never_gives_a_traceback(runner, tmp_path, content):
    path = write(tmp_path, "x.tl", content)
    result = runner.invoke(app, ["check", str(path)])
    assert result.exit_code in (1, 2)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output


@pytest.mark.parametrize("content", ["", "\n  \n", "// only a comment\n"])
def test_a_file_without_statements_is_not_ok(runner, tmp_path, content):
    """Read, and an invalid sketch: exit 1, as `tune build --sketch` answers it (tests/test_newcomer_path.py)."""
    path = write(tmp_path, "empty.tl", content)
    result = runner.invoke(app, ["check", str(path)])
    assert result.exit_code == 1
    assert result.output.splitlines()[:2] == [
        f"{path}:1:1: error[empty-program]: the program has no statements: a sketch with nothing in it is not a "
        "kernel",
        "  hint: write the kernel's flow (copies, GEMMs, softmax, the output's store), or start from a reference "
        "sketch: tl/sketches/mha_causal.tl"]
    assert f"{path}: ok" not in result.output and f"{path}: 1 error" in result.output


def test_undecodable_bytes_exit_2(runner, tmp_path):
    path = write(tmp_path, "bin.tl", bytes(range(128, 256)))
    result = runner.invoke(app, ["check", str(path)])
    assert result.exit_code == 2
    assert "not UTF-8" in result.output


@pytest.mark.parametrize("make", [lambda t: t / "missing.tl", lambda t: t])
def test_missing_file_or_directory_exit_2(runner, tmp_path, make):
    result = runner.invoke(app, ["check", str(make(tmp_path))])
    assert result.exit_code == 2
    assert "tune check: error:" in result.output


def test_io_error_wins_over_diagnostics(runner, tmp_path):
    bad = write(tmp_path, "bad.tl", "for i = 0:N\n")
    result = runner.invoke(app, ["check", str(bad), str(tmp_path / "nope.tl")])
    assert result.exit_code == 2
    assert "error[syntax]" in result.output


def test_no_files_is_a_usage_error(runner):
    assert runner.invoke(app, ["check"]).exit_code == 2


def test_python_m_tuner_check(tmp_path):
    bad = write(tmp_path, "bad.tl", "Copy Q from global to shared\nfor i = 0:N\n")
    proc = subprocess.run([sys.executable, "-m", "tuner", "check", str(sketch_path("mqa", True)), str(bad)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert f"{sketch_path('mqa', True)}: ok" in proc.stdout
    assert f"{bad}:2:1: error[syntax]: 'for' at line 2 has no matching 'end'" in proc.stdout
    assert "Traceback" not in proc.stderr
