"""The options of one campaign, as the CLI gives them (frozen; checked by ``resolve``)."""
from __future__ import annotations

import importlib.util
import math
import numbers
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

SAMPLERS = ("tpe", "random", "qmc", "gp", "cmaes")
# Optuna imports these samplers' packages on the first ask: without them a campaign would fail every trial.
SAMPLER_PACKAGES = {"cmaes": ("cmaes",), "gp": ("scipy", "torch")}
MAX_GPU_OVERLAP = 8     # more waiting processes only hold CUDA contexts and CPUs
MAX_LLM_SKETCHES = 8
SEED_LIMIT = 2 ** 32    # the samplers seed numpy's RandomState: 0 <= seed < 2**32
DEFAULT_TRIALS = 60     # --trials of a campaign on a GPU
# --trials of a --dry-run that does not give one: enough to see the toolchain, the sketches, the space and the
# translator work (the first seeds), one kernel a CPU on a 2-core laptop, in about two minutes. Sixty (the GPU
# default) compiled for 10 minutes and more on 2 CPUs (T4 MLA: 16 in 9.5 min, then Ray's node ran out of memory).
# T4 MLA on 2 CPUs (2026-11-27, load ~4): two units of one kernel side by side took 129 s, of two 171 s.
DRY_RUN_TRIALS = 2


def default_trials(dry_run: bool) -> int:
    """``--trials`` when not given: a campaign's, or a dry run's few (the compiles alone take minutes a kernel
    per CPU for the larger head dims)."""
    return DRY_RUN_TRIALS if dry_run else DEFAULT_TRIALS


@dataclass(frozen=True)
class CampaignOptions:
    gpu: str
    variant: Optional[str] = None         # one, a comma list, or "all" (combos.py); or a --model
    trials: int = DEFAULT_TRIALS          # per combination: measured candidates plus those that failed to
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
                                          # 4: a fresh process needs ~5x its timed section to start (H100 campaigns, BENCHMARKS.md)
    compile_timeout: float = 900.0        # one compile batch, seconds
    compile_batch: int = 8                # configs per nvcc translation unit (one front end shared)
    seqlens: Optional[tuple[int, ...]] = None   # benchmark shapes; default the paper grid
    infra_retries: int = 2                # re-enqueues of one parameter set after infrastructure failures
    # Trial timing (tuner.measure.timer.Timing): `tune bench`'s 25/100 ms. Shorter windows cost little GPU time
    # once trial start-up is cheap (workers.py), but rank candidates by noisier numbers.
    bench_warmup_ms: float = 25.0
    bench_rep_ms: float = 100.0
    bench_rotate: int = 3
    live: bool = True                     # rich live view
    early_stop: bool = True               # probe the longest seqlen first; stop a candidate far behind (earlystop.py)
    layout: str = "dense"                 # dense (b, s, h, d); varlen / paged: the serving mixes (tuner/measure/mixes.py);
                                          # "all" or a comma list: several (combos.serving_targets)
    page_size: Union[int, tuple, None] = None   # the paged layout's KV-cache page (tuner.measure.mixes.PAGE_SIZES), or several
    phase: str = "prefill"                # or decode: split-KV decode kernels on the decode buckets
                                          # (tuner/serving/buckets/decode.py) over a paged (default) or dense cache;
                                          # "all": both
    # Attention options built into the kernels (combos.py): --window L,R, --softcap X, --sinks; --layer picks a
    # model preset's kind of layer (local or global) whose options it tunes (default: every kind it has)
    window: Optional[tuple] = None
    softcap: Optional[float] = None
    sinks: bool = False
    layer: Optional[str] = None
    # --kv-dtype fp8 (--phase decode): the KV cache's dtype where it is not the queries' (an e4m3 cache with
    # k_scale / v_scale, kernel_abi.spec.KernelSpec.kv_dtype); None: the queries'
    kv_dtype: Optional[str] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "study_dir", Path(self.study_dir))

    def timing(self) -> dict:
        """The trials' and baselines' tuner.measure.timer.Timing, as plain fields (it crosses into Ray tasks)."""
        return {"warmup_ms": self.bench_warmup_ms, "rep_ms": self.bench_rep_ms, "rotate": self.bench_rotate}


def _count(value, low: int, high: Optional[int] = None) -> bool:
    return (isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= low
            and (high is None or value <= high))


def _seconds(value, zero_ok: bool = False) -> bool:
    return (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
            and (value >= 0 if zero_ok else value > 0))


