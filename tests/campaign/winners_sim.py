"""False winners on a noisy grid: the maximum of single measurements against the confirmed-winner rule.

The grid: the 380 warp-specialised kernels measured on the H100 (fixture h100_mha_d128_bf16_causal_ws_measured),
their recorded TFLOPS taken as each kernel's **true** speed, served by the replay backend as a noisy GPU
(``_meta.noise``: every measurement = true speed x exp(sigma * z)). A simulated campaign measures the
published seeds and every kernel within ``POOL`` of the best geometric mean (the neighbourhood a converging
search measures: many near-ties, as on the GPU), each once, with the replay backend's trial measurement. Per
bucket the challenger is the best single measurement; then

* "max of single measurements" stores the challenger;
* the rule re-times the challenger against the best seed with the replay backend's re-timing job
  (tuner/campaign/retime.py: the same noise, interleaved rounds) and lets tuner/campaign/winners.decide judge.

A **false winner** is a stored kernel that is not a seed and is truly no faster than the truly best seed at that
bucket's seqlen: a "search beat the seeds" that is noise. Everything is seeded: the counts are deterministic.

    python -m tests.campaign.winners_sim --campaigns 20
"""
from __future__ import annotations

import argparse
import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from tuner.serving.buckets.seqlen import bucket_for
from tuner.campaign.backends import _replay_measure
from tuner.campaign.confirm import DEFAULT_RULE, ConfirmRule
from tuner.campaign.retime import _replay_retime
from tuner.campaign.winners import Contender, Contest, decide
from kernel_abi.spec import grid_problems

from .search_efficiency import MEASURED, measured_grid, published_seeds

POOL = 0.15                  # kernels within 15% of the best geometric mean: 91 of the grid's 380


@dataclass(frozen=True)
class Grid:
    path: Path               # the noisy replay file
    truth: dict              # (schedule, params key) -> {"<seqlen>": true TFLOPS}
    rows: dict               # (schedule, params key) -> the replay row (params, schedule)
    seeds: tuple             # keys of the published seeds
    measured: tuple          # keys a simulated campaign measures: the seeds, then the pool


def noisy_grid(directory: Path, sigma: float, seed: int = 0, pool: float = POOL) -> Grid:
    """The measured grid as a noisy replay file in ``directory``."""
    from translate.params import KernelParams

    rows = [json.loads(line) for line in gzip.open(MEASURED, "rt")]
    meta = dict(rows[0]["_meta"], noise={"sigma": sigma, "seed": seed})
    entries = {(r["schedule"], KernelParams.from_dict(r["params"]).key()): r for r in rows[1:] if "tflops" in r}
    path = Path(directory) / f"noisy-{sigma:g}-{seed}.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [{"_meta": meta}] + list(entries.values())) + "\n")
    fs, values = measured_grid()
    seeds = []
    for chosen in published_seeds(fs):
        point = next(p for p in fs.points if fs.optuna_params(p) == chosen)
        seeds.append((point.sketch, point.params.key()))
    best = max(values.values())
    pool_keys = sorted(k for k, v in values.items() if v >= (1 - pool) * best and k not in seeds)
    return Grid(path, {k: r["tflops"] for k, r in entries.items()}, entries, tuple(seeds), tuple(seeds) + tuple(pool_keys))


def _contender(grid: Grid, key, role: str, measured: dict) -> Contender:
    row = grid.rows[key]
    return Contender(role, f"{key[0]}:{key[1]}", f"{key[0]}:{key[1]}", measured[key], row["params"], key[0],
                     "seed" if key in grid.seeds else "search", None, key in grid.seeds)


