"""`tune bench`: our kernel against torch SDPA's flash, cuDNN and efficient backends, and FlashAttention-4 where
installed, on the paper grid (tuner/measure/dense.py; docs/benchmarks.md); a serving layout is
tuner.commands.bench_serving's, the decode phase tuner.commands.bench_decode's. Our kernel is verified first: an
unverified kernel is reported FAILED and never timed."""
from __future__ import annotations

import datetime as _dt
import json
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from rich.console import Console
from rich.table import Table

from tuner.build import ModelOptions, build_kernels
from tuner.measure import fa4, flashinfer_fp8
from tuner.measure.dense import BASELINES, DEFAULT_SEQLENS, FP8_BASELINES, bench_problems, bench_rows
from tuner.measure.timer import first_line


@dataclass(frozen=True)
class BenchTarget:
    """What `tune bench` measures, from --variant/--head-dim or a --model preset: ``heads`` None is the paper
    grid's heads; ``causals`` the masks to build a kernel for."""

    variant: str
    head_dim: Optional[int]
    heads: Optional[tuple[int, int]]
    causals: tuple[bool, ...]
    dtype: Optional[str]
    model: Optional[str] = None


def preset_options(model: Optional[str], layer: Optional[str], options: "ModelOptions") -> tuple:
    """(the options to build and time, a line saying where they came from, or None). A --model preset whose attention
    has options (a sliding window on its local layers, a cap, sinks: tuner/models.toml) gives those of its ``layer``
    kind (local or global; default: the pattern's first), unless --window/--softcap/--sinks are given, which win.
    UsageError for --layer without --model or a kind the model does not have."""
    from tuner.build import NO_OPTIONS, UsageError
    from tuner.models import ModelError, get_model

    if model is None:
        if layer is not None:
            raise UsageError("--layer picks a --model preset's kind of layer (local or global); give --model")
        return options, None
    try:
        preset = get_model(model)
    except ModelError as exc:
        raise UsageError(str(exc)) from None
    kinds = preset.layer_kinds()
    if layer is not None and layer.strip().lower() not in kinds:
        raise UsageError(f"model {preset.name} has {' and '.join(kinds)} layers; --layer {layer} is not one of them")
    if options != NO_OPTIONS:
        return options, f"{preset.name}: the options given (--window/--softcap/--sinks), not the preset's"
    kind = layer.strip().lower() if layer is not None else kinds[0]
    values = preset.options(kind)
    from tuner.build import ModelOptions

    chosen = ModelOptions(values["window"], values["softcap"], values["sinks"])
    if chosen == NO_OPTIONS:
        return options, None
    said = ", ".join(x for x in (values["window"] != (-1, -1) and f"window {values['window'][0]},{values['window'][1]}",
                                 values["softcap"] and f"softcap {values['softcap']:g}", values["sinks"] and "sinks")
                     if x)
    return chosen, f"{preset.name} {kind} layers ({preset.layers} repeating): {said}"


def resolve_bench_target(variant: Optional[str], model: Optional[str], head_dim: Optional[int],
                         dtype: Optional[str], causal: Optional[bool]) -> BenchTarget:
    """--variant or --model (UsageError naming the conflict); a model gives its variant, head dims, heads, the
    masks it runs with (unless --causal/--no-causal) and its serving dtype (unless --dtype); a model whose head
    dims the kernels do not take yet is refused, saying so."""
    from tuner.build import UsageError
    from tuner.models import ModelError, get_model

    if model is None:
        if variant is None:
            raise UsageError("give --variant (mha, gqa, mqa or mla) or --model (a preset of `tune models`)")
        return BenchTarget(variant, head_dim, None, (False, True) if causal is None else (causal,), dtype)
    if variant is not None or head_dim is not None:
        raise UsageError("--model sets the variant and head dim; drop --variant/--head-dim")
    try:
        preset = get_model(model)
    except ModelError as exc:
        raise UsageError(str(exc)) from None
    if preset.kernel_support():
        raise UsageError(preset.kernel_support())
    return BenchTarget(preset.variant, None if preset.variant == "mla" else preset.d_qk,
                       (preset.heads_q, preset.heads_kv),
                       tuple(sorted(preset.causal)) if causal is None else (causal,),
                       dtype or preset.dtypes[0], preset.name)


