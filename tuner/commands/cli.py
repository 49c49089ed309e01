"""The ``tune`` command line. Each sub-command is a thin shell over a module that does one job.

Exit codes: 0 success, 1 the work found problems (an invalid sketch, an empty one included, parameters the
profile refuses, a failed compile or verification, nothing verified), 2 usage or I/O error (an unknown option
or value, a path that cannot be read or written: a missing or undecodable sketch file, a study dir that is a
file or read-only). `tune check` and `tune build` answer the same sketch with the same code. A usage error is one
line on stderr, ``tune: error: ...`` (``tune build: error: ...`` for a sub-command); a traceback is never the
answer to bad input.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from kernel_abi.spec import HEAD_DIMS
from tuner.campaign.options import DEFAULT_TRIALS, DRY_RUN_TRIALS


def _click_exceptions():
    """click's exception classes as this typer raises them (typer >= 0.2x vendors click as typer._click)."""
    try:
        from typer._click import exceptions
    except ImportError:
        from click import exceptions
    return exceptions


def _aborts(exceptions) -> tuple:
    """What ends a command as "aborted": click's Abort where the vendored click has one (typer's does not: an
    ``except`` naming it would itself raise while another exception, e.g. a closed pipe's SystemExit, passes), and
    Ctrl-C."""
    return tuple(c for c in (getattr(exceptions, "Abort", None), KeyboardInterrupt) if c is not None)


class _Flags:
    """A flag takes no value, so its help row shows no type. typer's rich help panel prints every option's type,
    a flag's as ``<bool>`` (``TyperOption.display_type_rich`` does not skip flags as its plain help and earlier
    typers did): an empty metavar is what it shows instead."""

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:
            if (getattr(param, "is_flag", False) or getattr(param, "count", False)) and param.metavar is None:
                param.metavar = ""
        return params


class TuneCommand(_Flags, TyperCommand):
    pass


class TuneGroup(_Flags, TyperGroup):
    """The ``tune`` group: click's usage errors (an unknown option, a value of the wrong type or out of range, a
    missing option) as one line, ``tune: error: ...`` (or ``tune build: error: ...``) and exit 2, whatever entry
    point runs it (the console script, ``python -m tuner``, typer's CliRunner); click's own answer is the usage,
    a hint and a boxed message."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, "tune", complete_var, standalone_mode=False, **extra)
        exceptions = _click_exceptions()
        try:
            code = super().main(args, "tune", complete_var, standalone_mode=False, **extra)
        except exceptions.ClickException as exc:
            ctx = getattr(exc, "ctx", None)
            where = ctx.command_path if ctx is not None else "tune"
            message = " ".join(exc.format_message().split()).rstrip(".")
            hint = f" (see `{where} --help`)" if isinstance(exc, exceptions.UsageError) else ""
            typer.echo(f"{where}: error: {message}{hint}", err=True)
            sys.exit(exc.exit_code)
        except _aborts(exceptions):
            typer.echo("tune: aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=TuneGroup,
    add_completion=False,
    no_args_is_help=False,
    invoke_without_command=True,
    help="Autotune FlashAttention kernels for a GPU: `tune --gpu h100 --variant mha` runs a campaign; "
         "`tune --gpu t4 --variant mha --dry-run` compiles a few candidates on any machine, no GPU needed.",
    context_settings={"help_option_names": ["-h", "--help"]},
)


HEAD_DIM_HELP = f"{', '.join(map(str, HEAD_DIMS[:-1]))} or {HEAD_DIMS[-1]} (d_qk = d_v; mla is 192/128)"
SCHEDULE_HELP = ("Reference sketch set when no --sketch: fa2 (the paper's flow; wgmma with mma_atom SM90_GMMA) or "
                 "fa2_late_prefetch (its K prefetch after the P·V GEMM), ws_overlap or ws_serial (Hopper "
                 "warp-specialised). Default: ws_overlap on sm90, fa2 elsewhere.")


LAYOUT_HELP = ("dense, varlen (packed sequences, cu_seqlens) or paged (a paged KV cache): the reference sketch's "
               "offsets.")
PAGE_SIZE_HELP = "With --layout paged: keys per page of the KV cache, one of 16, 32, 64, 128, 256."
WINDOW_HELP = ("L,R: a sliding window, L keys left and R right of each query's diagonal (-1: open; FlashAttention's "
               "window_size; causal closes the right side). The kernel takes the sizes at run time.")
SOFTCAP_HELP = "Soft-cap the scores: cap * tanh(scores / cap) (Gemma 2: 50)."
SINKS_HELP = "A learned logit per query head joins each row's softmax (gpt-oss; FA4's learnable_sink)."
PHASE_HELP = ("prefill, or decode: split-KV decode kernels (a few new tokens per sequence against a KV cache, "
              "paged with 16-token pages by default, or --layout dense), tuned per decode bucket (batch x KV "
              "capacity, tuner/serving/buckets/decode.py) against FA4's paged decode.")


def _model_options(command: str, window, softcap, sinks):
    """--window / --softcap / --sinks as tuner.build.ModelOptions; a one-line usage error where they are malformed
    (absorbed MLA decode refuses them where its target is resolved)."""
    from tuner.build import UsageError, parse_options

    try:
        options = parse_options(window, softcap, sinks)
    except UsageError as exc:
        typer.echo(f"{command}: error: {exc}", err=True)
        raise typer.Exit(2)
    return options


NO_TABLE_HELP = ("Use no bucket-defaults table (hardware_profiles/bucket_defaults/): every key-length bucket takes the "
                 "per-spec default, as on a GPU nobody has tuned.")


def _no_bucket_table(hide: bool) -> None:
    if hide:
        from tuner.defaults.table import hide_tables

        hide_tables()


def _fail_usage(message: str, command: str = "tune") -> "typer.Exit":
    typer.echo(f"{command}: error: {message}", err=True)
    return typer.Exit(2)


def _comma_ints(text: str, option: str, what: str = "a comma list of integers") -> tuple:
    """A comma list of integers, in order; a usage error ("``option`` must be ``what``") when one is not one."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise _fail_usage(f"{option} must be {what}, got {text!r}") from None