def campaign(grid: Grid, number: int, rule: ConfirmRule = DEFAULT_RULE) -> list[dict]:
    """One simulated campaign: per bucket, what each policy stores and whether it is a false winner."""
    problems = grid_problems("mha", 128, "bf16", True)
    measured = {}
    for i, key in enumerate(grid.measured):
        row = grid.rows[key]
        out = _replay_measure(str(grid.path), {"params": row["params"], "schedule": key[0], "profile": "h100",
                                               "problems": problems, "trial": f"campaign{number}-{i}"})
        measured[key] = out["tflops"]
    results = []
    for problem in problems:
        s = str(problem.seqlen_k)
        best_seed_truth = max(grid.truth[k][s] for k in grid.seeds)
        challenger = max(grid.measured, key=lambda k: measured[k][s])
        seed = max(grid.seeds, key=lambda k: measured[k][s])
        contest = Contest(bucket_for(problem.seqlen_k), problem, _contender(grid, challenger, "challenger", measured),
                          None if challenger in grid.seeds else _contender(grid, seed, "seed", measured), None)
        if contest.seed is None:
            ruled = challenger
        else:
            payload = {"bucket": contest.bucket, "profile": "h100", "problem": problem, "rule": rule.to_dict(),
                       "nonce": f"campaign{number}", "kernels": [
                           {"role": c.role, "params": c.params, "schedule": c.schedule} for c in contest.timed()]}
            decision = decide(contest, _replay_retime(str(grid.path), payload), None, rule)
            ruled = challenger if decision.winner.role == "challenger" else seed
        for policy, stored in (("max_single", challenger), ("rule", ruled)):
            truth = grid.truth[stored][s]
            results.append({"campaign": number, "seqlen": problem.seqlen_k, "policy": policy,
                            "claims_win": stored not in grid.seeds,
                            "false_winner": stored not in grid.seeds and truth <= best_seed_truth,
                            "true_gain": truth / best_seed_truth,
                            "claimed_gain": measured[stored][s] / max(measured[k][s] for k in grid.seeds)})
    return results


def compare(grid: Grid, campaigns: int, rule: ConfirmRule = DEFAULT_RULE) -> dict[str, dict]:
    """Per policy over ``campaigns`` x 6 buckets: false winners, claimed wins, the true and the claimed gain."""
    rows = [r for n in range(campaigns) for r in campaign(grid, n, rule)]
    out = {}
    for policy in ("max_single", "rule"):
        mine = [r for r in rows if r["policy"] == policy]
        claims = [r for r in mine if r["claims_win"]]
        out[policy] = {"buckets": len(mine), "claims": len(claims),
                       "false_winners": sum(r["false_winner"] for r in mine),
                       "true_wins": sum(r["claims_win"] and not r["false_winner"] for r in mine),
                       "mean_true_gain": sum(r["true_gain"] for r in mine) / len(mine),
                       "mean_claimed_gain_of_claims": (sum(r["claimed_gain"] for r in claims) / len(claims)
                                                       if claims else None),
                       "mean_true_gain_of_claims": (sum(r["true_gain"] for r in claims) / len(claims)
                                                    if claims else None)}
    return out


def main() -> None:
    import tempfile

    ap = argparse.ArgumentParser()
    ap.add_argument("--campaigns", type=int, default=20)
    ap.add_argument("--sigmas", default="0.03,0.06")
    ap.add_argument("--rounds", default="9")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for sigma in (float(x) for x in a.sigmas.split(",")):
            grid = noisy_grid(Path(tmp), sigma)
            print(f"sigma {sigma:g}: {len(grid.measured)} kernels measured per campaign ({len(grid.seeds)} seeds)")
            for rounds in (int(x) for x in a.rounds.split(",")):
                rule = ConfirmRule(rounds=rounds)
                for policy, r in compare(grid, a.campaigns, rule).items():
                    label = policy if policy == "max_single" else f"rule ({rounds} rounds)"
                    print(f"  {label:>17}: {r['false_winners']:>3} false winners, {r['true_wins']:>3} true wins, "
                          f"{r['claims']:>3} claims in {r['buckets']} buckets; mean true gain over the best seed "
                          f"{r['mean_true_gain']:.4f}; claims: claimed x{r['mean_claimed_gain_of_claims'] or 0:.3f}, "
                          f"true x{r['mean_true_gain_of_claims'] or 0:.3f}")


if __name__ == "__main__":
    main()
