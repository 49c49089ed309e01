"""The early stop (tuner/campaign/earlystop.py) replayed on the recorded grid: which kernels it stops, whether
any of them would have won a bucket, and the GPU time it saves.

Each kernel is "measured" by the replay backend's trial code (backends._replay_measure) with the payload the
campaign loop sends: the seeds first and in full, then every other kernel probed at the longest seqlen against
the incumbent there (the best TFLOPS measured in full so far). A kernel's GPU time is earlystop.TrialCost's
(the H100's measured stages); a kernel the full measurement makes a bucket winner (the highest recorded TFLOPS at
a seqlen among the kernels of the run) must never be stopped. Two orders:

* ``grid_replay``: every kernel of the grid once, in a seeded random order (every bucket winner of the grid);
* ``search_replay``: the campaign's sampler (TPE over the feasible space, seeds enqueued, a stopped kernel told
  as pruned) until ``budget`` distinct kernels were measured: what a campaign on this grid would spend.

    python -m tests.campaign.early_stop_sim --seeds 5 --budget 200
"""
from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path

from translate.params import KernelParams
from tuner.campaign import study as st
from tuner.campaign.backends import _replay_measure, replay_key
from tuner.campaign.earlystop import DEFAULT_EARLY_STOP, EarlyStop, TrialCost
from kernel_abi.spec import grid_problems

from .search_efficiency import FIXTURE, MEASURED, _quiet_study, answer_repeat, sm80_class_h100

TIMING = {"warmup_ms": 25.0, "rep_ms": 100.0, "rotate": 3}    # a campaign trial's (CampaignOptions' defaults)
PROBLEMS = grid_problems("mha", 128, "bf16", True)
LONGEST = str(max(p.seqlen_k for p in PROBLEMS))


def grid_rows(path: Path = FIXTURE) -> dict:
    """A recorded grid's rows by their replay key (the sketch's name too where a row has one)."""
    rows = [json.loads(line) for line in gzip.open(path, "rt")]
    return {replay_key(KernelParams.from_dict(r["params"]), r.get("schedule")): r for r in rows if "tflops" in r}


def seed_keys(rows: dict) -> list[str]:
    """The seeds a campaign on this profile enqueues that the grid holds (published choices, profile stand-ins)."""
    from search_spaces import load_space
    from tuner.llm import LLMConfig, propose_params
    from kernel_abi.spec import spec_for

    if any(r.get("schedule") for r in rows.values()):   # the measured Hopper grid: its published seeds
        from .search_efficiency import measured_grid, published_seeds

        fs = measured_grid()[0]
        points = [next(p for p in fs.points if fs.optuna_params(p) == chosen) for chosen in published_seeds(fs)]
        return [replay_key(p.params, p.sketch) for p in points]
    keys = []
    for seed in load_space("mha").seeds_for(128):
        raw = dict(seed.params)
        raw.pop("schedule", None)
        keys.append(KernelParams(**raw).key())
    keys += [s.params.key() for s in propose_params(LLMConfig.from_options(None, None, None), sm80_class_h100(),
                                                      spec_for("mha", 128, "bf16", True), "", 8, None)]
    return [k for k in dict.fromkeys(keys) if k in rows]


class Replay:
    """The loop's side of the early stop over one run: the incumbent, the stops and the GPU seconds."""

    def __init__(self, path: Path, rows: dict, seeds: list[str], rule: EarlyStop = DEFAULT_EARLY_STOP):
        self.path, self.rows, self.seeds, self.rule = str(path), rows, set(seeds), rule
        self.incumbent: float | None = None
        self.measured: dict[str, dict] = {}      # key -> what the trial reported
        self.stopped: set[str] = set()
        self.gpu_s = self.gpu_s_without = 0.0

    def measure(self, key: str, number: int) -> dict:
        plan = None if key in self.seeds else self.rule.plan(PROBLEMS, self.incumbent, TIMING)
        row = self.rows[key]
        out = _replay_measure(self.path, {"params": row["params"], "schedule": row.get("schedule"), "profile": "h100",
                                          "problems": PROBLEMS, "trial": number, "early_stop": plan, "timing": TIMING})
        cost, n = TrialCost(), len(PROBLEMS)
        self.gpu_s_without += cost.full(n, TIMING)
        stopped = out.get("early_stop") is not None
        self.gpu_s += cost.full(n, TIMING) if plan is None else cost.probed(n, TIMING, self.rule, stopped)
        if stopped:
            self.stopped.add(key)
        else:
            value = out["tflops"][LONGEST]
            self.incumbent = value if self.incumbent is None else max(self.incumbent, value)
        self.measured[key] = out
        return out

    def summary(self) -> dict:
        """Bucket winners under full measurement (recorded TFLOPS of every kernel this run measured) and
        those the early stop dropped (must be none), the stops, and the GPU seconds with and without."""
        winners = {str(p.seqlen_k): max(self.measured, key=lambda k: self.rows[k]["tflops"][str(p.seqlen_k)])
                   for p in PROBLEMS}
        return {"kernels": len(self.measured), "stopped": len(self.stopped), "winners": winners,
                "lost": sorted({k for k in winners.values() if k in self.stopped}),
                "gpu_s": round(self.gpu_s, 1), "gpu_s_without": round(self.gpu_s_without, 1),
                "saved": round(1 - self.gpu_s / self.gpu_s_without, 4) if self.gpu_s_without else 0.0}


