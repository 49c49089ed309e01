"""The replay backend's file format and its values for configurations it does not hold."""
import json

import pytest

from hardware_profiles import load_profile
from translate.params import KernelParams
from tuner.campaign.backends import BackendError, _replay_measure, load_replay, parse_backend
from tuner.campaign.perfmodel import model_tflops
from kernel_abi.spec import grid_problems

from .search_efficiency import FIXTURE


def _write(tmp_path, rows):
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_recorded_grid_fixture_loads_and_serves_recorded_numbers():
    data = load_replay(FIXTURE)
    assert data.meta["device_name"] == "NVIDIA H100 80GB HBM3" and len(data.entries) > 1000
    key, entry = next(iter(data.entries.items()))
    problems = grid_problems("mha", 128, "bf16", True)
    out = _replay_measure(str(FIXTURE), {"params": entry["params"], "profile": "h100", "problems": problems})
    assert out["verified"] and not out["replay_unknown"]
    assert out["tflops"] == {k: float(v) for k, v in entry["tflops"].items()}


def test_unknown_configs_get_the_deterministic_model_value_and_are_marked(tmp_path):
    path = _write(tmp_path, [{"_meta": {"device_name": "X"}}])
    params = KernelParams(block_m=64, block_n=32)
    problems = grid_problems("mha", 128, "bf16", True, seqlens=(1024,))
    out = _replay_measure(str(path), {"params": params.to_dict(), "profile": "h100", "problems": problems})
    assert out["replay_unknown"] is True
    assert out["tflops"]["1024"] == model_tflops(params, problems[0], load_profile("h100")) > 0


def test_wrong_fault_fails_verification_with_a_reason(tmp_path):
    params = KernelParams(block_n=32).to_dict()
    path = _write(tmp_path, [{"params": params, "fault": "wrong"}])
    out = _replay_measure(str(path), {"params": params, "profile": "h100", "problems": []})
    assert out["verified"] is False and "wrong result" in out["reason"]


@pytest.mark.parametrize("rows,message", [
    ([{"params": {"block_q": 1}, "tflops": {}}], "unknown kernel parameter"),
    ([{"params": {}, "fault": "melt"}], "unknown fault 'melt'"),
    ([{"params": {}}], "needs 'tflops' or 'fault'"),
])
def test_broken_replay_files_are_refused_with_the_line(tmp_path, rows, message):
    path = _write(tmp_path, rows)
    with pytest.raises(BackendError, match=message):
        parse_backend(f"replay:{path}")


def test_backend_choices():
    assert parse_backend(None).kind == "gpu"
    with pytest.raises(BackendError, match="choose gpu or replay:FILE"):
        parse_backend("cuda")
    with pytest.raises(BackendError, match="does not exist"):
        parse_backend("replay:/nonexistent.jsonl")
