"""Search efficiency on a recorded grid: trials a sampler needs to get within 3% of the grid's best.

Runs the campaign's own pieces (search space, suggest, validate, infeasible-as-constraint telling, the
trial value = geometric mean TFLOPS over the grid seqlens) against a replay file, in process and
without Ray, so hundreds of trials take seconds. Seeds are not enqueued: this measures the sampler.

    PYTHONPATH=. python tests/campaign/search_efficiency.py --seeds 10 --budget 200
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import warnings
from pathlib import Path

import optuna

from hardware_profiles import load_profile
from search_spaces import load_space, suggest
from translate.params import validate
from tuner.campaign import study as st
from tuner.campaign.backends import load_replay
from tuner.campaign.distinct import CACHED_FROM
from kernel_abi.spec import grid_problems, spec_for

FIXTURE = Path(__file__).parent / "fixtures" / "h100_mha_d128_bf16_causal.jsonl.gz"


def sm80_class_h100():
    """The H100 profile without wgmma: the recorded grid holds sm80-class kernels only, so the search runs
    over that part of the space (the Hopper schedules would all be 'not in the grid')."""
    import dataclasses

    h100 = load_profile("h100")
    return dataclasses.replace(h100, mma_atoms=tuple(a for a in h100.mma_atoms if a != "SM90_GMMA"),
                               g2s_copy_atoms=tuple(a for a in h100.g2s_copy_atoms if a != "SM90_TMA"))


def grid_values(path: Path = FIXTURE) -> dict[str, float]:
    data = load_replay(path)
    return {k: st.geomean(e["tflops"].values()) for k, e in data.entries.items() if "tflops" in e}


def _quiet_study(sampler_kind: str, seed: int, distinct: bool = True) -> optuna.Study:
    """An in-memory study of the campaign's sampler (``distinct``: as the campaign makes it, blind to cache
    repeats; else the bare Optuna sampler), without Optuna's per-trial logs and warnings."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = st.make_sampler(sampler_kind, seed) if distinct else st._optuna_sampler(sampler_kind, seed)
        return optuna.create_study(direction="maximize", sampler=sampler)


def trials_to_target(sampler_kind: str, seed: int, values: dict[str, float], budget: int,
                     within: float = 0.03) -> int | None:
    """Trials until the best value is within ``within`` of the grid's best; None if the budget ends first."""
    profile, space = sm80_class_h100(), load_space("mha")
    spec = spec_for("mha", 128, "bf16", True)
    problems = grid_problems("mha", 128, "bf16", True)
    target = (1.0 - within) * max(values.values())
    study = _quiet_study(sampler_kind, seed)
    for n in range(1, budget + 1):
        trial = study.ask()
        params = suggest(trial, space, profile, spec)
        errors = [e for p in problems for e in validate(params, profile, p)]
        value = values.get(params.key())
        if errors or value is None:
            st.tell_infeasible(study, trial, "; ".join(errors) or "not in the recorded grid")
            continue
        st.tell_feasible(study, trial, value)
        if value >= target:
            return n
    return None


def compare(samplers=("tpe", "random"), seeds=range(5), budget: int = 200) -> dict[str, dict]:
    values = grid_values()
    out = {}
    for kind in samplers:
        out[kind] = summarise([trials_to_target(kind, s, values, budget) for s in seeds], budget)
    return out


