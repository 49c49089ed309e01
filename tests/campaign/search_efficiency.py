"""Search efficiency on a recorded grid: trials a sampler needs to get within 3% of the grid's best.

Runs the campaign's own pieces (search space, suggest, validate, infeasible-as-constraint telling, the
trial value = geometric mean TFLOPS over the grid seqlens) against a replay file, in process and
without Ray, so hundreds of trials take seconds. Seeds are not enqueued: this measures the sampler.

    PYTHONPATH=. python tests/campaign/search_efficiency.py --seeds 10 --budget 200
"""
from __future__ import annotations

import argparse
import statistics
import warnings
from pathlib import Path

import optuna

from hardware_profiles import load_profile
from search_spaces import load_space, suggest
from translate.params import validate
from tuner.campaign import study as st
from tuner.campaign.backends import load_replay
from tuner.problem import grid_problems, spec_for

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


def trials_to_target(sampler_kind: str, seed: int, values: dict[str, float], budget: int,
                     within: float = 0.03) -> int | None:
    """Trials until the best value is within ``within`` of the grid's best; None if the budget ends first."""
    profile, space = sm80_class_h100(), load_space("mha")
    spec = spec_for("mha", 128, "bf16", True)
    problems = grid_problems("mha", 128, "bf16", True)
    target = (1.0 - within) * max(values.values())
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = optuna.create_study(direction="maximize", sampler=st.make_sampler(sampler_kind, seed))
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
        runs = [trials_to_target(kind, s, values, budget) for s in seeds]
        hit = [r for r in runs if r is not None]
        # A run that never gets there counts as the budget: the mean is then a lower bound.
        out[kind] = {"runs": runs, "mean": statistics.mean(r if r is not None else budget for r in runs),
                     "median": statistics.median(r if r is not None else budget for r in runs),
                     "missed": len(runs) - len(hit)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--budget", type=int, default=200)
    ap.add_argument("--samplers", default="tpe,random")
    a = ap.parse_args()
    values = grid_values()
    print(f"grid: {len(values)} valid configurations, best {max(values.values()):.1f} TFLOPS (geomean over seqlens)")
    for kind, r in compare(a.samplers.split(","), range(a.seeds), a.budget).items():
        print(f"{kind:>7}: mean {r['mean']:.1f} trials, median {r['median']:.1f}, missed {r['missed']}/{a.seeds} "
              f"(budget {a.budget}); runs {r['runs']}")


if __name__ == "__main__":
    main()
