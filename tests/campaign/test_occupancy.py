"""The summary's steady-state GPU occupancy (finish.steady_state): per GPU, the share of the window from
its first lock to its last release that some trial held the lock."""
from __future__ import annotations

import pytest

from tuner.campaign.finish import steady_state


def test_no_spans_no_steady_state():
    assert steady_state([]) is None


def test_occupancy_is_held_time_over_each_gpus_own_window():
    spans = [("n/gpu-0", 100.0, 102.0), ("n/gpu-0", 102.0, 104.0), ("n/gpu-0", 106.0, 108.0),   # 6 of 8 s
             ("n/gpu-1", 200.0, 201.0), ("n/gpu-1", 203.0, 204.0)]                            # 2 of 4 s
    s = steady_state(spans)
    assert s["gpus"] == 2 and s["trials"] == 5
    assert s["window_s"] == pytest.approx(12.0) and s["held_s"] == pytest.approx(8.0)
    assert s["held_fraction"] == pytest.approx(8 / 12, abs=1e-3)
    assert s["measured_per_gpu_hour"] == pytest.approx(5 / (12 / 3600), rel=1e-3)
    assert (s["from"], s["to"]) == (100.0, 204.0)


def test_saturation_starts_at_the_first_trial_that_waited_for_the_lock():
    # gpu-0: a ramp (gaps while the first kernels compile), then trials queue for the lock (waited > 0)
    spans = [("n/gpu-0", 0.0, 1.0, 0.0), ("n/gpu-0", 10.0, 11.0, 0.0), ("n/gpu-0", 20.0, 21.0, 0.0),
             ("n/gpu-0", 21.0, 22.0, 0.4), ("n/gpu-0", 22.0, 23.0, 1.2), ("n/gpu-0", 23.5, 24.0, 0.0)]
    s = steady_state(spans)
    assert s["held_fraction"] == pytest.approx(5.5 / 24, abs=1e-3)
    sat = s["saturated"]
    assert (sat["from"], sat["to"], sat["trials"]) == (21.0, 24.0, 3)
    assert sat["held_fraction"] == pytest.approx(2.5 / 3, abs=1e-3)
    # no trial ever waited: the pipeline never filled
    assert steady_state([("g", 0.0, 1.0, 0.0), ("g", 5.0, 6.0, 0.01)])["saturated"] is None


def test_the_idle_gap_between_two_gpus_windows_does_not_count():
    # the same GPU key on two nodes is two GPUs: a gap between their windows is not idle time of either
    one = steady_state([("a/gpu-0", 0.0, 10.0), ("b/gpu-0", 50.0, 60.0)])
    assert one["held_fraction"] == pytest.approx(1.0) and one["window_s"] == pytest.approx(20.0)
