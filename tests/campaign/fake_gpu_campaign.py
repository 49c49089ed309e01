"""A whole campaign with the real GPU backend on a CPU-only machine: its own local Ray cluster (one fake
H100), every Ray worker and every trial process running tests/campaign/gpu_fakes.install first (Ray's
worker_process_setup_hook; trialproc's TUNER_TRIAL_SETUP_HOOK).

    python -m tests.campaign.fake_gpu_campaign STUDY_DIR TRIALS [--resume]

Run from the repository root (the test does); exit code is run_campaign's.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


def main(study_dir: str, trials: int, resume: bool = False) -> int:
    os.environ["RAY_AUTH_MODE"] = "disabled"
    import ray

    from tuner.campaign import CampaignOptions, run_campaign
    from tuner.campaign.trialproc import SETUP_HOOK_ENV

    ray.init(address="local", num_cpus=2, num_gpus=1, labels={"ray.io/accelerator-type": "H100"},
             include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             object_store_memory=200 * 1024 * 1024,
             runtime_env={"worker_process_setup_hook": "tests.campaign.gpu_fakes.install",
                          "env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])),
                                       SETUP_HOOK_ENV: "tests.campaign.gpu_fakes.install"}})
    try:
        return run_campaign(CampaignOptions(gpu="h100", variant="mha", trials=trials, study_dir=Path(study_dir),
                                            seqlens=(128, 256), compile_batch=2, trial_timeout=120.0, seed=1,
                                            resume=resume, live=False, bench_warmup_ms=5.0, bench_rep_ms=20.0, bench_rotate=2))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), "--resume" in sys.argv[3:]))