def option_problems(o: CampaignOptions) -> list[str]:
    """Every number of the options that makes no sense, named as the CLI spells it (the fields that are not on
    the CLI by their own name); empty when all do. Checked before anything is created: no study dir, no
    journal, no cluster."""
    problems = []

    def need(ok: bool, name: str, what: str, value) -> None:
        if not ok:
            problems.append(f"{name} must be {what}, got {value!r}")

    need(_count(o.trials, 1), "--trials", "an integer of at least 1", o.trials)
    need(o.timeout is None or _seconds(o.timeout), "--timeout", "a positive number of seconds", o.timeout)
    need(_seconds(o.trial_timeout), "--trial-timeout", "a positive number of seconds", o.trial_timeout)
    need(_count(o.gpu_overlap, 1, MAX_GPU_OVERLAP), "--gpu-overlap", f"an integer from 1 to {MAX_GPU_OVERLAP}",
         o.gpu_overlap)
    need(_count(o.compile_batch, 1), "--compile-batch", "an integer of at least 1", o.compile_batch)
    need(_count(o.llm_sketches, 0, MAX_LLM_SKETCHES), "--llm-sketches", f"an integer from 0 to {MAX_LLM_SKETCHES}",
         o.llm_sketches)
    need(o.seed is None or _count(o.seed, 0, SEED_LIMIT - 1), "--seed", f"an integer from 0 to {SEED_LIMIT - 1}",
         o.seed)
    missing = [p for p in SAMPLER_PACKAGES.get(o.sampler, ()) if importlib.util.find_spec(p) is None]
    if missing:
        problems.append(f"--sampler {o.sampler} needs the {', '.join(missing)} package(s): pip install "
                        + " ".join(missing))
    need(o.seqlens is None or (len(o.seqlens) > 0 and all(_count(s, 1) for s in o.seqlens)), "--seqlens",
         "a list of positive integers", o.seqlens)
    from tl.layout import LAYOUTS
    from tuner.serving.buckets.serving import PAGE_SIZES

    from .combos import several

    if several(o.layout) or several(o.phase) or several(o.page_size):
        pass            # several layouts or phases: combos.serving_targets checks each
    elif o.layout not in LAYOUTS:
        need(False, "--layout", f"one of {', '.join(LAYOUTS)}, a comma list of them or all", o.layout)
    elif o.phase not in ("prefill", "decode"):
        need(False, "--phase", "prefill, decode or all", o.phase)
    elif o.phase == "decode":
        problems.extend(decode_option_problems(o))
    if o.kv_dtype is not None:
        from kernel_abi.spec import KV_DTYPES

        if o.kv_dtype not in KV_DTYPES:
            problems.append(f"--kv-dtype must be one of {', '.join(KV_DTYPES)}, got {o.kv_dtype!r}")
        elif o.phase != "decode":
            problems.append(f"--kv-dtype {o.kv_dtype} is a decode cache's dtype: give --phase decode (prefill FP8 is "
                            "--dtype fp8)")
    elif o.layout == "paged":
        need(o.page_size in PAGE_SIZES and _count(o.page_size, 1), "--page-size",
             f"one of {', '.join(map(str, PAGE_SIZES))} with --layout paged", o.page_size)
    elif o.page_size is not None:
        problems.append(f"--page-size applies to --layout paged only, got --layout {o.layout}")
    if o.phase == "prefill" and o.layout in LAYOUTS and o.layout != "dense" and o.seqlens is not None:
        problems.append(f"--seqlens applies to the dense layout; --layout {o.layout} measures the serving mixes "
                        "of tuner/measure/mixes.toml")
    need(_seconds(o.compile_timeout), "compile_timeout", "a positive number of seconds", o.compile_timeout)
    need(_count(o.infra_retries, 0), "infra_retries", "an integer of at least 0", o.infra_retries)
    need(_seconds(o.bench_warmup_ms, zero_ok=True), "bench_warmup_ms", "a number of milliseconds of at least 0",
         o.bench_warmup_ms)
    need(_seconds(o.bench_rep_ms), "bench_rep_ms", "a positive number of milliseconds", o.bench_rep_ms)
    need(_count(o.bench_rotate, 1), "bench_rotate", "an integer of at least 1", o.bench_rotate)
    where = study_dir_problem(o.study_dir, o.resume and o.storage is None)
    if where is not None:
        problems.append(where)
    return problems


def study_dir_problem(study_dir: Path, must_exist: bool = False) -> Optional[str]:
    """Why ``--study-dir`` cannot hold the campaign's journals, kernels and caches, as one clause naming the path
    and the reason; None when it can. It must be a directory (or one that can be created: its nearest existing
    parent a writable directory) that this user can write; ``must_exist`` (--resume with the journal in the
    study dir): it must be there. Reads the file system, creates nothing."""
    path = Path(study_dir)
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            return f"--study-dir {path} is not writable ({_not_writable_reason(path)})"
        return None
    if path.exists() or path.is_symlink():
        return f"--study-dir {path} is not a directory" + (" (a file)" if path.is_file() else "")
    if must_exist:
        return f"--resume: the study dir {path} does not exist; run without --resume to start the campaign there"
    parent = next((p for p in path.absolute().parents if p.exists() or p.is_symlink()), None)
    if parent is None:   # (only a file system without a root would get here)
        return f"--study-dir {path} cannot be created"
    if not parent.is_dir():
        return f"--study-dir {path} cannot be created: {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"--study-dir {path} cannot be created: {parent} is not writable ({_not_writable_reason(parent)})"
    return None


def _not_writable_reason(directory: Path) -> str:
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return "a read-only file system"
    except OSError:
        pass
    return "permission denied"


DECODE_PAGE_SIZES = (16, 32, 64, 128, 256)   # any power of two the gathers index (one table lookup per key row)


def decode_option_problems(o: CampaignOptions) -> list[str]:
    """--phase decode: a paged (with its page size) or dense cache, no prefill grid."""
    problems = []
    if o.layout not in ("paged", "dense"):
        problems.append(f"--phase decode reads a paged or a dense KV cache, not --layout {o.layout}")
    elif o.layout == "paged" and (o.page_size not in DECODE_PAGE_SIZES or not _count(o.page_size, 1)):
        problems.append(f"--page-size must be one of {', '.join(map(str, DECODE_PAGE_SIZES))} with --phase decode "
                        f"--layout paged, got {o.page_size!r}")
    elif o.layout == "dense" and o.page_size is not None:
        problems.append("--page-size applies to a paged cache; --phase decode --layout dense has none")
    if o.seqlens is not None:
        problems.append("--seqlens sets the prefill grid; --phase decode measures one call per decode bucket "
                        "(tuner/serving/buckets/decode.py)")
    return problems
