"""`tune bench`: our kernel against torch SDPA's flash, cuDNN and efficient backends, and FlashAttention-4
where installed (tuner/fa4.py), on the paper grid.

Protocol (DESIGN.md): 16k tokens per shape (batch = 16384 / seqlen), hidden 2048; every backend measured
in this process on the same input tensors; median of many timed runs after warm-up, rotating several input
sets so no run finds its operands in L2; TFLOPS = Problem.flops / time. Our kernel is verified first: an
unverified kernel is reported FAILED and never timed.

Our kernel and FA4 take (b, s, h, d); SDPA takes (b, h, s, d): SDPA gets transposed views of the same storage.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import itertools
import json
import math
import platform
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from rich.console import Console
from rich.table import Table

from tuner import fa4
from kernel_abi.spec import Problem, grid_problems

SDPA_BASELINES = ("flash", "cudnn", "efficient")
# In this order: our output is cross-checked against the first that ran, so an SDPA backend when one can.
BASELINES = SDPA_BASELINES + ("fa4",)
DEFAULT_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
# Our output against the first baseline that ran, on the benchmark inputs themselves: a kernel that
# passed verification on small shapes but breaks at grid size (index overflow, grid limits) is caught.
CROSS_CHECK_REL_ERR = 2e-2


def tflops(problem: Problem, ms: float) -> float:
    return problem.flops / (ms * 1e-3) / 1e12


def bench_problems(variant: str, head_dim: Optional[int], dtype: str, causal: Optional[bool],
                   seqlens: Sequence[int] = DEFAULT_SEQLENS, heads: Optional[tuple[int, int]] = None) -> list[Problem]:
    """The paper grid: MHA 32 heads at d64 / 16 at d128, GQA 16q/2kv and MQA 16q/1kv at d128, MLA 16 heads
    192/128; causal and not unless one is asked for. ``heads`` (a --model's) replaces the grid's."""
    # heads_for ignores the head dim for mla (always 192/128)
    return grid_problems(variant, 128 if head_dim is None else head_dim, dtype, causal, seqlens=tuple(seqlens),
                         heads=heads)


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


def resolve_bench_target(variant: Optional[str], model: Optional[str], head_dim: Optional[int],
                         dtype: Optional[str], causal: Optional[bool]) -> BenchTarget:
    """--variant or --model (UsageError naming the conflict); a model gives its variant, head dims, heads, the
    masks it runs with (unless --causal/--no-causal) and its serving dtype (unless --dtype)."""
    from tuner.build_cmd import UsageError
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


# -- inputs and timing (torch imported lazily: the module loads on CPU-only machines) ----------------


def _torch_dtype(dtype: str):
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]


@dataclass(frozen=True)
class Timing:
    """How one measurement is taken: do_bench's warm-up and repetition budgets (milliseconds of GPU time)
    and the number of input sets rotated. The defaults are `tune bench`'s; a campaign trial, which only
    ranks candidates against baselines timed the same way, uses shorter budgets."""

    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    rotate: int = 3

    def __post_init__(self) -> None:
        if not (self.warmup_ms >= 0 and self.rep_ms > 0 and self.rotate >= 1):
            raise ValueError(f"timing needs warmup_ms >= 0, rep_ms > 0 and rotate >= 1, got {self}")


DEFAULT_TIMING = Timing()


def make_inputs(problem: Problem, sets: int = 3, seed: int = 0, device: str = "cuda") -> list[tuple]:
    """``sets`` independent (q, k, v) triples in our (b, s, h, d) layout, on ``device``."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    dt = _torch_dtype(problem.dtype)
    p = problem

    def randn(*shape):
        return torch.randn(*shape, device=device, dtype=dt, generator=gen)

    return [(randn(p.batch, p.seqlen_q, p.heads_q, p.d_qk), randn(p.batch, p.seqlen_k, p.heads_kv, p.d_qk),
             randn(p.batch, p.seqlen_k, p.heads_kv, p.d_v)) for _ in range(max(1, sets))]


def time_ms(fn: Callable[[], object], warmup: int = 10, reps: int = 50, *, timing: Optional[Timing] = None) -> float:
    """Median milliseconds of ``fn`` on the current stream: triton's do_bench when installed (it also
    flushes L2; ``timing`` gives its budgets), else CUDA events around ``warmup`` + ``reps`` calls."""
    timing = timing or DEFAULT_TIMING
    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None
    if do_bench is not None:
        return float(do_bench(fn, warmup=timing.warmup_ms, rep=timing.rep_ms, return_mode="median"))
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def alternating_rounds(calls: dict, rounds: int) -> dict:
    """{label: [ms of each round]}: every call timed once a round (time_ms), the order reversed every other round so
    that none always runs first (clock and power drift fall on all alike)."""
    ms = {label: [] for label in calls}
    for r in range(rounds):
        for label in (list(calls) if r % 2 == 0 else list(reversed(calls))):
            ms[label].append(time_ms(calls[label]))
    return ms


def _rotating(call: Callable, inputs: Sequence[tuple]) -> Callable[[], object]:
    cycle = itertools.cycle(inputs)
    return lambda: call(*next(cycle))


def measure_problem(kernel, problem: Problem, rotate: int = 3, inputs: Optional[Sequence[tuple]] = None, *,
                    timing: Optional[Timing] = None, device: str = "cuda") -> float:
    """Median ms of ``kernel(q, k, v)`` on this problem, rotating ``rotate`` input sets (``timing.rotate``
    when a timing is given)."""
    if inputs is None:
        inputs = make_inputs(problem, timing.rotate if timing is not None else rotate, device=device)
    return time_ms(_rotating(kernel, inputs), timing=timing)


def _sdpa_call(problem: Problem):
    import torch.nn.functional as F

    gqa = problem.heads_q != problem.heads_kv

    def call(q, k, v):
        kwargs = {"enable_gqa": True} if gqa else {}
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=problem.causal, scale=problem.softmax_scale, **kwargs)

    return call


