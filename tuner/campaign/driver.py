"""The campaign driver: one process owns the studies and drives Ray tasks with Optuna's ask/tell.

A campaign tunes one or more combinations (variant, head dim, dtype, causal; or a model preset's), one
Optuna study each in the same storage, sharing the compile pool and the GPU workers: ``--trials`` is per
combination and the asks go to the combination that has the fewest candidates finished or in flight, so
the GPU time (and the ``--timeout`` budget) is split fairly.

Pipeline per candidate (loop.py; its pacing in pacing.py, what it tells the study in telling.py): ask →
suggest a valid point of the space (search_spaces/feasible.py) → translate → the measurement cache (cache.py:
measured before? then the recorded value, no compile, no GPU) → compile batch (Ray CPU task) → verify +
benchmark (a fresh process of the GPU worker of one GPU of the requested type, workers.py; probed at the longest
seqlen first and stopped when far behind, earlystop.py) → tell. After the search, each bucket's best is re-timed
against the best seed and the stored kernel on a GPU worker (winners.py, retime.py, confirm.py) before the
finish (finish.py) stores it or reports it as beating the seeds.
"""
from __future__ import annotations

import json
import time

import optuna
from rich.console import Console

from hardware_profiles import ProfileError, load_profile
from search_spaces import SCHEDULE, SpaceError, load_space
from search_spaces.feasible import default_sketches, feasible_space

from . import sketches as sk
from . import study as st
from .backends import BackendError, parse_backend
from .cache import MeasurementCache
from .cluster import ClusterError, connect, gpu_pool
from .combos import ComboError, expand_combinations, kv_dtype_combinations
from .options import CampaignOptions, option_problems
from .state import WORKER_GRACE_S, Campaign
from .baselines import finish_baselines, start_baselines

DEFAULT_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_SEED_SOURCE = "the per-spec default (translate.defaults)"
MEASURED_SEED_PREFIX = "measured:"     # a search space's seed from a developer's A/B runs (search_spaces/*.toml)


def resolve(options: CampaignOptions, console: Console) -> list[Campaign]:
    """Check every option that can be checked without a cluster; ValueError-family on bad input."""
    profile = load_profile(options.gpu)
    left_out: list[str] = []
    combos = expand_combinations(profile, options.variant, options.head_dim, options.dtype, options.causal,
                                 options.model, options.layout, options.page_size, options.phase, options.window,
                                 options.softcap, options.sinks, options.layer, notes=left_out)
    if options.kv_dtype:
        combos = kv_dtype_combinations(combos, options.kv_dtype)
    for note in left_out:
        console.print(f"left out: {note}", markup=False)
    if options.sampler not in st.SAMPLERS:
        raise ValueError(f"unknown sampler {options.sampler!r}; choose one of: {', '.join(st.SAMPLERS)}")
    problems = option_problems(options)
    if problems:
        raise ValueError("; ".join(problems))
    backend = parse_backend(options.backend)
    seqlens = tuple(options.seqlens or DEFAULT_SEQLENS)
    cache = MeasurementCache(options.study_dir)
    started = time.monotonic()
    camps = []
    for combo in combos:
        spec = combo.spec()
        space = load_space(spec.variant, phase=spec.phase, layout=spec.layout)
        dense_grid = combo.layout == "dense" and combo.phase == "prefill"
        problems = combo.problems(seqlens=seqlens) if dense_grid else combo.problems()
        space.domains(profile, spec.d_qk, spec.dtype)  # an empty domain is an error now, not at trial 1
        heads = combo.decode_heads() if combo.phase == "decode" and combo.heads else combo.heads
        name = st.study_name(profile.name, spec, options.dry_run, heads=heads, page_size=combo.page_size,
                             options_tag=combo.options_tag() + combo.kv_tag())
        camps.append(Campaign(options, combo, profile, spec, space, problems, backend, name,
                              options.study_dir / name / "compiled", console,
                              fake_compile=backend.kind == "replay" and not options.dry_run, cache=cache,
                              started=started))
    return camps


