"""Confirmed winners: a bucket's best is stored, and reported as beating the seeds, only after a re-timing.

After the search, per shape bucket (docs/design.md: "a win is a re-timed win"):

* the **challenger** is the verified kernel with the highest single measurement at the bucket's shape (the
  maximum of many noisy numbers: biased upwards);
* its incumbents are the **best seed** of the run (by its single measurement) and the **stored** kernel of
  the bucket (from an earlier run, if any);
* the GPU worker times them again side by side (retime.py: one fresh process, interleaved rounds, the same
  inputs), and the rule (confirm.py) judges each pair from the per-round ratios.

The run's winner of a bucket is the challenger when it is clearly faster than the best seed, else the best
seed: only then do the report and the summary say that the search beat the seeds. The run's winner replaces
the stored kernel only when it is clearly faster than it too (``KernelStore.replace``); otherwise the store
keeps its kernel.

Where a GPU's bucket defaults apply (dense prefill, warp-specialised: tuner/defaults/table.py), the **per-spec
default** (translate.defaults, enqueued as a seed) is timed in the same rounds, and the run's winner is judged
against it too (``vs_default``): a winner confirmed against it is what `tune defaults` turns into the GPU's
table. It decides nothing here. Without a re-timing (it failed, or was not run) nothing is claimed: the best seed is the
run's winner and a stored kernel stays. Nothing is re-timed when the challenger is the best seed itself and
nothing (or the same kernel) is stored.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optuna.trial import TrialState

from . import study as st
from .confirm import DEFAULT_RULE, ConfirmRule, Verdict, verdict_across
from .problems import bucket_of, problem_key, problem_order, record_key

ROLES = ("challenger", "seed", "stored", "default")


@dataclass(frozen=True)
class Contender:
    role: str                      # one of ROLES
    kernel_name: str
    sha256: str                    # of its cubin: the kernel's identity in the store
    tflops: dict                   # "<seqlen>" -> TFLOPS, its own measurement in the campaign (or the record's)
    params: dict
    schedule: str
    source: str                    # "search", a seed's source, or where a stored kernel came from
    trial: int | None = None       # its trial in this study (None: the stored kernel)
    seeded: bool = False           # a seed's trial (study.is_seed)
    stem: str = ""                 # its kernel files (.cubin, .cu, .meta.json) relative to the study dir
    frozen: Any = field(default=None, compare=False, repr=False)   # the FrozenTrial, or the KernelRecord

    def at(self, seqlen: int) -> float | None:
        value = self.tflops.get(str(seqlen))
        return None if value is None else float(value)

    def label(self) -> str:
        where = f"trial {self.trial}" if self.trial is not None else self.source
        return f"{self.kernel_name} ({where})"

    def to_dict(self, seqlen: int) -> dict:
        return {"role": self.role, "kernel_name": self.kernel_name, "trial": self.trial, "source": self.source,
                "seeded": self.seeded, "schedule": self.schedule, "params": self.params, "sha256": self.sha256,
                "tflops": self.at(seqlen), "stem": self.stem}


@dataclass(frozen=True)
class Contest:
    bucket: str
    problem: Any                   # the benchmark shape the challenger won the bucket at
    challenger: Contender
    seed: Contender | None         # None: the challenger is the best seed, or no seed passed verification
    stored: Contender | None       # None: nothing stored for the bucket
    default: Contender | None = None   # the per-spec default's trial (None: no bucket defaults here, or it failed)

    def contenders(self) -> list[Contender]:
        return [c for c in (self.challenger, self.seed, self.stored, self.default) if c is not None]

    def timed(self) -> list[Contender]:
        """The distinct kernels to time (the stored kernel may be this run's challenger or seed)."""
        seen, out = set(), []
        for c in self.contenders():
            if c.sha256 not in seen:
                seen.add(c.sha256)
                out.append(c)
        return out

    def needs_retiming(self) -> bool:
        return len(self.timed()) > 1


@dataclass(frozen=True)
class Decision:
    contest: Contest
    winner: Contender              # this run's winner of the bucket: the challenger or the best seed
    vs_seed: Verdict | None        # the challenger against the best seed (re-timed)
    vs_stored: Verdict | None      # the run's winner against the stored kernel (re-timed)
    store: bool                    # write the winner: nothing is stored, or it beat the stored kernel
    note: str                      # the decision in words
    retimed: dict | None = None    # the re-timing's result (retime.py), None without one
    vs_default: Verdict | None = None   # the run's winner against the per-spec default (re-timed; module doc)
    runs: tuple = ()               # every fresh process's re-timing ({role: [ms per round]}), for the records

    @property
    def search_beat_seeds(self) -> bool:
        return self.vs_seed is not None and self.vs_seed.confirmed and self.winner.role == "challenger"

    def to_dict(self) -> dict:
        c, seqlen = self.contest, problem_key(self.contest.problem)
        retimed = None
        if self.retimed:
            lock = self.retimed.get("gpu_lock") or {}
            retimed = {"tflops": self.retimed.get("tflops"), "failed": self.retimed.get("failed") or {},
                       "rounds": len(self.retimed.get("order") or []), "pid": self.retimed.get("pid"),
                       "pids": self.retimed.get("pids"),
                       "held_s": round(lock["released_at"] - lock["acquired_at"], 3)
                       if lock.get("released_at") and lock.get("acquired_at") else None}
        from dataclasses import asdict

        return {"bucket": c.bucket, "seqlen": seqlen, "problem": asdict(c.problem),
                **{role: (getattr(c, role).to_dict(seqlen) if getattr(c, role) else None) for role in ROLES},
                "winner": self.winner.role, "winner_trial": self.winner.trial,
                "vs_seed": self.vs_seed.to_dict() if self.vs_seed else None,
                "vs_stored": self.vs_stored.to_dict() if self.vs_stored else None,
                "vs_default": self.vs_default.to_dict() if self.vs_default else None,
                "search_beat_seeds": self.search_beat_seeds, "store": self.store, "note": self.note,
                "retimed": retimed, "ms_per_process": [self.times_of(run) for run in self.runs] or None}

    def times_of(self, run: dict) -> dict:
        """One process's per-round times by role (a role that is another's kernel gets its times)."""
        twins = {cont.role: next(x for x in self.contest.timed() if x.sha256 == cont.sha256).role
                 for cont in self.contest.contenders()}
        return {role: (run.get("ms") or {}).get(twin) for role, twin in twins.items()}


# ---- the contests ----------------------------------------------------------------------------------------

def verified(study) -> list:
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if (t.user_attrs.get("verification") or {}).get("passed") is True]


