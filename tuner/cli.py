"""The ``tune`` command line. Each sub-command is a thin shell over a module that does one job.

Exit codes: 0 success, 1 the work found problems (invalid sketch, failed verification), 2 usage or I/O
error. A traceback is never the answer to bad input.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=False,
    invoke_without_command=True,
    help="Autotune FlashAttention kernels for a GPU: `tune --gpu h100 --variant mha` runs a campaign.",
    context_settings={"help_option_names": ["-h", "--help"]},
)


SCHEDULE_HELP = ("Reference sketch set when no --sketch: fa2 (the paper's flow; wgmma with mma_atom SM90_GMMA), "
                 "ws_overlap or ws_serial (Hopper warp-specialised). Default: ws_overlap on sm90, fa2 elsewhere.")


def _fail_usage(message: str) -> "typer.Exit":
    typer.echo(f"tune: error: {message}", err=True)
    return typer.Exit(2)


def _parse_seqlens(text: Optional[str]):
    if not text:
        return None
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise _fail_usage(f"--seqlens must be a comma list of integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise _fail_usage(f"--seqlens must list positive integers, got {text!r}")
    return values


@app.callback()
def campaign(
    ctx: typer.Context,
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Hardware profile: t4, rtx8000, a100, l40s, h100, h200."),
    variant: Optional[str] = typer.Option(None, "--variant", help="mha, gqa, mqa or mla."),
    trials: int = typer.Option(60, "--trials", min=1, help="Trials to run (seeds included)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Wall-clock budget in seconds."),
    head_dim: Optional[int] = typer.Option(None, "--head-dim", help="64 or 128 (mla is 192/128)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="fp16 or bf16 (default: bf16 where supported)."),
    causal: bool = typer.Option(True, "--causal/--no-causal", help="Causal mask (bottom-right aligned)."),
    study_dir: Path = typer.Option(Path("studies"), "--study-dir", help="Where studies and best kernels live."),
    storage: Optional[str] = typer.Option(None, "--storage", help="Optuna storage URL (default: journal file in the study dir)."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Join this Ray cluster (default: start a local one)."),
    llm_base_url: Optional[str] = typer.Option(None, "--llm-base-url", envvar="OPENAI_BASE_URL", help="OpenAI-compatible endpoint."),
    llm_model: Optional[str] = typer.Option(None, "--llm-model", envvar="OPENAI_MODEL", help="Model name at the endpoint."),
    llm_api_key: Optional[str] = typer.Option(None, "--llm-api-key", envvar="OPENAI_API_KEY", help="API key (never stored)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Compile and validate every candidate; no GPU needed."),
    resume: bool = typer.Option(False, "--resume", help="Continue the study in the study dir."),
    sampler: str = typer.Option("tpe", "--sampler", help="Sampler: tpe (default), random, qmc, gp, cmaes."),
    backend: Optional[str] = typer.Option(None, "--backend", help="Benchmark backend: gpu (default) or replay:FILE."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Sampler seed."),
    trial_timeout: float = typer.Option(300.0, "--trial-timeout", help="Seconds a GPU trial may verify and benchmark (from taking its GPU's lock) before it is killed."),
    gpu_overlap: int = typer.Option(4, "--gpu-overlap", min=1, max=8,
                                    help="Trial processes per GPU at once: the next starts up while one is timed "
                                         "(timed sections never overlap); 1: one at a time."),
    compile_batch: int = typer.Option(8, "--compile-batch", min=1, help="Kernel configs per nvcc translation unit."),
    seqlens: Optional[str] = typer.Option(None, "--seqlens", help="Comma list of benchmark seqlens (default: the paper grid)."),
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    if gpu is None or variant is None:
        typer.echo(ctx.get_help())
        raise _fail_usage("a campaign needs --gpu and --variant (or use a sub-command: check, gpus, build, bench, export)")
    from tuner.campaign import CampaignOptions, run_campaign

    options = CampaignOptions(
        gpu=gpu, variant=variant, trials=trials, timeout=timeout, head_dim=head_dim, dtype=dtype,
        causal=causal, study_dir=study_dir, storage=storage, ray_address=ray_address,
        llm_base_url=llm_base_url, llm_model=llm_model, llm_api_key=llm_api_key, dry_run=dry_run,
        resume=resume, sampler=sampler, backend=backend, seed=seed, trial_timeout=trial_timeout,
        gpu_overlap=gpu_overlap, compile_batch=compile_batch, seqlens=_parse_seqlens(seqlens),
    )
    raise typer.Exit(run_campaign(options))


@app.command()
def check(files: List[Path] = typer.Argument(..., help="TL files to check.")) -> None:
    """Parse and check TL programs; print `ok` or diagnostics per file."""
    from tuner.check_cmd import run_check

    raise typer.Exit(run_check(files))


@app.command()
def gpus() -> None:
    """List the hardware profiles."""
    from tuner.gpus_cmd import show_gpus

    raise typer.Exit(show_gpus())


@app.command()
def build(
    gpu: str = typer.Option(..., "--gpu"),
    variant: str = typer.Option(..., "--variant"),
    sketch: Optional[Path] = typer.Option(None, "--sketch", help="TL file (default: the built-in reference sketch)."),
    params: Optional[str] = typer.Option(None, "--params", help="JSON object or file of kernel parameters."),
    head_dim: Optional[int] = typer.Option(None, "--head-dim"),
    dtype: Optional[str] = typer.Option(None, "--dtype"),
    causal: bool = typer.Option(True, "--causal/--no-causal"),
    out: Path = typer.Option(..., "-o", "--out", help="Output directory for .cu, .cubin and resources JSON."),
    schedule: Optional[str] = typer.Option(None, "--schedule", help=SCHEDULE_HELP),
) -> None:
    """Translate a TL program to CuTe C++ and compile it to a cubin (no GPU needed)."""
    from tuner.build_cmd import run_build

    raise typer.Exit(run_build(gpu=gpu, variant=variant, sketch=sketch, params=params, head_dim=head_dim,
                               dtype=dtype, causal=causal, out=out, schedule=schedule))


@app.command()
def bench(
    gpu: str = typer.Option(..., "--gpu"),
    variant: str = typer.Option(..., "--variant"),
    params: Optional[str] = typer.Option(None, "--params", help="JSON object or file of kernel parameters."),
    sketch: Optional[Path] = typer.Option(None, "--sketch"),
    head_dim: Optional[int] = typer.Option(None, "--head-dim"),
    dtype: Optional[str] = typer.Option(None, "--dtype"),
    causal: Optional[bool] = typer.Option(None, "--causal/--no-causal", help="Default: both."),
    seqlens: Optional[str] = typer.Option(None, "--seqlens", help="Comma list (default 512..16384)."),
    out_json: Optional[Path] = typer.Option(None, "--json", help="Write results here."),
    schedule: Optional[str] = typer.Option(None, "--schedule", help=SCHEDULE_HELP),
) -> None:
    """Benchmark a kernel on the paper grid against torch SDPA's flash, cuDNN and efficient backends and
    FlashAttention-4 (flash_attn.cute) where installed."""
    from tuner.bench import run_bench

    raise typer.Exit(run_bench(gpu=gpu, variant=variant, params=params, sketch=sketch, head_dim=head_dim,
                               dtype=dtype, causal=causal, seqlens=seqlens, out_json=out_json, schedule=schedule))


@app.command("export")
def export_cmd(
    gpu: str = typer.Option(..., "--gpu"),
    variant: Optional[str] = typer.Option(None, "--variant"),
    study_dir: Path = typer.Option(Path("studies"), "--study-dir"),
    out: Path = typer.Option(..., "-o", "--out"),
) -> None:
    """Export the stored best kernels of a GPU for production (JSON configs, sources, cubins)."""
    from tuner.export import run_export

    raise typer.Exit(run_export(gpu=gpu, variant=variant, study_dir=study_dir, out_dir=out))


def main() -> None:
    # Ray's token auth is on by default; a local cluster that this tool starts has nothing to guard.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    app()


if __name__ == "__main__":
    main()