def summarise(runs: list, budget: int) -> dict:
    """Trials to the target over seeded runs; a run that never gets there counts as the budget (the mean is
    then a lower bound)."""
    counted = [r if r is not None else budget for r in runs]
    return {"runs": runs, "mean": statistics.mean(counted), "median": statistics.median(counted),
            "missed": sum(r is None for r in runs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--budget", type=int, default=200)
    ap.add_argument("--samplers", default="tpe,random")
    ap.add_argument("--measured", action="store_true", help="the measured Hopper grid instead of the "
                                                            "model grid; budget: the grid's size")
    a = ap.parse_args()
    if a.measured:
        fs, values = measured_grid()
        best = max(values.values())
        print(f"measured grid: {len(values)} configurations ({len(fs.points)} in the space), best {best:.1f} "
              f"TFLOPS (geomean over seqlens), {sum(v >= 0.97 * best for v in values.values())} within 3%")
        # Optuna's sampler alone (repeats told and seen), then as the campaign runs it: blind to repeats, the
        # nearest unasked point enqueued after each (without that TPE blind to repeats stalls), seeds or not
        for label, enqueue, near in (("sampler alone", False, False), ("campaign, seeds", True, True),
                                     ("campaign", False, True)):
            for kind, r in compare_measured(a.samplers.split(","), range(a.seeds), len(values), enqueue, near,
                                            distinct=near).items():
                print(f"{label:>19} {kind:>7}: mean {r['mean']:.1f} trials "
                      f"({100 * r['mean'] / len(values):.1f}% of the grid), median {r['median']:.1f}, "
                      f"missed {r['missed']}/{a.seeds}, mean asks {r['mean_asks']:.1f}; runs {r['runs']}")
        return
    values = grid_values()
    print(f"grid: {len(values)} valid configurations, best {max(values.values()):.1f} TFLOPS (geomean over seqlens)")
    for kind, r in compare(a.samplers.split(","), range(a.seeds), a.budget).items():
        print(f"{kind:>7}: mean {r['mean']:.1f} trials, median {r['median']:.1f}, missed {r['missed']}/{a.seeds} "
              f"(budget {a.budget}); runs {r['runs']}")




# ---- the measured Hopper grid: every valid point of a space measured on the H100 ----------------

MEASURED = Path(__file__).parent / "fixtures" / "h100_mha_d128_bf16_causal_ws_measured.jsonl.gz"
MEASURED_SPACE = Path(__file__).parent / "fixtures" / "h100_mha_d128_ws_space.toml"


def measured_grid():
    """(feasible space of the fixture's space, {(sketch, params key): geomean TFLOPS}) of the measured grid."""
    import tomllib

    from search_spaces import parse_space
    from search_spaces.feasible import feasible_space
    from translate.params import KernelParams

    space = parse_space(tomllib.loads(MEASURED_SPACE.read_text()), str(MEASURED_SPACE))
    problems = grid_problems("mha", 128, "bf16", True)
    fs = feasible_space(space, load_profile("h100"), 128, "bf16", problems)
    values = {}
    for row in (json.loads(line) for line in gzip.open(MEASURED, "rt")):
        if "tflops" in row:
            values[(row["schedule"], KernelParams.from_dict(row["params"]).key())] = st.geomean(row["tflops"].values())
    return fs, values


def published_seeds(fs):
    """The search space's published Hopper choices (FA3/FA4) that are points of the grid, as enqueue dicts."""
    from translate.params import KernelParams

    profile, problems = load_profile("h100"), grid_problems("mha", 128, "bf16", True)
    out = []
    for seed in load_space("mha").seeds_for(128):
        raw = dict(seed.params)
        schedule = raw.pop("schedule", "fa2")
        full = {**KernelParams(**raw).to_dict(), "schedule": schedule}
        chosen, reasons = fs.project(full, profile, 128, "bf16", problems)
        if not reasons:
            out.append(chosen)
    return out


def measured_trials_to_target(sampler_kind: str, seed: int, budget: int, *, enqueue_seeds: bool = False,
                              within: float = 0.03, grid=None, near: bool = False, asks: list | None = None,
                              distinct: bool = True,
                              max_distance: int | None = st.NEIGHBOUR_MAX_DISTANCE) -> int | None:
    """As the campaign counts: distinct kernels measured until one is within ``within`` of the grid's best;
    a re-proposed kernel is answered from the measurement cache and costs nothing (told as the loop tells
    it). ``near``: as the campaign loop does, a re-proposal enqueues the nearest valid point (at most
    ``max_distance`` choices away) that was not asked yet (tuner/campaign/loop.py _propose_near).
    ``distinct``: the sampler reads the study without its repeats, as the campaign's does. ``asks`` gets
    the number of asks the run took."""
    import random

    fs, values = grid or measured_grid()
    rng = random.Random(seed)
    target = (1.0 - within) * max(values.values())
    study = _quiet_study(sampler_kind, seed, distinct)
    if enqueue_seeds:
        for chosen in published_seeds(fs):
            study.enqueue_trial(chosen)
    measured: dict = {}
    asked: set = set()
    idle = n_asks = 0
    result = None
    while len(measured) < budget and idle < 2000:
        trial = study.ask()
        n_asks += 1
        point = fs.suggest(trial)
        key = (point.sketch, point.params.key())
        asked.add(key)
        value = values[key]
        if key in measured:
            idle += 1
            answer_repeat(study, trial, measured[key][1], fs if near else None, point, asked, rng, max_distance)
        else:
            idle = 0
            measured[key] = (value, trial.number)
            if value >= target:
                result = len(measured)
                break
        study.tell(trial, value)
    if asks is not None:
        asks.append(n_asks)
    return result


def asks_to_measure(kernels: int, seed: int, *, distinct: bool = True, near: bool = True,
                    max_distance: int | None = st.NEIGHBOUR_MAX_DISTANCE, grid=None, ask_limit: int = 5000) -> dict:
    """Late in a campaign: asks until ``kernels`` distinct kernels of the measured grid are measured (None if
    ``ask_limit`` asks do not get there: the sampler stalled), the best found as a fraction of the grid's,
    and the mean time of an ask the sampler answered (not an enqueued point)."""
    import random
    import time

    fs, values = grid or measured_grid()
    rng, study = random.Random(seed), _quiet_study("tpe", seed, distinct)
    measured: dict = {}
    asked: set = set()
    sampler_s = sampler_asks = n = 0
    while len(measured) < kernels and n < ask_limit:
        n += 1
        start = time.perf_counter()
        trial = study.ask()
        point = fs.suggest(trial)
        if not trial._fixed_params:   # the sampler chose it (an enqueued point costs no sampling)
            sampler_s += time.perf_counter() - start
            sampler_asks += 1
        key = (point.sketch, point.params.key())
        asked.add(key)
        if key in measured:
            answer_repeat(study, trial, measured[key], fs if near else None, point, asked, rng, max_distance)
        else:
            measured[key] = trial.number
        study.tell(trial, values[key])
    best = max(values[k] for k in measured) / max(values.values())
    return {"asks": n if len(measured) >= kernels else None, "best": best,
            "sampler_ms": 1000 * sampler_s / max(sampler_asks, 1)}


def answer_repeat(study: optuna.Study, trial, first: int, fs=None, point=None, asked: set = frozenset(),
                  rng=None, max_distance: int | None = st.NEIGHBOUR_MAX_DISTANCE) -> None:
    """As the loop answers a re-proposal from the cache: mark ``trial`` (the campaign's sampler then leaves
    it out of what it reads: tuner/campaign/distinct.py) and, given the feasible space ``fs``, enqueue the
    nearest point to ``point`` not asked yet (loop._propose_near)."""
    trial.set_user_attr(CACHED_FROM, {"study": study.study_name, "trial": first})
    pick = fs.unasked_neighbour(point, asked, rng, max_distance) if fs is not None else None
    if pick is not None:
        study.enqueue_trial(fs.optuna_params(pick))


def compare_measured(samplers=("tpe", "random"), seeds=range(10), budget: int = 380, enqueue_seeds: bool = False,
                     near: bool = False, distinct: bool = True):
    grid = measured_grid()
    out = {}
    for kind in samplers:
        asks: list = []
        out[kind] = summarise([measured_trials_to_target(kind, s, budget, enqueue_seeds=enqueue_seeds, grid=grid,
                                                         near=near, asks=asks, distinct=distinct)
                                  for s in seeds], budget)
        out[kind]["mean_asks"] = statistics.mean(asks)
    return out


if __name__ == "__main__":
    main()
