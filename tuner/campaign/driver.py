"""The campaign driver: one process owns the study and drives Ray tasks with Optuna's ask/tell.

Pipeline per candidate: ask → suggest → validate (invalid: infeasible, no compile) → compile batch
(Ray CPU task) → verify + benchmark (a fresh process of the GPU worker of one GPU of the requested type,
workers.py) → tell. Compiles run ahead of the GPUs so they overlap benchmarks; up to K trials per GPU are
in flight (``--gpu-overlap K``): the next ones start while one is timed, and the per-GPU lock (gpulock.py)
lets one trial at a time verify and benchmark.

Trial limits are the worker's (trialproc.py): ``--trial-timeout`` from the moment a trial takes its GPU's
lock, and K x that from its start until it does (start-up plus the other trials' timed sections); a trial
past either is killed, which frees the lock (flock). The driver only keeps a backstop: a call that
outlives every limit by WORKER_GRACE_S means a stuck worker, which is replaced.
"""
from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from rich.console import Console

from hardware_profiles import ProfileError, load_profile
from search_spaces import DEFAULT_SCHEDULE, SCHEDULE, SpaceError, load_space, suggest_candidate
from translate.params import KernelParams, validate
from tuner.problem import grid_problems, spec_for

from . import study as st
from .backends import BackendError, BackendSpec, parse_backend
from .cluster import ClusterError, GpuPool, connect, cpu_count, gpu_pool
from .options import CampaignOptions

DEFAULT_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
MAX_GPU_OVERLAP = 8   # more waiting processes only hold CUDA contexts and CPUs
WORKER_GRACE_S = 120.0   # beyond a trial's own limits: a worker's start-up (its fork server's imports)


@dataclass
class Candidate:
    trial: optuna.Trial
    params: KernelParams
    schedule: str = DEFAULT_SCHEDULE
    compiled: dict | None = None
    started: float = 0.0
    slot: int = -1                 # its GPU worker (index in the pool) and that worker's handle
    worker: Any = None


@dataclass
class Tally:
    done: int = 0
    infeasible: int = 0
    failed: int = 0
    best: float = 0.0
    best_trial: int | None = None
    told: int = 0
    elapsed: float = 0.0       # seconds of this run's loop
    gpu_busy: float = 0.0      # seconds GPU trials of this run held their GPU's lock, summed over GPUs
    measured: int = 0          # GPU trials of this run that returned (any outcome)
    lock_spans: list = field(default_factory=list)   # (gpu, acquired_at, released_at, waited_s), this run


@dataclass
class Campaign:
    """Everything fixed for one run, resolved from the options."""

    options: CampaignOptions
    profile: Any
    spec: Any
    space: Any
    problems: list
    backend: BackendSpec
    name: str
    kernels_dir: Path
    console: Console
    fake_compile: bool
    program: Any = None
    program_text: str = ""
    programs: dict = field(default_factory=dict)        # schedule -> TL program (the search's sketch dimension)
    program_texts: dict = field(default_factory=dict)   # schedule -> its source text
    pool: GpuPool | None = None
    workers: Any = None            # workers.WorkerPool, when there are GPUs
    baselines_ref: Any = None      # the library baselines' call while it is in flight
    baselines: dict = field(default_factory=dict)          # {"<seqlen>": {library: TFLOPS or None}}
    baseline_errors: dict = field(default_factory=dict)    # {"<seqlen>": {library: why it has no number}}
    device_name: str = ""
    llm_seeds: list = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)   # --timeout counts from here: the whole run


def resolve(options: CampaignOptions, console: Console) -> Campaign:
    """Check every option that can be checked without a cluster; ValueError-family on bad input."""
    profile = load_profile(options.gpu)
    space = load_space(options.variant)
    dtype = options.dtype or ("bf16" if "bf16" in profile.dtypes else "fp16")
    if dtype not in profile.dtypes:
        raise ValueError(f"{profile.name} does not support {dtype}; choose one of: {', '.join(profile.dtypes)}")
    spec = spec_for(space.variant, options.head_dim, dtype, options.causal)
    if options.sampler not in st.SAMPLERS:
        raise ValueError(f"unknown sampler {options.sampler!r}; choose one of: {', '.join(st.SAMPLERS)}")
    if options.trials < 1:
        raise ValueError("--trials must be at least 1")
    if not isinstance(options.gpu_overlap, int) or not 1 <= options.gpu_overlap <= MAX_GPU_OVERLAP:
        raise ValueError(f"--gpu-overlap must be an integer from 1 to {MAX_GPU_OVERLAP}, got {options.gpu_overlap!r}")
    if options.trial_timeout <= 0:
        raise ValueError(f"--trial-timeout must be positive, got {options.trial_timeout:g}")
    backend = parse_backend(options.backend)
    seqlens = tuple(options.seqlens or DEFAULT_SEQLENS)
    problems = grid_problems(space.variant, spec.d_qk, dtype, options.causal, seqlens=seqlens)
    space.domains(profile, spec.d_qk, dtype)  # an empty domain is an error now, not at trial 1
    name = st.study_name(profile.name, spec, options.dry_run)
    kernels_dir = options.study_dir / name / "compiled"
    return Campaign(options, profile, spec, space, problems, backend, name, kernels_dir, console,
                    fake_compile=backend.kind == "replay" and not options.dry_run)


