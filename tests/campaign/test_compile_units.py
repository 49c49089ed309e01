"""Compile units are filled to --compile-batch across ask slices (tuner/campaign/loop.py FILL_WAIT_S): a lone
Hopper kernel costs ~3x the nvcc time of one in a unit of four (H100 campaigns, BENCHMARKS.md)."""
import pytest

from tuner.campaign import loop as loop_module
from tuner.campaign import run_campaign

from .conftest import load_study, replay_options

pytestmark = pytest.mark.slow


def test_units_are_filled_across_ask_slices_that_each_bring_one_candidate(ray_cluster, tmp_path, monkeypatch):
    one_at_a_time = loop_module.Loop.ask_batch     # every ask slice ends after its first candidate

    def ask_one(self, camp, size, until=float("inf")):
        return one_at_a_time(self, camp, min(size, 1), until)

    monkeypatch.setattr(loop_module.Loop, "ask_batch", ask_one)
    assert run_campaign(replay_options(tmp_path, trials=16, compile_batch=4, early_stop=False)) == 0
    units = [t.user_attrs["compile"]["unit_kernels"] for t in load_study(tmp_path).trials
             if (t.user_attrs.get("compile") or {}).get("unit_kernels")]
    assert len(units) >= 12
    assert units.count(4) >= len(units) // 2, units   # ramp-up units of 1 and 2 aside, units of four