def grid_replay(order_seed: int, path: Path = FIXTURE, rule: EarlyStop = DEFAULT_EARLY_STOP) -> dict:
    rows = grid_rows(path)
    seeds = seed_keys(rows)
    rest = sorted(k for k in rows if k not in seeds)
    random.Random(order_seed).shuffle(rest)
    replay = Replay(path, rows, seeds, rule)
    for n, key in enumerate(seeds + rest):
        replay.measure(key, n)
    return replay.summary()


def search_replay(seed: int, budget: int, path: Path = FIXTURE, rule: EarlyStop = DEFAULT_EARLY_STOP) -> dict:
    """TPE as the campaign runs it: the feasible space, the seeds enqueued first, a re-proposal answered from
    the cache (no GPU) and a neighbour of it enqueued, a stopped kernel told pruned (its probe reported) and
    never the incumbent."""
    from search_spaces import load_space
    from search_spaces.feasible import feasible_space

    from .search_efficiency import measured_grid

    rows = grid_rows(path)
    seeds = seed_keys(rows)
    if Path(path) == MEASURED:   # the space that grid measured, on the H100 profile
        fs = measured_grid()[0]
    else:                        # the model grid holds the sm80-class kernels
        fs = feasible_space(load_space("mha"), sm80_class_h100(), 128, "bf16", PROBLEMS)
    keyed = any(r.get("schedule") for r in rows.values())
    study = _quiet_study("tpe", seed)
    by_key = {replay_key(p.params, p.sketch if keyed else None): p for p in fs.points}
    for key in seeds:
        if key in by_key:
            study.enqueue_trial(fs.optuna_params(by_key[key]))
    replay = Replay(path, rows, seeds, rule)
    told: dict[str, float | None] = {}
    first: dict[str, int] = {}
    asked: set = set()
    rng = random.Random(seed)
    asks = 0
    while len(replay.measured) < budget and asks < 20 * budget:
        asks += 1
        trial = study.ask()
        point = fs.suggest(trial)
        asked.add((point.sketch, point.params.key()))
        key = replay_key(point.params, point.sketch if keyed else None)
        if key in told:   # a re-proposal: the loop enqueues the nearest point not asked yet (loop._propose_near)
            answer_repeat(study, trial, first[key], fs, point, asked, rng)
        else:
            first[key] = trial.number
            out = replay.measure(key, len(replay.measured))
            told[key] = None if out.get("early_stop") else st.geomean(out["tflops"].values())
            if told[key] is None:
                trial.report(float(out["early_stop"]["probe_tflops"]), 0)
        if told[key] is None:
            st.tell_feasible(study, trial, None)
        else:
            st.tell_feasible(study, trial, told[key])
    return replay.summary()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=int, default=200)
    a = ap.parse_args()
    for path in (FIXTURE, MEASURED):
        g = grid_replay(0, path)
        print(f"{path.name}, whole grid ({g['kernels']} kernels, random order): {g['stopped']} stopped, bucket "
              f"winners lost {g['lost']}, GPU {g['gpu_s']} s instead of {g['gpu_s_without']} s "
              f"(saved {100 * g['saved']:.1f}%)")
    for path in (FIXTURE, MEASURED):
        for s in range(a.seeds):
            r = search_replay(s, a.budget, path)
            print(f"{path.name}, TPE seed {s} ({r['kernels']} kernels): {r['stopped']} stopped, bucket winners lost "
                  f"{r['lost']}, GPU {r['gpu_s']} s instead of {r['gpu_s_without']} s (saved {100 * r['saved']:.1f}%)")


if __name__ == "__main__":
    main()


def kernels_to_target(seed: int, early_stop: bool, within: float = 0.03) -> tuple[int | None, float]:
    """On the measured Hopper grid, the sampler alone (no seeds, as search_efficiency.measured_trials_to_target
    counts): distinct kernels measured until one is within ``within`` of the grid's best geometric mean, and
    the GPU seconds they took; with or without the early stop (no seeds: every kernel after the first
    complete one is probed)."""
    from .search_efficiency import measured_grid

    fs, values = measured_grid()
    rows = grid_rows(MEASURED)
    target = (1 - within) * max(values.values())
    study = _quiet_study("tpe", seed)
    replay = Replay(MEASURED, rows, [], DEFAULT_EARLY_STOP)
    told: dict = {}
    first: dict = {}
    asked: set = set()
    rng = random.Random(seed)
    for _ in range(5000):
        trial = study.ask()
        point = fs.suggest(trial)
        asked.add((point.sketch, point.params.key()))
        key = replay_key(point.params, point.sketch)
        if key in told:
            answer_repeat(study, trial, first[key], fs, point, asked, rng)
        else:
            first[key] = trial.number
            if not early_stop:
                replay.incumbent = None     # no incumbent: measured in full
            out = replay.measure(key, len(replay.measured))
            told[key] = None if out.get("early_stop") else st.geomean(out["tflops"].values())
            if told[key] is None:
                trial.report(float(out["early_stop"]["probe_tflops"]), 0)
            elif told[key] >= target:
                return len(replay.measured), replay.gpu_s
        st.tell_feasible(study, trial, told[key])
    return None, replay.gpu_s
