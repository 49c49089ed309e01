"""Stop timing a candidate early when it cannot win a bucket.

A trial verifies its kernel and times it at every benchmark shape, 25 + 100 ms of do_bench windows each,
about 1.6 s of its GPU's lock on the H100 (TrialCost). Most of what a search proposes is far slower than
the best kernel found so far. So, once a study has a fully measured kernel, a candidate that is not a seed
first times the **longest** seqlen with a short window (``probe_*``); when it is below ``1 - margin`` times
the study's incumbent there (the best TFLOPS measured at that seqlen so far), it stops: it is told to the
study as pruned (feasible, not fully measured), never stored, and the other shapes are not timed. The
seeds, the yardstick of the search and the incumbents of the confirmed-winner rule (confirm.py), are
always measured in full.

Why the longest seqlen and why a 20% margin: on the recorded grids the winner of every bucket, short ones
included, is within 7.4% of the best kernel at the longest seqlen (the model grid h100_mha_d128_bf16_causal:
7.4%; the 380 kernels measured on the H100, h100_mha_d128_bf16_causal_ws_measured: 6.4%), while most of the
space is far behind there (below 0.8x: 98.5% of the model grid, 74.5% of the measured one). A would-be winner
is stopped only if its probe reads at least 13.6% low, over four standard deviations of a 3% timing noise;
and the longest seqlen is where one launch costs most. Replayed (tests/campaign/test_early_stop.py,
early_stop_sim.py, BENCHMARKS.md): no bucket winner of either grid is ever stopped; the campaign's sampler
on the recorded grid stops 127 of 150 kernels and spends 87.9 s of GPU instead of 238.5 s (63% saved), on
the measured grid 37%, and it proposes the very same kernels as without the early stop.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EarlyStop:
    margin: float = 0.20            # stop below (1 - margin) x the incumbent at the longest seqlen
    probe_warmup_ms: float = 5.0    # the probe's do_bench windows (a trial's: 25 / 100 ms)
    probe_rep_ms: float = 20.0

    def __post_init__(self) -> None:
        if not 0 < self.margin < 1:
            raise ValueError(f"margin must be in (0, 1), got {self.margin!r}")
        if not (self.probe_warmup_ms >= 0 and self.probe_rep_ms > 0):
            raise ValueError(f"the probe needs warmup_ms >= 0 and rep_ms > 0, got {self}")

    def stops(self, probe_tflops: float, incumbent: float) -> bool:
        """The candidate cannot win a bucket: its probe is below (1 - margin) x the incumbent."""
        return probe_tflops < (1.0 - self.margin) * incumbent

    def plan(self, problems, incumbent: float | None, timing: dict) -> dict | None:
        """A trial payload's ``early_stop`` (None: measure in full): the seqlen to probe first, the incumbent
        there, the margin and the probe's timing (``timing``'s input rotation)."""
        if incumbent is None or incumbent <= 0 or not problems:
            return None
        from .problems import is_dense, probe_problem, problem_key

        probe = probe_problem(problems)
        seqlen = probe.seqlen_k if is_dense(probe) else problem_key(probe)   # (a serving mix: its name)
        return {"seqlen": seqlen, "incumbent": round(float(incumbent), 3), "margin": self.margin,
                "probe": {"warmup_ms": self.probe_warmup_ms, "rep_ms": self.probe_rep_ms,
                          "rotate": int(timing.get("rotate", 3))}}

    def to_dict(self) -> dict:
        return {"margin": self.margin, "probe_warmup_ms": self.probe_warmup_ms, "probe_rep_ms": self.probe_rep_ms}


DEFAULT_EARLY_STOP = EarlyStop()


def decide(plan: dict, probe_tflops: float) -> dict | None:
    """In the trial process: the trial's ``early_stop`` record when its probe stops it, else None."""
    rule = EarlyStop(margin=float(plan["margin"]), probe_warmup_ms=float(plan["probe"]["warmup_ms"]),
                     probe_rep_ms=float(plan["probe"]["rep_ms"]))
    incumbent = float(plan["incumbent"])
    if not rule.stops(probe_tflops, incumbent):
        return None
    key = plan["seqlen"]
    return {"seqlen": int(key) if isinstance(key, (int, float)) else key, "probe_tflops": round(probe_tflops, 2), "incumbent": incumbent,
            "ratio": round(probe_tflops / incumbent, 4), "margin": rule.margin}


@dataclass(frozen=True)
class TrialCost:
    """Seconds a trial holds its GPU's lock, from the H100 campaign of 2026-11-21 (BENCHMARKS.md):
    verification 0.27 s; the benchmark of 6 shapes 1.32 s, 0.75 s of it do_bench's windows (6 x 125 ms), so
    0.095 s per shape besides its windows (inputs, the SDPA cross-check, do_bench's estimate and L2 flush).
    A probe is counted as a shape of its own (its set-up cost included) even where it reuses the shape's
    inputs: the savings below are a lower bound."""

    verify_s: float = 0.27
    shape_s: float = 0.095

    def full(self, shapes: int, timing: dict) -> float:
        return self.verify_s + shapes * (self.shape_s + _window_s(timing))

    def probed(self, shapes: int, timing: dict, rule: EarlyStop, stopped: bool) -> float:
        """A probed trial: the probe, then (unless it stopped) the full measurement."""
        probe = self.shape_s + (rule.probe_warmup_ms + rule.probe_rep_ms) / 1000.0
        return self.verify_s + probe if stopped else self.full(shapes, timing) + probe


def _window_s(timing: dict) -> float:
    return (float(timing.get("warmup_ms", 25.0)) + float(timing.get("rep_ms", 100.0))) / 1000.0
