"""The Optuna study of a campaign: name, storage, sampler, resume, and how results are told.

Infeasible candidates (invalid, compile error, wrong result, crash, timeout) are told PRUNED with a
positive constraint (``trial.set_constraint``; Optuna 5 deprecates ``constraints_func`` and TPE reads
the trial's constraints directly), so TPE ranks them below every feasible trial and learns to avoid
the region. The constraint is also kept in ``user_attrs["constraint"]`` with the reason in
``user_attrs["infeasible_reason"]``. FAIL is only for infrastructure failures (TPE ignores FAIL); their
parameters go back into the queue.
"""
from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import optuna
from optuna.storages import JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from .distinct import DistinctHistorySampler
from .journal import JournalError, check_journal
from .options import SAMPLERS

INFEASIBLE = "infeasible"      # the constraint key
SEEDS_ATTR = "seeds_enqueued"
NEIGHBOUR_SOURCE = "neighbour of re-proposed trial"   # the source of a trial the loop enqueued (loop.py)
# How far from a re-proposed kernel the loop looks for one not asked yet: any distance, nearest first. Within one
# choice, the neighbours around TPE's favourites run out late in a campaign, and TPE over the study's distinct
# measurements (distinct.py) then repeats itself for good: on the measured H100 grid it stalled at 50-150
# kernels (3 seeds) with one or three choices allowed; with any, it measured 250 in 466 asks.
NEIGHBOUR_MAX_DISTANCE = None


# Enqueued trials that are not seeds: a retry, a redo after a kill, the loop's neighbour of a re-proposal.
NOT_SEEDS = ("retry of", "redo of", NEIGHBOUR_SOURCE)


def is_seed(trial) -> bool:
    """A trial of the seeds (the LLM's proposals, the libraries' published choices, the profile's stand-ins):
    enqueued with a source that is none of NOT_SEEDS. The search's own proposals have no source."""
    source = str(trial.user_attrs.get("source") or "")
    return bool(source) and not source.startswith(NOT_SEEDS)


class StudyError(RuntimeError):
    """The study cannot be opened as asked (exists without --resume, missing on --resume, bad URL)."""


def study_name(gpu: str, spec, dry_run: bool = False, heads: tuple[int, int] | None = None,
               page_size: int | None = None, options_tag: str = "") -> str:
    """One study per combination; a model's heads (they change the benchmark shapes) name their own, and so
    does a serving layout (and its page size), and attention options (``options_tag``: ``-w127-sinks``, the
    window's size included: another window is another benchmark). Names without them are as they were."""
    c = "causal" if spec.causal else "noncausal"
    d = f"d{spec.d_qk}" if spec.d_qk == spec.d_v else f"d{spec.d_qk}x{spec.d_v}"
    h = f"-{heads[0]}q{heads[1]}kv" if heads else ""
    layout = getattr(spec, "layout", "dense")
    lay = "" if layout == "dense" else f"-{layout}" + (f"{page_size}" if page_size else "")
    if getattr(spec, "phase", "prefill") == "decode":   # decode studies apart, the dense-cache ones too
        lay += "-decode"
    return f"{gpu}-{spec.variant}-{spec.dtype}-{d}-{c}{h}{options_tag}{lay}" + ("-dryrun" if dry_run else "")


def make_storage(url: str | None, study_dir: Path, name: str, resume: bool = False):
    """The storage of study ``name``: a journal file in ``study_dir`` (default), a journal file at ``url``, or a
    database URL. With ``resume`` a journal must be there already: StudyError, and nothing created, when it is not
    (a journal is created only for a new study)."""
    if url is None or url.endswith(".journal") or url.startswith("journal:"):
        path = study_dir / f"{name}.journal" if url is None else Path(url.removeprefix("journal:"))
        if resume and not path.is_file():
            raise StudyError(f"--resume: no study {name!r}: there is no journal {path}; "
                             + _resume_hint(path, name))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StudyError(f"cannot create the study dir {path.parent}: {exc.strerror or exc}") from None
        return open_journal(path)
    try:
        return RDBStorage(url, heartbeat_interval=None)
    except Exception as exc:  # SQLAlchemy raises many kinds; all mean "cannot use this URL"
        raise StudyError(f"cannot open storage {url!r}: {type(exc).__name__}: {exc}") from None


