"""The campaign loop: ask → suggest → translate → cache → compile (Ray CPU tasks) → measure (GPU workers)
→ tell, for every combination of a run at once, until each has its ``--trials`` or the budget ends.

Bounded lookahead. A sampler asked far ahead of its results proposes blindly (H200 run of 2026-11-22: 603
asks, 132 compiled and never measured). So the loop asks only when a compile slot is free and the kernels
compiling or compiled-and-waiting are fewer than the GPUs need next: Little's law, the GPUs' measured
rate (trials per second) times a compile batch's measured latency, with a floor of 2 x the GPU trial
slots before either is known; the kernels compiled and waiting never exceed 2 x the GPU trial slots.
When ``--timeout`` ends the search, the trials on the GPUs finish (up to DRAIN_S), compiles in flight are
cancelled, and the compiled-but-unmeasured ones (at most 2 x the slots) are queued for ``--resume``.

Every ask is told something: a point the space proves valid is translated and keyed (cache.py); a key
measured before is answered from the cache (no compile, no GPU), a key already in flight waits for that
measurement, anything else is compiled and measured once. Asks that bring no new candidate (cache hits,
rejections) do not count toward ``--trials``; a study whose last IDLE_ASK_LIMIT asks brought none has
converged and stops asking.

Trial limits are the worker's (trialproc.py): ``--trial-timeout`` from the moment a trial takes its GPU's
lock, and K x that from its start until it does; a trial past either is killed, which frees the lock. The
driver keeps a backstop: a call that outlives every limit by WORKER_GRACE_S means a stuck worker.
"""
from __future__ import annotations

import math
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import optuna

from search_spaces import SpaceError
from translate.params import KernelParams

from . import study as st
from .cache import from_result, measurement_key
from .cluster import cpu_count
from .driver import WORKER_GRACE_S, Campaign, Tally

IDLE_ASK_LIMIT = 200      # asks in a row with nothing new to measure: the study has converged
DRAIN_S = 30.0            # after --timeout, how long the trials already on a GPU may take to finish
EWMA = 0.3                # weight of the newest compile latency / GPU time in the pacing estimates
# A hung kernel (a pipeline deadlock) holds its GPU until killed. Once the typical trial's hold is known,
# a trial gets HANG_FACTOR times that, at least HANG_FLOOR_S (and never more than --trial-timeout): on the
# H100 (2026-11-23) a trial held the GPU ~1.5 s and eight hung ones held it 30 s each, half of that run.
HANG_FACTOR = 10.0
HANG_FLOOR_S = 20.0
# The driver asks at most this long before it launches and collects again: with many cache hits TPE is asked
# hundreds of times in a row (591 in the llama3-8b run of 2026-11-23), and GPUs must not wait on that.
ASK_SLICE_S = 0.5


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


class Pacer:
    """How many kernels should be compiling or compiled-and-waiting (see the module doc)."""

    def __init__(self, n_gpus: int, gpu_slots: int, compile_slots: int = 0):
        self.n_gpus, self.gpu_slots, self.compile_slots = n_gpus, gpu_slots, compile_slots
        self.compile_s: float | None = None     # one batch, submit to result
        self.trial_s: float | None = None       # one trial's hold of its GPU

    def note_compile(self, seconds: float) -> None:
        self.compile_s = seconds if self.compile_s is None else (1 - EWMA) * self.compile_s + EWMA * seconds

    def note_trial(self, seconds: float) -> None:
        if seconds > 0:
            self.trial_s = seconds if self.trial_s is None else (1 - EWMA) * self.trial_s + EWMA * seconds

    @property
    def ready_cap(self) -> int:
        return 2 * self.gpu_slots

    def target(self) -> int:
        floor = 2 * self.gpu_slots
        if self.compile_s is None or self.trial_s is None:
            # Before the first measurements the sampler proposes its start-up points and the seeds, which
            # no result would change: fill the compile slots too, so the GPUs do not wait on the ramp-up
            # (the H100 run of 2026-11-23 measured 15 trials in its first 77 s with the floor alone).
            return floor + self.compile_slots
        rate = self.n_gpus / self.trial_s
        return max(floor, math.ceil(1.25 * rate * self.compile_s))

    def room(self, in_compile: int, ready: int, seconds_left: float | None = None) -> int:
        """Kernels to start compiling now; near the end of ``--timeout`` no more than the GPUs can still
        measure after they compile (so the budget does not end with compiled kernels never measured)."""
        if self.n_gpus == 0:           # dry run: the compile slots are the only bound
            return 1 << 30
        if ready >= self.ready_cap:
            return 0
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