def _backend(name: str):
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0][:200] if text else type(exc).__name__)


def _baseline(name: str, problem: Problem):
    """(context to run it in, ``call(q, k, v)`` to time, its output -> (b, s, h, d)). FA4 raises
    fa4.Fa4Unavailable here when it is not importable."""
    if name == "fa4":
        return contextlib.nullcontext(), fa4.attention_call(problem), (lambda out: out)
    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel(_backend(name)), _sdpa_call(problem), (lambda out: out.transpose(1, 2))


def measure_baselines(problem: Problem, inputs: Optional[Sequence[tuple]] = None, *, rotate: int = 3,
                      errors: Optional[dict] = None, outputs: Optional[dict] = None,
                      timing: Optional[Timing] = None, device: str = "cuda") -> dict[str, Optional[float]]:
    """TFLOPS of torch SDPA's flash, cuDNN and efficient backends and of FA4; None where a backend cannot
    run the shape or is not installed (the reason goes to ``errors[name]``). ``outputs[name]`` receives
    each backend's output on the first input set, in (b, s, h, d), for cross-checks.

    Each backend's first call is untimed: it pays first-use costs (FA4 JIT-compiles per shape, 1-4 s).
    FA4's output must agree with the first SDPA backend that ran, as ours must (CROSS_CHECK_REL_ERR): a
    library called wrongly would otherwise be a fast, meaningless bar."""
    if inputs is None:
        inputs = make_inputs(problem, timing.rotate if timing is not None else rotate, device=device)
    result: dict[str, Optional[float]] = {}
    ref = None   # (name, output) of the first SDPA backend that ran
    for name in BASELINES:
        try:
            context, call, to_ours = _baseline(name, problem)
            with context:
                out = to_ours(call(*inputs[0]))
                _sync()
                if name == "fa4" and ref is not None:
                    rel = _rel_err(out, ref[1])
                    if not rel <= CROSS_CHECK_REL_ERR:   # also NaN
                        raise ValueError(f"output differs from torch SDPA {ref[0]} on the benchmark inputs "
                                         f"(rel err {rel:.3g} > {CROSS_CHECK_REL_ERR})")
                if ref is None and name in SDPA_BASELINES:
                    ref = (name, out)
                if outputs is not None:
                    outputs[name] = out
                result[name] = tflops(problem, time_ms(_rotating(call, inputs), timing=timing))
        except Exception as exc:  # noqa: BLE001 - "cannot run this shape" comes in many exception types
            result[name] = None
            if errors is not None:
                errors[name] = _first_line(exc)
    return result


