"""scripts/nvcc_trace.py on a small made-up trace: nesting by time spans, self time per template family, the outline."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import nvcc_trace  # noqa: E402


def _event(name, ts, dur, detail=None, pid=7):
    return {"name": name, "ph": "X", "ts": ts, "dur": dur, "pid": pid, **({"args": {"detail": detail}} if detail else {})}


TRACE = {"traceEvents": [
    {"name": "process_name", "ph": "M", "pid": 7},
    _event("CUDA C++ Front-End", 0, 10_000_000, "k.ii"),
    _event("Instantiating Template Function", 1_000_000, 4_000_000, "cute::ThrCopy::partition_S [cute::ThrCopy<A>]"),
    _event("Instantiating Template Function", 2_000_000, 1_000_000, "cute::get [cute::get<0>]"),
    _event("Instantiating Template Function", 6_000_000, 2_000_000, "cute::get [cute::get<1>]"),
    _event("Total PTXAS Time", 11_000_000, 500_000, pid=8),
]}


def test_children_are_nested_by_time_and_self_time_excludes_them(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(TRACE))
    events = nvcc_trace.load_events(str(path))
    depth, self_us = nvcc_trace.nest(events)
    by_name = {(e["name"], (e.get("args") or {}).get("detail")): (d, s) for e, d, s in zip(events, depth, self_us)}
    assert by_name[("CUDA C++ Front-End", "k.ii")] == (0, 10_000_000 - 4_000_000 - 2_000_000)
    assert by_name[("Instantiating Template Function", "cute::ThrCopy::partition_S [cute::ThrCopy<A>]")] == \
        (1, 3_000_000)
    assert by_name[("Total PTXAS Time", None)][0] == 0            # another process: not inside the front end
    lines = nvcc_trace.summary(events, depth=1, min_s=0.5, top=5)
    assert "  10.00 CUDA C++ Front-End: k.ii" in lines and "     4.00 Instantiating Template Function: cute::Thr" in \
        "\n".join(lines)
    families = [ln for ln in lines if ln.startswith("  ") and "(Instantiating" in ln]
    assert families[0].split()[:3] == ["3.00", "1", "cute::ThrCopy::partition_S"]
    assert families[1].split()[:3] == ["3.00", "2", "cute::get"]   # two instantiations' self time summed


def test_an_unreadable_trace_is_one_line_and_exit_2(tmp_path, capsys):
    assert nvcc_trace.main([str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
