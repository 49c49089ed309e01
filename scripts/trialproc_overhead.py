"""Where a GPU trial's seconds go outside its job: the fork server's start of a trial process, the job, and
the wait for the process to exit after its result (tuner/campaign/trialproc.py), in a Ray actor as the
campaign runs trials (workers.py) and in this plain process.

    PYTHONPATH=scripts:. python3 scripts/trialproc_overhead.py [--rounds 8] [--json OUT]

Jobs: ``noop`` (nothing), ``cuda`` (CUDA context, 2 GiB allocated, a matmul: what a trial holds when it
ends). Per job: spawn -> job start, the job itself, job end -> the parent has the result, -> the process
exited (join), and run() in all; medians over the rounds, seconds.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def noop_job(on_locked=None) -> dict:
    from tuner.campaign.trialproc import started_at

    now = time.time()
    return {"spawned": started_at(), "job_start": now, "job_end": time.time()}


def cuda_job(on_locked=None) -> dict:
    from tuner.campaign.trialproc import started_at

    now = time.time()
    import torch

    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    a = torch.randn(1024, 1024, device="cuda")
    (a @ a).sum().item()
    del x
    return {"spawned": started_at(), "job_start": now, "job_end": time.time()}


def measure(runner, job, rounds: int) -> dict:
    rows = []
    for _ in range(rounds):
        t0 = time.time()
        out = runner.run(job, (), timeout_s=120, wait_s=120)
        t_end = time.time()
        v = out.value
        if out.kind != "result":
            return {"error": f"{out.kind}: {out.message}"}
        rows.append({"start_s": v["job_start"] - v["spawned"], "job_s": v["job_end"] - v["job_start"],
                     "run_s": t_end - t0, "after_job_s": t_end - v["job_end"]})
    return {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}


def plain(rounds: int, preload: tuple) -> dict:
    from tuner.campaign.trialproc import FreshProcesses

    runner = FreshProcesses(preload)
    runner.boot()
    import torch

    import trialproc_overhead as me   # by module name: the fork server's children import it (not __main__)

    jobs = (("noop", me.noop_job), ("cuda", me.cuda_job)) if torch.cuda.is_available() else (("noop", noop_job),)
    return {name: measure(runner, job, rounds) for name, job in jobs}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--json")
    args = ap.parse_args()
    from tuner.campaign.workers import PRELOAD

    preload = PRELOAD["gpu"] + ("trialproc_overhead",)
    out = {"plain": plain(args.rounds, preload)}
    print(out, flush=True)
    import ray

    ray.init(include_dashboard=False, log_to_driver=False)

    import torch

    import trialproc_overhead as me   # by reference: a Ray worker imports it (PYTHONPATH has scripts/)

    in_ray = ray.remote(num_gpus=1 if torch.cuda.is_available() else 0)(me.plain)
    out["ray_task"] = ray.get(in_ray.remote(args.rounds, preload))
    for where, jobs in out.items():
        for name, r in jobs.items():
            print(f"{where:9} {name:5} " + "  ".join(f"{k} {v}" for k, v in r.items()), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