def run_campaign(options: CampaignOptions) -> int:
    """Run (or resume) a campaign; returns the exit code (0 ok, 1 nothing verified, 2 usage/setup)."""
    console = Console(highlight=False)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        camp = resolve(options, console)
    except (ProfileError, SpaceError, BackendError, ValueError) as exc:
        return _error(exc)
    where = options.storage or str(options.study_dir / f"{camp.name}.journal")
    try:
        storage = st.make_storage(options.storage, options.study_dir, camp.name)
        st.check_study_state(storage, camp.name, options.resume, where)
        connect(options.ray_address)
        if not options.dry_run:
            camp.pool = gpu_pool(camp.profile.ray_accelerator_type)
        _llm_stage(camp)
        study = st.open_study(storage, camp.name, st.make_sampler(options.sampler, options.seed),
                              options.resume, where)
    except (st.StudyError, ClusterError, BackendError) as exc:
        return _error(exc)
    except _llm_errors() as exc:
        return _error(f"LLM stage: {exc}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    console.print(f"study [bold]{camp.name}[/] in {where}; backend {camp.backend.label}"
                  + (f"; {camp.pool.gpus} {camp.pool.accelerator_type} GPU(s)" if camp.pool else "; dry run (no GPU)"))
    if options.resume:
        redone = st.fail_stale_running(study)
        if redone:
            console.print(f"resume: trial(s) {', '.join(map(str, redone))} were left running; marked FAIL and queued again")
    _enqueue_seeds(camp, study)
    if camp.pool is not None:
        from .workers import WorkerPool

        camp.workers = WorkerPool(camp.pool, camp.backend, options.gpu_overlap)
    try:
        camp.baselines_ref = _start_baselines(camp, study) if camp.workers is not None else None
        tally = _loop(camp, study)
        if camp.workers is not None:   # the final table and the store need them: wait, or try once more
            wait_s = (options.gpu_overlap + 3) * options.trial_timeout + WORKER_GRACE_S
            if camp.baselines_ref is not None:
                _finish_baselines(camp, study, camp.baselines_ref, wait_s=wait_s)
            if not camp.baselines and camp.workers.handles:   # (no workers left after an interrupted loop)
                camp.console.print("measuring the baselines again, now that the GPU is free")
                ref = _start_baselines(camp, study)
                if ref is not None:
                    _finish_baselines(camp, study, ref, wait_s=wait_s)
            camp.baselines_ref = None
    finally:
        if camp.workers is not None:   # its trial processes die with it: no GPU stays locked
            camp.workers.shutdown()
    from .finish import finish

    return finish(camp, study, tally)


def _error(message) -> int:
    """Usage and setup errors: one line on stderr, never a traceback; exit code 2."""
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"tune: error: {message}", markup=False)
    return 2


def _llm_errors() -> tuple[type[BaseException], ...]:
    try:
        from tuner.llm import LLMError

        return (LLMError,)
    except ImportError:
        return (RuntimeError,)


