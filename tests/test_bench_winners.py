"""scripts/bench_winners.py: one `tune bench` per distinct bucket winner, at what it won (subprocess stubbed)."""
import importlib.util
import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("bench_winners", REPO / "scripts" / "bench_winners.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _winner(bucket: str, name: str, winner: str = "challenger") -> dict:
    kernel = {"kernel_name": name, "params": {"block_m": 192, "block_n": 96}, "schedule": "ws_overlap"}
    return {"bucket": bucket, "winner": winner, winner: kernel}


def test_a_dense_campaigns_winners_are_benched_once_each_at_the_seqlens_they_won(tmp_path, monkeypatch, capsys):
    study = tmp_path / "studies" / "h100-mha-bf16-d64-causal"
    study.mkdir(parents=True)
    (tmp_path / "studies" / "kernels").mkdir()                  # the store beside the study: not a study
    winners = [_winner("s2048", "k_a"), _winner("s4096", "k_a"), _winner("s8192", "k_b", "seed")]
    (study / "summary.json").write_text(json.dumps({"winners": winners}))
    calls = []

    def fake_run(cmd, capture_output, text):
        calls.append(cmd)
        seqlens = [int(s) for s in cmd[cmd.index("--seqlens") + 1].split(",")]
        rows = [{"seqlen": n, "ours": 400.0, "fa4": 500.0, "cudnn": 320.0} for n in seqlens]
        Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps({"rows": rows}))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    rc = _script().main([str(tmp_path / "studies"), "--layout", "dense", "--variant", "mha", "--head-dim", "64",
                         "--no-causal", "--out", str(tmp_path / "out")])
    assert rc == 0 and len(calls) == 2                          # two distinct kernels
    first = calls[0]
    assert first[first.index("--seqlens") + 1] == "2048,4096" and "--no-causal" in first
    assert first[first.index("--head-dim") + 1] == "64" and "--model" not in first and "--layout" not in first
    assert json.loads(first[first.index("--params") + 1]) == {"block_m": 192, "block_n": 96}
    assert calls[1][calls[1].index("--seqlens") + 1] == "8192"
    out = capsys.readouterr().out
    assert "s4096" in out and "fa4 500.0 (0.800)" in out and "cudnn 320.0 (1.250)" in out
