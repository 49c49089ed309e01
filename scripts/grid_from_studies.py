"""A replay grid recorded on a GPU: every verified, timed trial of one or more campaign journals.

    python3 scripts/grid_from_studies.py OUT.jsonl.gz STUDY.journal [STUDY.journal ...]

Each distinct parameter set becomes one replay entry (tuner/campaign/backends.py's format) whose TFLOPS
per seqlen are the mean over the trials that measured it; ``_meta`` names the device, the baselines of
the first journal and how many measurements each entry averages. Only studies of one spec (variant,
dtype, head dim, causal) and one trial timing should be merged.
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from collections import defaultdict


def collect(journals: list[str]) -> tuple[dict, dict]:
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    per_key: dict[str, dict] = {}
    samples: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    meta: dict = {"source": "measured", "journals": len(journals)}
    for path in journals:
        storage = JournalStorage(JournalFileBackend(path))
        for summary in storage.get_all_studies():
            study = optuna.load_study(study_name=summary.study_name, storage=storage)
            base = study.user_attrs.get("baselines") or {}
            meta.setdefault("device_name", base.get("device_name"))
            meta.setdefault("baselines", base.get("baselines"))
            meta.setdefault("study", summary.study_name)
            for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
                if (t.user_attrs.get("verification") or {}).get("passed") is not True:
                    continue
                key = t.user_attrs["params_key"]
                per_key[key] = t.user_attrs["kernel_params"]
                for seqlen, tf in (t.user_attrs.get("tflops") or {}).items():
                    samples[key][seqlen].append(float(tf))
    entries = {k: {"params": per_key[k], "tflops": {s: round(statistics.mean(v), 2) for s, v in by_s.items()},
                   "measurements": max(len(v) for v in by_s.values())} for k, by_s in samples.items()}
    return meta, entries


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(usage="%(prog)s OUT.jsonl.gz STUDY.journal [STUDY.journal ...]", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", metavar="OUT.jsonl.gz", help="the replay file to write (gzip when it ends in .gz)")
    ap.add_argument("journals", metavar="STUDY.journal", nargs="+", help="a campaign's Optuna journal")
    args = ap.parse_args(argv)
    out, journals = args.out, args.journals
    meta, entries = collect(journals)
    opener = gzip.open if out.endswith(".gz") else open
    with opener(out, "wt") as fh:
        fh.write(json.dumps({"_meta": meta}) + "\n")
        for key in sorted(entries):
            fh.write(json.dumps(entries[key]) + "\n")
    print(f"{out}: {len(entries)} measured configurations from {len(journals)} journal(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
