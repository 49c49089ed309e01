"""scripts/dense_profile.py on the CPU: a point names a spec and a key length on the paper grid, and the table reads
ncu's raw export in the units ncu wrote (a duration in ms or us, a clock in GHz), with the stall reasons largest
first."""
import csv
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import dense_profile as dp  # noqa: E402


def test_a_point_is_a_spec_and_a_paper_grid_key_length():
    label, spec, problem = dp.parse_point("mqa64c:16384")
    assert label == "mqa64c_16384" and (spec.variant, spec.d_qk, spec.causal) == ("mqa", 64, True)
    assert (problem.batch, problem.seqlen_k, problem.heads_q, problem.heads_kv) == (1, 16384, 32, 1)
    for bad in ("mha64n", "mha64n:8k", "xyz64n:1024"):
        with pytest.raises(ValueError):
            dp.parse_point(bad)


def write_raw(path: Path, rows: list[dict], units: dict) -> None:
    names = list(rows[0])
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(names)
        w.writerow([units.get(n, "") for n in names])
        for row in rows:
            w.writerow([row[n] for n in names])


def test_the_raw_export_is_read_in_its_units(tmp_path):
    stall = dp.STALL_PREFIX + "{}" + dp.STALL_SUFFIX
    rows = [{"Kernel Name": "ours", "gpu__time_duration.sum": "2.5", "smsp__cycles_elapsed.avg.per_second": "1.44",
             "smsp__inst_executed.sum": "951,525,276", stall.format("wait"): "2.18", stall.format("barrier"): "0.1",
             stall.format("long_scoreboard"): "0.66"},
            {"Kernel Name": "fa4", "gpu__time_duration.sum": "2304.7", "smsp__cycles_elapsed.avg.per_second": "1.43",
             "smsp__inst_executed.sum": "889319568", stall.format("wait"): "1.49", stall.format("barrier"): "0.56",
             stall.format("long_scoreboard"): "n/a"}]
    units = {"gpu__time_duration.sum": "ms", "smsp__cycles_elapsed.avg.per_second": "Ghz",
             "smsp__inst_executed.sum": "inst"}
    path = tmp_path / "raw.csv"
    write_raw(path, rows, units)
    ours, fa4 = dp.summarize_raw(path)
    assert ours["us"] == pytest.approx(2500) and ours["mhz"] == pytest.approx(1440)
    assert ours["inst_M"] == pytest.approx(951.525276) and list(ours["stalls"]) == ["wait", "long_scoreboard", "barrier"]
    assert list(fa4["stalls"]) == ["wait", "barrier"]   # a value ncu could not give is left out
    units["gpu__time_duration.sum"] = "us"
    write_raw(path, rows, units)
    assert dp.summarize_raw(path)[1]["us"] == pytest.approx(2304.7)
    units["gpu__time_duration.sum"] = "fortnight"   # unknown: the column stays empty, never wrong
    write_raw(path, rows, units)
    assert "us" not in dp.summarize_raw(path)[0]