def _llm_stage(camp: Campaign) -> None:
    """The TL program and the seeds: from the LLM endpoint, or the built-in sketch and profile seeds."""
    opts = camp.options
    try:
        from tuner.llm import LLMConfig, ResponseCache, generate_program, propose_params
    except ImportError as exc:
        if not camp.fake_compile:
            raise BackendError(f"the LLM/sketch stage (tuner.llm) is not available: {exc}") from None
        camp.console.print("sketch stage unavailable: replay backend runs without a TL program; "
                           "using the search space's seeds")
        return
    config = LLMConfig.from_options(opts.llm_base_url, opts.llm_model, opts.llm_api_key)
    cache = ResponseCache(opts.study_dir / camp.name)
    outcome = generate_program(config, camp.profile, camp.spec, cache)
    camp.program, camp.program_text = outcome.program, outcome.program_text
    _schedule_programs(camp, outcome)
    camp.llm_seeds = propose_params(config, camp.profile, camp.spec, outcome.program_text, 8, cache)
    camp.console.print(f"sketch: {getattr(outcome, 'message', '') or outcome.source}")
    sources = sorted({s.source for s in camp.llm_seeds})
    camp.console.print(f"seeds: {len(camp.llm_seeds)} from {', '.join(sources) or 'nowhere'}"
                       + ("" if config.configured else " (no LLM endpoint configured: profile-derived seeds)"))


def _schedule_programs(camp: Campaign, outcome) -> None:
    """One TL program per schedule the space offers on this profile (the sketch is a search dimension):
    the reference sketches, with the LLM's program in place of the reference of its own kind."""
    import tl
    from tl.pipelines import has_roles

    try:
        schedules = camp.space.domain(SCHEDULE, camp.profile, camp.spec.d_qk, camp.spec.dtype)
    except KeyError:   # a space without the dimension: the paper's flow
        schedules = (DEFAULT_SCHEDULE,)
    for schedule in schedules:
        text = tl.load_sketch(camp.spec.variant, camp.spec.causal, schedule)
        camp.programs[schedule], camp.program_texts[schedule] = tl.parse_program(text), text
    if outcome.source == "llm":
        kind = "ws_overlap" if has_roles(outcome.program.statements) else DEFAULT_SCHEDULE
        if kind in camp.programs:
            camp.programs[kind], camp.program_texts[kind] = outcome.program, outcome.program_text
            camp.console.print(f"the LLM's program stands for schedule {kind}")


def _enqueue_seeds(camp: Campaign, study: optuna.Study) -> None:
    """LLM (or profile) seeds first, then the search space's FA2/FA3 seeds; once per study."""
    if study.user_attrs.get(st.SEEDS_ATTR):
        return
    hd, dt = camp.spec.d_qk, camp.spec.dtype
    offered = [(s.params.to_dict(), s.source, getattr(s, "rationale", "")) for s in camp.llm_seeds]
    for seed in camp.space.seeds_for(hd):
        raw = dict(seed.params)
        schedule = raw.pop(SCHEDULE, DEFAULT_SCHEDULE)
        full = {**KernelParams(**raw).to_dict(), SCHEDULE: schedule}
        offered.append((full, f"search space: {seed.source}", ""))
    seen: set[str] = set()
    count = 0
    for params, source, rationale in offered:
        schedule = params.get(SCHEDULE, DEFAULT_SCHEDULE)
        key = f"{schedule}:{KernelParams.from_dict({k: v for k, v in params.items() if k != SCHEDULE}).key()}"
        if key in seen:
            continue
        chosen, problems = camp.space.project(params, camp.profile, hd, dt)
        if problems:
            camp.console.print(f"seed {key} ({source}) skipped: {'; '.join(problems)}")
            continue
        seen.add(key)
        attrs = {"source": source}
        if rationale:
            attrs["rationale"] = rationale
        study.enqueue_trial(chosen, user_attrs=attrs)
        count += 1
    study.set_user_attr(st.SEEDS_ATTR, True)
    if camp.program_text:
        study.set_user_attr("tl_program", camp.program_text)
    if camp.program_texts:
        study.set_user_attr("tl_programs", camp.program_texts)
    camp.console.print(f"enqueued {count} seed(s)")


def _start_baselines(camp: Campaign, study: optuna.Study):
    """The library baselines, measured once per study by a GPU worker while the first kernels compile:
    returns the call in flight, or None when the study has them already."""
    cached = study.user_attrs.get("baselines")
    if cached:
        camp.baselines, camp.device_name = cached["baselines"], cached["device_name"]
        camp.baseline_errors = cached.get("errors") or {}   # (studies from before the errors were kept: none)
        return None
    return camp.workers.submit_baselines(camp.problems, camp.options.timing(), camp.options.trial_timeout)