def _rel_err(out, ref) -> float:
    diff = (out.float() - ref.float()).norm().item()
    base = ref.float().norm().item()
    return diff / base if base else math.inf


def bench_rows(kernel, problems: Sequence[Problem], *, verified: bool = True, verify_reason: str = "",
               rotate: int = 3, with_baselines: bool = True, on_row: Optional[Callable[[dict], None]] = None
               ) -> list[dict]:
    """One dict per problem: TFLOPS of ours (None unless ``verified`` and the run checks out), of each
    baseline, and the ratios. ``kernel`` may be None (baselines only)."""
    import torch

    rows = []
    for problem in problems:
        row = problem_row(problem)
        inputs = make_inputs(problem, rotate)
        errors: dict[str, str] = {}
        outputs: dict = {}
        baselines = measure_baselines(problem, inputs, errors=errors, outputs=outputs) if with_baselines else {}
        row.update({name: _round(baselines.get(name)) for name in BASELINES})
        raw = dict(baselines)
        row.update({f"{name}_err": msg for name, msg in errors.items()})
        row["ours"] = None
        if kernel is None:
            row["status"] = "no kernel"
        elif not verified:
            row["status"] = "FAILED"
            row["reason"] = verify_reason or "verification failed"
        else:
            try:
                out = kernel(*inputs[0])
                _sync()
                ref = next((n for n in BASELINES if n in outputs), None)
                if ref is not None:
                    row["cross_check_rel_err"] = _rel_err(out, outputs[ref])
                    row["cross_check_against"] = ref
                bad = (not torch.isfinite(out).all().item()) or row.get("cross_check_rel_err", 0.0) > CROSS_CHECK_REL_ERR
                if bad:
                    against = "FA4" if ref == "fa4" else f"SDPA {ref}"
                    row["status"] = "FAILED"
                    row["reason"] = ("output is not finite" if ref is None else
                                     f"output differs from {against} on the benchmark inputs "
                                     f"(rel err {row['cross_check_rel_err']:.3g}) or is not finite")
                else:
                    ms = measure_problem(kernel, problem, inputs=inputs)
                    raw["ours"] = tflops(problem, ms)
                    row.update(ours=_round(raw["ours"]), ours_ms=round(ms, 5), status="ok")
            except Exception as exc:  # noqa: BLE001 - a launch failure is a result for this row
                row["status"] = "error"
                row["reason"] = _first_line(exc)
        for name in BASELINES:
            ours, base = raw.get("ours"), raw.get(name)
            row[f"ours/{name}"] = round(ours / base, 3) if ours is not None and base else None
        del inputs, outputs
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def problem_row(problem: Problem) -> dict:
    return {"variant": problem.variant, "batch": problem.batch, "heads_q": problem.heads_q,
            "heads_kv": problem.heads_kv, "seqlen": problem.seqlen_q, "d_qk": problem.d_qk, "d_v": problem.d_v,
            "causal": problem.causal, "dtype": problem.dtype, "flops": problem.flops}


def _round(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(x, 2)


# -- the command --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Built:
    spec: object
    params: object
    kernel: object          # GeneratedKernel
    compiled: object        # CompileResult
    seqlens: Optional[tuple[int, ...]] = None   # the seqlens this kernel serves (a bucket default's); None: all


def _results_table(rows: Sequence[dict], title: str) -> Table:
    table = Table(title=title)
    for col in ("seqlen", "causal", "batch", "heads", "ours TF", "flash", "cudnn", "efficient", "fa4",
                "ours/flash", "ours/cudnn", "ours/eff", "ours/fa4", "status"):
        table.add_column(col, justify="right" if col not in ("status", "causal") else "left")

    def fmt(x):
        return "–" if x is None else f"{x:g}"

    def base(r, name):
        return fa4.NOT_INSTALLED if fa4.is_not_installed(r.get(f"{name}_err")) else fmt(r.get(name))

    for r in rows:
        status = r["status"] if r["status"] == "ok" else f"[red]{r['status']}[/red] {r.get('reason', '')}"
        table.add_row(str(r["seqlen"]), "yes" if r["causal"] else "no", str(r["batch"]),
                      f"{r['heads_q']}/{r['heads_kv']}", fmt(r.get("ours")),
                      *(base(r, name) for name in BASELINES),
                      *(fmt(r.get(f"ours/{name}")) for name in BASELINES), status)
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
            "python": platform.python_version(), "nvcc": nvcc_version, "fa4": fa4.status()}