def _parse_seqlens(text: Optional[str]):
    if not text:
        return None
    values = _comma_ints(text, "--seqlens")
    if not values or min(values) < 1:
        raise _fail_usage(f"--seqlens must list positive integers, got {text!r}")
    return values


KV_DTYPE_HELP = ("--phase decode: the KV cache's dtype where it is not --dtype's: fp8 (e4m3 with fp32 k_scale/v_scale "
                 "per tensor or per KV head, vLLM's kv_cache_dtype fp8), read by fp16/bf16 queries; absorbed MLA "
                 "(--variant mla, --model deepseek-v3): an e4m3 latent cache with one scale, V read at it.")


def _kv_dtype(text: Optional[str]) -> Optional[str]:
    return None if text is None else text.strip().lower()


def _no_kv_dtype(command: str, kv_dtype: Optional[str]) -> None:
    if kv_dtype is not None:
        typer.echo(f"{command}: error: --kv-dtype is a decode cache's dtype (--phase decode); prefill FP8 is "
                   "--dtype fp8", err=True)
        raise typer.Exit(2)


@app.callback()
def campaign(
    ctx: typer.Context,
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Hardware profile: t4, rtx8000, a100, l40s, h100, h200."),
    variant: Optional[str] = typer.Option(None, "--variant", help="mha, gqa, mqa or mla; a comma list, or all."),
    model: Optional[str] = typer.Option(None, "--model", help="A model preset (`tune models`): its variant, heads "
                                                               "and head dims, e.g. llama3-8b."),
    trials: Optional[int] = typer.Option(None, "--trials", min=1, show_default=False,
                                         help="Per combination: candidates to measure (seeds included; those that "
                                              "fail to compile or verify count, cache hits and sets refused before "
                                              f"compiling do not). Default: {DEFAULT_TRIALS}; with --dry-run "
                                              f"{DRY_RUN_TRIALS}."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Wall-clock budget in seconds (the whole run)."),
    head_dim: Optional[str] = typer.Option(None, "--head-dim", help=HEAD_DIM_HELP + ", or a comma list."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="fp16, bf16 or fp8 (e4m3 in, bf16 out: Hopper, dense, "
                                                              "varlen and paged, head dims 64, 96, 128, 192 and 256), or a comma list (default: bf16 "
                                                              "where supported)."),
    causal: bool = typer.Option(True, "--causal/--no-causal", help="Causal mask (bottom-right aligned); "
                                                                   "`--causal both` tunes both."),
    causal_mode: Optional[str] = typer.Option(None, "--causal-mode", hidden=True),
    study_dir: Path = typer.Option(Path("studies"), "--study-dir", help="Where studies and best kernels live."),
    storage: Optional[str] = typer.Option(None, "--storage", help="Optuna storage URL (default: journal file in the study dir)."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Join this Ray cluster (default: start a local one)."),
    llm_base_url: Optional[str] = typer.Option(None, "--llm-base-url", envvar="OPENAI_BASE_URL", help="OpenAI-compatible endpoint."),
    llm_model: Optional[str] = typer.Option(None, "--llm-model", envvar="OPENAI_MODEL", help="Model name at the endpoint."),
    llm_api_key: Optional[str] = typer.Option(None, "--llm-api-key", envvar="OPENAI_API_KEY", help="API key (never stored)."),
    llm_sketches: int = typer.Option(3, "--llm-sketches", min=0, max=8,
                                     help="Schedule variants to ask of the LLM per combination (each a choice of "
                                          "the search's sketch dimension)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Compile and validate candidates on this machine, no GPU "
                                                          f"needed: {DRY_RUN_TRIALS} per combination unless --trials "
                                                          "says otherwise, about two minutes on a 2-CPU machine (its "
                                                          "first line says how long there); nothing is measured or "
                                                          "stored."),
    resume: bool = typer.Option(False, "--resume", help="Continue the studies in the study dir."),
    remeasure: bool = typer.Option(False, "--remeasure", help="Measure again what the measurement cache of the study "
                                                               "dir holds (default: a kernel measured before on this "
                                                               "GPU for these shapes gets its recorded value)."),
    sampler: str = typer.Option("tpe", "--sampler", help="Sampler: tpe (default), random, qmc, gp, cmaes."),
    backend: Optional[str] = typer.Option(None, "--backend", help="Benchmark backend: gpu (default) or replay:FILE."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Sampler seed."),
    trial_timeout: float = typer.Option(300.0, "--trial-timeout", help="Seconds a GPU trial may verify and benchmark (from taking its GPU's lock) before it is killed."),
    gpu_overlap: int = typer.Option(4, "--gpu-overlap", min=1, max=8,
                                    help="Trial processes per GPU at once: the next starts up while one is timed "
                                         "(timed sections never overlap); 1: one at a time."),
    compile_batch: int = typer.Option(8, "--compile-batch", min=1, help="Kernel configs per nvcc translation unit."),
    seqlens: Optional[str] = typer.Option(None, "--seqlens", help="Comma list of benchmark seqlens (default: the paper grid)."),
    early_stop: bool = typer.Option(True, "--early-stop/--no-early-stop",
                                    help="Probe a candidate at the longest seqlen first and stop timing it when it "
                                         "is over 20% behind the best kernel there (seeds are always timed in full)."),
    layout: Optional[str] = typer.Option(None, "--layout", help="dense (the paper grid; the default), varlen "
                                                                "(packed sequences, cu_seqlens) or paged (a paged KV "
                                                                "cache): a serving layout is measured on the mixes of "
                                                                "tuner/measure/mixes.toml and stored per serving bucket "
                                                                "(Hopper only). --phase decode: paged (default, pages "
                                                                "of 16) or dense. A comma list, or all: every layout "
                                                                "the GPU takes, one study each, one report and store "
                                                                "(with --phase all: decode over a paged cache too)."),
    page_size: Optional[str] = typer.Option(None, "--page-size", help="KV-cache page size of --layout paged: "
                                                                       "16, 32, 64, 128 or 256, or a comma list "
                                                                       "(with several layouts: default 16)."),
    phase: str = typer.Option("prefill", "--phase", help=PHASE_HELP + " all: prefill and decode. The combinations "
                              "share the run's --timeout by candidates: the next goes to the one with the fewest "
                              "finished, each up to --trials."),
    window: Optional[str] = typer.Option(None, "--window", help=WINDOW_HELP),
    softcap: Optional[float] = typer.Option(None, "--softcap", help=SOFTCAP_HELP),
    sinks: bool = typer.Option(False, "--sinks", help=SINKS_HELP),
    layer: Optional[str] = typer.Option(None, "--layer", help="With --model: tune only this kind of the model's "
                                        "layers, local (its sliding window) or global (default: every kind it has, "
                                        "each its own study with the preset's options)."),
    no_bucket_table: bool = typer.Option(False, "--no-bucket-table", help=NO_TABLE_HELP + " The campaign seeds the "
                                         "per-spec default alone and no developer-measured choice (to find the "
                                         "defaults itself: `tune defaults`)."),
    kv_dtype: Optional[str] = typer.Option(None, "--kv-dtype", help=KV_DTYPE_HELP + " Its studies are named -kvfp8 "
                                           "and its records export as configs of their own."),
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    _no_bucket_table(no_bucket_table)
    if gpu is None or (variant is None and model is None):
        if gpu is None and variant is None and model is None:   # nothing asked: the help, then why
            typer.echo(ctx.get_help())
        raise _fail_usage("a campaign needs --gpu and --variant or --model, e.g. tune --gpu t4 --variant mha "
                          f"--dry-run (or use a sub-command: {', '.join(command_names())}; tune --help)")
    from tuner.build import UsageError, parse_options
    from tuner.campaign import CampaignOptions, run_campaign
    from tuner.campaign.options import default_trials

    try:
        attention = parse_options(window, softcap, sinks)
    except UsageError as exc:
        raise _fail_usage(str(exc)) from None
    options = CampaignOptions(
        gpu=gpu, variant=variant, trials=default_trials(dry_run) if trials is None else trials, timeout=timeout,
        head_dim=head_dim, dtype=dtype,
        causal=causal_mode if causal_mode is not None else causal, model=model, study_dir=study_dir,
        storage=storage, ray_address=ray_address, llm_base_url=llm_base_url, llm_model=llm_model,
        llm_api_key=llm_api_key, llm_sketches=llm_sketches, dry_run=dry_run, resume=resume, remeasure=remeasure,
        sampler=sampler, backend=backend, seed=seed, trial_timeout=trial_timeout, gpu_overlap=gpu_overlap,
        compile_batch=compile_batch, seqlens=_parse_seqlens(seqlens), early_stop=early_stop,
        layout=_campaign_layout(layout, phase), page_size=_campaign_page_size(layout, _parse_page_sizes(page_size), phase),
        phase=phase.strip().lower(), window=attention.window if window is not None else None,
        softcap=attention.softcap if softcap is not None else None, sinks=attention.sinks, layer=layer,
        kv_dtype=_kv_dtype(kv_dtype),
    )
    raise typer.Exit(run_campaign(options))


def _parse_page_sizes(text: Optional[str]):
    """--page-size: one size (an int) or a comma list (a tuple); the sizes are checked with the layouts
    (tuner.campaign.combos)."""
    if text is None:
        return None
    what = "an integer or a comma list of them"
    sizes = tuple(dict.fromkeys(_comma_ints(text, "--page-size", what)))
    if not sizes:
        raise _fail_usage(f"--page-size must be {what}, got {text!r}")
    return sizes[0] if len(sizes) == 1 and "," not in text else sizes


def _campaign_layout(layout: Optional[str], phase: str) -> str:
    """--layout as given; unset, dense (prefill) or paged (decode)."""
    if layout is not None:
        return layout.strip().lower()
    return "paged" if phase.strip().lower() == "decode" else "dense"


def _campaign_page_size(layout: Optional[str], page_size: Optional[int], phase: str) -> Optional[int]:
    """--page-size as given; unset with a decode campaign's default paged cache: pages of 16 (vLLM's). (Several
    layouts or phases: combos.serving_targets gives paged kernels pages of 16 by default.)"""
    if page_size is None and layout is None and phase.strip().lower() == "decode":
        return 16
    return page_size


@app.command(cls=TuneCommand)
def check(files: List[Path] = typer.Argument(..., help="TL files to check.")) -> None:
    """Parse and check TL programs; print `ok` or diagnostics per file."""
    from tuner.commands.check import run_check

    raise typer.Exit(run_check(files))


@app.command(cls=TuneCommand)
def gpus() -> None:
    """List the hardware profiles."""
    from tuner.commands.gpus import show_gpus

    raise typer.Exit(show_gpus())


@app.command(cls=TuneCommand)
def models() -> None:
    """List the model presets (`--model NAME`)."""
    from tuner.commands.models import show_models

    raise typer.Exit(show_models())


@app.command(cls=TuneCommand)
def build(
    gpu: str = typer.Option(..., "--gpu"),
    variant: str = typer.Option(..., "--variant"),
    sketch: Optional[Path] = typer.Option(None, "--sketch", help="TL file (default: the built-in reference sketch)."),
    params: Optional[str] = typer.Option(None, "--params", help="JSON object or file of kernel parameters."),
    head_dim: Optional[int] = typer.Option(None, "--head-dim", help=HEAD_DIM_HELP),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="fp16, bf16 or fp8 (e4m3 q/k/v with descales, bf16 out; Hopper, "
                                                      "dense, varlen and paged, head dims 64, 96, 128, 192 and 256)."),
    causal: bool = typer.Option(True, "--causal/--no-causal"),
    out: Path = typer.Option(..., "-o", "--out", help="Output directory for .cu, .cubin and resources JSON."),
    schedule: Optional[str] = typer.Option(None, "--schedule", help=SCHEDULE_HELP),
    layout: Optional[str] = typer.Option(None, "--layout", help=LAYOUT_HELP + " Default: dense (decode: paged)."),
    page_size: Optional[int] = typer.Option(None, "--page-size", help=PAGE_SIZE_HELP + " Checked against the "
                                            "kernel's block N before compiling; without it the paged kernel reads "
                                            "every page size its block N tiles (chosen at run time)."),
    phase: str = typer.Option("prefill", "--phase", help="prefill, or decode: the split-KV decode kernel "
                                                         "(--schedule decode or decode_late; --layout paged, the "
                                                         "default, or dense)."),
    seqlen: Optional[int] = typer.Option(None, "--seqlen", help="Key length the kernel is for: the default is "
                                         "the profile's for its bucket (hardware_profiles/bucket_defaults/; "
                                         "--params change that one). Dense prefill only."),
    window: Optional[str] = typer.Option(None, "--window", help=WINDOW_HELP),
    softcap: Optional[float] = typer.Option(None, "--softcap", help=SOFTCAP_HELP),
    sinks: bool = typer.Option(False, "--sinks", help=SINKS_HELP),
    no_bucket_table: bool = typer.Option(False, "--no-bucket-table", help=NO_TABLE_HELP),
    kv_dtype: Optional[str] = typer.Option(None, "--kv-dtype", help=KV_DTYPE_HELP),
) -> None:
    """Translate a TL program to CuTe C++ and compile it to a cubin (no GPU needed)."""
    from tuner.commands.build import run_build

    _no_bucket_table(no_bucket_table)
    phase = phase.strip().lower()
    if phase not in ("prefill", "decode"):
        typer.echo(f"tune build: error: --phase must be prefill or decode, got {phase!r}", err=True)
        raise typer.Exit(2)
    options = _model_options("tune build", window, softcap, sinks)
    if phase == "decode":
        if seqlen is not None:
            typer.echo("tune build: error: --seqlen picks a dense prefill bucket's default; a decode kernel's "
                       "split is chosen per call", err=True)
            raise typer.Exit(2)
        from tuner.commands.build_decode import run_decode_build

        raise typer.Exit(run_decode_build(gpu, variant, sketch, params, head_dim, dtype, causal, out,
                                          layout.strip().lower() if layout else None, page_size, schedule,
                                          options=options, kv_dtype=_kv_dtype(kv_dtype)))
    _no_kv_dtype("tune build", kv_dtype)
    layout = (layout or "dense").strip().lower()

    raise typer.Exit(run_build(gpu=gpu, variant=variant, sketch=sketch, params=params, head_dim=head_dim,
                               dtype=dtype, causal=causal, out=out, schedule=schedule, layout=layout,
                               page_size=page_size, seqlen=seqlen, options=options))


@app.command(cls=TuneCommand)
def bench(
    gpu: str = typer.Option(..., "--gpu"),
    variant: Optional[str] = typer.Option(None, "--variant", help="mha, gqa, mqa or mla (or give --model)."),
    model: Optional[str] = typer.Option(None, "--model", help="A model preset (`tune models`): its variant, head "
                                                               "dims and heads, e.g. llama3-8b."),
    params: Optional[str] = typer.Option(None, "--params", help="JSON object or file of kernel parameters."),
    sketch: Optional[Path] = typer.Option(None, "--sketch"),
    head_dim: Optional[int] = typer.Option(None, "--head-dim", help=HEAD_DIM_HELP),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="fp16, bf16 or fp8 (e4m3 q/k/v with descales, bf16 out; Hopper, "
                                                      "dense, varlen and paged, head dims 64, 96, 128, 192 and 256)."),
    causal: Optional[bool] = typer.Option(None, "--causal/--no-causal", help="Default: both."),
    seqlens: Optional[str] = typer.Option(None, "--seqlens", help="Comma list (default 512..16384)."),
    out_json: Optional[Path] = typer.Option(None, "--json", help="Write results here."),
    schedule: Optional[str] = typer.Option(None, "--schedule", help=SCHEDULE_HELP),
    layout: Optional[str] = typer.Option(None, "--layout", help=LAYOUT_HELP + " varlen/paged time the serving mixes "
                                                                       "(tuner/measure/mixes.toml) instead of the grid."),
    page_size: Optional[int] = typer.Option(None, "--page-size", help=PAGE_SIZE_HELP + " Default: 16 and 128 "
                                            "(decode: 16)."),
    phase: str = typer.Option("prefill", "--phase", help="prefill, or decode: 1 new token per sequence against a "
                                                         "KV cache (--layout paged, the default, or dense), timed "
                                                         "in GB/s against FA4's paged decode."),
    window: Optional[str] = typer.Option(None, "--window", help=WINDOW_HELP),
    softcap: Optional[float] = typer.Option(None, "--softcap", help=SOFTCAP_HELP),
    sinks: bool = typer.Option(False, "--sinks", help=SINKS_HELP),
    layer: Optional[str] = typer.Option(None, "--layer", help="With --model: which kind of the model's layers to "
                                        "bench, local (its sliding window) or global; the preset's options "
                                        "(window, softcap, sinks) unless --window/--softcap/--sinks are given. "
                                        "Default: the first kind of its layer pattern."),
    no_bucket_table: bool = typer.Option(False, "--no-bucket-table", help=NO_TABLE_HELP),
    kv_dtype: Optional[str] = typer.Option(None, "--kv-dtype", help=KV_DTYPE_HELP + " The bench times the 16-bit "
                                           "cache's kernel beside it in the same process."),
) -> None:
    """Benchmark a kernel on the paper grid against torch SDPA's flash, cuDNN and efficient backends and
    FlashAttention-4 (flash_attn.cute) where installed; with --layout varlen|paged on the serving mixes against
    FA4's flash_attn_varlen_func, FlashInfer (if installed) and SDPA on the padded batch."""
    _no_bucket_table(no_bucket_table)
    layout_given, layout = layout, (layout or "dense").strip().lower()
    phase = phase.strip().lower()
    options = _model_options("tune bench", window, softcap, sinks)
    if phase not in ("prefill", "decode"):
        typer.echo(f"tune bench: error: --phase must be prefill or decode, got {phase!r}", err=True)
        raise typer.Exit(2)
    if phase == "decode":
        if seqlens is not None or schedule is not None:
            typer.echo("tune bench: error: --seqlens and --schedule set prefill benches; --phase decode times the "
                       "decode grid (batch 1-128 x KV 1k-32k)", err=True)
            raise typer.Exit(2)
        from tuner.commands.bench_decode import run_decode_bench

        raise typer.Exit(run_decode_bench(gpu, variant, model, params, sketch, head_dim, dtype, causal,
                                          None if layout_given is None else layout, page_size, out_json,
                                          options=options, layer=layer, kv_dtype=_kv_dtype(kv_dtype)))
    _no_kv_dtype("tune bench", kv_dtype)
    if layout != "dense":
        if seqlens is not None:
            typer.echo(f"tune bench: error: --seqlens sets the paper grid of the dense layout; --layout {layout} times "
                       "the serving mixes of tuner/measure/mixes.toml", err=True)
            raise typer.Exit(2)
        from tuner.commands.bench_serving import run_mix_bench

        raise typer.Exit(run_mix_bench(gpu=gpu, variant=variant, model=model, layout=layout, page_size=page_size,
                                       params=params, sketch=sketch, head_dim=head_dim, dtype=dtype, causal=causal,
                                       schedule=schedule, out_json=out_json, options=options, layer=layer))
    from tuner.commands.bench import run_bench

    raise typer.Exit(run_bench(gpu=gpu, variant=variant, params=params, sketch=sketch, head_dim=head_dim,
                               dtype=dtype, causal=causal, seqlens=seqlens, out_json=out_json, schedule=schedule,
                               page_size=page_size, model=model, options=options, layer=layer))


@app.command("export", cls=TuneCommand)
def export_cmd(
    gpu: str = typer.Option(..., "--gpu"),
    variant: Optional[str] = typer.Option(None, "--variant"),
    study_dir: Path = typer.Option(Path("studies"), "--study-dir"),
    out: Path = typer.Option(..., "-o", "--out"),
) -> None:
    """Export the stored best kernels of a GPU for production (JSON configs, sources, cubins)."""
    from tuner.store.export import run_export

    if not study_dir.is_dir():
        what = "is not a directory" if study_dir.exists() else "does not exist"
        raise _fail_usage(f"--study-dir {study_dir} {what}: a campaign stores its best kernels there "
                          f"(tune --gpu {gpu} --variant {variant or 'mha'} --study-dir {study_dir})", "tune export")

    raise typer.Exit(run_export(gpu=gpu, variant=variant, study_dir=study_dir, out_dir=out))


@app.command("defaults", cls=TuneCommand)
def defaults_cmd(
    gpu: str = typer.Option(..., "--gpu"),
    study_dir: Path = typer.Option(Path("studies"), "--study-dir", help="A campaign study dir (its */summary.json), "
                                   "or a table's records folder (records/<gpu>/)."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Write the table here ('-': print it). Default: "
                                       "<gpu>.toml where tables are read (hardware_profiles/bucket_defaults/ or "
                                       "$TUNER_BUCKET_TABLES), so tune build, tune bench and campaigns use it."),
    force: bool = typer.Option(False, "--force", help="Replace the GPU's table where tables are read."),
) -> None:
    """Derive a GPU's bucket-defaults table from its campaigns: each bucket winner confirmed faster than the
    per-spec default in fresh processes becomes a change for that bucket."""
    from tuner.commands.defaults import run_defaults

    raise typer.Exit(run_defaults(gpu, study_dir, out, force))


def command_names() -> tuple[str, ...]:
    """The sub-commands registered on the app (a new one joins the list by being registered)."""
    return tuple(c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands)


def campaign_argv(argv: list[str]) -> list[str]:
    """A campaign's ``--causal both|true|false`` (a value) next to the ``--causal``/``--no-causal`` flags: the
    value form becomes the hidden ``--causal-mode``. Sub-commands keep their plain flags."""
    from tuner.campaign.combos import CAUSAL_WORDS

    commands = command_names()
    if any(a in commands for a in argv):
        return argv
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--causal" and i + 1 < len(argv) and argv[i + 1].lower() in CAUSAL_WORDS:
            out.append(f"--causal-mode={argv[i + 1]}")
            i += 2
            continue
        out.append(f"--causal-mode={a.split('=', 1)[1]}" if a.startswith("--causal=") else a)
        i += 1
    return out


def main() -> None:
    # Ray's token auth is on by default; a local cluster that this tool starts has nothing to guard.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    app(args=campaign_argv(sys.argv[1:]))


if __name__ == "__main__":
    main()