def _finish_baselines(camp: Campaign, study: optuna.Study, ref, wait_s: float = 0.0) -> None:
    """Take the baselines' result; they are context, not the campaign's goal: a failure is a warning."""
    import ray

    try:
        report = ray.get(ref, timeout=wait_s or None)
    except Exception as exc:  # noqa: BLE001 - worker lost, or not done within wait_s
        camp.console.print(f"[yellow]baselines could not be measured: {type(exc).__name__}: {exc}[/]")
        return
    if report["outcome"] != "result":
        camp.console.print(f"[yellow]baselines could not be measured: {report['outcome']}: {report['message']}[/]")
        return
    result = report["value"]
    camp.baselines, camp.device_name = result["baselines"], result["device_name"]
    camp.baseline_errors = result.get("errors") or {}
    by_reason: dict[tuple, list] = {}     # one line per library and reason (FA4 not installed: not one per seqlen)
    for seqlen, errs in camp.baseline_errors.items():
        for lib, msg in errs.items():
            by_reason.setdefault((lib, msg), []).append(seqlen)
    for (lib, msg), seqlens in by_reason.items():
        camp.console.print(f"baseline {lib} at seqlen {', '.join(seqlens)} cannot run: {msg}", markup=False)
    study.set_user_attr("baselines", {"baselines": camp.baselines, "device_name": camp.device_name,
                                      "errors": camp.baseline_errors})


# ---------------------------------------------------------------------------------------------------
# The loop


