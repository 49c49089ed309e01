"""The options of one campaign, as the CLI gives them (frozen; checked by ``resolve``)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

SAMPLERS = ("tpe", "random", "qmc", "gp", "cmaes")


@dataclass(frozen=True)
class CampaignOptions:
    gpu: str
    variant: Optional[str] = None         # one, a comma list, or "all" (combos.py); or a --model
    trials: int = 60                      # per combination: measured candidates plus those that failed to
                                          # compile or verify (seeds included; cache hits and sets refused
                                          # before compiling do not count)
    timeout: Optional[float] = None       # wall-clock budget of this run, seconds (all combinations)
    head_dim: Union[int, str, None] = None   # one or a comma list
    dtype: Optional[str] = None           # one or a comma list
    causal: Union[bool, str] = True       # or "both"
    model: Optional[str] = None           # a preset (tuner/models.toml): its variant, heads and head dims
    remeasure: bool = False               # measure again what the measurement cache holds
    llm_sketches: int = 3                 # sketch variants asked of the LLM per combination
    study_dir: Path = Path("studies")
    storage: Optional[str] = None         # Optuna storage URL; default a journal file in study_dir
    ray_address: Optional[str] = None     # join this cluster; default start a local one
    llm_base_url: Optional[str] = None
    llm_model: Optional[str] = None
    llm_api_key: Optional[str] = None
    dry_run: bool = False
    resume: bool = False
    sampler: str = "tpe"
    backend: Optional[str] = None         # "gpu" (default) or "replay:FILE"
    seed: Optional[int] = None
    # Not on the CLI yet (defaults fit a real GPU; tests shorten them).
    trial_timeout: float = 300.0          # verify + benchmark of one trial, seconds from taking the GPU lock;
                                          # then its process is killed (workers.py)
    gpu_overlap: int = 4                  # trial processes per GPU at once (the next ones start up while one
                                          # is timed; the GPU lock keeps timed sections apart); 1: one at a time.
                                          # 4: a fresh process needs ~5x its timed section to start (H100, run 8)
    compile_timeout: float = 900.0        # one compile batch, seconds
    compile_batch: int = 8                # configs per nvcc translation unit (CUTE.md §1.6)
    seqlens: Optional[tuple[int, ...]] = None   # benchmark shapes; default the paper grid
    infra_retries: int = 2                # re-enqueues of one parameter set after infrastructure failures
    # Trial timing (tuner.bench.Timing): `tune bench`'s 25/100 ms. Shorter windows cost little GPU time
    # once trial start-up is cheap (workers.py), but rank candidates by noisier numbers.
    bench_warmup_ms: float = 25.0
    bench_rep_ms: float = 100.0
    bench_rotate: int = 3
    live: bool = True                     # rich live view
    early_stop: bool = True               # probe the longest seqlen first; stop a candidate far behind (earlystop.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "study_dir", Path(self.study_dir))

    def timing(self) -> dict:
        """The trials' and baselines' tuner.bench.Timing, as plain fields (it crosses into Ray tasks)."""
        return {"warmup_ms": self.bench_warmup_ms, "rep_ms": self.bench_rep_ms, "rotate": self.bench_rotate}