def best_per_bucket(study, problems) -> dict[str, tuple]:
    """Bucket -> (trial, problem, tflops): the highest single measurement at each benchmark shape's bucket
    among the verified trials measured in full."""
    best: dict[str, tuple] = {}
    trials = verified(study)
    for problem in problems:
        bucket = bucket_of(problem)
        for t in trials:
            tf = (t.user_attrs.get("tflops") or {}).get(problem_key(problem))
            if tf is not None and (bucket not in best or tf > best[bucket][2]):
                best[bucket] = (t, problem, float(tf))
    return best


def trial_stem(camp, t) -> Path:
    """A trial's kernel files (.cubin, .cu, .meta.json): a cache hit's may be another study's of the dir."""
    if t.user_attrs.get("kernel_stem"):
        return camp.options.study_dir / t.user_attrs["kernel_stem"]
    return camp.kernels_dir / t.user_attrs["kernel_name"]


def _from_trial(camp, t, role: str) -> Contender:
    stem = trial_stem(camp, t)
    cubin = stem.with_suffix(".cubin").read_bytes()
    return Contender(role, t.user_attrs["kernel_name"], hashlib.sha256(cubin).hexdigest(),
                     dict(t.user_attrs.get("tflops") or {}), dict(t.user_attrs.get("kernel_params") or t.params),
                     t.user_attrs.get("schedule", ""), str(t.user_attrs.get("source") or "search"), t.number,
                     st.is_seed(t), str(stem.relative_to(camp.options.study_dir)), t)


def _from_record(record) -> Contender:
    return Contender("stored", record.kernel_name, record.kernel_sha256,
                     {record_key(record.problem): record.tflops}, dict(record.params), record.sketch,
                     f"stored: study {record.study}, trial {record.trial}", None, False, "", record)


def stored_records(camp) -> dict:
    """The store's kernels of this combination's spec, by bucket ({} when the store cannot be read)."""
    from tuner.store.records import KernelStore, StoreError

    spec = camp.spec
    try:
        return KernelStore(camp.options.study_dir).best(camp.profile.arch_family, spec.variant, spec.dtype,
                                                        spec.d_qk, spec.d_v, spec.causal, spec.layout, spec.phase,
                                                        spec.features, spec.kv_dtype)
    except (StoreError, OSError) as exc:
        camp.console.print(f"[yellow]{camp.label}: the stored kernels cannot be read ({exc}); the buckets' "
                           "winners are compared with this run's seeds only[/]")
        return {}


def default_identity(profile, spec) -> tuple[str, str] | None:
    """The per-spec default's (schedule, KernelParams key) where bucket defaults apply, else None."""
    from tuner.defaults.table import applies_to

    if profile.sm < 90 or not applies_to(spec, "ws_overlap"):
        return None
    from translate.defaults import default_params

    return "ws_overlap", default_params(profile, spec, "ws_overlap").key()