def _loop(camp: Campaign, study: optuna.Study) -> Tally:
    """The ask → compile → measure → tell pipeline until the trials or the budget are spent; the library
    baselines' call (``camp.baselines_ref``) is taken when it lands."""
    import ray

    from .live import live_view
    from .tasks import compile_batch

    opts = camp.options
    tally = Tally()
    for t in st.finished(study):
        _count(tally, t.state, t.value if t.state == optuna.trial.TrialState.COMPLETE else None,
               st.is_infeasible(t), t.number)
    tally.told = 0
    start = time.monotonic()
    # The budget is the run's, not the loop's: Ray start, the sketch stage and the baselines count too, so
    # `--timeout T` ends the search T seconds after the command started (then the finish: store, report).
    deadline = camp.started + opts.timeout if opts.timeout else None
    n_gpus = camp.pool.gpus if camp.pool else 0
    overlap = opts.gpu_overlap
    gpu_slots = n_gpus * overlap
    workers = camp.workers
    # Compile batches in flight: the CPUs that the GPU trials' processes (one CPU each) leave free, so the
    # ready queue keeps up with the GPUs (a batch of 8 takes ~75 CPU-seconds).
    cpus = cpu_count()
    compile_slots = max(min(2, cpus), min(16, cpus - gpu_slots))
    max_inflight = gpu_slots + n_gpus + opts.compile_batch * compile_slots
    batches_sent = 0
    buffer: list[Candidate] = []
    compiling: dict[Any, tuple[list[Candidate], float]] = {}
    ready: deque[Candidate] = deque()
    measuring: dict[Any, Candidate] = {}
    inflight = 0
    stop_reason = None
    camp.kernels_dir.mkdir(parents=True, exist_ok=True)

    def finished_count() -> int:
        return tally.done + tally.infeasible

    with live_view(camp, tally, start, deadline) as live:
        try:
            while True:
                now = time.monotonic()
                if stop_reason is None and deadline is not None and now >= deadline:
                    stop_reason = "the --timeout budget ran out"
                # 1. ask
                while (stop_reason is None and finished_count() + inflight < opts.trials
                       and inflight < max_inflight):
                    trial = study.ask()
                    schedule, params = suggest_candidate(trial, camp.space, camp.profile, camp.spec)
                    trial.set_user_attr("params_key", params.key())
                    trial.set_user_attr("kernel_params", params.to_dict())
                    trial.set_user_attr(SCHEDULE, schedule)
                    ws = schedule.startswith("ws_")
                    errors = sorted({e for p in camp.problems for e in validate(params, camp.profile, p,
                                                                                 warp_specialized=ws)})
                    if errors:
                        st.tell_infeasible(study, trial, "invalid: " + "; ".join(errors), stage="validate")
                        _count(tally, "infeasible", None, True, trial.number)
                        continue
                    buffer.append(Candidate(trial, params, schedule))
                    inflight += 1
                # 2. compile what is buffered: full batches, or anything when the CPUs are idle
                while buffer and (len(buffer) >= opts.compile_batch or len(compiling) < compile_slots):
                    size = _batch_size(opts.compile_batch, batches_sent, n_gpus)
                    batch, buffer = buffer[:size], buffer[size:]
                    batches_sent += 1
                    items = [(c.trial.number, c.params.to_dict(), c.schedule) for c in batch]
                    ref = compile_batch.remote(items, camp.programs, camp.spec, camp.profile.name,
                                               str(camp.kernels_dir.parent / "nvcc-cache"), opts.compile_timeout,
                                               camp.backend.path if camp.fake_compile else None)
                    compiling[ref] = (batch, time.monotonic())
                # 3. launch GPU trials while GPU workers have room
                while ready and stop_reason is None:
                    slot = workers.free_slot()
                    if slot is None:
                        break
                    cand = ready.popleft()
                    payload = {"trial": cand.trial.number, "params": cand.params.to_dict(), "profile": camp.profile.name,
                               "spec": camp.spec, "problems": camp.problems, "cubin": cand.compiled["cubin"],
                               "meta": cand.compiled["meta"], "timing": opts.timing()}
                    ref, cand.worker = workers.submit(slot, payload, opts.trial_timeout, opts.trial_timeout * overlap)
                    cand.slot, cand.started = slot, time.monotonic()
                    measuring[ref] = cand
                if stop_reason is not None or (inflight == 0 and finished_count() >= opts.trials):
                    break
                if inflight == 0 and not compiling and not measuring:
                    break
                # 4. wait for anything
                pending = [camp.baselines_ref] if camp.baselines_ref is not None else []
                refs = list(compiling) + list(measuring) + pending
                done, _ = ray.wait(refs, num_returns=1, timeout=0.5) if refs else ([], [])
                if done:  # collect everything that is ready without waiting again
                    done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                for ref in done:
                    if pending and ref == pending[0]:
                        _finish_baselines(camp, study, ref)
                        camp.baselines_ref = None
                    elif ref in compiling:
                        batch, _ = compiling.pop(ref)
                        for cand, outcome in _compile_outcomes(camp, ref, batch):
                            if outcome == "ready":
                                ready.append(cand)
                                continue
                            inflight -= 1
                            _tell_compile(camp, study, tally, cand, outcome)
                    else:
                        cand = measuring.pop(ref)
                        workers.release(cand.slot)
                        inflight -= 1
                        tally.measured += 1
                        report = _tell_measurement(camp, study, tally, cand, ref)
                        tally.gpu_busy += _held_seconds(report)
                        _note_span(tally, report)
                # 5. a worker whose call outlived every limit of its trials is stuck: replace it (its trials
                #    in flight come back as infrastructure failures and are queued again)
                now = time.monotonic()
                for ref, cand in list(measuring.items()):
                    if now - cand.started > opts.trial_timeout * (overlap + 1) + WORKER_GRACE_S:
                        if workers.replace(cand.slot, cand.worker):
                            camp.console.print(f"[yellow]GPU worker {cand.slot} did not answer for trial "
                                               f"{cand.trial.number}; replaced[/]")
                for ref, (batch, submitted) in list(compiling.items()):
                    if now - submitted > opts.compile_timeout * 1.5:
                        ray.cancel(ref, force=True)
                        compiling.pop(ref)
                        for cand in batch:
                            inflight -= 1
                            st.tell_infeasible(study, cand.trial, f"compile timeout after {opts.compile_timeout:g} s",
                                               stage="compile")
                            _count(tally, "infeasible", None, True, cand.trial.number)
                live.refresh()
        except KeyboardInterrupt:  # Ctrl-C: the unfinished trials go back in the queue
            stop_reason = "interrupted"
        # Out of budget (or interrupted): what is still in flight goes back into the queue.
        if stop_reason is not None:
            leftovers = buffer + list(ready) + [c for b, _ in compiling.values() for c in b] + list(measuring.values())
            for ref in compiling:
                ray.cancel(ref, force=True)
            if workers is not None and measuring:   # kills the trials in flight with their workers
                workers.shutdown()
            for cand in leftovers:
                st.tell_infra_failure(study, cand.trial, cand.trial.params, f"not finished: {stop_reason}", True)
                tally.failed += 1
            camp.console.print(f"stopped: {stop_reason}; {len(leftovers)} unfinished trial(s) queued for --resume")
        tally.elapsed = time.monotonic() - start
        live.refresh(force=True)
    return tally


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


def _batch_size(full: int, sent: int, n_gpus: int) -> int:
    """Compile batches ramp up 1, 2, 4, ... to ``full`` while the GPUs wait for their first kernels: a
    one-config unit builds in a third of an eight-config one's time (CUTE.md §1.6), so trials start sooner."""
    if n_gpus == 0:
        return full
    return max(1, min(full, 2 ** sent))


