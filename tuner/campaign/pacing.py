"""How far the compiles run ahead of the GPUs, and in what batches (the campaign loop's pacing).

Bounded lookahead. A sampler asked far ahead of its results proposes blindly (H200 run of 2026-11-22: 603
asks, 132 compiled and never measured). So the loop asks only when a compile slot is free and the kernels
compiling or compiled-and-waiting are fewer than the GPUs need next: Little's law, the GPUs' measured
rate (trials per second) times a compile batch's measured latency, with a floor of 2 x the GPU trial
slots before either is known.

No separate cap on the kernels compiled and waiting: that bound is the target itself. A cap of 2 x the GPU
trial slots (8 on one H100) made the compiles run in waves (device run of 2026-11-25, units of 8 on 12
compile slots): a wave of units finished together, its ~60-90 kernels held the cap for the ~60 s the GPU
took to drain them, no compile started meanwhile, and the next wave arrived ~35 s after the queue ran dry.
The host's CPUs were busy 54% of the campaign (12 compilers at a time, then none for 30-40 s), the GPU
lock 55%.
"""
from __future__ import annotations

import math

EWMA = 0.3                # weight of the newest compile latency / GPU time in the pacing estimates
# A hung kernel (a pipeline deadlock) holds its GPU until killed. Once the typical trial's hold is known,
# a trial gets HANG_FACTOR times that, at least HANG_FLOOR_S (and never more than --trial-timeout): on the
# H100 (2026-11-23) a trial held the GPU ~1.5 s and eight hung ones held it 30 s each, half of that run.
HANG_FACTOR = 10.0
HANG_FLOOR_S = 20.0


class Pacer:
    """How many kernels should be compiling or compiled-and-waiting (see the module doc)."""

    def __init__(self, n_gpus: int, gpu_slots: int, compile_slots: int = 0, first_round: int | None = None):
        self.n_gpus, self.gpu_slots, self.compile_slots = n_gpus, gpu_slots, compile_slots
        # kernels in the first round of compile units (batch_size's ramp); one a slot when not given
        self.first_round = compile_slots if first_round is None else first_round
        self.compile_s: float | None = None     # one batch, submit to result
        self.trial_s: float | None = None       # one trial's hold of its GPU

    def note_compile(self, seconds: float) -> None:
        self.compile_s = seconds if self.compile_s is None else (1 - EWMA) * self.compile_s + EWMA * seconds

    def note_trial(self, seconds: float) -> None:
        if seconds > 0:
            self.trial_s = seconds if self.trial_s is None else (1 - EWMA) * self.trial_s + EWMA * seconds

    def target(self) -> int:
        floor = 2 * self.gpu_slots
        if self.compile_s is None or self.trial_s is None:
            # Before the first measurements the sampler proposes its start-up points and the seeds, which
            # no result would change: fill the compile slots too, so the GPUs do not wait on the ramp-up
            # (the H100 run of 2026-11-23 measured 15 trials in its first 77 s with the floor alone).
            return floor + self.first_round
        rate = self.n_gpus / self.trial_s
        return max(floor, math.ceil(1.25 * rate * self.compile_s))

    def room(self, in_compile: int, ready: int, seconds_left: float | None = None) -> int:
        """Kernels to start compiling now; near the end of ``--timeout`` no more than the GPUs can still
        measure after they compile (so the budget does not end with compiled kernels never measured)."""
        if self.n_gpus == 0:           # dry run: the compile slots are the only bound
            return 1 << 30
        room = self.target() - in_compile - ready
        if seconds_left is not None and self.compile_s is not None and self.trial_s is not None:
            can_measure = int(self.n_gpus * (seconds_left - self.compile_s) / self.trial_s)
            room = min(room, can_measure - in_compile - ready)
        return room

    def trial_limit(self, cap: float) -> float:
        """The seconds a trial may hold its GPU before it is taken for hung."""
        if self.trial_s is None:
            return cap
        return min(cap, max(HANG_FLOOR_S, HANG_FACTOR * self.trial_s))


