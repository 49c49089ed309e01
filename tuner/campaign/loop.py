"""The campaign loop: ask → suggest → translate → cache → compile (Ray CPU tasks) → measure (GPU workers)
→ tell, for every combination of a run at once, until each has its ``--trials`` or the budget ends.

Bounded lookahead (how many kernels compile ahead of the GPUs, and in what batches): pacing.py.
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

import random
import time
from collections import Counter, deque
from typing import Any

import optuna

from search_spaces import SpaceError
from translate.params import KernelParams

from . import study as st
from .cache import from_result, measurement_key
from .cluster import compile_pool
from .state import WORKER_GRACE_S, Campaign, Candidate, Tally
from .distinct import CACHED_FROM
from .driver_clock import DriverClock
from .earlystop import DEFAULT_EARLY_STOP
from .pacing import Pacer, batch_size, dry_run_unit, first_round, one_unit_each, unit_size
from .problems import probe_problem, problem_key
from .telling import (compile_outcomes, count_outcome, held_seconds, lock_record, measured_value, note_span,
                      save_kernel, tell_infra, tell_measurement)

IDLE_ASK_LIMIT = 200      # asks in a row with nothing new to measure: the study has converged
DRAIN_S = 30.0            # after --timeout, how long the trials already on a GPU may take to finish
# The driver asks at most this long before it launches and collects again: with many cache hits TPE is asked
# hundreds of times in a row (591 in the llama3-8b run of 2026-11-23), and GPUs must not wait on that.
ASK_SLICE_S = 0.5
# Between two slices of asking the loop waits for a result this long when it still has kernels to ask for (0.5 s
# otherwise). Waiting 0.5 s each time halved the asking: late in the H100 campaign of 2026-11-25, 85% of the
# asks were cache hits (TPE over ~1000 trials re-proposing measured points) and the loop asked ~3 times a
# second, 0.4-0.6 new kernels/s against the GPU's 1.1, and the GPU was locked 30-50% of its last 3 minutes.
ASK_WAIT_S = 0.02
# A unit short of its size when an ask slice ends waits for the next slices this long before it is compiled as
# it is. In the H100 campaign of 2026-11-24 each ask (TPE over ~500 trials, translation, ~2 of 3 asks cache hits) takes
# long enough that a 0.5 s slice often ended a unit at 1-3 kernels; 86 of 277 were built alone at 19.6 s of
# nvcc each, against 6.4 s in units of four.
FILL_WAIT_S = 3.0


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
        # Compile batches in flight: the CPU-only nodes' CPUs, else those the GPU trials' processes leave free.
        self.compile_pool = compile_pool(gpu_slots)
        self.compile_slots = self.compile_pool.slots
        if self.compile_pool.dedicated:
            self.console.print(f"compiles: {self.compile_pool.describe()}")
        self.pacer = Pacer(self.n_gpus, gpu_slots, self.compile_slots,
                           first_round(self.opts.compile_batch, self.n_gpus, self.compile_slots))
        self.batches_sent = 0
        self.compiling: dict[Any, tuple[list[Candidate], float]] = {}
        self.filling: dict[str, tuple[list[Candidate], float]] = {}   # camp -> a unit being asked, since when
        self.compile_node: dict[Any, str | None] = {}   # the node each compile task was placed on
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
        # early stop (earlystop.py): per study, the best TFLOPS measured in full at its longest seqlen so far
        self.early_stop = DEFAULT_EARLY_STOP if self.opts.early_stop else None
        self.incumbent: dict[str, float | None] = {c.name: None for c in camps}
        for c in camps:
            for t in st.finished(c.study):
                if t.state == optuna.trial.TrialState.COMPLETE and (t.user_attrs.get("verification") or {}).get("passed"):
                    self._note_incumbent(c, t.user_attrs.get("tflops"))

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
                count_outcome(camp.tally, "infeasible", None, trial.number)
                camp.idle_asks = 0
                continue
            key = measurement_key(camp.profile.name, camp.backend.label, camp.spec, camp.problems,
                                  self.opts.timing(), source)
            trial.set_user_attr("measurement_key", key)
            hit = None if self.opts.remeasure else self.cache.get(key)
            if hit is not None and hit.early_stop and st.is_seed(trial):
                hit = None   # a seed is measured in full (the yardstick), even where a probe once stopped its kernel
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
        """The sampler re-proposed a kernel measured or in flight: queue the nearest valid point (fewest
        choices apart) not asked yet, so the next ask brings something new near what the sampler favours.
        On the measured H100 grid (30 sampler seeds; tests/campaign/search_efficiency.py) TPE with this,
        reading the study without its repeats (distinct.py), reached 3% of the best in 24.9 kernels and 32
        asks (mean) against 33.0 and 51.5 with repeats seen and one choice away only; to measure 250 kernels
        it took 466 asks against 4425, at 5 ms an ask against 68."""
        near = camp.feasible.unasked_neighbour(point, self.asked[camp.name], self.rng, st.NEIGHBOUR_MAX_DISTANCE)
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
        trial.set_user_attr(CACHED_FROM, {"study": hit.study, "trial": hit.trial})
        trial.set_user_attr("kernel_name", hit.kernel_name)
        trial.set_user_attr("kernel_stem", hit.kernel_stem)
        if hit.device_name:
            trial.set_user_attr("device_name", hit.device_name)
        if hit.verified:
            if hit.early_stop:
                trial.set_user_attr("early_stop", hit.early_stop)
            st.tell_feasible(camp.study, trial, hit.value, tflops=hit.tflops, verification=hit.verification,
                             backend=camp.backend.kind)
            if hit.value is not None:
                self._note_incumbent(camp, hit.tflops)
                if hit.value > camp.tally.best:
                    camp.tally.best, camp.tally.best_trial = hit.value, trial.number
        else:
            st.tell_infeasible(camp.study, trial, hit.reason or "failed verification (cached)", stage="verify",
                               verification=hit.verification)
        camp.tally.cached += 1
        camp.idle_asks += 1

    def _note_incumbent(self, camp: Campaign, tflops: dict | None) -> None:
        """A kernel measured in full: it may be the new incumbent at the longest seqlen (early stop)."""
        value = (tflops or {}).get(problem_key(probe_problem(camp.problems)))
        if value is not None and (self.incumbent[camp.name] is None or value > self.incumbent[camp.name]):
            self.incumbent[camp.name] = float(value)

    def _early_stop_plan(self, cand: Candidate) -> dict | None:
        """The trial's early stop (earlystop.py); the seeds are always measured in full."""
        if self.early_stop is None or st.is_seed(cand.trial):
            return None
        return self.early_stop.plan(cand.camp.problems, self.incumbent[cand.camp.name], self.opts.timing())

    # ---- the loop -------------------------------------------------------------------------------
    def in_compile(self) -> int:
        return (sum(len(batch) for batch, _ in self.compiling.values())
                + sum(len(batch) for batch, _ in self.filling.values()))

    def _send_unit(self, camp: Campaign, batch: list[Candidate]) -> None:
        from .tasks import compile_batch

        self.batches_sent += 1
        for unit in one_unit_each(batch):
            items = [(c.trial.number, c.params.to_dict(), c.schedule) for c in unit]
            node = self.compile_pool.place(Counter(self.compile_node.values()))
            placed = self.compile_pool.task_options(node)
            task = compile_batch.options(**placed) if placed else compile_batch
            ref = task.remote(items, [c.kernel for c in unit], camp.profile.nvcc_arch,
                              str(self.opts.study_dir / "nvcc-cache"), self.opts.compile_timeout,
                              camp.backend.path if camp.fake_compile else None,
                              camp.spec.to_dict() if camp.fake_compile else None)
            self.compiling[ref] = (unit, time.monotonic())
            self.compile_node[ref] = node

    def _flush_stale_units(self) -> None:
        """Units short of their size that waited FILL_WAIT_S for more asks are compiled as they are."""
        now = time.monotonic()
        for name, (batch, since) in list(self.filling.items()):
            if now - since >= FILL_WAIT_S and len(self.compiling) < self.compile_slots:
                del self.filling[name]
                self._send_unit(batch[0].camp, batch)

    def run(self) -> None:
        import ray

        from .live import live_view

        opts = self.opts
        start = time.monotonic()
        deadline = self.camps[0].started + opts.timeout if opts.timeout else None
        for c in self.camps:
            c.kernels_dir.mkdir(parents=True, exist_ok=True)
        clock = self.clock = DriverClock()
        with live_view(self.camps, start, deadline) as live:
            try:
                while True:
                    now = time.monotonic()
                    clock.sample(**self._levels())
                    if self.stop_reason is None and deadline is not None and now >= deadline:
                        self._stop("the --timeout budget ran out")
                    # 1. launch GPU trials while GPU workers have room
                    with clock.section("launch"):
                        self._launch_ready()
                    # 2. ask and compile, while a compile slot is free and the GPUs need more (time-sliced)
                    with clock.section("send"):
                        self._flush_stale_units()
                    until = time.monotonic() + ASK_SLICE_S
                    while (self.stop_reason is None and len(self.compiling) < self.compile_slots
                           and time.monotonic() < until):
                        left = None if deadline is None else deadline - time.monotonic()
                        in_compile, ready = self.in_compile(), len(self.ready)
                        planned = batch_size(opts.compile_batch, self.batches_sent, self.n_gpus, self.compile_slots)
                        if self.n_gpus == 0:   # dry run: its few candidates over the free compile slots
                            planned = dry_run_unit(planned, sum(max(0, c.remaining()) for c in self.camps
                                                                if c.exhausted is None),
                                                   self.compile_slots - len(self.compiling))
                        size = unit_size(self.pacer.room(in_compile, ready),
                                         self.pacer.room(in_compile, ready, left), planned)
                        camp = self.next_camp() if size > 0 else None
                        if camp is None:
                            break
                        held, since = self.filling.pop(camp.name, ([], time.monotonic()))
                        with clock.section("ask"):
                            batch = held + self.ask_batch(camp, max(0, size - len(held)), until)
                        if not batch:
                            continue
                        if len(batch) < size and time.monotonic() - since < FILL_WAIT_S and camp.exhausted is None \
                                and camp.remaining() > 0:
                            self.filling[camp.name] = (batch, since)   # the slice ended: fill it in the next
                            break
                        with clock.section("send"):
                            self._send_unit(camp, batch)
                    # the slice ran out while the GPUs still wanted kernels: ask on after a glance at the
                    # results, instead of waiting for one (see ASK_WAIT_S)
                    asking = (self.stop_reason is None and time.monotonic() >= until
                              and len(self.compiling) < self.compile_slots)
                    with clock.section("launch"):
                        self._launch_ready()
                    if self._finished():
                        break
                    # 3. wait for anything
                    refs = list(self.compiling) + list(self.measuring) + list(self.baseline_refs)
                    wait_s = ASK_WAIT_S if asking else 0.5
                    clock.sample(**self._levels())
                    with clock.section("wait"):
                        done, _ = ray.wait(refs, num_returns=1, timeout=wait_s) if refs else ([], [])
                        if done:  # collect everything that is ready without waiting again
                            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                    for ref in done:
                        if ref in self.baseline_refs:
                            from .baselines import finish_baselines

                            camp = self.baseline_refs.pop(ref)
                            with clock.section("baselines"):
                                finish_baselines(camp, ref)
                            camp.baselines_ref = None
                        elif ref in self.compiling:
                            with clock.section("compiled"):
                                self._compiled(ref)
                        else:
                            with clock.section("measured"):
                                self._measured(ref)
                    with clock.section("backstops"):
                        self._backstops()
                    with clock.section("view"):
                        live.refresh()
            except KeyboardInterrupt:  # Ctrl-C: the unfinished trials go back in the queue
                self.stop_reason = "interrupted"
            self._leftovers()
            elapsed = time.monotonic() - start
            driver = clock.report()
            for c in self.camps:
                c.tally.elapsed = elapsed
                c.tally.driver = driver
            live.refresh(force=True)

    def _levels(self) -> dict:
        """The queues the driver clock samples (tuner/campaign/driver_clock.py)."""
        return {"compiling_units": len(self.compiling), "compiling_kernels": self.in_compile(),
                "ready": len(self.ready), "measuring": len(self.measuring),
                "free_gpu_slots": self.workers.free_slots() if self.n_gpus else 0,
                "idle_gpus": self.workers.idle_gpus() if self.n_gpus else 0}

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
            self.compile_node.pop(ref, None)
            for cand in batch:
                self._requeue(cand, f"not finished: {reason} (not compiled yet)")
        for batch, _ in self.filling.values():
            for cand in batch:
                self._requeue(cand, f"not finished: {reason} (not compiled yet)")
        self.filling.clear()

    def _finished(self) -> bool:
        if self.stop_reason is not None:   # --timeout: let the trials on the GPUs finish, for a while
            return not self.measuring or time.monotonic() - self.draining_since > DRAIN_S
        idle = not self.compiling and not self.measuring and not self.ready and not self.filling
        return idle and self.next_camp() is None

    def _launch(self, cand: Candidate, slot: int) -> None:
        camp = cand.camp
        payload = {"trial": cand.trial.number, "params": cand.params.to_dict(), "schedule": cand.schedule,
                   "profile": camp.profile.name,
                   "spec": camp.spec, "problems": camp.problems, "cubin": cand.compiled["cubin"],
                   "meta": cand.compiled["meta"], "timing": self.opts.timing(),
                   "early_stop": self._early_stop_plan(cand)}
        limit = self.pacer.trial_limit(self.opts.trial_timeout)
        cand.trial.set_user_attr("trial_limit_s", round(limit, 1))
        ref, cand.worker = self.workers.submit(slot, payload, limit, self.opts.trial_timeout * self.overlap)
        cand.slot, cand.started = slot, time.monotonic()
        self.measuring[ref] = cand

    def _compiled(self, ref) -> None:
        batch, submitted = self.compiling.pop(ref)
        self.compile_node.pop(ref, None)
        wall = time.monotonic() - submitted
        self.pacer.note_compile(wall)
        for cand, outcome in compile_outcomes(batch, ref, wall):
            camp = cand.camp
            if outcome == "ready":
                save_kernel(camp, cand, cand.compiled)
                if camp.pool is None:   # dry run: compiled is as far as it goes
                    st.tell_feasible(camp.study, cand.trial, None, dry_run=True, stage="compile")
                    self._finish_candidate(cand, compiled=True)
                    count_outcome(camp.tally, "pruned", None, cand.trial.number)
                else:
                    self.ready.append(cand)
                continue
            if isinstance(outcome, tuple):
                self._finish_candidate(cand)
                tell_infra(camp, cand, outcome[1])
            else:
                self._finish_candidate(cand, infeasible=outcome)
                st.tell_infeasible(camp.study, cand.trial, outcome, stage="compile")
                count_outcome(camp.tally, "infeasible", None, cand.trial.number)

    def _measured(self, ref) -> None:
        cand = self.measuring.pop(ref)
        camp = cand.camp
        self.workers.release(cand.slot)
        camp.tally.measured += 1
        report, result, cacheable = tell_measurement(camp, cand, ref)
        held = held_seconds(report)
        camp.tally.gpu_busy += held
        if lock_record(report) is not None:   # a trial that returned: the typical hold (not a killed one's)
            self.pacer.note_trial(held)
        note_span(camp.tally, report)
        if result is None:        # infrastructure: the candidate was queued again (its duplicates need not be)
            self._finish_candidate(cand)
            return
        camp.inflight -= 1
        waiters = self.waiting.pop(cand.key, [])
        name = cand.trial.user_attrs.get("kernel_name") or ""
        stem = str((camp.kernels_dir / name).relative_to(self.opts.study_dir))
        value = measured_value(result)
        if value is not None:
            self._note_incumbent(camp, result["tflops"])
        entry = from_result(cand.key, result, value, camp.name, cand.trial.number, name, stem)
        if cacheable:
            self.cache.put(entry)
        for other, trial in waiters:
            self._tell_cached(other, trial, entry)

    def _finish_candidate(self, cand: Candidate, reason: str = "", compiled: bool = False,
                          infeasible: str | None = None) -> None:
        """``cand`` ends without a measurement; so do its duplicates in flight (the same kernel, asked again while
        it compiled or waited). With an answer (a dry run's ``compiled`` kernel, or one that cannot build:
        ``infeasible``) a duplicate gets the same one, as a repeat of ``cand`` (counted with the cache hits, as a
        measured kernel's duplicates are: no compile, no GPU). Without one (lost to the infrastructure, or the run
        stopped) a duplicate is told FAIL, which the sampler ignores, and is no failure of its own: it is not
        counted as one, nor queued again (``cand`` is, when it is worth another try)."""
        cand.camp.inflight -= 1
        for other, trial in self.waiting.pop(cand.key, []):
            trial.set_user_attr("duplicate_of", cand.trial.number)
            if compiled or infeasible is not None:
                trial.set_user_attr("cache_hit", True)
                trial.set_user_attr(CACHED_FROM, {"study": cand.camp.name, "trial": cand.trial.number})
                for attr in ("kernel_name", "registers", "spill_stores"):
                    if cand.trial.user_attrs.get(attr) is not None:
                        trial.set_user_attr(attr, cand.trial.user_attrs[attr])
                if compiled:
                    st.tell_feasible(other.study, trial, None, dry_run=True, stage="compile")
                else:
                    st.tell_infeasible(other.study, trial, infeasible, stage="compile")
                other.tally.cached += 1
                continue
            st.tell_infra_failure(other.study, trial, trial.params,
                                  reason or f"a duplicate of trial {cand.trial.number}, which was not measured", False)

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
                self.compile_node.pop(ref, None)
                for cand in batch:
                    reason = f"compile timeout after {self.opts.compile_timeout:g} s"
                    st.tell_infeasible(cand.camp.study, cand.trial, reason, stage="compile")
                    count_outcome(cand.camp.tally, "infeasible", None, cand.trial.number)
                    self._finish_candidate(cand, infeasible=reason)

    def _leftovers(self) -> None:
        """Out of budget (or interrupted): what did not finish goes back into the queue for --resume."""
        import ray

        if self.stop_reason is None:
            return
        for ref in self.compiling:
            ray.cancel(ref, force=True)
        pending = [c for batch, _ in list(self.compiling.values()) + list(self.filling.values()) for c in batch]
        self.compiling.clear()
        self.filling.clear()
        self.compile_node.clear()
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
                count_outcome(c.tally, t.state, t.value if t.state == optuna.trial.TrialState.COMPLETE else None, t.number,
                       st.is_infeasible(t))
        c.tally.told = 0
    Loop(camps).run()
