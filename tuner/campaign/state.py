"""The state of a running campaign: one ``Campaign`` per combination (its study and everything fixed for it), its
``Tally`` of outcomes, and the ``Candidate`` kernels in flight between the loop's stages."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from rich.console import Console

from search_spaces.feasible import FeasibleSpace
from translate.params import KernelParams

from .backends import BackendSpec
from .cache import MeasurementCache
from .cluster import GpuPool
from .combos import Combination
from .options import CampaignOptions

WORKER_GRACE_S = 120.0   # beyond a trial's own limits: a worker's start-up (its fork server's imports)


@dataclass
class Tally:
    done: int = 0              # measured and verified (this study's finished trials, as the loop saw them)
    infeasible: int = 0        # compile, verification or run failures: finished, they count toward --trials
    rejected: int = 0          # refused before compiling (validate): they do not count
    cached: int = 0            # answered from the measurement cache: no compile, no GPU; they do not count
    failed: int = 0            # infrastructure failures (queued again)
    best: float = 0.0
    best_trial: int | None = None
    told: int = 0
    elapsed: float = 0.0       # seconds of this run's loop
    gpu_busy: float = 0.0      # seconds GPU trials of this run held their GPU's lock, summed over GPUs
    measured: int = 0          # GPU trials of this run that returned (any outcome)
    unmeasured: int = 0        # compiled but not measured when the run stopped
    lock_spans: list = field(default_factory=list)   # (gpu, acquired_at, released_at, waited_s), this run
    driver: dict | None = None  # the loop's sections and queue levels (driver_clock.DriverClock.report)

    @property
    def finished(self) -> int:
        """What ``--trials`` counts: measured candidates and those that failed to compile or verify."""
        return self.done + self.infeasible


@dataclass
class Campaign:
    """One combination of a run: its study and everything fixed for it."""

    options: CampaignOptions
    combo: Combination
    profile: Any
    spec: Any
    space: Any
    problems: list
    backend: BackendSpec
    name: str
    kernels_dir: Path
    console: Console
    fake_compile: bool
    cache: MeasurementCache
    started: float                 # --timeout counts from here: the whole run
    sketches: list = field(default_factory=list)         # sketches.Sketch: the study's schedule dimension
    programs: dict = field(default_factory=dict)         # sketch name -> parsed TL program
    program_texts: dict = field(default_factory=dict)    # sketch name -> its text
    feasible: FeasibleSpace | None = None
    study: Any = None
    tally: Tally = field(default_factory=Tally)
    pool: GpuPool | None = None
    workers: Any = None            # workers.WorkerPool, shared by the run's campaigns
    baselines_ref: Any = None      # the library baselines' call while it is in flight
    baselines: dict = field(default_factory=dict)          # {"<seqlen>": {library: TFLOPS or None}}
    baseline_errors: dict = field(default_factory=dict)    # {"<seqlen>": {library: why it has no number}}
    device_name: str = ""
    llm_seeds: list = field(default_factory=list)
    llm_message: str = ""
    inflight: int = 0              # asked candidates not yet finished (compiling, ready, measuring)
    idle_asks: int = 0             # asks in a row that brought no new candidate (cache hits, rejections)
    exhausted: str | None = None   # why this study stopped asking before its --trials
    contests: list | None = None   # winners.Contest per bucket, and their decisions (after the re-timing)
    decisions: dict | None = None
    report: Path | None = None     # the run's report of this combination (a dry run's: its summary), once written

    @property
    def program_text(self) -> str:
        """The default sketch's program (the first of the study's dimension)."""
        return self.sketches[0].text if self.sketches else ""

    @property
    def label(self) -> str:
        return self.combo.label()

    def base_of(self, sketch: str) -> str:
        return self.feasible.base_of(sketch) if self.feasible is not None else sketch

    def remaining(self) -> int:
        return self.options.trials - self.tally.finished - self.inflight


@dataclass
class Candidate:
    camp: Campaign
    trial: optuna.Trial
    params: KernelParams
    schedule: str
    key: str
    kernel: Any = None             # translate.GeneratedKernel (None: the replay backend compiles nothing)
    compiled: dict | None = None
    started: float = 0.0
    slot: int = -1                 # its GPU worker (index in the pool) and that worker's handle
    worker: Any = None
