"""`tune build`: TL sketch + parameters + GPU profile -> DIR/<kernel>.cu, .cubin and .json. No GPU needed."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

from rich.console import Console

from hardware_profiles import Profile
from kernel_abi.spec import KernelSpec
from tl.pipelines import has_roles
from translate.params import KernelParams, validate
from tuner.build import (NO_OPTIONS, ModelOptions, UsageError, load_checked_program, parse_params_arg,
                         resolve_schedule, resolve_target)


def run_build(gpu: str, variant: str, sketch: Optional[Path], params: Optional[str], head_dim: Optional[int],
              dtype: Optional[str], causal: bool, out: Path, console: Optional[Console] = None,
              cache_dir: Optional[Path] = None, schedule: Optional[str] = None, layout: str = "dense",
              page_size: Optional[int] = None, seqlen: Optional[int] = None,
              options: Optional[ModelOptions] = None) -> int:
    """0 built; 1 the sketch, the parameters or the compile failed; 2 bad input (a page size the kernel's block
    N cannot tile included: tuner.serving.launch.paging) or missing toolchain. ``seqlen``: the key length the kernel is for;
    the base parameters are then the profile's default for that bucket (tuner/defaults/table.py)."""
    from tuner.defaults.table import BucketTableError, bucket_change, bucket_params
    from tuner.serving.buckets.seqlen import bucket_for
    import translate
    from translate.defaults import default_params, probe_problem
    from tuner.serving.launch.paging import compatible_page_sizes, page_misfit, page_size_error

    console = console or Console()
    err = Console(stderr=True, soft_wrap=True)
    try:
        profile, spec = resolve_target(gpu, variant, head_dim, dtype, causal, layout, options or NO_OPTIONS)
        problem = page_size_error(layout, page_size)
        if problem is not None:
            raise UsageError(problem)
        schedule = resolve_schedule(schedule, profile)
        if layout != "dense" and not schedule.startswith("ws_"):
            raise UsageError(f"the {layout} layout is built by the warp-specialised Hopper schedules (ws_overlap, "
                             f"ws_serial); {profile.name} builds {schedule}")
        program, _, label, diagnostics = load_checked_program(variant, causal, sketch, schedule, layout, spec)
        if diagnostics or program is None:
            for d in diagnostics:
                err.print(str(d), markup=False, highlight=False)
            err.print(f"{label}: {len(diagnostics)} problem(s); nothing built", markup=False)
            return 1
        warp_specialized = has_roles(program.statements)
        kind = "ws_overlap" if warp_specialized else "fa2"
        bucket = entry = None   # with --seqlen: its bucket, and the table's entry for it (None: the per-spec default)
        if seqlen is not None:
            if isinstance(seqlen, bool) or not isinstance(seqlen, int) or seqlen < 1:
                raise UsageError(f"--seqlen must be a positive integer, got {seqlen!r}")
            if layout != "dense":
                raise UsageError(f"--seqlen picks a dense bucket's default; the {layout} layout's buckets are "
                                 "chosen per call from the mix")
            bucket = bucket_for(seqlen)
            entry = bucket_change(profile, spec, bucket, kind)
        base = (bucket_params(profile, spec, bucket, kind) if bucket is not None
                else default_params(profile, spec, kind, page_size=page_size))
        kernel_params = parse_params_arg(params, base)
        misfit = page_misfit(page_size, kernel_params.block_n, kernel_params.g2s_atom) if page_size is not None else None
        if misfit is not None:
            raise UsageError(misfit)
    except UsageError as exc:
        err.print(f"tune build: error: {exc}", markup=False, highlight=False)
        return 2
    except BucketTableError as exc:
        err.print(f"tune build: error: {exc}", markup=False, highlight=False)
        return 1
    except ValueError as exc:  # no default candidate fits the profile
        err.print(f"tune build: error: {exc}", markup=False, highlight=False)
        return 1

    reasons = validate(kernel_params, profile, probe_problem(spec), warp_specialized=warp_specialized)
    if reasons:
        err.print(f"parameters {kernel_params.key()} are not legal on {profile.name} for {spec.label()}:",
                  markup=False)
        for r in reasons:
            err.print(f"  - {r}", markup=False, highlight=False)
        return 1
    try:
        kernel = translate.generate(program, kernel_params, profile, spec)
    except translate.TranslationError as exc:
        err.print(f"translation failed: {exc}", markup=False, highlight=False)
        return 1

    out = Path(out)
    built = compile_into(kernel, profile, out, err, cache_dir)
    if isinstance(built, int):
        return built
    result, sass = built
    record = build_record(kernel, result, profile, spec, kernel_params, sass)
    if layout == "paged":   # the page size is a run-time argument: every size block N tiles works
        record["page_size"] = page_size
        record["page_sizes"] = list(compatible_page_sizes(kernel_params.block_n, kernel_params.g2s_atom))
    if bucket is not None:   # which bucket's default the base was, and the measurement behind its change
        record["bucket_default"] = {"seqlen": seqlen, "bucket": bucket,
                                    "change": entry.as_dict() if entry else {},
                                    "measured": entry.measured if entry else None}
    (out / f"{kernel.name}.json").write_text(json.dumps(record, indent=2, default=str))
    gmma = "QGMMA" if spec.dtype == "fp8" else "HGMMA"
    tensor_ops = (f"{gmma} {sass.get(gmma, '?')}, UTMALDG {sass.get('UTMALDG', '?')}" if kernel_params.is_gmma
                  else f"HMMA {sass.get('HMMA', '?')}")
    console.print(f"[green]built[/green] {kernel.name} for {profile.name} ({profile.nvcc_arch}): "
                  f"{result.registers} regs, {result.spill_stores} B spill stores, "
                  f"{kernel.smem_bytes} B dynamic smem, {kernel.num_threads} threads, "
                  f"{'cached' if result.cached else f'{result.compile_seconds:.1f} s'}; {tensor_ops}",
                  soft_wrap=True)   # one line a kernel, also in a log (rich wraps at 80 columns off a terminal)
    if layout == "paged":
        console.print(f"  paged: reads pages of {', '.join(map(str, record['page_sizes']))} keys (chosen at run time; "
                      f"block N {kernel_params.block_n})" + (f", checked for {page_size}" if page_size else ""),
                      markup=False, highlight=False)
    if bucket is not None:
        console.print(f"  default of bucket {bucket}: " + (
            f"{entry.as_dict()} over the per-spec default ({entry.measured})" if entry is not None
            else "the per-spec default"), markup=False, highlight=False)
    console.print(f"  {out / kernel.name}.{{cu,cubin,json}}", markup=False, highlight=False)
    return 0


