"""`tune build --phase decode`: a decode sketch (the reference one of --schedule, or --sketch) + decode parameters
+ GPU profile -> DIR/<kernel>.cu, .cubin and .json (both entry points: the split kernel and its combine). No GPU.

Exit codes as `tune build`: 0 built; 1 the sketch, the parameters or the compile failed; 2 bad input.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from rich.console import Console


def resolve_decode_schedule(schedule: Optional[str]) -> str:
    import tl
    from tuner.build import UsageError

    if schedule is None:
        return "decode"
    if schedule not in tl.DECODE_SCHEDULES:
        raise UsageError(f"unknown decode schedule {schedule!r}; choose one of: {', '.join(tl.DECODE_SCHEDULES)}")
    return schedule


def run_decode_build(gpu: str, variant: Optional[str], sketch: Optional[Path], params: Optional[str],
                     head_dim: Optional[int], dtype: Optional[str], causal: bool, out: Path,
                     layout: Optional[str] = None, page_size: Optional[int] = None, schedule: Optional[str] = None,
                     console: Optional[Console] = None, cache_dir: Optional[Path] = None, options=None,
                     kv_dtype: Optional[str] = None) -> int:
    """``options`` (tuner.build.ModelOptions of --window/--softcap/--sinks) are built in: the reference sketch gets
    their statements (a --sketch states them itself)."""
    import tl
    from translate.compiler import generate
    from translate.decode import validate_decode
    from translate.decode.params import WGMMA_KINDS, default_decode_params
    from translate.kernel import TranslationError
    from tuner.commands.bench_decode import resolve_decode_target
    from tuner.commands.build import build_record, compile_into
    from tuner.build import UsageError, load_checked_program, parse_params_arg

    console = console or Console()
    err = Console(stderr=True, soft_wrap=True)
    try:
        profile, spec, _, page_size, _ = resolve_decode_target(gpu, variant, None, head_dim, dtype, causal, layout,
                                                               page_size, options, kv_dtype)
        schedule = resolve_decode_schedule(schedule)
        if sketch is None:
            tl.decode_sketch_path(spec.variant, schedule, spec.layout)   # a missing one is a usage error
        program, _, label, diagnostics = load_checked_program(spec.variant, spec.causal, sketch, schedule,
                                                              spec.layout, spec)
        decode_params = parse_params_arg(params, default_decode_params(spec, None, profile))
    except (UsageError, ValueError) as exc:
        err.print(f"tune build: error: {exc}", markup=False, highlight=False)
        return 2
    if diagnostics or program is None:
        for d in diagnostics:
            err.print(str(d), markup=False, highlight=False)
        err.print(f"{label}: {len(diagnostics)} problem(s); nothing built", markup=False)
        return 1
    reasons = validate_decode(decode_params, profile, spec)
    if reasons:
        err.print(f"decode parameters {decode_params.key()} are not legal on {profile.name} for {spec.label()}:",
                  markup=False)
        for r in reasons:
            err.print(f"  - {r}", markup=False, highlight=False)
        return 1
    try:
        kernel = generate(program, decode_params, profile, spec)
    except TranslationError as exc:
        err.print(f"translation failed: {exc}", markup=False, highlight=False)
        return 1
    out = Path(out)
    built = compile_into(kernel, profile, out, err, cache_dir)
    if isinstance(built, int):
        return built
    result, sass = built
    record = build_record(kernel, result, profile, spec, decode_params, sass)
    record["schedule"] = schedule
    if spec.layout == "paged":   # any power-of-two page: one table lookup per key row
        record["page_size"] = page_size
    (out / f"{kernel.name}.json").write_text(json.dumps(record, indent=2, default=str))
    tensor_op = "HGMMA" if decode_params.mma in WGMMA_KINDS else "HMMA"
    console.print(f"[green]built[/green] {kernel.name} for {profile.name} ({profile.nvcc_arch}): "
                  f"{result.registers} regs, {result.spill_stores} B spill stores, {kernel.smem_bytes} B dynamic smem, "
                  f"{kernel.num_threads} threads, {'cached' if result.cached else f'{result.compile_seconds:.1f} s'}; "
                  f"{tensor_op} {sass.get(tensor_op, '?')}, LDGSTS {sass.get('LDGSTS', '?')}")
    console.print(f"  {out / kernel.name}.{{cu,cubin,json}} (entry points {kernel.name}, {kernel.name}_combine)",
                  markup=False, highlight=False)
    return 0
