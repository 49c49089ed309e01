"""After the loop: store each bucket's confirmed winner (winners.py), write the report, print the table."""
from __future__ import annotations

import json
import time
from pathlib import Path

from optuna.trial import TrialState

from . import study as st
from .confirm import DEFAULT_RULE
from .winners import decisions_for, trial_stem
from .problems import bucket_of, is_decode, is_dense, problem_key, problem_order


def trial_rows(study) -> list[dict]:
    """The study's trials as tuner.campaign.report's plain dicts."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("cache_hit"):
            state = "cached"
        elif t.state == TrialState.COMPLETE:
            state = "complete"
        elif t.state == TrialState.PRUNED:
            if st.is_infeasible(t):
                state = "infeasible"
            else:   # stopped early (probed, far behind), or a dry run's compiled-but-unmeasured candidate
                state = "stopped early" if t.user_attrs.get("early_stop") else "complete"
        elif t.state == TrialState.FAIL:   # a duplicate of a kernel that was not measured is no failure of its own
            state = "duplicate" if t.user_attrs.get("duplicate_of") is not None else "failed"
        else:
            state = "running"
        rows.append({"number": t.number, "state": state, "tflops": t.value if t.state == TrialState.COMPLETE else None,
                     "reason": t.user_attrs.get("infeasible_reason") or t.user_attrs.get("infra_failure"),
                     "params": t.user_attrs.get("kernel_params", t.params), "source": t.user_attrs.get("source", "search")})
    return rows


def finish_all(camps) -> int:
    """Finish every combination of the run; with several, also the run's report (a table per combination).
    Exit code 0 when every combination has a verified kernel (or, dry run, a compiled one), else 1. The last line
    says what to do next (next_step)."""
    codes = [finish(c) for c in camps]
    report = camps[0].report if len(camps) == 1 else None
    if len(camps) > 1:
        from tuner.campaign.report import write_campaign_report

        sections = []
        for c, code in zip(camps, codes):
            summary = json.loads((c.options.study_dir / c.name / SUMMARY_FILE).read_text())
            sections.append({"label": c.label, "study": c.name, "summary": summary, "ok": code == 0,
                             "exhausted": c.exhausted})
        path = write_campaign_report(camps[0].options.study_dir, camps[0].profile.name, sections)
        camps[0].console.print(f"campaign report ({len(camps)} combinations): {path}")
        report = path
    code = 0 if all(code == 0 for code in codes) else 1
    camps[0].console.print(next_step(camps, code, report), markup=False, soft_wrap=True)
    return code


def next_step(camps, code: int, report) -> str:
    """The run's last line: what to do after it. A dry run that compiled: the same command on a machine with the
    GPU; one that compiled nothing: `tune build`, which shows nvcc's log. A campaign that stored kernels: `tune
    export`, and where the report is; one that verified nothing: the report, which says why."""
    opts, profile = camps[0].options, camps[0].profile
    target = f"--model {opts.model}" if opts.model else f"--variant {opts.variant}"
    if opts.dtype:   # (the rest of the combination's flags as given: the same command)
        target += f" --dtype {opts.dtype}"
    if opts.layout != "dense":
        target += f" --layout {opts.layout}"
    if opts.page_size is not None:   # (a paged campaign needs it: tuner.campaign.options)
        sizes = opts.page_size if isinstance(opts.page_size, tuple) else (opts.page_size,)
        target += f" --page-size {','.join(map(str, sizes))}"
    if opts.phase != "prefill":
        target += f" --phase {opts.phase}"
    if getattr(opts, "kv_dtype", None):
        target += f" --kv-dtype {opts.kv_dtype}"
    study_dir = opts.study_dir
    if opts.dry_run:
        if code == 0:
            return (f"next: on a machine with the GPU ({profile.display_name}), run the same command without "
                    f"--dry-run (tune --gpu {profile.name} {target} --study-dir {study_dir}); this dry run's kernels "
                    f"are in {study_dir / camps[0].name / 'compiled'}")
        return (f"next: no candidate compiled; tune build --gpu {profile.name} --variant {camps[0].spec.variant} "
                "-o out/ builds the default kernel alone and shows nvcc's log")
    if code == 0:
        return (f"next: tune export --gpu {profile.name} --study-dir {study_dir} -o exported/ (the stored kernels, "
                f"for serving); report: {report}")
    return f"next: a combination has no verified kernel; the report says why each candidate failed: {report}"


def tally_counts(tally) -> dict:
    """The counts the live line shows (liveview.counts_text), from the run's tally."""
    return {"done": tally.done, "infeasible": tally.infeasible, "failed": tally.failed, "rejected": tally.rejected,
            "cached": tally.cached}


def counts_line(tally, prefix: str = "trials") -> str:
    """The run's counts in the live line's words; a failure says what it was (the live line has no room)."""
    from tuner.campaign.liveview import counts_text

    line = f"{prefix} {counts_text(tally_counts(tally))}"
    if tally.failed:
        line += (f" ({tally.failed} failed: lost to the infrastructure (a compile task or a GPU worker died) or "
                 "left when the run stopped; queued again for --resume)")
    return line


def finish(camp) -> int:
    study, tally, console = camp.study, camp.tally, camp.console
    opts = camp.options
    console.print(f"— {camp.label} ({camp.name})", markup=False)
    if opts.dry_run:   # done: compiled (nothing is measured); the counts are the live line's
        console.print(f"dry run: {counts_line(tally)}; done = compiled, nothing measured or stored "
                      f"(in {_minutes(time.monotonic() - camp.started)})", markup=False, soft_wrap=True)
        camp.report = write_summary(camp, study, tally, [], None, opts.study_dir / camp.name / SUMMARY_FILE)
        return 0 if tally.done else 1
    decisions = decisions_for(camp)
    stored = _store(camp, study, decisions)
    rows = _bench_rows(camp, decisions)
    from tuner.campaign.report import final_table, write_report

    report_dir = opts.study_dir / camp.name
    top = _top_record(camp, stored, decisions)
    winners = [d.to_dict() for d in sorted(decisions.values(), key=lambda d: problem_order(d.contest.problem))]
    path = write_report(report_dir, trial_rows(study), top, rows, winners)
    summary = write_summary(camp, study, tally, rows, top, report_dir / SUMMARY_FILE, decisions)
    if rows:
        console.print(final_table(rows))
    for d in winners:
        console.print(f"  {d['bucket']}: {_winner_text(d)}", markup=False)
    console.print(counts_line(tally), markup=False, soft_wrap=True)
    console.print(f"report: {path}; summary: {summary}")
    camp.report = path
    if not decisions:
        console.print("[red]no candidate passed verification: nothing stored[/]")
        return 1
    console.print(f"stored {len(stored)} new best kernel(s) under {opts.study_dir / 'kernels'} "
                  f"({len(decisions) - len(stored)} bucket(s) kept the stored kernel)")
    return 0


def _minutes(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}:{s:02d} min"


def _winner_text(d: dict) -> str:
    """A bucket's decision in one line (the report's table says the same)."""
    who = d[d["winner"]]
    text = f"{who['kernel_name']} (trial {who['trial']}, {'search' if d['search_beat_seeds'] else who['source']})"
    return f"{text}: {d['note']}"


SUMMARY_FILE = "summary.json"


def _top_record(camp, stored: list, decisions: dict):
    """The fastest kernel of this spec: one stored now, else the stored one that this run did not beat."""
    if stored:
        return max(stored, key=lambda r: r.tflops)
    if not decisions:
        return None
    from tuner.store.records import KernelStore, StoreError

    spec = camp.spec
    try:
        kept = KernelStore(camp.options.study_dir).best(camp.profile.arch_family, spec.variant, spec.dtype,
                                                         spec.d_qk, spec.d_v, spec.causal, spec.layout, spec.phase,
                                                         spec.features, spec.kv_dtype)
    except (StoreError, OSError):
        return None
    return max(kept.values(), key=lambda r: r.tflops) if kept else None


def write_summary(camp, study, tally, rows: list[dict], top, path: Path, decisions: dict | None = None) -> Path:
    """The run in numbers, for scripts and BENCHMARKS.md: counts, time, trials per GPU-hour, GPU
    occupancy, and ours against the libraries per benchmark shape."""
    from tuner.measure.dense import BASELINES

    n_gpus = camp.pool.gpus if camp.pool else 0
    finished_now = tally.told                      # feasible + infeasible trials finished in this run
    gpu_hours = tally.elapsed * n_gpus / 3600
    stage_totals: dict[str, float] = {}
    for t in study.get_trials(deepcopy=False):
        for stage, sec in (t.user_attrs.get("stage_seconds") or {}).items():
            stage_totals[stage] = round(stage_totals.get(stage, 0.0) + float(sec), 2)
    ratios = []
    for r in rows:
        ratio = {k: (round(r["ours"] / r[k], 3) if r.get("ours") and r.get(k) else None) for k in BASELINES}
        ratios.append({**r, "ratios": ratio})
    data = {
        "study": camp.name, "gpu": camp.profile.name, "device_name": camp.device_name or None,
        "backend": camp.backend.label, "gpus": n_gpus, "gpu_overlap": camp.options.gpu_overlap,
        "combination": camp.label, "spec": camp.spec.to_dict(), "sketches": [s.name for s in camp.sketches],
        "trials": {"done": tally.done, "infeasible": tally.infeasible, "failed": tally.failed,
                   "rejected_before_compile": tally.rejected, "cache_hits": tally.cached,
                   "finished_this_run": finished_now, "measured_this_run": tally.measured,
                   "compiled_unmeasured_at_stop": tally.unmeasured, "in_study": len(study.trials),
                   "converged": camp.exhausted},
        "measured_fraction": round(tally.measured / finished_now, 3) if finished_now else None,
        "remeasured": remeasured(study),
        "search_vs_seeds": search_vs_seeds(decisions or {}),
        "winners": [d.to_dict() for d in sorted((decisions or {}).values(), key=lambda d: problem_order(d.contest.problem))],
        "confirm_rule": DEFAULT_RULE.to_dict(),
        "early_stop": early_stop_summary(study, camp.options),
        "elapsed_s": round(tally.elapsed, 1),
        "gpu_held_s": round(tally.gpu_busy, 1),       # under the GPU lock: verify + benchmark
        "gpu_held_fraction": round(tally.gpu_busy / (tally.elapsed * n_gpus), 3) if n_gpus and tally.elapsed else None,
        "trials_per_gpu_hour": round(finished_now / gpu_hours, 1) if gpu_hours > 0 else None,
        "measured_per_gpu_hour": round(tally.measured / gpu_hours, 1) if gpu_hours > 0 else None,
        "steady_state": steady_state(tally.lock_spans),
        "compile_pipeline": compile_pipeline(study, tally, n_gpus),
        "driver": tally.driver,
        "stage_seconds": stage_totals,
        "timing": camp.options.timing(),
        "best": None if top is None else {"kernel_name": top.kernel_name, "trial": top.trial, "bucket": top.bucket,
                                          "tflops": top.tflops, "params": top.params,
                                          "kernel_sha256": top.kernel_sha256},
        "best_tflops_geomean": tally.best or None, "best_trial": tally.best_trial,
        "rows": ratios,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return path


def compile_pipeline(study, tally, n_gpus: int) -> dict | None:
    """Whether compiles kept up with the GPUs: per compiled kernel, its batch's latency (submit to result),
    the part of it spent waiting for a CPU, its share of nvcc's time; kernels compiled per second over the
    loop against the kernels per second the GPUs take (GPUs / their mean hold per trial)."""
    rows = [t.user_attrs["compile"] for t in study.get_trials(deepcopy=False) if t.user_attrs.get("compile")]
    if not rows:
        return None
    n = len(rows)
    holds = [released - acquired for _, acquired, released, *_ in tally.lock_spans]
    take_rate = n_gpus / (sum(holds) / len(holds)) if holds and n_gpus and sum(holds) > 0 else None
    return {"kernels": n, "nvcc_cached": sum(1 for r in rows if r.get("nvcc_cached")),
            "mean_batch": round(sum(r["batch"] for r in rows) / n, 2),
            "latency_s": round(sum(r["wall_s"] for r in rows) / n, 2),
            "cpu_wait_s": round(sum(max(0.0, r["wall_s"] - r["task_s"]) for r in rows) / n, 2),
            "nvcc_s_per_kernel": round(sum(r["unit_nvcc_s"] / max(1, r["unit_kernels"]) for r in rows) / n, 2),
            "compiled_per_s": round(n / tally.elapsed, 3) if tally.elapsed else None,
            "gpus_take_per_s": round(take_rate, 3) if take_rate else None}


def remeasured(study) -> int:
    """Measurements of a kernel the study had measured already (the cache should make this 0)."""
    keys = [t.user_attrs.get("measurement_key") for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get("pid") and t.user_attrs.get("measurement_key")]   # reached a GPU, any outcome
    return len(keys) - len(set(keys))


def search_vs_seeds(decisions: dict) -> list[dict]:
    """Per bucket: the run's best single measurement against the best seed's (the LLM's or the libraries'
    published choices) and what re-timing both side by side said; ``search_beat_seeds`` only where the
    challenger was clearly faster (confirm.py)."""
    out = []
    for d in sorted(decisions.values(), key=lambda d: problem_order(d.contest.problem)):
        c, seed, seqlen = d.contest.challenger, d.contest.seed, problem_key(d.contest.problem)
        best_seed = c if c.seeded else seed
        single = c.at(seqlen) / best_seed.at(seqlen) if best_seed is not None and best_seed.at(seqlen) else None
        out.append({"seqlen": seqlen, "bucket": d.contest.bucket, "best": c.at(seqlen), "best_trial": c.trial,
                    "best_is_seed": c.seeded, "best_schedule": c.schedule, "best_params": c.frozen.user_attrs.get(
                        "params_key") if c.frozen is not None else None,
                    "best_seed": best_seed.at(seqlen) if best_seed else None,
                    "best_seed_trial": best_seed.trial if best_seed else None,
                    "ratio": round(single, 4) if single else None,      # single measurements: not a claim
                    "retimed": d.vs_seed.to_dict() if d.vs_seed else None,
                    "search_beat_seeds": d.search_beat_seeds})
    return out


def early_stop_summary(study, options) -> dict:
    """How many measured trials stopped after their probe (earlystop.py) and the GPU time that saved: the
    mean lock hold of a trial measured in full minus a stopped one's, per stopped trial."""
    from .earlystop import DEFAULT_EARLY_STOP

    held: dict[str, list[float]] = {"stopped": [], "full": []}
    for t in study.get_trials(deepcopy=False):
        lock = t.user_attrs.get("gpu_lock")
        if not lock or not lock.get("released_at") or t.user_attrs.get("cache_hit"):
            continue
        if t.user_attrs.get("early_stop"):
            held["stopped"].append(lock["released_at"] - lock["acquired_at"])
        elif t.state == TrialState.COMPLETE:
            held["full"].append(lock["released_at"] - lock["acquired_at"])
    mean = {k: (sum(v) / len(v) if v else None) for k, v in held.items()}
    saved = (len(held["stopped"]) * (mean["full"] - mean["stopped"])
             if mean["full"] is not None and mean["stopped"] is not None else None)
    return {"enabled": options.early_stop, "rule": DEFAULT_EARLY_STOP.to_dict(), "stopped": len(held["stopped"]),
            "measured_in_full": len(held["full"]),
            "mean_held_s": {k: (round(v, 3) if v is not None else None) for k, v in mean.items()},
            "saved_gpu_s": round(saved, 1) if saved is not None else None}


# A trial that waited this long for its GPU's lock found the pipeline full: another trial was ready.
SATURATED_WAIT_S = 0.05


def steady_state(spans: list) -> dict | None:
    """GPU occupancy from this run's lock spans ``(gpu, acquired_at, released_at, waited_s)`` (host clock):

    * the window from each GPU's first lock to its last release, and the share of it some trial held the
      lock (verify + benchmark); the loop-wide share also counts the start (Ray, sketch, baselines, the
      first compile) and the drain;
    * ``saturated``: the same from the first trial on that GPU that had to wait for the lock, i.e. once
      compiles and trial start-ups ran ahead of the GPU. Idle time there is a bubble in the pipeline."""
    by_gpu: dict[str, list[tuple[float, float, float]]] = {}
    for gpu, acquired, released, *waited in spans:
        by_gpu.setdefault(gpu, []).append((acquired, released, float(waited[0]) if waited else 0.0))
    if not by_gpu:
        return None
    out = _occupancy(list(by_gpu.values()))
    saturated = []
    for intervals in by_gpu.values():
        intervals.sort()
        first = next((i for i, (_, _, w) in enumerate(intervals) if w >= SATURATED_WAIT_S), None)
        if first is not None:
            saturated.append(intervals[first:])
    out["saturated"] = _occupancy(saturated) if saturated else None
    return out


def _occupancy(per_gpu: list[list[tuple]]) -> dict:
    window = held = 0.0
    trials = 0
    for intervals in per_gpu:
        window += max(r for _, r, _ in intervals) - min(a for a, _, _ in intervals)
        held += sum(r - a for a, r, _ in intervals)
        trials += len(intervals)
    return {"gpus": len(per_gpu), "trials": trials, "window_s": round(window, 1), "held_s": round(held, 1),
            "held_fraction": round(held / window, 3) if window > 0 else None,
            "measured_per_gpu_hour": round(trials / (window / 3600), 1) if window > 0 else None,
            "from": min(a for iv in per_gpu for a, _, _ in iv),        # host clock (time.time())
            "to": max(r for iv in per_gpu for _, r, _ in iv)}


def _store(camp, study, decisions: dict) -> list:
    """Write each bucket's winner that the decision says to store, in place of the kernel the decision was
    taken against (KernelStore.replace)."""
    from tuner.store.provenance import collect
    from tuner.store.records import KernelRecord, KernelStore, StoreError

    store = KernelStore(camp.options.study_dir)
    device = camp.device_name or camp.profile.display_name
    provenance = collect(camp.profile, device_name=device)
    provenance["backend"] = camp.backend.kind if camp.backend.kind == "gpu" else f"replay ({Path(camp.backend.path).name})"
    default_program = camp.program_text or study.user_attrs.get("tl_program", "")
    programs = camp.program_texts or study.user_attrs.get("tl_programs", {})
    stored = []
    for bucket, d in sorted(decisions.items(), key=lambda kv: problem_order(kv[1].contest.problem)):
        if not d.store:
            continue
        t, problem = d.winner.frozen, d.contest.problem
        sketch = t.user_attrs.get("schedule", "")
        tl_program = programs.get(sketch, default_program)   # the trial's own sketch
        stem = trial_stem(camp, t)
        confirmation = {k: v for k, v in d.to_dict().items() if k in ("vs_seed", "vs_stored", "note", "seed", "stored",
                                                                       "search_beat_seeds")}
        record = KernelRecord(
            arch=camp.profile.arch_family, gpu=camp.profile.name, device_name=t.user_attrs.get("device_name") or device,
            variant=camp.spec.variant, dtype=camp.spec.dtype, d_qk=camp.spec.d_qk, d_v=camp.spec.d_v,
            causal=camp.spec.causal, bucket=bucket, params=t.user_attrs["kernel_params"], kernel_name=d.winner.kernel_name,
            kernel_meta=json.loads(stem.with_suffix(".meta.json").read_text()),
            source=stem.with_suffix(".cu").read_text(), cubin=stem.with_suffix(".cubin").read_bytes(),
            tl_program=tl_program, verification=t.user_attrs["verification"], tflops=d.winner.at(problem_key(problem)),
            baselines=dict(camp.baselines.get(problem_key(problem), {})), problem=_problem_dict(problem),
            provenance=provenance, study=camp.name, trial=t.number, sketch=sketch,
            confirmation={**confirmation, "rule": DEFAULT_RULE.to_dict()}, layout=camp.spec.layout,
            phase=camp.spec.phase)
        expected = d.contest.stored.sha256 if d.contest.stored is not None else None
        try:
            if store.replace(record, expected):
                stored.append(record)
            else:
                camp.console.print(f"[yellow]bucket {bucket}: not stored: the store's kernel changed while this run "
                                   "decided (another campaign stored one)[/]")
        except StoreError as exc:  # one unusable record must not lose the others or the report
            camp.console.print(f"[red]bucket {bucket}: not stored: {exc}[/]")
    return stored


def _problem_dict(problem) -> dict:
    from dataclasses import asdict

    if is_decode(problem):   # its layout, bytes and name beside the fields
        return problem.to_dict()
    return asdict(problem)


def _bench_rows(camp, decisions: dict) -> list[dict]:
    """Per benchmark shape: this run's winner of its bucket against the libraries, same run; ``<library>_err``
    says why a library has no number (FA4 not installed, a shape it cannot run)."""
    from .backends import baseline_names

    rows = []
    for problem in camp.problems:
        d = decisions.get(bucket_of(problem))
        if d is None:
            continue
        key = problem_key(problem)
        base = camp.baselines.get(key, {})
        errors = camp.baseline_errors.get(key, {})
        BASELINES = baseline_names([problem])
        rows.append({"seqlen": problem.seqlen_k if is_dense(problem) else key, "causal": problem.causal,
                     "ours": d.winner.at(key),
                     **({} if is_dense(problem) else {"bucket": problem.bucket}),
                     **{name: base.get(name) for name in BASELINES},
                     **{f"{name}_err": errors[name] for name in BASELINES if errors.get(name)},
                     "trial": d.winner.trial})
    return rows