def compile_into(kernel, profile: Profile, out: Path, err: Console, cache_dir: Optional[Path] = None):
    """Write ``kernel``'s source to ``out``, compile it, write the cubin: (the compile result, its SASS summary),
    or the exit code after saying why (2: ``out`` cannot be written or nvcc is missing; 1: nvcc failed, its log
    beside the source)."""
    from translate import nvcc
    from translate.sass import sass_summary

    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{kernel.name}.cu").write_text(kernel.source)
    except OSError as exc:
        err.print(f"tune build: error: cannot write to {out}: {exc.strerror or exc}", markup=False)
        return 2
    result = nvcc.compile_kernels([kernel], profile.nvcc_arch, cache_dir=cache_dir or nvcc.default_cache_dir(),
                                  batch_size=1, jobs=1)[0]
    if not result.ok:
        (out / f"{kernel.name}.log").write_text(result.log)
        err.print(result.log[-4000:], markup=False, highlight=False)
        err.print(f"nvcc: {result.error_kind} for {kernel.name} ({profile.nvcc_arch}); "
                  f"log in {out / (kernel.name + '.log')}", markup=False)
        return 2 if result.error_kind == "nvcc-missing" else 1
    cubin_path = out / f"{kernel.name}.cubin"
    cubin_path.write_bytes(result.cubin)
    try:
        sass = sass_summary(cubin_path, kernel.name)
    except (RuntimeError, ValueError, OSError) as exc:
        sass = {"error": str(exc)}
    return result, sass if sass is not None else {"error": "cuobjdump not available"}


def build_record(kernel, result, profile: Profile, spec: KernelSpec, params: KernelParams, sass: dict) -> dict:
    """The JSON sidecar: what runtime.load_kernel and the reports need besides the cubin."""
    from translate import nvcc

    try:
        meta = kernel.meta()
    except Exception:  # noqa: BLE001 - a sidecar without meta is still useful
        meta = {}
    return {
        "name": kernel.name,
        "gpu": profile.name,
        "arch": profile.nvcc_arch,
        "spec": dataclasses.asdict(spec),
        "params": params.to_dict(),
        "num_threads": kernel.num_threads,
        "smem_bytes": kernel.smem_bytes,
        "block_m": kernel.block_m,
        "block_n": kernel.block_n,
        "resources": result.resources(),
        "compile_seconds": round(result.compile_seconds, 3),
        "cached": result.cached,
        "cache_key": result.key,
        "nvcc_version": result.nvcc_version,
        "cutlass_version": nvcc.cutlass_version(),
        "sass": sass,
        "meta": meta,
    }