def run_bench(gpu: str, variant: Optional[str], params: Optional[str], sketch: Optional[Path],
              head_dim: Optional[int], dtype: Optional[str], causal: Optional[bool], seqlens: Optional[str],
              out_json: Optional[Path], console: Optional[Console] = None, cache_dir: Optional[Path] = None,
              schedule: Optional[str] = None, layout: str = "dense", page_size: Optional[int] = None,
              model: Optional[str] = None) -> int:
    """0 measured (some rows may be FAILED: see the table); 1 sketch/params/compile failed; 2 bad input,
    no GPU, or a GPU the profile's cubins cannot run on. A serving layout (varlen, paged) is
    tuner.bench_mixes's: the mixes of tuner/mixes.toml instead of the paper grid."""
    from tuner.build_cmd import UsageError, resolve_schedule, resolve_target

    console = console or Console()
    err = Console(stderr=True, soft_wrap=True)

    def usage(msg: str) -> int:
        err.print(f"tune bench: error: {msg}", markup=False, highlight=False)
        return 2

    if layout != "dense":
        if seqlens is not None:
            return usage(f"--seqlens sets the paper grid of the dense layout; --layout {layout} times the serving "
                         "mixes of tuner/mixes.toml")
        from tuner.bench_mixes import run_mix_bench

        return run_mix_bench(gpu=gpu, variant=variant, model=model, layout=layout, page_size=page_size,
                             params=params, sketch=sketch, head_dim=head_dim, dtype=dtype, causal=causal,
                             schedule=schedule, out_json=out_json, console=console, cache_dir=cache_dir)
    try:
        if page_size is not None:
            raise UsageError("--page-size applies to --layout paged only (got --layout dense)")
        target = resolve_bench_target(variant, model, head_dim, dtype, causal)
        variant, head_dim, dtype = target.variant, target.head_dim, target.dtype
        seqlen_list = parse_seqlens(seqlens)
        targets = [resolve_target(gpu, variant, head_dim, dtype, c) for c in target.causals]
        schedule = resolve_schedule(schedule, targets[0][0])
    except (UsageError, ValueError) as exc:
        return usage(str(exc))
    profile = targets[0][0]

    import torch

    problem = device_problem(profile, err)
    if problem is not None:
        return usage(problem)
    device_name = torch.cuda.get_device_name()

    built, code = _build_kernels(targets, variant, params, sketch, profile, err, cache_dir, schedule, seqlen_list)
    if built is None:
        return code

    from tuner.serving.launch import load_kernel
    from tuner.verify import verify

    all_rows: list[dict] = []
    kernels_info = {}
    for b in built:
        label = b.spec.label() if b.seqlens is None else f"{b.spec.label()}@{','.join(map(str, b.seqlens))}"
        problems = bench_problems(variant, head_dim, b.spec.dtype, b.spec.causal, b.seqlens or seqlen_list,
                                  target.heads)
        kernel, verified, reason, report = None, False, "", None
        try:
            kernel = load_kernel(b.compiled.cubin, b.kernel.meta())
            report = verify(kernel, b.spec)
            verified, reason = bool(report.passed), (report.reason or "")
        except Exception as exc:  # noqa: BLE001 - a kernel that cannot load or run is a FAILED row, not a crash
            reason = f"{type(exc).__name__}: {_first_line(exc)}"
        kernels_info[label] = {"name": b.kernel.name, "params": b.params.to_dict(),
                               "resources": b.compiled.resources(), "verified": verified, "reason": reason,
                               "verification": report.to_dict() if report is not None else None}
        if not verified:
            err.print(f"{b.kernel.name}: verification FAILED ({reason}); it is not timed", markup=False)
        console.print(f"[bold]{label}[/bold]: {b.kernel.name} {b.params.key()} "
                      f"({b.compiled.registers} regs, {b.compiled.spill_stores} B spills)")
        all_rows += bench_rows(kernel, problems,
                               verified=verified, verify_reason=reason,
                               on_row=lambda r: console.print(
                                   f"  s={r['seqlen']:>5} causal={r['causal']!s:5} ours={r.get('ours')} "
                                   f"flash={r.get('flash')} cudnn={r.get('cudnn')} eff={r.get('efficient')} "
                                   f"fa4={r.get('fa4')} {r['status']}", markup=False, highlight=False))
    console.print(_results_table(all_rows, f"{variant} on {device_name} ({profile.name}), TFLOPS"))

    if out_json is not None:
        record = {"tool": "tune bench", **environment_record(profile, built[0].compiled.nvcc_version),
                  "variant": variant, "model": target.model, "kernels": kernels_info, "rows": all_rows}
        problem = write_record(out_json, record)
        if problem is not None:
            return usage(problem)
        console.print(f"wrote {out_json}", markup=False, highlight=False)
    return 0


