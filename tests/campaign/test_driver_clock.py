"""The campaign driver's clock (tuner/campaign/driver_clock.py): section times, time-weighted queue levels, and the
share of the loop with an idle GPU and nothing ready."""
import pytest

from tuner.campaign.driver_clock import DriverClock


class Ticks:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_sections_add_their_time_and_the_report_says_what_the_thread_did():
    t = Ticks()
    clock = DriverClock(t)
    with clock.section("ask"):
        t.now += 2.0
    with clock.section("wait"):
        t.now += 5.0
    with clock.section("ask"):
        t.now += 1.0
    t.now += 2.0   # outside every section
    r = clock.report()
    assert r["elapsed_s"] == 10.0 and r["sections"]["ask"] == {"s": 3.0, "share": 0.3, "calls": 2}
    assert r["sections"]["wait"]["s"] == 5.0 and r["busy_s"] == 3.0 and r["busy_fraction"] == 0.3
    assert r["untimed_s"] == 2.0


def test_levels_are_time_weighted_and_starvation_is_an_idle_gpu_with_nothing_ready():
    t = Ticks()
    clock = DriverClock(t)
    clock.sample(ready=0, idle_gpus=2, compiling_kernels=8)    # 4 s: GPUs idle, kernels compiling
    t.now += 4.0
    clock.sample(ready=3, idle_gpus=1, compiling_kernels=0)    # 6 s: kernels ready (not starved)
    t.now += 6.0
    r = clock.report()
    assert r["levels"]["compiling_kernels"] == {"mean": 3.2, "max": 8.0}
    assert r["levels"]["ready"] == {"mean": 1.8, "max": 3.0}
    assert r["gpus_starved"] == 0.4


def test_an_unknown_section_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown driver section 'asks'"):
        with DriverClock().section("asks"):
            pass