def run_campaign(options: CampaignOptions) -> int:
    """Run (or resume) a campaign; returns the exit code (0 ok, 1 nothing verified, 2 usage/setup)."""
    console = Console(highlight=False)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        camps = resolve(options, console)
    except (ProfileError, SpaceError, BackendError, ComboError, ValueError) as exc:
        return _error(exc)
    where = {c.name: options.storage or str(options.study_dir / f"{c.name}.journal") for c in camps}
    new_paths = _absent_setup_paths(options, camps)
    try:
        storages = {c.name: st.make_storage(options.storage, options.study_dir, c.name, options.resume) for c in camps}
        for c in camps:
            st.check_study_state(storages[c.name], c.name, options.resume, where[c.name])
        if options.dry_run:   # what it does and how long that takes, before Ray starts
            console.print(dry_run_plan(camps, options), markup=False, soft_wrap=True)
        connect(options.ray_address)
        pool = None if options.dry_run else gpu_pool(camps[0].profile.ray_accelerator_type)
        for c in camps:
            c.pool = pool
            c.study = st.open_study(storages[c.name], c.name, st.make_sampler(options.sampler, options.seed),
                                    options.resume, where[c.name])
            _sketch_stage(c)
    except (st.StudyError, ClusterError, BackendError, SpaceError) as exc:
        _remove_setup_leftovers(*new_paths)
        return _error(exc)
    except _llm_errors() as exc:
        _remove_setup_leftovers(*new_paths)
        return _error(f"LLM stage: {exc}")
    except OSError as exc:   # the study dir's files (resolve checked the dir itself): one line, not a traceback
        _remove_setup_leftovers(*new_paths)
        return _error(f"{exc.filename or options.study_dir}: {exc.strerror or exc}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for c in camps:
        console.print(f"study [bold]{c.name}[/] in {where[c.name]}; backend {c.backend.label}"
                      + (f"; {c.pool.gpus} {c.pool.accelerator_type} GPU(s)" if c.pool else "; dry run (no GPU)"))
        console.print(f"  {c.label}: {len(c.feasible.points)} valid parameter sets of {c.feasible.enumerated} "
                      f"over {len(c.sketches)} sketch(es): {', '.join(s.name for s in c.sketches)}", markup=False)
        if options.resume:
            redone = st.fail_stale_running(c.study)
            if redone:
                console.print(f"resume: trial(s) {', '.join(map(str, redone))} were left running; marked FAIL and "
                              "queued again")
        _enqueue_seeds(c)
    workers = None
    if pool is not None:
        from .workers import WorkerPool

        workers = WorkerPool(pool, camps[0].backend, options.gpu_overlap)
    for c in camps:
        c.workers = workers
    try:
        if workers is not None:
            for c in camps:
                c.baselines_ref = start_baselines(c)
        from .loop import run_loop

        run_loop(camps)
        if workers is not None:   # the final table and the store need them: wait, or try once more
            wait_s = (options.gpu_overlap + 3) * options.trial_timeout + WORKER_GRACE_S
            for c in camps:
                if c.baselines_ref is not None:
                    finish_baselines(c, c.baselines_ref, wait_s=wait_s)
                if not c.baselines and workers.handles:   # (no workers left after an interrupted loop)
                    console.print(f"{c.label}: measuring the baselines again, now that the GPU is free")
                    ref = start_baselines(c)
                    if ref is not None:
                        finish_baselines(c, ref, wait_s=wait_s)
                c.baselines_ref = None
            # Confirmed winners (winners.py): each bucket's challenger re-timed against its incumbents
            from .winners import retime_all

            try:
                retime_all(camps, wait_s=wait_s)
            except Exception as exc:  # noqa: BLE001 - the finish must still store and report; unconfirmed, nothing is claimed
                console.print(f"[yellow]re-timing the bucket winners failed ({type(exc).__name__}: {exc}): "
                              "no challenger replaces a seed or a stored kernel in this run[/]")
    finally:
        if workers is not None:   # its trial processes die with it: no GPU stays locked
            workers.shutdown()
    from .finish import finish_all

    return finish_all(camps)


def _absent_setup_paths(options: CampaignOptions, camps: list[Campaign]):
    """The default journals, study folders and study dir that are not there yet: what a failed setup removes."""
    journals = [] if options.storage is not None else [options.study_dir / f"{c.name}.journal" for c in camps]
    dirs = [options.study_dir / c.name for c in camps] + [options.study_dir]
    return [j for j in journals if not j.exists()], [d for d in dirs if not d.exists()]


def _remove_setup_leftovers(journals: list, dirs: list) -> None:
    """A setup that failed (no GPU of the type on the cluster, the LLM stage, a study that cannot be opened) leaves
    no empty journal and no empty folder it created. A journal with anything in it stays (a study created: a rerun
    resumes it), and so does a folder that is not empty."""
    for path in journals:
        try:
            if path.is_file() and path.stat().st_size == 0:
                path.unlink()
        except OSError:
            pass
    for directory in dirs:   # the study folders, then the study dir
        try:
            directory.rmdir()
        except OSError:
            pass


def local_cpus() -> int:
    """The CPUs this process may use (a local Ray cluster's, and so a dry run's compile slots)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def dry_run_plan(camps: list[Campaign], options: CampaignOptions) -> str:
    """A dry run's first line: what it compiles and about how long that takes here (pacing.dry_run_seconds)."""
    from .cluster import MAX_SLOTS_PER_NODE
    from .pacing import dry_run_seconds

    kernels = options.trials * len(camps)
    what = (f"dry run: {options.trials} candidate(s) per combination ({len(camps)} combination(s), {kernels} "
            f"kernel(s)) translated and compiled for {camps[0].profile.name} ({camps[0].profile.nvcc_arch}), "
            "nothing measured")
    if options.ray_address:
        return f"{what}; compiled on the Ray cluster at {options.ray_address}"
    cpus = local_cpus()
    seconds = dry_run_seconds(camps[0].profile.nvcc_arch, kernels, min(cpus, MAX_SLOTS_PER_NODE),
                              options.compile_batch)
    when = "about a minute" if seconds < 90 else f"about {round(seconds / 60)} min"
    return f"{what}: {when} on this machine's {cpus} CPU(s)" + (
        "" if options.trials <= 8 else "; --trials sets fewer")


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


def _sketch_stage(camp: Campaign) -> None:
    """The study's sketches (kept in the study: a resumed study searches the same ones), the feasible
    space over them, and the seeds; the LLM is asked only for a new study."""
    opts = camp.options
    stored = sk.from_attr(camp.study.user_attrs.get(sk.ATTR))
    llm = _llm_module(camp)
    config = cache = None
    if llm is not None:
        config = llm.LLMConfig.from_options(opts.llm_base_url, opts.llm_model, opts.llm_api_key)
        cache = llm.ResponseCache(opts.study_dir / camp.name)
    if stored:
        camp.sketches = stored
        camp.console.print(f"{camp.label}: the study's {len(stored)} sketch(es) (resumed)", markup=False)
    else:
        programs = []
        if llm is not None and config.configured and camp.spec.phase == "decode":
            camp.llm_message = "the LLM writes prefill sketches; --phase decode searches the built-in decode sketches"
        elif llm is not None and config.configured and camp.spec.layout != "dense":
            camp.llm_message = (f"the LLM writes dense sketches; --layout {camp.spec.layout} searches the built-in "
                                "warp-specialised sketches in its layout")
        elif llm is not None and config.configured:
            programs = llm.generate_programs(config, camp.profile, camp.spec, cache, count=opts.llm_sketches)
            camp.llm_message = (f"{len(programs)} sketch variant(s) from {config.model}" if programs else
                                f"no usable sketch from {config.model}: the built-in sketches only")
        elif llm is not None:
            camp.llm_message = f"{config.not_configured_reason}; the built-in sketches only"
        bases = [name for name, _ in default_sketches(camp.space, camp.profile, camp.spec.d_qk, camp.spec.dtype)]
        camp.sketches = sk.campaign_sketches(camp.spec.variant, camp.spec.causal, bases, programs, camp.spec.layout,
                                             camp.spec.phase, camp.spec.features)
        camp.study.set_user_attr(sk.ATTR, sk.to_attr(camp.sketches))
        if camp.llm_message:
            camp.console.print(f"sketches: {camp.llm_message}", markup=False)
    camp.programs = sk.parsed(camp.sketches)
    camp.program_texts = {s.name: s.text for s in camp.sketches}
    camp.feasible = feasible_space(camp.space, camp.profile, camp.spec.d_qk, camp.spec.dtype, camp.combo.shapes(),
                                   tuple((s.name, s.base) for s in camp.sketches), camp.spec.layout,
                                   camp.combo.page_size, camp.spec.kv_dtype)
    if llm is not None and camp.spec.phase == "decode":
        camp.console.print("seeds: the decode space's own (search_spaces/decode/); the LLM proposes prefill "
                           "parameters", markup=False)
    elif llm is not None:
        camp.llm_seeds = llm.propose_params(config, camp.profile, camp.spec, camp.program_text, 8, cache)
        sources = sorted({s.source for s in camp.llm_seeds})
        camp.console.print(f"seeds: {len(camp.llm_seeds)} from {', '.join(sources) or 'nowhere'}"
                           + ("" if config.configured else " (no LLM endpoint configured: profile-derived seeds)"))


def _llm_module(camp: Campaign):
    try:
        import tuner.llm as llm
    except ImportError as exc:
        if not camp.fake_compile:
            raise BackendError(f"the LLM/sketch stage (tuner.llm) is not available: {exc}") from None
        camp.console.print("sketch stage unavailable: replay backend runs with the built-in sketches and the "
                           "search space's seeds")
        return None
    return llm


def _enqueue_seeds(camp: Campaign) -> None:
    """The LLM's seeds first, then the search space's FA2/FA3/FA4 seeds (the profile's own schedule first),
    then the profile's stand-ins; each once and only if valid; once per study."""
    study = camp.study
    if study.user_attrs.get(st.SEEDS_ATTR):
        return
    hd, dt = camp.spec.d_qk, camp.spec.dtype
    cls = camp.space.params_class()           # KernelParams, or DecodeParams for a decode space
    decode = camp.spec.phase == "decode"
    proposals = [(s.params.to_dict(), s.source, getattr(s, "rationale", "")) for s in camp.llm_seeds]
    published = []
    if not decode and camp.spec.layout != "dense":
        published += serving_default_seeds(camp.profile, camp.spec, camp.combo.page_size)
    if not decode and camp.spec.layout == "dense":
        published += per_spec_default_seed(camp.profile, camp.spec)
        published += bucket_default_seeds(camp.profile, camp.spec)
    from_scratch = tables_hidden()
    for seed in camp.space.seeds_for(hd, camp.spec.kv_dtype, dt):
        if from_scratch and seed.source.startswith(MEASURED_SEED_PREFIX):
            continue          # a developer's A/B result: not seeded when the campaign is to find the defaults itself
        raw = dict(seed.params)
        schedule = raw.pop(SCHEDULE, "decode" if decode else "fa2")
        full = {**cls(**raw).to_dict(), SCHEDULE: schedule}
        published.append((full, f"search space: {seed.source}", ""))
    # The LLM's proposals first; then the libraries' published choices, those of the profile's own schedule
    # first (on Hopper the warp-specialised ones); then, without an LLM, the profile's FA2-era stand-ins.
    from translate.defaults import default_schedule

    own = default_schedule(camp.profile)
    published.sort(key=lambda p: p[0][SCHEDULE] != own)
    from_llm = [p for p in proposals if p[1] == "llm"]
    offered = from_llm + published + [p for p in proposals if p[1] != "llm"]
    seen: set[str] = set()
    count = other_schedule = 0
    for params, source, rationale in offered:
        # a seed without a schedule: TMA loads come with the warp-specialised flow, anything else the paper's
        schedule = params.get(SCHEDULE, "ws_overlap" if params.get("g2s_atom") == "SM90_TMA" else "fa2")
        params = {**params, SCHEDULE: schedule}
        key = f"{schedule}:{cls.from_dict({k: v for k, v in params.items() if k != SCHEDULE}).key()}"
        if key in seen:
            continue
        if not decode and camp.spec.layout != "dense" and not schedule.startswith("ws_"):
            other_schedule += 1   # (said once below: not a fault of the seed)
            continue
        if not decode:
            params = serving_seed(params, camp.spec.layout)
        chosen, problems = camp.feasible.project(params, camp.profile, hd, dt, camp.combo.shapes())
        if problems:
            camp.console.print(f"seed {key} ({source}) skipped: {'; '.join(problems)}", markup=False)
            continue
        seen.add(key)
        attrs = {"source": source}
        if rationale:
            attrs["rationale"] = rationale
        study.enqueue_trial(chosen, user_attrs=attrs)
        count += 1
    study.set_user_attr(st.SEEDS_ATTR, True)
    study.set_user_attr("tl_program", camp.program_text)
    study.set_user_attr("tl_programs", camp.program_texts)
    if other_schedule:
        camp.console.print(f"{camp.label}: {other_schedule} seed(s) of the sm80-class schedules left out: the "
                           f"{camp.spec.layout} layout is built by the warp-specialised ones", markup=False)
    camp.console.print(f"{camp.label}: enqueued {count} seed(s)", markup=False)


def serving_default_seeds(profile, spec, page_size) -> list[tuple[dict, str, str]]:
    """A serving layout's seeds as (params, source, rationale): its own default first, what `tune build --layout`
    gives (for a 16-bit paged kernel, the cp.async producer, which the published dense seeds do not have), so the seeds
    a winner must beat include it; then its measured one-bucket neighbours (translate.defaults.serving_seed_changes)
    and, an FP8 paged kernel, its default with the other K copy (cp.async or TMA: fp8_paged_other_k_copy), for the
    re-timing to judge."""
    from translate.defaults import default_params, fp8_paged_other_k_copy, serving_seed_changes

    own_default = default_params(profile, spec, "ws_overlap", page_size=page_size).to_dict()
    seeds = [({**own_default, SCHEDULE: "ws_overlap"}, f"the {spec.layout} layout's default", "")]
    for change in serving_seed_changes(spec):
        seeds.append(({**own_default, **change, SCHEDULE: "ws_overlap"},
                      f"the {spec.layout} layout's default with {json.dumps(change, sort_keys=True)}",
                      "won some serving buckets' mixes, lost others (translate.defaults.serving_seed_changes)"))
    if spec.layout == "paged" and spec.dtype == "fp8":
        change = fp8_paged_other_k_copy(own_default)
        seeds.append(({**own_default, **change, SCHEDULE: "ws_overlap"},
                      f"the {spec.layout} layout's default with {json.dumps(change, sort_keys=True)}",
                      "FP8 K by the other copy (cp.async through the page table or TMA boxes): the default's is "
                      "measured on pages of 16 and 128 only (translate.defaults.fp8_paged_other_k_copy)"))
    return seeds


def tables_hidden() -> bool:
    """`--no-bucket-table`: the campaign starts from the per-spec default alone (tuner/defaults/table.py)."""
    from tuner.defaults.table import tables_dir

    return tables_dir() is None


def per_spec_default_seed(profile, spec) -> list[tuple[dict, str, str]]:
    """The per-spec default (translate.defaults) of a warp-specialised profile, as a seed: the kernel every bucket's
    winner is also re-timed against (winners.py, role "default"), so that a confirmed change to it can become a
    bucket default (`tune defaults`)."""
    from translate.defaults import default_params
    from tuner.defaults.table import applies_to

    if profile.sm < 90 or not applies_to(spec, "ws_overlap"):
        return []
    params = default_params(profile, spec, "ws_overlap")
    return [({**params.to_dict(), SCHEDULE: "ws_overlap"}, DEFAULT_SEED_SOURCE, "")]


def bucket_default_seeds(profile, spec) -> list[tuple[dict, str, str]]:
    """The profile's measured per-bucket defaults (tuner/defaults/table.py) that differ from the per-spec one, as
    (params, source, rationale) seeds: a campaign's winner of a bucket must beat what `tune build --seqlen` gives."""
    from translate.defaults import default_params
    from tuner.defaults.table import bucket_change, group_buckets, load_table
    from tuner.serving.buckets.seqlen import BUCKETS, bucket_name

    if profile.sm < 90 or not load_table(profile.name):
        return []
    base = default_params(profile, spec, "ws_overlap").key()
    return [({**params.to_dict(), SCHEDULE: "ws_overlap"},
             f"{profile.name} default for {','.join(buckets)} (hardware_profiles/bucket_defaults)",
             bucket_change(profile, spec, buckets[0]).measured)
            for params, buckets in group_buckets(profile, spec, [bucket_name(e) for e in BUCKETS])
            if params.key() != base]


def serving_seed(params: dict, layout: str) -> dict:
    """A published (dense) seed for a serving layout: its producer gets the registers the layout's needs
    (translate.defaults.SERVING_PRODUCER_REGS), as the layout's own defaults do; the rest is kept."""
    if layout == "dense" or params.get("g2s_atom") != "SM90_TMA":
        return params
    from translate.defaults import SERVING_PRODUCER_REGS

    return {**params, "producer_regs": max(params.get("producer_regs", 24), SERVING_PRODUCER_REGS[layout])}