def trial_identity(t) -> tuple:
    """A trial's (schedule, KernelParams key), as the loop recorded them when it asked for the trial."""
    return t.user_attrs.get("schedule"), t.user_attrs.get("params_key")


def contests(camp, best: dict) -> list[Contest]:
    """One contest per bucket with a verified kernel (see the module doc)."""
    verified_trials = verified(camp.study)
    seeds = [t for t in verified_trials if st.is_seed(t)]
    stored = stored_records(camp)
    identity = default_identity(camp.profile, camp.spec)
    defaults = [t for t in verified_trials if identity is not None and trial_identity(t) == identity]
    out = []
    for bucket, (t, problem, _) in sorted(best.items(), key=lambda kv: problem_order(kv[1][1])):
        key = problem_key(problem)
        challenger = _from_trial(camp, t, "challenger")
        seed = None
        if not challenger.seeded:
            at = [s for s in seeds if (s.user_attrs.get("tflops") or {}).get(key) is not None]
            if at:
                seed = _from_trial(camp, max(at, key=lambda s: float(s.user_attrs["tflops"][key])), "seed")
        default = None
        at = [d for d in defaults if (d.user_attrs.get("tflops") or {}).get(key) is not None]
        if at:
            default = _from_trial(camp, at[0], "default")
        record = stored.get(bucket)
        out.append(Contest(bucket, problem, challenger, seed, _from_record(record) if record else None, default))
    return out


# ---- the decision (pure) ----------------------------------------------------------------------------------

def decide(contest: Contest, retimed: dict | list[dict] | None, error: str | None = None,
           rule: ConfirmRule = DEFAULT_RULE) -> Decision:
    """The bucket's decision from its re-timings (``retimed``: retime.py's result, one per fresh process: a
    verdict must hold in each, confirm.verdict_across), or without one (``error`` says why; None when none
    was needed)."""
    c, s, k = contest.challenger, contest.seed, contest.stored
    runs = [retimed] if isinstance(retimed, dict) else list(retimed or [])
    if not runs:
        winner = s if s is not None else c
        if s is not None:
            base = f"not re-timed ({error}): the best seed stands"
        else:
            base = "the challenger is the best seed" if c.seeded else "no seed passed verification to compare with"
        if k is None:
            return Decision(contest, winner, None, None, True, f"{base}; the store held nothing for the bucket: stored")
        if k.sha256 == winner.sha256:
            return Decision(contest, winner, None, None, False, f"{base}; already stored")
        return Decision(contest, winner, None, None, False, f"{base}; not re-timed against the stored kernel "
                                                            f"({error}): it stays")
    failed = {role: why for run in runs for role, why in (run.get("failed") or {}).items()}
    # a role that is another's kernel shares its times
    timed_as = {cont.role: next(x for x in contest.timed() if x.sha256 == cont.sha256).role
                for cont in contest.contenders()}
    per_run = [{role: run.get("ms", {}).get(twin) for role, twin in timed_as.items()} for run in runs]

    def timed(role: str) -> bool:
        return all(times[role] for times in per_run)

    def against(role: str, incumbent: str) -> Verdict:
        return verdict_across([(times[role], times[incumbent]) for times in per_run], rule)

    record = {**runs[0], "pids": [run.get("pid") for run in runs]}
    where = f" ({len(runs)} fresh processes)" if len(runs) > 1 else ""
    notes = []
    vs_seed = None
    winner = c
    if s is not None:
        if timed("challenger") and timed("seed"):
            vs_seed = against("challenger", "seed")
            winner = c if vs_seed.confirmed else s
            notes.append(f"challenger {vs_seed.text()} the best seed{where}: "
                         + ("clearly faster" if vs_seed.confirmed else "not clearly faster, the seed stands"))
        elif not timed("challenger"):
            winner = s
            notes.append(f"the challenger could not be timed again ({failed.get('challenger', 'no times')}): "
                         "the seed stands")
        else:
            notes.append(f"the best seed could not be timed again ({failed.get('seed', 'no times')})")
    d = contest.default
    vs_default = None
    if d is not None and d.sha256 != winner.sha256 and timed(winner.role) and timed("default"):
        vs_default = against(winner.role, "default")
        notes.append(f"{winner.role} {vs_default.text()} the per-spec default{where}")

    def decided(store: bool, vs_stored: Verdict | None = None, last: str | None = None) -> Decision:
        return Decision(contest, winner, vs_seed, vs_stored, store, "; ".join(notes + ([last] if last else [])),
                        record, vs_default, tuple(runs))

    if k is None:
        return decided(True, last="the store held nothing for the bucket: stored")
    if k.sha256 == winner.sha256:
        return decided(False, last="already stored")
    if not timed("stored"):
        return decided(True, last=f"the stored kernel could not be timed here ({failed.get('stored', 'no times')}): "
                                  "replaced")
    if not timed(winner.role):
        return decided(False, last="the stored kernel stays")
    vs_stored = against(winner.role, "stored")
    return decided(vs_stored.confirmed, vs_stored, f"{winner.role} {vs_stored.text()} the stored kernel{where}: "
                   + ("replaces it" if vs_stored.confirmed else "not clearly faster, the stored kernel stays"))


