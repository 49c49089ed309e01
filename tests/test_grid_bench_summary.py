"""scripts/grid_bench_summary.py on the CPU: the grid's measure over a folder of `tune bench --json` records."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import grid_bench_summary as gbs  # noqa: E402


def record(folder: Path, name: str, fa4: dict, cudnn: dict) -> None:
    rows = [{"seqlen": s, "ours/fa4": fa4.get(s), "ours/cudnn": cudnn.get(s)} for s in (512, 1024, 2048, 4096, 8192, 16384)]
    (folder / f"{name}.json").write_text(json.dumps({"rows": rows}))


def test_the_long_keys_geomean_and_the_counts(tmp_path, capsys):
    record(tmp_path, "a", {2048: 1.1, 4096: 0.9, 8192: 1.0, 16384: 1.2}, {512: 0.8, 1024: 1.01, 2048: 0.99, 4096: 1.2})
    record(tmp_path, "b", {2048: 1.05, 4096: None, 8192: 0.95, 16384: 1.0}, {512: None, 1024: 0.9})
    (tmp_path / "not_a_record.json").write_text("[1, 2]")
    s = gbs.summary(gbs.load(tmp_path))
    assert s["points_long"] == 7 and s["ge_fa4"] == 5
    assert s["ge_max"] == 4            # a's 2k beat FA4 but not cuDNN; a missing cuDNN value does not veto
    assert s["geomean_fa4_long"] == pytest.approx(math.exp(sum(map(math.log, (1.1, 0.9, 1.0, 1.2, 1.05, 0.95, 1.0))) / 7))
    assert (s["points_short"], s["ge_cudnn_short"]) == (3, 1)
    assert gbs.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| b | - | - | 1.050 | - | 0.950 | 1.000 | - | 0.900 |" in out and "5 of 7 points" in out


def test_bad_input_is_named(tmp_path, capsys):
    assert gbs.main([str(tmp_path / "missing")]) == 2
    assert gbs.main([str(tmp_path)]) == 1 and "no tune bench records" in capsys.readouterr().err


def test_the_driver_is_valid_bash():
    assert subprocess.run(["bash", "-n", str(SCRIPTS / "grid_bench.sh")]).returncode == 0