def write_record(path: Path, record: dict) -> Optional[str]:
    """Write a `--json` record; why it could not be written, or None."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(record, indent=1, default=str))
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror or exc}"
    return None


def _build_kernels(targets, variant, params, sketch, profile, err, cache_dir, schedule: str = "fa2",
                   seqlens: Optional[Sequence[int]] = None, page_size: Optional[int] = None):
    """Translate and compile one kernel per (spec) in one batched nvcc call, each from the reference sketch of
    its spec's layout unless a sketch file is given. With neither --params nor a sketch file and ``seqlens``
    given, a warp-specialised dense spec gets one kernel per distinct bucket default of those seqlens
    (tuner/bucket_defaults.py), each serving its own seqlens. ``page_size``: a paged spec's default is the one for
    that page size (translate.defaults.WHOLE_TILE_PAGES). (built, exit code)."""
    import translate
    from translate import nvcc
    from translate.defaults import default_params, probe_problem
    from translate.params import validate
    from tl.pipelines import has_roles
    from tuner.bucket_defaults import applies_to, group_by_params
    from tuner.build_cmd import UsageError, load_checked_program, parse_params_arg

    pending = []
    for prof, spec in targets:
        try:
            program, _, label, diagnostics = load_checked_program(variant, spec.causal, sketch, schedule,
                                                                  spec.layout)
            warp_specialized = program is not None and has_roles(program.statements)
            kp = parse_params_arg(params, default_params(prof, spec, "ws_overlap" if warp_specialized else "fa2",
                                                         page_size=page_size))
            groups = [(kp, None)]
            if (params is None and sketch is None and seqlens is not None and warp_specialized
                    and applies_to(spec, "ws_overlap")):
                grouped = group_by_params(prof, spec, seqlens)
                groups = [(g, tuple(s)) for g, s in grouped] if len(grouped) > 1 else [(grouped[0][0], None)]
        except UsageError as exc:
            err.print(f"tune bench: error: {exc}", markup=False, highlight=False)
            return None, 2
        except ValueError as exc:   # no default fits the profile, or a bucket table it refuses (BucketTableError)
            err.print(f"tune bench: error: {exc}", markup=False, highlight=False)
            return None, 1
        if diagnostics or program is None:
            for d in diagnostics:
                err.print(str(d), markup=False, highlight=False)
            return None, 1
        for kp, served in groups:
            reasons = validate(kp, prof, probe_problem(spec), warp_specialized=warp_specialized)
            if reasons:
                err.print(f"parameters {kp.key()} are not legal for {spec.label()}: " + "; ".join(reasons),
                          markup=False)
                return None, 1
            try:
                pending.append((spec, kp, translate.generate(program, kp, prof, spec), served))
            except translate.TranslationError as exc:
                err.print(f"translation failed for {spec.label()}: {exc}", markup=False, highlight=False)
                return None, 1
    compiled = nvcc.compile_kernels([k for _, _, k, _ in pending], profile.nvcc_arch,
                                    cache_dir=cache_dir or nvcc.default_cache_dir())
    for (spec, _, k, _), res in zip(pending, compiled):
        if not res.ok:
            err.print(res.log[-3000:], markup=False, highlight=False)
            err.print(f"nvcc: {res.error_kind} for {k.name}", markup=False)
            return None, 2 if res.error_kind == "nvcc-missing" else 1
    return [_Built(spec, kp, k, res, served) for (spec, kp, k, served), res in zip(pending, compiled)], 0
