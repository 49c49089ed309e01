"""When a re-timed challenger beats an incumbent: the rule behind every stored winner and every "search beat
the seeds" (docs/design.md: a win is a re-timed win).

GPU timings move 3-6% between runs, so the best of many single measurements is biased upwards (the
winner's curse): on an H100 a stored "+1.7%" winner was slower than the seed when both were timed again
side by side. So the challenger and its incumbents are timed again in one fresh process, interleaved
(retime.py), on the same inputs, ``rounds`` times each; round i gives the ratio
``incumbent_ms[i] / challenger_ms[i]`` (the challenger's TFLOPS over the incumbent's: > 1 is faster).

**The rule**: the challenger replaces the incumbent only when, in each of ``processes`` fresh processes, the
lower bound of the ``confidence`` percentile-bootstrap interval of the median of those per-round ratios is
above 1 + ``min_gain``. The interval is the
bootstrap's exact limit (infinitely many resamples, computed from the binomial law of the resampled median,
no random draws), so a decision never depends on a resampling seed. With 9 rounds at 95% the lower bound
is the second smallest ratio: a challenger must be faster in at least 8 of the 9 rounds.

Why more than one process: the interval measures the spread between rounds of one process, and a fresh process
moves more than that (its inputs' placement, the clocks it meets). On the H100 (BENCHMARKS.md, 2026-11-24/25),
scripts/retime_check.py re-timed 10 claims of one-process confirmations in a third process: 4 did not hold,
e.g. x1.014 [1.006, 1.018] re-checked at [0.993, 1.009], x1.020 [1.006, 1.054] at [1.000, 1.026].
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class ConfirmRule:
    """How a challenger is re-timed against its incumbents, and when it wins.

    Measured on the noisy grid (tests/campaign/winners_sim.py, BENCHMARKS.md: the 380 kernels measured on the
    H100 as true speeds, every measurement times log-normal noise; 20 campaigns x 6 buckets, each measuring the
    2 published seeds and the 91 kernels within 15% of the best): 9 rounds at 95% stored 1 false winner (a
    non-seed truly no faster than the best seed) in 120 buckets at 3% noise and 1 at 6%, where the maximum of
    single measurements stored 52 and 83. Fewer rounds are worse, not cheaper: with 7 the bound is the second
    smallest of 7 ratios (a tie passes one time in 16: 4 and 3 false winners), with 5 the smallest (one in 32).
    15 rounds confirm more of the true wins at 3% (16 against 10; 1 and 2 false winners) for two thirds more GPU
    time. Each round times every contestant once with ``warmup_ms``/``rep_ms`` (do_bench windows, ms of GPU
    time): 9 x 3 x ~60 ms, about 1.6 s of the GPU's lock per contest of three kernels."""

    rounds: int = 9
    confidence: float = 0.95
    # A lower bound within 0.1% of 1 is a tie at the resolution of re-timing in another process: the first H100
    # campaign with this rule (2026-11-24, BENCHMARKS.md) claimed s2048 at x1.006 [1.0004, 1.031], and
    # scripts/retime_check.py's 15 rounds in a fresh process gave [0.998, 1.014]; the claims at 1.006 and
    # 1.0016 held ([1.006, 1.009], [1.008, 1.012]).
    min_gain: float = 0.001
    warmup_ms: float = 10.0
    rep_ms: float = 40.0
    rotate: int = 3                 # input sets rotated within a timing, as a trial's
    processes: int = 2              # fresh processes that must each confirm (module doc)

    def __post_init__(self) -> None:
        if not (isinstance(self.rounds, int) and self.rounds >= 3 and self.rounds % 2 == 1):
            raise ValueError(f"rounds must be an odd integer >= 3 (the median of an odd count is one round's "
                             f"ratio), got {self.rounds!r}")
        if not 0.5 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0.5, 1), got {self.confidence!r}")
        if not 0 <= self.min_gain < 0.5:
            raise ValueError(f"min_gain must be in [0, 0.5), got {self.min_gain!r}")
        if not (isinstance(self.processes, int) and self.processes >= 1):
            raise ValueError(f"processes must be an integer >= 1, got {self.processes!r}")
        if not (self.warmup_ms >= 0 and self.rep_ms > 0 and self.rotate >= 1):
            raise ValueError(f"timing needs warmup_ms >= 0, rep_ms > 0 and rotate >= 1, got {self}")

    def timing(self) -> dict:
        """One round's timing of one kernel (tuner.measure.timer.Timing fields)."""
        return {"warmup_ms": self.warmup_ms, "rep_ms": self.rep_ms, "rotate": self.rotate}

    def to_dict(self) -> dict:
        return {"rounds": self.rounds, "confidence": self.confidence, "min_gain": self.min_gain,
                "processes": self.processes, **self.timing()}


