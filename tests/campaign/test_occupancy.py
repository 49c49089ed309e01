"""The summary's steady-state GPU occupancy (finish.steady_state): per GPU, the share of the window from
its first lock to its last release that some trial held the lock."""
from __future__ import annotations

import pytest

from tuner.campaign.state import Tally
from tuner.campaign.finish import compile_pipeline, steady_state


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


def test_compile_pipeline_compares_compiled_kernels_per_second_with_what_the_gpus_take():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    # one batch of two kernels: 30 s from submit to result, 20 s of it the task's, one nvcc unit of 16 s
    for _ in range(2):
        t = study.ask()
        t.set_user_attr("compile", {"batch": 2, "wall_s": 30.0, "task_s": 20.0, "unit_kernels": 2,
                                    "nvcc_cached": False, "unit_nvcc_s": 16.0})
        study.tell(t, 1.0)
    cached = study.ask()   # a batch of one that nvcc's cache answered
    cached.set_user_attr("compile", {"batch": 1, "wall_s": 3.0, "task_s": 0.5, "unit_kernels": 1,
                                     "nvcc_cached": True, "unit_nvcc_s": 0.0})
    study.tell(cached, 1.0)
    study.tell(study.ask(), 1.0)   # a cache hit of the measurements: no compile
    tally = Tally()
    tally.elapsed = 60.0
    tally.lock_spans = [("g", 0.0, 1.5, 0.0), ("g", 2.0, 4.5, 0.0)]    # mean hold 2 s: 0.5 kernels/s per GPU
    p = compile_pipeline(study, tally, n_gpus=2)
    assert p["kernels"] == 3 and p["nvcc_cached"] == 1
    assert p["mean_batch"] == pytest.approx(5 / 3, abs=0.01)
    assert p["latency_s"] == pytest.approx(21.0) and p["cpu_wait_s"] == pytest.approx((10 + 10 + 2.5) / 3, abs=0.01)
    assert p["nvcc_s_per_kernel"] == pytest.approx((8 + 8 + 0) / 3, abs=0.01)
    assert p["compiled_per_s"] == pytest.approx(3 / 60, abs=1e-3) and p["gpus_take_per_s"] == pytest.approx(1.0)
    assert compile_pipeline(optuna.create_study(), tally, 2) is None
