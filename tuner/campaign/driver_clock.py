"""Where a campaign's driver loop spends its time, and what its queues held while it ran (tuner/campaign/loop.py).

The loop is one thread that asks the samplers, sends compile units, launches GPU trials, waits on Ray and tells the
results. When more GPUs add few trials per hour, either that thread is busy (its sections add up to the run) or
the GPUs wait for kernels: the sections say which, and the levels say what waited. Sections (seconds and calls):
``ask`` (sampler asks, the feasible-space suggestion, translation), ``send`` (compile units submitted), ``launch``
(GPU trials submitted), ``wait`` (blocked in ray.wait: the thread had nothing to do), ``compiled`` and ``measured``
(handling results: saving kernels, telling trials, the measurement cache), ``baselines``, ``backstops``, ``view``
(the live view). Levels (time-weighted mean and max over the loop): compile units and kernels in flight, kernels
compiled and ready for a GPU, trials on GPU workers, free trial slots and idle GPUs (no trial in flight);
``gpus_starved`` is the share of the loop with an idle GPU and no kernel ready (the GPUs waited for compiles, or for
asks when nothing compiled).
"""
from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager
from typing import Callable

SECTIONS = ("ask", "send", "launch", "wait", "compiled", "measured", "baselines", "backstops", "view")


class DriverClock:
    """Section times and queue levels of one loop; ``report()`` for the run summary."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self.started = clock()
        self.seconds: dict[str, float] = {name: 0.0 for name in SECTIONS}
        self.calls: Counter = Counter()
        self._levels: dict[str, tuple[float, float]] = {}   # name -> (integral of level dt, max)
        self._current: dict[str, float] = {}
        self._starved = 0.0
        self._last = self.started

    @contextmanager
    def section(self, name: str):
        if name not in self.seconds:
            raise ValueError(f"unknown driver section {name!r}; one of {', '.join(SECTIONS)}")
        t0 = self._clock()
        try:
            yield
        finally:
            self.seconds[name] += self._clock() - t0
            self.calls[name] += 1

    def sample(self, **levels: float) -> None:
        """The queues now (compiling_units, compiling_kernels, ready, measuring, free_gpu_slots, idle_gpus): the
        previous sample's levels held since it was taken."""
        now = self._clock()
        self._close(now)
        self._current = {k: float(v) for k, v in levels.items()}

    def _close(self, now: float) -> None:
        dt = max(0.0, now - self._last)
        for name, level in self._current.items():
            area, peak = self._levels.get(name, (0.0, 0.0))
            self._levels[name] = (area + level * dt, max(peak, level))
        if self._current.get("idle_gpus", 0) > 0 and self._current.get("ready", 0) == 0:
            self._starved += dt
        self._last = now

    def report(self) -> dict:
        now = self._clock()
        self._close(now)
        elapsed = now - self.started
        busy = sum(self.seconds.values()) - self.seconds["wait"]

        def share(x: float):
            return round(x / elapsed, 3) if elapsed > 0 else None

        return {
            "elapsed_s": round(elapsed, 2),
            "busy_s": round(busy, 2), "busy_fraction": share(busy),   # the thread working, not waiting on Ray
            "sections": {name: {"s": round(s, 3), "share": share(s), "calls": self.calls[name]}
                         for name, s in self.seconds.items()},
            "untimed_s": round(max(0.0, elapsed - sum(self.seconds.values())), 3),
            "levels": {name: {"mean": round(area / elapsed, 2) if elapsed > 0 else None, "max": peak}
                       for name, (area, peak) in sorted(self._levels.items())},
            "gpus_starved": share(self._starved),
        }