def parse_seqlens(text: Optional[str]) -> tuple[int, ...]:
    if text is None:
        return DEFAULT_SEQLENS
    try:
        values = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise ValueError(f"--seqlens must be a comma list of integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"--seqlens needs positive integers, got {text!r}")
    return values


def results_table(rows: Sequence[dict], title: str) -> Table:
    table = Table(title=title)
    bf16 = any("ours_bf16" in r for r in rows)   # an FP8 bench: our bf16 kernel on the same values beside
    fp8 = FP8_BASELINES if any(FP8_BASELINES[0] in r for r in rows) else ()   # ... and FlashInfer's FP8 prefill
    names = BASELINES + fp8
    for col in ("seqlen", "causal", "batch", "heads", "ours TF", *(("ours bf16", "ours/bf16") if bf16 else ()),
                "flash", "cudnn", "efficient", "fa4", *(("fi fp8",) if fp8 else ()), "ours/flash", "ours/cudnn",
                "ours/eff", "ours/fa4", *(("ours/fi fp8",) if fp8 else ()), "status"):
        table.add_column(col, justify="right" if col not in ("status", "causal") else "left")

    def fmt(x):
        return "–" if x is None else f"{x:g}"

    def base(r, name):
        return fa4.NOT_INSTALLED if fa4.is_not_installed(r.get(f"{name}_err")) else fmt(r.get(name))

    for r in rows:
        status = r["status"] if r["status"] == "ok" else f"[red]{r['status']}[/red] {r.get('reason', '')}"
        table.add_row(str(r["seqlen"]), "yes" if r["causal"] else "no", str(r["batch"]),
                      f"{r['heads_q']}/{r['heads_kv']}", fmt(r.get("ours")),
                      *((fmt(r.get("ours_bf16")), fmt(r.get("ours/ours_bf16"))) if bf16 else ()),
                      *(base(r, name) for name in names),
                      *(fmt(r.get(f"ours/{name}")) for name in names), status)
    return table


def device_problem(profile, err: Console) -> Optional[str]:
    """Why this machine cannot time ``profile``'s kernels (no GPU, another architecture); None when it can.
    Warns (on ``err``) when the GPU is of the architecture but not one of the profile's devices."""
    import torch

    if not torch.cuda.is_available():
        return ("no CUDA GPU is visible: `tune bench` times kernels on a GPU "
                "(use `tune build` to translate and compile without one)")
    major, minor = torch.cuda.get_device_capability()
    device_name = torch.cuda.get_device_name()
    if (major, minor) != tuple(profile.compute_capability) and not (profile.sm == 80 and major == 8):
        return (f"the {profile.name} profile builds {profile.nvcc_arch} cubins, which cannot run (or be "
                f"timed meaningfully) on this {device_name} (compute capability {major}.{minor})")
    if not any(n.lower() in device_name.lower() for n in profile.device_names):
        err.print(f"warning: this is a {device_name}, not one of the {profile.name} profile's devices "
                  f"({', '.join(profile.device_names)}); the numbers are for this device", markup=False)
    return None


def environment_record(profile, nvcc_version) -> dict:
    """The machine and library versions a `tune bench --json` record starts with."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    return {"command": " ".join(sys.argv), "date": _dt.datetime.now(_dt.timezone.utc).isoformat(),
            "device": torch.cuda.get_device_name(), "capability": f"{major}.{minor}", "gpu_profile": profile.name,
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            "python": platform.python_version(), "nvcc": nvcc_version, "fa4": fa4.status(),
            "flashinfer": flashinfer_fp8.library_status()}


def run_bench(gpu: str, variant: Optional[str], params: Optional[str], sketch: Optional[Path],
              head_dim: Optional[int], dtype: Optional[str], causal: Optional[bool], seqlens: Optional[str],
              out_json: Optional[Path], console: Optional[Console] = None, cache_dir: Optional[Path] = None,
              schedule: Optional[str] = None, page_size: Optional[int] = None, model: Optional[str] = None,
              options: Optional["ModelOptions"] = None, layer: Optional[str] = None) -> int:
    """0 measured (some rows may be FAILED: see the table); 1 sketch/params/compile failed; 2 bad input,
    no GPU, or a GPU the profile's cubins cannot run on. ``options``: a window, a cap, sinks (tuner.build), built
    into the kernel and given to every problem, FA4 and the reference alike."""
    from tuner.build import NO_OPTIONS, UsageError, resolve_schedule, resolve_target

    options = options or NO_OPTIONS

    console = console or Console()
    err = Console(stderr=True, soft_wrap=True)

    def usage(msg: str) -> int:
        err.print(f"tune bench: error: {msg}", markup=False, highlight=False)
        return 2

    try:
        if page_size is not None:
            raise UsageError("--page-size applies to --layout paged only (got --layout dense)")
        target = resolve_bench_target(variant, model, head_dim, dtype, causal)
        options, options_note = preset_options(model, layer, options)
        variant, head_dim, dtype = target.variant, target.head_dim, target.dtype
        seqlen_list = parse_seqlens(seqlens)
        targets = [resolve_target(gpu, variant, head_dim, dtype, c, options=options) for c in target.causals]
        schedule = resolve_schedule(schedule, targets[0][0])
    except (UsageError, ValueError) as exc:
        return usage(str(exc))
    profile = targets[0][0]
    if options_note:
        err.print(f"tune bench: {options_note}", markup=False, highlight=False)

    import torch

    problem = device_problem(profile, err)
    if problem is not None:
        return usage(problem)
    device_name = torch.cuda.get_device_name()

    built, code = build_kernels(targets, variant, params, sketch, profile, err, cache_dir, schedule, seqlen_list)
    if built is None:
        return code
    bf16_built = {}   # an FP8 bench times our bf16 default of each spec too, on the same values
    if targets[0][1].dtype == "fp8" and params is None and sketch is None:
        bf16_targets = [resolve_target(gpu, variant, head_dim, "bf16", c) for c in target.causals]
        more, code = build_kernels(bf16_targets, variant, None, None, profile, err, cache_dir, schedule, seqlen_list)
        if more is None:
            return code
        for twin in more:
            bf16_built.setdefault(twin.spec.causal, []).append(twin)

    from tuner.serving.launch import load_kernel
    from tuner.measure.verify import verify

    all_rows: list[dict] = []
    kernels_info = {}
    bf16_loaded: dict = {}
    for b in built:
        label = b.spec.label() if b.seqlens is None else f"{b.spec.label()}@{','.join(map(str, b.seqlens))}"
        problems = [p.with_(**options.problem_changes(p.causal))
                    for p in bench_problems(variant, head_dim, b.spec.dtype, b.spec.causal, b.seqlens or seqlen_list,
                                            target.heads)]
        kernel, verified, reason, report = None, False, "", None
        try:
            kernel = load_kernel(b.compiled.cubin, b.kernel.meta())
            report = verify(kernel, b.spec)
            verified, reason = bool(report.passed), (report.reason or "")
        except Exception as exc:  # noqa: BLE001 - a kernel that cannot load or run is a FAILED row, not a crash
            reason = f"{type(exc).__name__}: {first_line(exc)}"
        kernels_info[label] = {"name": b.kernel.name, "params": b.params.to_dict(),
                               "resources": b.compiled.resources(), "verified": verified, "reason": reason,
                               "verification": report.to_dict() if report is not None else None}
        if not verified:
            err.print(f"{b.kernel.name}: verification FAILED ({reason}); it is not timed", markup=False)
        console.print(f"[bold]{label}[/bold]: {b.kernel.name} {b.params.key()} "
                      f"({b.compiled.registers} regs, {b.compiled.spill_stores} B spills)")
        rows = bench_rows(kernel, problems,
                          verified=verified, verify_reason=reason,
                          on_row=lambda r: console.print(
                              f"  s={r['seqlen']:>5} causal={r['causal']!s:5} ours={r.get('ours')} "
                              f"flash={r.get('flash')} cudnn={r.get('cudnn')} eff={r.get('efficient')} "
                              f"fa4={r.get('fa4')}"
                              + (f" flashinfer_fp8={r.get('flashinfer_fp8')}" if "flashinfer_fp8" in r else "")
                              + (f" ({r['flashinfer_fp8_err']})" if r.get("flashinfer_fp8_err") else "")
                              + f" {r['status']}", markup=False, highlight=False, soft_wrap=True))
        if bf16_built.get(b.spec.causal):
            if b.spec.causal not in bf16_loaded:   # (verified once, whatever the FP8 kernels' bucket groups)
                bf16_loaded[b.spec.causal] = load_bf16_twins(bf16_built[b.spec.causal], console)
            add_bf16_twins(rows, bf16_loaded[b.spec.causal], problems, on_row=lambda r: console.print(
                f"  s={r['seqlen']:>5} causal={r['causal']!s:5} ours_bf16={r.get('ours_bf16')} "
                f"ours/ours_bf16={r.get('ours/ours_bf16')}", markup=False, highlight=False, soft_wrap=True))
        all_rows += rows
    console.print(results_table(all_rows, f"{variant} on {device_name} ({profile.name}), TFLOPS"))

    if out_json is not None:
        record = {"tool": "tune bench", **environment_record(profile, built[0].compiled.nvcc_version),
                  "variant": variant, "model": target.model, "kernels": kernels_info, "rows": all_rows}
        problem = write_record(out_json, record)
        if problem is not None:
            return usage(problem)
        console.print(f"wrote {out_json}", markup=False, highlight=False)
    return 0


def load_bf16_twins(twins: list, console: Console) -> dict:
    """{the seqlens a twin serves (None: all): its loaded kernel} of the bf16 twins that pass the gate."""
    from tuner.measure.verify import verify
    from tuner.serving.launch import load_kernel

    loaded = {}
    for twin in twins:
        kernel = load_kernel(twin.compiled.cubin, twin.kernel.meta())
        report = verify(kernel, twin.spec)
        console.print(f"  bf16 twin {twin.kernel.name}: verified={report.passed}", markup=False, highlight=False)
        if report.passed:
            loaded[twin.seqlens and tuple(twin.seqlens)] = kernel
    return loaded


def add_bf16_twins(rows: list[dict], loaded: dict, problems, on_row=None) -> None:
    """Our bf16 default of the same spec (its bucket's, where the profile's table has one; ``loaded``:
    load_bf16_twins) timed on each FP8 row's problem in bf16: ``ours_bf16`` and ``ours/ours_bf16`` in the rows;
    ``on_row(row)`` after each (the log line: a narrow terminal truncates the table's columns)."""
    import dataclasses

    for row, problem in zip(rows, problems):
        kernel = next((k for seqlens, k in loaded.items() if seqlens is None or problem.seqlen_k in seqlens), None)
        if kernel is None:
            continue
        other = bench_rows(kernel, [dataclasses.replace(problem, dtype="bf16")], with_baselines=False)[0]
        row["ours_bf16"] = other.get("ours")
        if row.get("ours") and other.get("ours"):
            row["ours/ours_bf16"] = round(row["ours"] / other["ours"], 3)
        if on_row is not None:
            on_row(row)


def write_record(path: Path, record: dict) -> Optional[str]:
    """Write a `--json` record; why it could not be written, or None."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(record, indent=1, default=str))
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror or exc}"
    return None