def batch_size(full: int, sent: int, n_gpus: int, compile_slots: int = 1) -> int:
    """While the GPUs wait for their first kernels, the first round of compile slots gets small units, a third
    each of one, two and four kernels, so the first trials start soon and kernels keep arriving until the
    first full units are built; then ``full`` for throughput (eight of different tiles: 2.7 s a kernel,
    against 3.5 s in units of four and ~6 s alone on a 2-core machine, BENCHMARKS.md 2026-11-24). With halves
    of one and two (before 2026-11-25) the H100's 12 slots built 18 kernels in the first wave, ~18 s of GPU
    work, and the GPU was locked 28 s of the campaign's first 70 s while the first units of eight compiled."""
    if n_gpus == 0:
        return full
    third = max(1, compile_slots // 3)
    for size, until in ((1, third), (2, 2 * third), (4, max(3 * third, compile_slots))):
        if sent < until:
            return min(full, size)
    return full


def dry_run_unit(full: int, remaining: int, free_slots: int) -> int:
    """A dry run's next compile unit: its few candidates spread over the free compile slots (units of
    ``full`` would build them as one unit on one CPU while the others wait). An nvcc unit's fixed cost is much of
    a small one's (T4 MLA alone on 2 CPUs: 79 s for one kernel, 166 s for four; two units side by side: 129 s
    of one kernel each, 171 s of two), so a unit a CPU ends first."""
    return max(1, min(full, math.ceil(remaining / max(1, free_slots))))


def first_round(full: int, n_gpus: int, compile_slots: int) -> int:
    """Kernels in the first round of compile units, one unit a slot (batch_size's ramp)."""
    return sum(batch_size(full, sent, n_gpus, compile_slots) for sent in range(compile_slots))


def unit_size(room: int, end_room: int, planned: int) -> int:
    """Kernels in the next compile unit: ``planned`` (batch_size) whenever the GPUs need any (``room`` > 0),
    even past Little's law's target, since a unit's own cost is shared by its kernels. H100 campaign of
    2026-11-24 (BENCHMARKS.md): with the unit cut to the room, 96 of 289 kernels were built alone, at a
    median of 18.2 s of nvcc each against 6.2 s in units of four (16 nvccs on 16 CPUs), and the compiles,
    at 0.64 kernels/s, starved a GPU that takes 1.03/s. Only the end of ``--timeout`` (``end_room``: kernels
    that can still be measured after they compile) cuts a unit short."""
    if room <= 0 or end_room <= 0:
        return 0
    return min(planned, end_room) if end_room < room else planned


def one_unit_each(batch: list) -> list[list]:
    """A batch split by preamble, in ask order. nvcc builds kernels of different preambles (a Hopper sketch
    and the sm80-class fa2 ones) as separate units one after the other inside a task; as separate tasks they
    build side by side on two CPUs, and a kernel's latency is its own unit's."""
    units: dict[str, list] = {}
    for cand in batch:
        units.setdefault("" if cand.kernel is None else cand.kernel.preamble, []).append(cand)
    return list(units.values())


# A dry run's time (its first line says it): nvcc's seconds for one kernel alone in its unit, per target, on the
# 2-core machine of 2026-11-27 (load 3-5): T4 (sm_75) 79 s for an MLA kernel and 99 s for an MHA one (two
# units side by side: 129 s each), A100 (sm_80) 55 s, H100 (sm_90a) 22-24 s; a unit of k kernels takes
# (0.6 + 0.4 k) times that (T4 MLA: 166 s for four). Other targets: the sm80 class's. Before the compiles,
# ~25 s: Ray's start, the sketches, the space.
DRY_RUN_KERNEL_S = {"sm_75": 100.0, "sm_80": 55.0, "sm_86": 55.0, "sm_89": 55.0, "sm_90a": 25.0, "sm_90": 25.0}
DRY_RUN_START_S = 25.0


def dry_run_seconds(arch: str, kernels: int, cpus: int, full: int) -> float:
    """About how long a dry run of ``kernels`` candidates for ``arch`` takes on ``cpus`` compile slots in units
    of at most ``full`` (dry_run_unit spreads them: one round of a unit a slot, more when they exceed it)."""
    alone = DRY_RUN_KERNEL_S.get(arch, DRY_RUN_KERNEL_S["sm_80"])
    per_slot = math.ceil(max(1, kernels) / max(1, cpus))
    rounds = math.ceil(per_slot / max(1, full))
    unit = min(full, per_slot)
    return DRY_RUN_START_S + rounds * alone * (0.6 + 0.4 * unit)