def _resume_hint(path: Path, name: str) -> str:
    """What to do when --resume finds no journal: the dry-run twin of the study if that is there, else start it."""
    twin = name[:-len("-dryrun")] if name.endswith("-dryrun") else f"{name}-dryrun"
    if (path.parent / f"{twin}.journal").is_file():
        flag = "without" if name.endswith("-dryrun") else "with"
        return f"{path.parent} holds {twin!r}: resume it {flag} --dry-run"
    return "run without --resume to start it"


def open_journal(path: Path) -> JournalStorage:
    """The journal storage at ``path``, a torn last record cut off first (one line on stderr says so);
    StudyError when a record before it is corrupt (journal.py)."""
    try:
        torn = check_journal(path)
    except JournalError as exc:
        raise StudyError(str(exc)) from None
    if torn is not None:
        print(f"tune: {torn.message()}", file=sys.stderr, flush=True)
    try:
        return JournalStorage(JournalFileBackend(str(path)))
    except OSError as exc:   # a journal that cannot be created or read (permissions, a read-only file system)
        raise StudyError(f"cannot open the journal {path}: {exc.strerror or exc}") from None


def make_sampler(kind: str, seed: int | None):
    """The campaign's sampler of ``kind``, reading the study without its cache repeats (distinct.py)."""
    return DistinctHistorySampler(_optuna_sampler(kind, seed))


def _optuna_sampler(kind: str, seed: int | None):
    if kind == "tpe":
        # multivariate + group: the atoms and tile sizes interact, and conditional params form groups.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(multivariate=True, group=True, seed=seed, n_startup_trials=10)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "qmc":
        return optuna.samplers.QMCSampler(seed=seed, warn_independent_sampling=False)
    if kind == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if kind == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    raise StudyError(f"unknown sampler {kind!r}; choose one of: {', '.join(SAMPLERS)}")


def check_study_state(storage, name: str, resume: bool, where: str) -> None:
    """Refuse to overwrite a study by accident, and to resume one that is not there."""
    names = {s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    if name in names and not resume:
        raise StudyError(f"study {name!r} already exists in {where}; pass --resume to continue it, "
                         "or choose a fresh --study-dir")
    if name not in names and resume:
        raise StudyError(f"--resume: no study {name!r} in {where}; run without --resume to start it")


def open_study(storage, name: str, sampler, resume: bool, where: str) -> optuna.Study:
    check_study_state(storage, name, resume, where)
    return optuna.create_study(storage=storage, study_name=name, sampler=sampler, direction="maximize",
                               load_if_exists=resume)


def fail_stale_running(study: optuna.Study) -> list[int]:
    """Trials left RUNNING by a killed driver: mark them FAIL and queue their parameters again."""
    redone = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study._storage.set_trial_user_attr(t._trial_id, "stale", True)
        study.tell(t.number, state=TrialState.FAIL)
        if t.params:
            study.enqueue_trial(t.params, user_attrs={"source": f"redo of stale trial {t.number}",
                                                      "redo_of": t.number})
        redone.append(t.number)
    return redone


def tell_infeasible(study: optuna.Study, trial: optuna.Trial, reason: str, **attrs) -> None:
    for k, v in attrs.items():
        trial.set_user_attr(k, v)
    trial.set_user_attr("infeasible_reason", reason)
    trial.set_user_attr("constraint", [1.0])
    trial.set_constraint(INFEASIBLE, 1.0)
    study.tell(trial, state=TrialState.PRUNED)


def tell_feasible(study: optuna.Study, trial: optuna.Trial, value: float | None, **attrs) -> None:
    """A working candidate: COMPLETE with ``value``, or PRUNED-but-feasible when nothing was measured
    (dry run), so TPE still learns where the compilable region lies."""
    for k, v in attrs.items():
        trial.set_user_attr(k, v)
    trial.set_user_attr("constraint", [0.0])
    trial.set_constraint(INFEASIBLE, 0.0)
    if value is None:
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, value)


def tell_infra_failure(study: optuna.Study, trial: optuna.Trial, params: dict, reason: str, retries_left: bool) -> None:
    trial.set_user_attr("infra_failure", reason)
    study.tell(trial, state=TrialState.FAIL)
    if retries_left:
        retries = int(trial.user_attrs.get("infra_retries", 0)) + 1
        study.enqueue_trial(params, user_attrs={"source": f"retry of trial {trial.number} after: {reason}",
                                                "infra_retries": retries})


def is_infeasible(t: FrozenTrial) -> bool:
    return any(v > 0 for v in t.constraints.values())


def finished(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))


def geomean(values) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 0.0