DEFAULT_RULE = ConfirmRule()


@dataclass(frozen=True)
class Verdict:
    """A challenger against one incumbent: the median per-round ratio, its interval, and the decision."""

    ratio: float                   # median of incumbent_ms / challenger_ms over the rounds
    low: float                     # the interval's bounds (the rule's confidence)
    high: float
    rounds: int
    confidence: float
    confirmed: bool                # low > 1 + min_gain: clearly faster than the incumbent

    def to_dict(self) -> dict:
        return {"ratio": round(self.ratio, 4), "low": round(self.low, 4), "high": round(self.high, 4),
                "rounds": self.rounds, "confidence": self.confidence, "confirmed": self.confirmed}

    def text(self) -> str:
        """``×1.021 [1.008, 1.034]``: the median ratio and its interval."""
        return f"×{self.ratio:.3f} [{self.low:.3f}, {self.high:.3f}]"


def round_ratios(challenger_ms: list[float], incumbent_ms: list[float]) -> list[float]:
    """Per round: the incumbent's time over the challenger's (the challenger's speed-up in that round)."""
    if len(challenger_ms) != len(incumbent_ms) or not challenger_ms:
        raise ValueError(f"need one time per round for both kernels, got {len(challenger_ms)} and "
                         f"{len(incumbent_ms)}")
    if any(not (t > 0 and math.isfinite(t)) for t in list(challenger_ms) + list(incumbent_ms)):
        raise ValueError("times must be positive and finite")
    return [i / c for c, i in zip(challenger_ms, incumbent_ms)]


def _binomial_tail(n: int, p: float, k: int) -> float:
    """P(Binomial(n, p) >= k)."""
    return sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k, n + 1))


def median_interval(values: list[float], confidence: float) -> tuple[float, float]:
    """The percentile-bootstrap interval of the median of an odd number of values, exactly: the median of a
    resample is at most the j-th smallest value when at least (n + 1) / 2 of its n draws are among the j
    smallest, i.e. P = P(Binomial(n, j / n) >= (n + 1) / 2); the bounds are the values where that
    distribution first reaches (1 - confidence) / 2 and (1 + confidence) / 2."""
    n = len(values)
    if n % 2 == 0 or n == 0:
        raise ValueError(f"need an odd number of values, got {n}")
    ordered = sorted(values)
    need = (n + 1) // 2
    tail = (1 - confidence) / 2

    def first_reaching(level: float) -> float:
        for j, value in enumerate(ordered, 1):
            if j < n and ordered[j] == value:     # ties: the distribution jumps at the last copy of a value
                continue
            if _binomial_tail(n, j / n, need) >= level - 1e-12:
                return value
        return ordered[-1]

    return first_reaching(tail), first_reaching(1 - tail)


def verdict(challenger_ms: list[float], incumbent_ms: list[float], rule: ConfirmRule = DEFAULT_RULE) -> Verdict:
    """The rule (module doc) applied to one challenger's and one incumbent's per-round times."""
    ratios = round_ratios(challenger_ms, incumbent_ms)
    if len(ratios) % 2 == 0:
        raise ValueError(f"the rule needs an odd number of rounds, got {len(ratios)}")
    low, high = median_interval(ratios, rule.confidence)
    return Verdict(statistics.median(ratios), low, high, len(ratios), rule.confidence, low > 1.0 + rule.min_gain)


def verdict_across(timings: list[tuple[list[float], list[float]]], rule: ConfirmRule = DEFAULT_RULE) -> Verdict:
    """The rule over several fresh processes' (challenger_ms, incumbent_ms): confirmed only when every process
    confirms; the ratio is the median of all rounds' ratios, the interval spans the processes' intervals."""
    if not timings:
        raise ValueError("need at least one process's times")
    each = [verdict(c, i, rule) for c, i in timings]
    if len(each) == 1:
        return each[0]
    ratios = [r for c, i in timings for r in round_ratios(c, i)]
    return Verdict(statistics.median(ratios), min(v.low for v in each), max(v.high for v in each),
                   len(ratios), rule.confidence, all(v.confirmed for v in each))