# ---- the re-timing jobs -----------------------------------------------------------------------------------

def payload(camp, contest: Contest, rule: ConfirmRule) -> dict:
    """The GPU job's payload (retime.py): the contest's distinct kernels, with their cubins and metadata."""
    kernels = []
    for cont in contest.timed():
        if cont.role == "stored":
            cubin, meta = cont.frozen.cubin, cont.frozen.kernel_meta
        else:
            stem = trial_stem(camp, cont.frozen)
            cubin, meta = stem.with_suffix(".cubin").read_bytes(), json.loads(stem.with_suffix(".meta.json").read_text())
        kernels.append({"role": cont.role, "name": cont.kernel_name, "cubin": cubin, "meta": meta,
                        "params": cont.params, "schedule": cont.schedule})
    return {"bucket": contest.bucket, "profile": camp.profile.name, "spec": camp.spec, "problem": contest.problem,
            "rule": rule.to_dict(), "kernels": kernels, "nonce": f"{camp.name}/{contest.bucket}"}


def retime_all(camps, wait_s: float, rule: ConfirmRule = DEFAULT_RULE) -> None:
    """Every combination's contests, re-timed on the GPU workers where needed; each campaign gets
    ``contests`` and ``decisions`` (bucket -> Decision). A re-timing that fails decides nothing."""
    import ray

    pending: dict = {}
    runs: dict = {}       # (campaign name, bucket) -> the re-timings back so far
    for camp in camps:
        camp.contests = contests(camp, best_per_bucket(camp.study, camp.problems))
        camp.decisions = {}
        for contest in camp.contests:
            if not contest.needs_retiming():
                camp.decisions[contest.bucket] = decide(contest, None, None, rule)
                continue
            runs[(camp.name, contest.bucket)] = []
            for process in range(rule.processes):
                job = payload(camp, contest, rule)
                job["nonce"] = f"{job['nonce']}#{process}"
                ref, slot = camp.workers.submit_retime(job, camp.options.trial_timeout, wait_s)
                pending[ref] = (camp, contest, slot)
    if not pending:
        return
    camps[0].console.print(f"re-timing {len(runs)} bucket winner(s) against their incumbents: {rule.rounds} "
                           f"interleaved rounds each, in each of {rule.processes} fresh process(es) on the GPU",
                           markup=False)
    deadline = time.monotonic() + wait_s + camps[0].options.trial_timeout
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not done:
                break
            for ref in done:
                camp, contest, slot = pending.pop(ref)
                camp.workers.release(slot)
                value, error = _outcome(ref)
                if contest.bucket in camp.decisions:   # an earlier process of the contest failed: decided
                    continue
                if value is None:                      # one process without times decides nothing
                    camp.decisions[contest.bucket] = decide(contest, None, error, rule)
                    continue
                got = runs[(camp.name, contest.bucket)]
                got.append(value)
                if len(got) == rule.processes:
                    camp.decisions[contest.bucket] = decide(contest, got, None, rule)
        reason = "no answer in time"
    except KeyboardInterrupt:
        reason = "interrupted"
    for ref, (camp, contest, _) in pending.items():
        ray.cancel(ref, force=True)
        if contest.bucket not in camp.decisions:
            camp.decisions[contest.bucket] = decide(contest, None, reason, rule)


def _outcome(ref) -> tuple[dict | None, str | None]:
    import ray

    try:
        report = ray.get(ref)
    except ray.exceptions.RayError as exc:
        return None, f"GPU worker lost: {type(exc).__name__}"
    if report["outcome"] != "result":
        return None, f"{report['outcome']}: {report['message']}"
    return report["value"], None


def decisions_for(camp) -> dict:
    """The campaign's decisions; buckets not re-timed (a dry run, an interrupted finish) decided without."""
    if getattr(camp, "contests", None) is None:
        camp.contests = contests(camp, best_per_bucket(camp.study, camp.problems))
    decisions = dict(getattr(camp, "decisions", None) or {})
    for contest in camp.contests:
        if contest.bucket not in decisions:
            decisions[contest.bucket] = decide(contest, None, "the re-timing did not run" if
                                               contest.needs_retiming() else None)
    return decisions
