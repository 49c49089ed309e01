"""The sampler sees each kernel the study measured once: re-proposals answered from the cache are left out.

A re-proposed kernel is told its cached result again (the loop must tell every ask), so the study holds it
twice, ten times, a hundred. Late in a campaign most asks are such repeats: in the H100 campaign of
2026-11-25 (BENCHMARKS.md), 1221 of 1626 trials were answers from this study's own cache. For the sampler each copy
is another observation at the same point. Two costs follow. TPE's "good" density piles onto points already
measured, so it proposes them again more often (a loop that feeds itself). And every ask walks all trials once
per parameter group (~20 groups): 172 ms an ask over those 1626 trials on this 2-core machine, 43 ms over the
405 distinct ones.

``DistinctHistorySampler`` wraps any Optuna sampler and gives it a view of the study without those repeats.
The study itself keeps them (reports count cache hits; the best trial is unchanged, since a repeat carries
the value of a trial that stays). A hit from another study of the study dir is new to this one and stays in
view.
"""
from __future__ import annotations

from typing import Any

from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial

CACHED_FROM = "cached_from"   # user attr the loop sets on a trial answered from the cache: {"study", "trial"}


def is_repeat(trial: FrozenTrial, study_name: str) -> bool:
    """A trial answered from a measurement made earlier in the same study."""
    source = trial.user_attrs.get(CACHED_FROM)
    return isinstance(source, dict) and source.get("study") == study_name


class _DistinctView:
    """The study as a sampler reads it, without its repeats; everything else is the study's."""

    def __init__(self, study):
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _distinct(self, trials):
        name = self._study.study_name
        return [t for t in trials if not is_repeat(t, name)]

    def _get_trials(self, deepcopy: bool = True, states=None, use_cache: bool = False):
        return self._distinct(self._study._get_trials(deepcopy=deepcopy, states=states, use_cache=use_cache))

    def get_trials(self, deepcopy: bool = True, states=None):
        return self._distinct(self._study.get_trials(deepcopy=deepcopy, states=states))

    @property
    def trials(self):
        return self.get_trials()


class DistinctHistorySampler(BaseSampler):
    """``inner`` asked over the study's distinct measurements (module docstring)."""

    def __init__(self, inner: BaseSampler):
        self.inner = inner

    def __repr__(self) -> str:
        return f"DistinctHistorySampler({type(self.inner).__name__})"

    def infer_relative_search_space(self, study, trial):
        return self.inner.infer_relative_search_space(_DistinctView(study), trial)

    def sample_relative(self, study, trial, search_space):
        return self.inner.sample_relative(_DistinctView(study), trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self.inner.sample_independent(_DistinctView(study), trial, param_name, param_distribution)

    def before_trial(self, study, trial) -> None:
        self.inner.before_trial(study, trial)

    def after_trial(self, study, trial, state, values) -> None:
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()