def _count(tally: Tally, state, value, infeasible: bool, number: int) -> None:
    from optuna.trial import TrialState

    if state == TrialState.FAIL or state == "fail":
        tally.failed += 1
        return
    tally.told += 1
    if infeasible:
        tally.infeasible += 1
        return
    tally.done += 1
    if value is not None and value > tally.best:
        tally.best, tally.best_trial = value, number


def _compile_outcomes(camp: Campaign, ref, batch: list[Candidate]):
    """(candidate, "ready" | reason-of-failure | ("infra", msg)) per candidate of a finished batch."""
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
        if not res["ok"]:
            out.append((cand, res["error"]))
            continue
        cand.compiled = res
        _save_kernel(camp, cand, res)
        for attr in ("registers", "spill_stores"):
            if res.get(attr) is not None:
                cand.trial.set_user_attr(attr, res[attr])
        out.append((cand, "ready" if camp.pool is not None else "dry-run-ok"))
    return out


def _save_kernel(camp: Campaign, cand: Candidate, res: dict) -> None:
    """Keep every compiled kernel on disk: the store takes the best one from here after the loop."""
    stem = camp.kernels_dir / res["kernel_name"]
    stem.with_suffix(".cubin").write_bytes(res["cubin"])
    stem.with_suffix(".cu").write_text(res.get("source") or "")
    stem.with_suffix(".meta.json").write_text(json.dumps(res.get("meta") or {}, indent=1, default=str))


def _tell_compile(camp: Campaign, study, tally: Tally, cand: Candidate, outcome) -> None:
    if outcome == "dry-run-ok":
        st.tell_feasible(study, cand.trial, None, dry_run=True, stage="compile")
        _count(tally, "pruned", None, False, cand.trial.number)
    elif isinstance(outcome, tuple):
        _infra(camp, study, tally, cand, outcome[1])
    else:
        st.tell_infeasible(study, cand.trial, outcome, stage="compile")
        _count(tally, "infeasible", None, True, cand.trial.number)


def _infra(camp: Campaign, study, tally: Tally, cand: Candidate, reason: str) -> None:
    retries = int(cand.trial.user_attrs.get("infra_retries", 0))
    st.tell_infra_failure(study, cand.trial, cand.trial.params, reason, retries < camp.options.infra_retries)
    tally.failed += 1
    camp.console.print(f"[yellow]trial {cand.trial.number}: infrastructure failure ({reason}); "
                       f"{'queued again' if retries < camp.options.infra_retries else 'not retried again'}[/]")


def _tell_measurement(camp: Campaign, study, tally: Tally, cand: Candidate, ref) -> dict | None:
    """Tell the study what the GPU worker reported for this trial; returns the report (None when the
    worker itself failed)."""
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
        _infra(camp, study, tally, cand, why)
        return None
    except RayTaskError as exc:   # the worker's own code raised: not the candidate's fault either
        msg = str(exc).strip().splitlines()[-1][:300]
        _infra(camp, study, tally, cand, f"GPU worker error: {msg}")
        return None
    except ray.exceptions.RayError as exc:
        _infra(camp, study, tally, cand, f"{type(exc).__name__}: {str(exc)[:200]}")
        return None
    where = {k: report.get(k) for k in ("node_id", "hostname", "pid", "gpu_ids")}
    for k, v in where.items():
        trial.set_user_attr(k, v)
    outcome = report["outcome"]
    if outcome != "result":
        reason = {"crash": f"crash: {report['message']} (an out-of-bounds access or illegal address kills the "
                           f"CUDA context)",
                  "timeout": report["message"],
                  "error": f"error in trial: {report['message']}"}.get(outcome, f"{outcome}: {report['message']}")
        st.tell_infeasible(study, trial, reason, stage="measure")
        _count(tally, "infeasible", None, True, trial.number)
        return report
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
        st.tell_infeasible(study, trial, result["reason"], stage="verify", verification=result.get("verification"))
        _count(tally, "infeasible", None, True, trial.number)
        return report
    value = round(st.geomean(result["tflops"].values()), 3)
    st.tell_feasible(study, trial, value, tflops=result["tflops"], verification=result.get("verification"),
                     backend=camp.backend.kind)
    _count(tally, "complete", value, False, trial.number)
    return report


def _lost_nodes(camp: Campaign) -> list[str]:
    from .cluster import alive_nodes

    alive = {n["NodeID"] for n in alive_nodes()}
    return [n for n in camp.pool.node_ids if n not in alive]
