"""How one measurement is taken: GPU time of a call, median of many after warm-up, with input sets rotated so no
run finds its operands in L2 (torch imported lazily: the module loads on CPU-only machines)."""
from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass
from typing import Callable, Optional, Sequence


@dataclass(frozen=True)
class Timing:
    """How one measurement is taken: do_bench's warm-up and repetition budgets (milliseconds of GPU time)
    and the number of input sets rotated. The defaults are `tune bench`'s; a campaign trial, which only
    ranks candidates against baselines timed the same way, uses shorter budgets."""

    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    rotate: int = 3
    # How L2 is emptied before each timed run. "zero": do_bench's memset of 256 MB, which leaves L2 full of dirty
    # lines that the timed call then writes back as it evicts them: 8-9 us more for an H200 decode call of 128k
    # cache tokens, FP8 and bf16 alike, under 1 us for one of 1k (BENCHMARKS.md "2026-11-29 (fifth session)").
    # "read": a sum over the same bytes, which leaves L2 clean (as the weights a model's other kernels read do).
    # Memory-bound calls of tens of microseconds, timed against the copy bandwidth, take "read".
    l2_flush: str = "zero"

    def __post_init__(self) -> None:
        if not (self.warmup_ms >= 0 and self.rep_ms > 0 and self.rotate >= 1):
            raise ValueError(f"timing needs warmup_ms >= 0, rep_ms > 0 and rotate >= 1, got {self}")
        if self.l2_flush not in L2_FLUSHES:
            raise ValueError(f"timing's l2_flush must be one of {L2_FLUSHES}, got {self.l2_flush!r}")


L2_FLUSHES = ("zero", "read")
FLUSH_BYTES = 256 * 1024 * 1024      # do_bench's buffer: several times any GPU's L2
DEFAULT_TIMING = Timing()


def time_ms(fn: Callable[[], object], warmup: int = 10, reps: int = 50, *, timing: Optional[Timing] = None) -> float:
    """Median milliseconds of ``fn`` on the current stream: triton's do_bench when installed (it also
    flushes L2; ``timing`` gives its budgets), else CUDA events around ``warmup`` + ``reps`` calls."""
    timing = timing or DEFAULT_TIMING
    if timing.l2_flush == "read":
        return _time_after_clean_flush(fn, timing)
    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None
    if do_bench is not None:
        return float(do_bench(fn, warmup=timing.warmup_ms, rep=timing.rep_ms, return_mode="median"))
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


_flush_buffers: dict = {}


def _time_after_clean_flush(fn: Callable[[], object], timing: Timing) -> float:
    """do_bench's procedure (an estimate from 5 runs sizes the warm-up and the repetitions to ``timing``'s budgets;
    the median of CUDA-event intervals around each run) with L2 emptied by reading FLUSH_BYTES before each run."""
    import torch

    device = torch.cuda.current_device()
    flush = _flush_buffers.get(device)
    if flush is None:
        flush = _flush_buffers[device] = torch.ones(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        flush.sum()
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(timing.warmup_ms / estimate))):
        fn()
    runs = max(1, int(timing.rep_ms / estimate))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    for i in range(runs):
        flush.sum()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def alternating_rounds(calls: dict, rounds: int) -> dict:
    """{label: [ms of each round]}: every call timed once a round (time_ms), the order reversed every other round so
    that none always runs first (clock and power drift fall on all alike)."""
    ms = {label: [] for label in calls}
    for r in range(rounds):
        for label in (list(calls) if r % 2 == 0 else list(reversed(calls))):
            ms[label].append(time_ms(calls[label]))
    return ms


def rotating(call: Callable, inputs: Sequence[tuple]) -> Callable[[], object]:
    """``call(*inputs[i])`` for i = 0, 1, 2, ... in turn: each timed run reads another input set."""
    cycle = itertools.cycle(inputs)
    return lambda: call(*next(cycle))


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none), at most 200 characters."""
    text = str(exc).strip()
    return (text.splitlines()[0][:200] if text else type(exc).__name__)
