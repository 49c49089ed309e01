"""Check every "search beat the seeds" claim of a finished campaign by re-timing it, apart from the campaign.

    python3 scripts/retime_check.py STUDY_DIR [OUT_JSON] [--rounds 15] [--backend gpu|replay:FILE]

STUDY_DIR is a campaign's study folder (`tune --study-dir`), on the GPU machine that ran it (or with a replay file).

For each study of STUDY_DIR (its summary.json) and each bucket whose winner the campaign reported as beating
the best seed (``search_beat_seeds``), the winner and that seed are timed again here, in a fresh process of
their own (tuner/campaign/retime.py's job, forked like a trial, no Ray), interleaved, on the same inputs,
with more rounds than the campaign's (15 by default), and judged by the same rule (tuner/campaign/confirm.py).
A claim holds when the lower bound of the re-check's interval is above 1. Prints one line per claim; exit 0
when every claim holds (or there is none), 1 when one does not, 2 on bad input.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path


def claims(study_dir: Path) -> list[tuple[str, dict]]:
    """(study name, winners entry) of every bucket reported as a win of the search over the seeds."""
    out = []
    for summary in sorted(study_dir.glob("*/summary.json")):
        data = json.loads(summary.read_text())
        out += [(data["study"], w) for w in data.get("winners") or [] if w.get("search_beat_seeds")]
    return out


def payload(study_dir: Path, gpu: str, entry: dict, rule) -> dict:
    from kernel_abi.spec import KernelSpec, Problem

    problem = Problem(**entry["problem"])
    kernels = []
    for role in ("challenger", "seed"):
        c = entry[role]
        stem = study_dir / c["stem"]
        meta = json.loads(stem.with_suffix(".meta.json").read_text())
        kernels.append({"role": role, "name": c["kernel_name"], "cubin": stem.with_suffix(".cubin").read_bytes(),
                        "meta": meta, "params": c["params"], "schedule": c["schedule"]})
    return {"bucket": entry["bucket"], "profile": gpu, "spec": KernelSpec.of(problem), "problem": problem,
            "rule": rule.to_dict(), "kernels": kernels, "nonce": f"retime_check/{entry['bucket']}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study_dir", metavar="STUDY_DIR", type=Path, help="a finished campaign's study folder")
    ap.add_argument("out_json", metavar="OUT_JSON", type=Path, nargs="?", help="write every claim's re-check here")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds of the re-check (default 15)")
    ap.add_argument("--backend", default="gpu", help="gpu, or replay:FILE (a recorded grid, for a CPU rehearsal)")
    args = ap.parse_args(argv)

    from tuner.campaign.backends import BackendError, parse_backend
    from tuner.campaign.confirm import DEFAULT_RULE, verdict
    from tuner.campaign.retime import retime_job
    from tuner.campaign.trialproc import FreshProcesses
    from tuner.campaign.workers import PRELOAD

    study_dir, out_json, rounds = args.study_dir, args.out_json, args.rounds
    rule = replace(DEFAULT_RULE, rounds=rounds)
    try:
        backend = parse_backend(args.backend)
    except BackendError as exc:
        print(f"retime_check.py: {exc}", file=sys.stderr)
        return 2
    runner = FreshProcesses(PRELOAD[backend.kind])
    results, ok = [], True
    found = claims(study_dir)
    if not found:
        print(f"{study_dir}: no bucket was reported as a win of the search over the seeds: nothing to check")
    for study, entry in found:
        gpu = study.split("-", 1)[0]
        out = runner.run(retime_job, (backend, payload(study_dir, gpu, entry, rule)), timeout_s=600, wait_s=600)
        claimed = entry["vs_seed"]
        row = {"study": study, "bucket": entry["bucket"], "claimed": claimed, "outcome": out.kind}
        if out.kind == "result" and all(out.value["ms"].get(r) for r in ("challenger", "seed")):
            v = verdict(out.value["ms"]["challenger"], out.value["ms"]["seed"], rule)
            row["recheck"] = v.to_dict()
            holds = v.confirmed
            text = f"re-check {v.text()} ({rounds} rounds, pid {out.value['pid']})"
        else:
            holds = False
            text = f"re-check failed: {out.kind}: {out.message or (out.value or {}).get('failed')}"
        row["holds"] = holds
        ok &= holds
        results.append(row)
        print(f"{study} {entry['bucket']}: claimed ×{claimed['ratio']:.3f} [{claimed['low']:.3f}, {claimed['high']:.3f}]"
              f"; {text}: {'HOLDS' if holds else 'DOES NOT HOLD'}", flush=True)
    if out_json is not None:
        out_json.write_text(json.dumps({"study_dir": str(study_dir), "rounds": rounds, "claims": results,
                                        "all_hold": ok}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