def _batch_size(full: int, sent: int, n_gpus: int, compile_slots: int = 1) -> int:
    """While the GPUs wait for their first kernels, the first round of compile slots gets small batches (half
    of them one kernel, then two): a lone Hopper kernel builds in ~11 s, four in one unit in ~18 s on a
    2-core machine (BENCHMARKS.md), so the first trials start sooner; then ``full`` for throughput."""
    if n_gpus == 0:
        return full
    if sent < max(1, compile_slots // 2):
        return 1
    if sent < max(2, compile_slots):
        return min(full, 2)
    return full


def one_unit_each(batch: list[Candidate]) -> list[list[Candidate]]:
    """A batch split by preamble, in ask order. nvcc builds kernels of different preambles (a Hopper sketch
    and the sm80-class fa2 ones) as separate units one after the other inside a task; as separate tasks they
    build side by side on two CPUs, and a kernel's latency is its own unit's."""
    units: dict[str, list[Candidate]] = {}
    for cand in batch:
        units.setdefault("" if cand.kernel is None else cand.kernel.preamble, []).append(cand)
    return list(units.values())


class Loop:
    def __init__(self, camps: list[Campaign]):
        self.camps = camps
        first = camps[0]
        self.opts = first.options
        self.cache = first.cache
        self.workers = first.workers
        self.console = first.console
        self.n_gpus = first.pool.gpus if first.pool else 0
        self.overlap = self.opts.gpu_overlap
        gpu_slots = self.n_gpus * self.overlap
        # Compile batches in flight: the CPUs that the GPU trials' processes (one CPU each) leave free.
        cpus = cpu_count()
        self.compile_slots = max(min(2, cpus), min(16, cpus - gpu_slots))
        self.pacer = Pacer(self.n_gpus, gpu_slots, self.compile_slots)
        self.batches_sent = 0
        self.compiling: dict[Any, tuple[list[Candidate], float]] = {}
        self.ready: deque[Candidate] = deque()
        self.measuring: dict[Any, Candidate] = {}
        self.waiting: dict[str, list[tuple[Campaign, Any]]] = {}   # key in flight -> its duplicate trials
        self.baseline_refs: dict[Any, Campaign] = {c.baselines_ref: c for c in camps if c.baselines_ref is not None}
        self.stop_reason: str | None = None
        self.draining_since: float | None = None
        # (sketch, params key) asked in each study, this run and before (a resumed study's too)
        self.asked: dict[str, set] = {c.name: {(t.user_attrs.get("schedule"), t.user_attrs.get("params_key"))
                                               for t in c.study.get_trials(deepcopy=False)} for c in camps}
        self.rng = random.Random(self.opts.seed)

    # ---- asking ----------------------------------------------------------------------------------
    def next_camp(self) -> Campaign | None:
        """The combination with the fewest candidates finished or in flight that still wants some."""
        open_ = [c for c in self.camps if c.exhausted is None and c.remaining() > 0]
        if not open_:
            return None
        return min(open_, key=lambda c: (c.tally.finished + c.inflight, self.camps.index(c)))

    def ask_batch(self, camp: Campaign, size: int, until: float = float("inf")) -> list[Candidate]:
        """Up to ``size`` new candidates of ``camp`` (fewer when the time slice ends at ``until``); asks
        that bring nothing new are told at once."""
        new: list[Candidate] = []
        study = camp.study
        while len(new) < size and camp.remaining() - len(new) > 0 and time.monotonic() < until:
            if camp.idle_asks >= IDLE_ASK_LIMIT:
                camp.exhausted = (f"the last {IDLE_ASK_LIMIT} asks brought no parameter set that was not measured "
                                  "or in flight already: the search converged")
                self.console.print(f"{camp.label}: {camp.exhausted}", markup=False)
                break
            trial = study.ask()
            # what the sampler could not know yet: candidates asked but not measured (the lookahead)
            trial.set_user_attr("asked_ahead", self.in_compile() + len(self.ready) + len(self.measuring) + len(new))
            try:
                point = camp.feasible.suggest(trial)
            except SpaceError as exc:   # an enqueued set (an old seed or retry) outside the valid space
                self._reject(camp, trial, f"invalid: {exc}")
                continue
            params, schedule = point.params, point.sketch
            self.asked[camp.name].add((schedule, params.key()))
            trial.set_user_attr("params_key", params.key())
            trial.set_user_attr("kernel_params", params.to_dict())
            trial.set_user_attr("schedule", schedule)
            # (no validate here: the points of the feasible space are the sets validate accepts)
            try:
                kernel, source = self._translate(camp, schedule, params)
            except Exception as exc:  # noqa: BLE001 - the translator refuses this candidate: it cannot work
                st.tell_infeasible(study, trial, f"translate: {exc}", stage="compile")
                _count(camp.tally, "infeasible", None, trial.number)
                camp.idle_asks = 0
                continue
            key = measurement_key(camp.profile.name, camp.backend.label, camp.spec, camp.problems,
                                  self.opts.timing(), source)
            trial.set_user_attr("measurement_key", key)
            hit = None if self.opts.remeasure else self.cache.get(key)
            if hit is not None:
                self._tell_cached(camp, trial, hit)
                self._propose_near(camp, trial, point)
                continue
            if key in self.waiting:
                self.waiting[key].append((camp, trial))
                camp.idle_asks += 1
                self._propose_near(camp, trial, point)
                continue
            self.waiting[key] = []
            camp.idle_asks = 0
            new.append(Candidate(camp, trial, params, schedule, key, kernel))
        camp.inflight += len(new)
        return new

    def _propose_near(self, camp: Campaign, trial, point) -> None:
        """The sampler re-proposed a kernel measured or in flight: queue a valid neighbour (one choice away)
        not asked yet, so the next ask brings something new near what the sampler favours. On the measured
        H100 grid (10 seeds) this took 42% fewer asks to reach 3% of the best, at the same number of kernels
        measured (33.8 against 35.9: BENCHMARKS.md)."""
        near = camp.feasible.unasked_neighbour(point, self.asked[camp.name], self.rng)
        if near is None:
            return
        camp.study.enqueue_trial(camp.feasible.optuna_params(near),
                                 user_attrs={"source": f"{st.NEIGHBOUR_SOURCE} {trial.number}"})

    def _translate(self, camp: Campaign, schedule: str, params: KernelParams):
        """(the kernel, its source: its identity in the cache); the compile task compiles this kernel. The
        replay backend compiles nothing: no kernel, and the candidate's name as the fake compile writes it."""
        if camp.fake_compile:
            return None, f"// replay backend: {schedule}:{params.key()} was not compiled\n"
        from translate import generate

        kernel = generate(camp.programs[schedule], params, camp.profile, camp.spec)
        return kernel, kernel.source

    def _reject(self, camp: Campaign, trial, reason: str) -> None:
        st.tell_infeasible(camp.study, trial, reason, stage="validate")
        camp.tally.rejected += 1
        camp.idle_asks += 1

    def _tell_cached(self, camp: Campaign, trial, hit) -> None:
        """A measurement made before (this study or another of the study dir): its result, no compile, no GPU."""
        trial.set_user_attr("cache_hit", True)
        trial.set_user_attr("cached_from", {"study": hit.study, "trial": hit.trial})
        trial.set_user_attr("kernel_name", hit.kernel_name)
        trial.set_user_attr("kernel_stem", hit.kernel_stem)
        if hit.device_name:
            trial.set_user_attr("device_name", hit.device_name)
        if hit.verified:
            st.tell_feasible(camp.study, trial, hit.value, tflops=hit.tflops, verification=hit.verification,
                             backend=camp.backend.kind)
            if hit.value is not None and hit.value > camp.tally.best:
                camp.tally.best, camp.tally.best_trial = hit.value, trial.number
        else:
            st.tell_infeasible(camp.study, trial, hit.reason or "failed verification (cached)", stage="verify",
                               verification=hit.verification)
        camp.tally.cached += 1
        camp.idle_asks += 1

    # ---- the loop -------------------------------------------------------------------------------
    def in_compile(self) -> int:
        return sum(len(batch) for batch, _ in self.compiling.values())

    def run(self) -> None:
        import ray

        from .live import live_view
        from .tasks import compile_batch

        opts = self.opts
        start = time.monotonic()
        deadline = self.camps[0].started + opts.timeout if opts.timeout else None
        for c in self.camps:
            c.kernels_dir.mkdir(parents=True, exist_ok=True)
        with live_view(self.camps, start, deadline) as live:
            try:
                while True:
                    now = time.monotonic()
                    if self.stop_reason is None and deadline is not None and now >= deadline:
                        self._stop("the --timeout budget ran out")
                    # 1. launch GPU trials while GPU workers have room
                    self._launch_ready()
                    # 2. ask and compile, while a compile slot is free and the GPUs need more (time-sliced)
                    until = time.monotonic() + ASK_SLICE_S
                    while (self.stop_reason is None and len(self.compiling) < self.compile_slots
                           and time.monotonic() < until):
                        left = None if deadline is None else deadline - time.monotonic()
                        room = self.pacer.room(self.in_compile(), len(self.ready), left)
                        camp = self.next_camp() if room > 0 else None
                        if camp is None:
                            break
                        size = min(room, _batch_size(opts.compile_batch, self.batches_sent, self.n_gpus,
                                                     self.compile_slots))
                        batch = self.ask_batch(camp, size, until)
                        if not batch:
                            continue
                        self.batches_sent += 1
                        for unit in one_unit_each(batch):
                            items = [(c.trial.number, c.params.to_dict(), c.schedule) for c in unit]
                            ref = compile_batch.remote(items, [c.kernel for c in unit], camp.profile.nvcc_arch,
                                                       str(opts.study_dir / "nvcc-cache"), opts.compile_timeout,
                                                       camp.backend.path if camp.fake_compile else None)
                            self.compiling[ref] = (unit, time.monotonic())
                    self._launch_ready()
                    if self._finished():
                        break
                    # 3. wait for anything
                    refs = list(self.compiling) + list(self.measuring) + list(self.baseline_refs)
                    done, _ = ray.wait(refs, num_returns=1, timeout=0.5) if refs else ([], [])
                    if done:  # collect everything that is ready without waiting again
                        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                    for ref in done:
                        if ref in self.baseline_refs:
                            from .driver import _finish_baselines

                            camp = self.baseline_refs.pop(ref)
                            _finish_baselines(camp, ref)
                            camp.baselines_ref = None
                        elif ref in self.compiling:
                            self._compiled(ref)
                        else:
                            self._measured(ref)
                    self._backstops()
                    live.refresh()
            except KeyboardInterrupt:  # Ctrl-C: the unfinished trials go back in the queue
                self.stop_reason = "interrupted"
            self._leftovers()
            elapsed = time.monotonic() - start
            for c in self.camps:
                c.tally.elapsed = elapsed
            live.refresh(force=True)

    def _launch_ready(self) -> None:
        while self.ready and self.stop_reason is None:
            slot = self.workers.free_slot()
            if slot is None:
                break
            self._launch(self.ready.popleft(), slot)

    def _stop(self, reason: str) -> None:
        import ray

        self.stop_reason = reason
        self.draining_since = time.monotonic()
        for ref, (batch, _) in list(self.compiling.items()):   # not compiled yet: nothing measured is lost
            ray.cancel(ref, force=True)
            self.compiling.pop(ref)
            for cand in batch:
                self._requeue(cand, f"not finished: {reason} (not compiled yet)")

    def _finished(self) -> bool:
        if self.stop_reason is not None:   # --timeout: let the trials on the GPUs finish, for a while
            return not self.measuring or time.monotonic() - self.draining_since > DRAIN_S
        idle = not self.compiling and not self.measuring and not self.ready
        return idle and self.next_camp() is None

    def _launch(self, cand: Candidate, slot: int) -> None:
        camp = cand.camp
        payload = {"trial": cand.trial.number, "params": cand.params.to_dict(), "schedule": cand.schedule,
                   "profile": camp.profile.name,
                   "spec": camp.spec, "problems": camp.problems, "cubin": cand.compiled["cubin"],
                   "meta": cand.compiled["meta"], "timing": self.opts.timing()}
        limit = self.pacer.trial_limit(self.opts.trial_timeout)
        cand.trial.set_user_attr("trial_limit_s", round(limit, 1))
        ref, cand.worker = self.workers.submit(slot, payload, limit, self.opts.trial_timeout * self.overlap)
        cand.slot, cand.started = slot, time.monotonic()
        self.measuring[ref] = cand

    def _compiled(self, ref) -> None:
        batch, submitted = self.compiling.pop(ref)
        wall = time.monotonic() - submitted
        self.pacer.note_compile(wall)
        for cand, outcome in _compile_outcomes(batch, ref, wall):
            camp = cand.camp
            if outcome == "ready":
                _save_kernel(camp, cand, cand.compiled)
                if camp.pool is None:   # dry run: compiled is as far as it goes
                    st.tell_feasible(camp.study, cand.trial, None, dry_run=True, stage="compile")
                    self._finish_candidate(cand)
                    _count(camp.tally, "pruned", None, cand.trial.number)
                else:
                    self.ready.append(cand)
                continue
            self._finish_candidate(cand)
            if isinstance(outcome, tuple):
                _infra(camp, cand, outcome[1])
            else:
                st.tell_infeasible(camp.study, cand.trial, outcome, stage="compile")
                _count(camp.tally, "infeasible", None, cand.trial.number)

    def _measured(self, ref) -> None:
        cand = self.measuring.pop(ref)
        camp = cand.camp
        self.workers.release(cand.slot)
        camp.tally.measured += 1
        report, result, cacheable = _tell_measurement(camp, cand, ref)
        held = _held_seconds(report)
        camp.tally.gpu_busy += held
        if _lock_record(report) is not None:   # a trial that returned: the typical hold (not a killed one's)
            self.pacer.note_trial(held)
        _note_span(camp.tally, report)
        if result is None:        # infrastructure: the candidate was queued again (its duplicates need not be)
            self._finish_candidate(cand)
            return
        camp.inflight -= 1
        waiters = self.waiting.pop(cand.key, [])
        name = cand.trial.user_attrs.get("kernel_name") or ""
        stem = str((camp.kernels_dir / name).relative_to(self.opts.study_dir))
        entry = from_result(cand.key, result, _value(result) if result.get("verified") else None, camp.name,
                            cand.trial.number, name, stem)
        if cacheable:
            self.cache.put(entry)
        for other, trial in waiters:
            self._tell_cached(other, trial, entry)

    def _finish_candidate(self, cand: Candidate, reason: str = "") -> None:
        """``cand`` ends without a measurement: its duplicates in flight fail with it (not queued again:
        ``cand`` is, when it is worth another try)."""
        cand.camp.inflight -= 1
        for other, trial in self.waiting.pop(cand.key, []):
            st.tell_infra_failure(other.study, trial, trial.params,
                                  reason or "the same kernel, asked while in flight, was not measured", False)
            other.tally.failed += 1

    def _requeue(self, cand: Candidate, reason: str) -> None:
        st.tell_infra_failure(cand.camp.study, cand.trial, cand.trial.params, reason, True)
        cand.camp.tally.failed += 1
        self._finish_candidate(cand, reason)

    def _backstops(self) -> None:
        import ray

        now = time.monotonic()
        for ref, cand in list(self.measuring.items()):
            if now - cand.started > self.opts.trial_timeout * (self.overlap + 1) + WORKER_GRACE_S:
                if self.workers.replace(cand.slot, cand.worker):
                    self.console.print(f"[yellow]GPU worker {cand.slot} did not answer for trial "
                                       f"{cand.trial.number}; replaced[/]")
        for ref, (batch, submitted) in list(self.compiling.items()):
            if now - submitted > self.opts.compile_timeout * 1.5:
                ray.cancel(ref, force=True)
                self.compiling.pop(ref)
                for cand in batch:
                    st.tell_infeasible(cand.camp.study, cand.trial, f"compile timeout after {self.opts.compile_timeout:g} s",
                                       stage="compile")
                    _count(cand.camp.tally, "infeasible", None, cand.trial.number)
                    self._finish_candidate(cand)

    def _leftovers(self) -> None:
        """Out of budget (or interrupted): what did not finish goes back into the queue for --resume."""
        import ray

        if self.stop_reason is None:
            return
        for ref in self.compiling:
            ray.cancel(ref, force=True)
        pending = [c for batch, _ in self.compiling.values() for c in batch]
        self.compiling.clear()
        unmeasured = list(self.ready) + list(self.measuring.values())
        self.ready.clear()
        if self.measuring and self.workers is not None:   # kills the trials still running with their workers
            self.workers.shutdown()
        self.measuring.clear()
        for cand in pending + unmeasured:
            self._requeue(cand, f"not finished: {self.stop_reason}")
        for cand in unmeasured:
            cand.camp.tally.unmeasured += 1
        self.console.print(f"stopped: {self.stop_reason}; {len(unmeasured)} compiled but unmeasured and "
                           f"{len(pending)} uncompiled trial(s) queued for --resume")


def run_loop(camps: list[Campaign]) -> None:
    for c in camps:   # this study's record so far (a resumed study continues its count)
        c.tally = Tally()
        for t in st.finished(c.study):
            if t.user_attrs.get("cache_hit"):
                c.tally.cached += 1
            elif t.user_attrs.get("stage") == "validate":
                c.tally.rejected += 1
            else:
                _count(c.tally, t.state, t.value if t.state == optuna.trial.TrialState.COMPLETE else None, t.number,
                       st.is_infeasible(t))
        c.tally.told = 0
    Loop(camps).run()


# ---- telling ---------------------------------------------------------------------------------------

def _value(result: dict) -> float:
    return round(st.geomean(result["tflops"].values()), 3)


def _count(tally: Tally, state, value, number: int, infeasible: bool | None = None) -> None:
    from optuna.trial import TrialState

    if state == TrialState.FAIL or state == "fail":
        tally.failed += 1
        return
    if infeasible is None:
        infeasible = state == "infeasible"
    tally.told += 1
    if infeasible:
        tally.infeasible += 1
        return
    tally.done += 1
    if value is not None and value > tally.best:
        tally.best, tally.best_trial = value, number


def _compile_outcomes(batch: list[Candidate], ref, wall_s: float):
    """(candidate, "ready" | reason-of-failure | ("infra", msg)) per candidate of a finished batch. Each
    trial records its batch's timing: ``compile`` = wall (driver: submit to result), task (the task's own
    run: wall minus task is the wait for a CPU), the nvcc unit's seconds and kernels."""
    import ray
    from ray.exceptions import RayTaskError

    try:
        results = ray.get(ref)
    except RayTaskError as exc:
        msg = str(exc).strip().splitlines()[-1][:500]
        return [(c, f"compile task error: {msg}") for c in batch]
    except ray.exceptions.RayError as exc:
        return [(c, ("infra", f"compile task lost: {type(exc).__name__}")) for c in batch]
    out = []
    for cand, res in zip(batch, results):
        cand.trial.set_user_attr("kernel_name", res.get("kernel_name"))
        if res.get("timing"):
            cand.trial.set_user_attr("compile", {"batch": len(batch), "wall_s": round(wall_s, 2), **res["timing"]})
        if not res["ok"]:
            out.append((cand, res["error"]))
            continue
        cand.compiled = res
        for attr in ("registers", "spill_stores"):
            if res.get(attr) is not None:
                cand.trial.set_user_attr(attr, res[attr])
        out.append((cand, "ready"))
    return out


def _save_kernel(camp: Campaign, cand: Candidate, res: dict) -> None:
    """Keep every compiled kernel on disk: the store takes the best one from here after the loop."""
    import json

    stem = camp.kernels_dir / res["kernel_name"]
    stem.with_suffix(".cubin").write_bytes(res["cubin"])
    stem.with_suffix(".cu").write_text(res.get("source") or "")
    stem.with_suffix(".meta.json").write_text(json.dumps(res.get("meta") or {}, indent=1, default=str))


def _infra(camp: Campaign, cand: Candidate, reason: str) -> None:
    retries = int(cand.trial.user_attrs.get("infra_retries", 0))
    st.tell_infra_failure(camp.study, cand.trial, cand.trial.params, reason, retries < camp.options.infra_retries)
    camp.tally.failed += 1
    camp.console.print(f"[yellow]trial {cand.trial.number}: infrastructure failure ({reason}); "
                       f"{'queued again' if retries < camp.options.infra_retries else 'not retried again'}[/]")


def _tell_measurement(camp: Campaign, cand: Candidate, ref) -> tuple[dict | None, dict | None, bool]:
    """Tell the study what the GPU worker reported for this trial; returns (report, the candidate's result:
    verified or not, whether the cache may keep it), with result None when the worker itself failed."""
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    trial = cand.trial
    try:
        report = ray.get(ref)
    except RayActorError as exc:
        # The worker died (its node lost, or killed as stuck): the trial did nothing wrong; queue it again.
        camp.workers.replace(cand.slot, cand.worker)
        lost = _lost_nodes(camp)
        why = f"GPU node(s) {', '.join(n[:12] for n in lost)} lost" if lost else f"GPU worker lost: {type(exc).__name__}"
        _infra(camp, cand, why)
        return None, None, False
    except RayTaskError as exc:   # the worker's own code raised: not the candidate's fault either
        msg = str(exc).strip().splitlines()[-1][:300]
        _infra(camp, cand, f"GPU worker error: {msg}")
        return None, None, False
    except ray.exceptions.RayError as exc:
        _infra(camp, cand, f"{type(exc).__name__}: {str(exc)[:200]}")
        return None, None, False
    for k in ("node_id", "hostname", "pid", "gpu_ids"):
        trial.set_user_attr(k, report.get(k))
    outcome = report["outcome"]
    if outcome != "result":
        reason = {"crash": f"crash: {report['message']} (an out-of-bounds access or illegal address kills the "
                           f"CUDA context)",
                  "timeout": report["message"],
                  "error": f"error in trial: {report['message']}"}.get(outcome, f"{outcome}: {report['message']}")
        st.tell_infeasible(camp.study, trial, reason, stage="measure")
        _count(camp.tally, "infeasible", None, trial.number)
        # A crash or a hang is this kernel's own: recorded, so that a re-proposal costs no GPU time again
        # (--remeasure tries it anyway). A worker's own error is not.
        return report, {"verified": False, "reason": reason, "tflops": {}, "device_name": None}, \
            outcome in ("crash", "timeout")
    result = report["value"]
    trial.set_user_attr("measure_seconds", round(time.monotonic() - cand.started, 2))
    if result.get("seconds"):
        trial.set_user_attr("stage_seconds", result["seconds"])
    trial.set_user_attr("device_name", result.get("device_name"))
    if result.get("replay_unknown"):
        trial.set_user_attr("replay_unknown", True)
    if result.get("gpu_lock"):   # when this trial held its GPU (time.time() of its host): timed sections never overlap
        trial.set_user_attr("gpu_lock", result["gpu_lock"])
    if not result["verified"]:
        st.tell_infeasible(camp.study, trial, result["reason"], stage="verify", verification=result.get("verification"))
        _count(camp.tally, "infeasible", None, trial.number)
        return report, result, True
    value = _value(result)
    st.tell_feasible(camp.study, trial, value, tflops=result["tflops"], verification=result.get("verification"),
                     backend=camp.backend.kind)
    _count(camp.tally, "complete", value, trial.number)
    return report, result, True


def _lost_nodes(camp: Campaign) -> list[str]:
    from .cluster import alive_nodes

    alive = {n["NodeID"] for n in alive_nodes()}
    return [n for n in camp.pool.node_ids if n not in alive]


def _lock_record(report: dict | None) -> dict | None:
    """The GPU lock span a trial reported (acquired and released), or None (killed, or never locked)."""
    value = (report or {}).get("value")
    lock = value.get("gpu_lock") if isinstance(value, dict) else None
    return lock if lock and lock.get("acquired_at") and lock.get("released_at") else None


def _held_seconds(report: dict | None) -> float:
    """How long a finished trial held its GPU's lock: its own record, else (killed) as its worker saw it."""
    lock = _lock_record(report)
    if lock is not None:
        return max(0.0, float(lock["released_at"]) - float(lock["acquired_at"]))
    return float((report or {}).get("held_s") or 0.0)


def _note_span(tally: Tally, report: dict | None) -> None:
    """Keep when a returned trial held its GPU (host clock): the summary's steady-state occupancy."""
    lock = _lock_record(report)
    if lock is not None:
        gpu = f"{(report or {}).get('node_id') or ''}/{lock.get('key')}"
        tally.lock_spans.append((gpu, float(lock["acquired_at"]), float(lock["released_at"]),
                                 float(lock.get("waited_s") or 0.0)))
