"""`tune bench --phase decode`: build a decode kernel (the reference decode sketch or --sketch, the default decode
parameters or --params), verify it with the decode gate, and time it on the decode grid against FA4's paged decode
and the GPU's copy bandwidth (tuner/measure/decode.py).

Exit codes as `tune bench`: 0 measured; 1 sketch, parameters or compile failed, or the kernel failed verification;
2 bad input or no GPU that can run the profile's kernels.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from rich.console import Console
from rich.table import Table

DECODE_LAYOUTS = ("paged", "dense")


def resolve_decode_target(gpu: str, variant, model, head_dim, dtype, causal, layout: str, page_size, options=None,
                          kv_dtype: str | None = None):
    """(profile, spec, heads, page size, model) of a decode bench or build; ``options`` (tuner.build.ModelOptions:
    --window/--softcap/--sinks) go into the spec (absorbed MLA has none); ``kv_dtype`` (--kv-dtype fp8: an e4m3
    cache read by queries of --dtype) too; UsageError naming the bad input."""
    from hardware_profiles import ProfileError, load_profile
    from kernel_abi.spec import KernelSpec, spec_for
    from tuner.commands.bench import resolve_bench_target
    from tuner.build import UsageError
    from tuner.serving.buckets.serving import PAGE_SIZES

    layout = "paged" if layout is None else layout
    if layout not in DECODE_LAYOUTS:
        raise UsageError(f"--phase decode reads a paged cache (--layout paged, the default) or a dense one "
                         f"(--layout dense), not {layout}")
    if layout == "dense" and page_size is not None:
        raise UsageError("--page-size applies to a paged cache (--layout paged)")
    try:
        profile = load_profile(gpu)
    except (ProfileError, ValueError, KeyError) as exc:
        raise UsageError(str(exc)) from None
    target = resolve_bench_target(variant, model, head_dim, dtype, causal)
    # pages of 16 (vLLM's) by default; absorbed MLA's of 64 (FlashMLA's)
    default_page = 64 if target.variant == "mla" else 16
    page_size = 0 if layout == "dense" else default_page if page_size is None else page_size   # 0: a dense cache
    if layout == "paged" and page_size not in PAGE_SIZES:
        raise UsageError(f"--page-size must be one of {', '.join(map(str, PAGE_SIZES))}, got {page_size}")
    given = options is not None and (options.window != (-1, -1) or options.softcap or options.sinks)
    if target.variant == "mla" and given:
        raise UsageError("absorbed MLA decode kernels are built without windows, soft-capping or sinks (no MLA model "
                         "uses them): drop --window/--softcap/--sinks")
    if kv_dtype is not None:
        from kernel_abi.spec import KV_DTYPES

        if kv_dtype not in KV_DTYPES:
            raise UsageError(f"--kv-dtype must be one of {', '.join(KV_DTYPES)} (none: the queries' dtype), got "
                             f"{kv_dtype!r}")
        if target.dtype == "fp8":
            raise UsageError("--kv-dtype fp8 caches are read by fp16 or bf16 queries: --dtype bf16 or fp16")
    if target.variant == "mla":
        # absorbed MLA decode: q/k 576 (512 latent + 64 rotary), v the first 512 columns of k, one latent KV head
        from kernel_abi.decode import MLA_DECODE_D_QK, MLA_DECODE_D_V
        from kernel_abi.spec import heads_for

        causal = target.causals[-1] if causal is None else causal
        spec = KernelSpec("mla", MLA_DECODE_D_QK, MLA_DECODE_D_V, causal, target.dtype or profile.default_dtype,
                          layout, "decode", kv_dtype=kv_dtype or "")
        hq = target.heads[0] if target.heads is not None else heads_for("mla", 192)[0]
        return profile, spec, (hq, 1), page_size, target.model
    try:
        base = spec_for(target.variant, target.head_dim, target.dtype or profile.default_dtype, True)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    causal = target.causals[-1] if causal is None else causal
    spec = KernelSpec(base.variant, base.d_qk, base.d_v, causal, base.dtype, layout, "decode",
                      **(options.spec_changes(causal) if given else {}), kv_dtype=kv_dtype or "")
    from kernel_abi.spec import kv_dtype_errors

    if kv_dtype_errors(spec):
        raise UsageError("; ".join(kv_dtype_errors(spec)))
    if target.heads is not None:
        heads = target.heads
    else:
        from kernel_abi.spec import heads_for
        hq, hkv, _, _ = heads_for(target.variant, base.d_qk)
        heads = (hq, hkv)
    return profile, spec, heads, page_size, target.model


def run_decode_bench(gpu: str, variant, model, params, sketch, head_dim, dtype, causal, layout, page_size,
                     out_json, console: Optional[Console] = None, cache_dir=None,
                     batches=None, kv_lens=None, options=None, layer=None, kv_dtype=None) -> int:
    """``options`` (--window/--softcap/--sinks) or a preset's layer kind (``layer``, as `tune bench` takes them) are
    built into the kernel, verified by the decode gate's option cases and given to every timed call (ours and
    FA4's). ``kv_dtype`` fp8: the FP8 cache's kernel (--params are its), beside the 16-bit cache's default kernel of
    the same spec, both verified and timed in this process (tuner.measure.decode.measure_fp8_point)."""
    from translate.decode import default_decode_params
    from tuner.commands.bench import device_problem, environment_record, preset_options, write_record
    from tuner.build import NO_OPTIONS, UsageError, load_checked_program, parse_params_arg

    console = console or Console()
    err = Console(stderr=True, soft_wrap=True)

    def usage(msg: str) -> int:
        err.print(f"tune bench: error: {msg}", markup=False, highlight=False)
        return 2

    try:
        options, options_note = preset_options(model, layer, options or NO_OPTIONS)
        profile, spec, heads, page_size, model_name = resolve_decode_target(gpu, variant, model, head_dim, dtype,
                                                                           causal, layout, page_size, options,
                                                                           kv_dtype)
        decode_params = parse_params_arg(params, default_decode_params(spec, heads[0], profile))
        _, text, _, _ = load_checked_program(spec.variant, spec.causal, sketch, "decode", spec.layout, spec)
    except (UsageError, OSError) as exc:
        return usage(str(exc))
    if options_note:
        err.print(f"tune bench: {options_note}", markup=False, highlight=False)
    from translate.decode import validate_decode

    reasons = validate_decode(decode_params, profile, spec)
    if reasons:
        return usage("the decode parameters cannot build this kernel: " + "; ".join(reasons))
    problem = device_problem(profile, err)
    if problem is not None:
        return usage(problem)

    import torch

    from tl.checker import check_source
    from translate.compiler import generate
    from translate.kernel import TranslationError
    from translate.nvcc import compile_kernel, default_cache_dir
    from tuner.measure.decode import BATCHES, KV_LENS, copy_bandwidth_gbs, decode_grid, measure_point
    from tuner.serving.launch.decode_kernel import load_decode_kernel
    from tuner.measure.verify_decode import verify_decode

    program, diags = check_source(text, str(sketch or "the decode sketch"))
    if program is None or diags:
        for d in diags:
            err.print(str(d), markup=False)
        return 1
    def build(spec, decode_params):
        """(generated kernel, compile result, loaded kernel, gate report), or an exit code."""
        try:
            kernel = generate(program, decode_params, profile, spec)
        except TranslationError as exc:
            err.print(f"tune bench: {exc}", markup=False)
            return 1
        compiled = compile_kernel(kernel, profile.nvcc_arch, cache_dir=cache_dir or default_cache_dir())
        if not compiled.ok:
            err.print(f"tune bench: {kernel.name} did not compile ({compiled.error_kind}):\n{compiled.log[-2000:]}",
                      markup=False)
            return 1
        k = load_decode_kernel(compiled.cubin, kernel.meta())
        report = verify_decode(k, spec, page_size=page_size)
        console.print(f"[bold]{spec.label()}[/bold]: {kernel.name} ({compiled.registers} regs, "
                      f"{compiled.spill_stores} B spills) verification {'passed' if report.passed else 'FAILED'}")
        if not report.passed:
            err.print(f"{kernel.name}: verification FAILED ({report.reason}); it is not timed", markup=False)
            return 1
        return kernel, compiled, k, report

    built = build(spec, decode_params)
    if isinstance(built, int):
        return built
    kernel, compiled, k, report = built
    copy = copy_bandwidth_gbs()
    if spec.kv_dtype:
        import dataclasses

        spec16 = dataclasses.replace(spec, kv_dtype="")
        built16 = build(spec16, default_decode_params(spec16, heads[0], profile))
        if isinstance(built16, int):
            return built16
        rows_of = _fp8_mla_rows if spec.variant == "mla" else _fp8_rows
        rows, table = rows_of(k, built16[2], spec, heads, page_size, copy, options, batches, kv_lens, profile)
        console.print(table)
        if out_json is not None:
            record = {"tool": "tune bench --phase decode --kv-dtype fp8",
                      **environment_record(profile, compiled.nvcc_version), "spec": spec.label(), "model": model_name,
                      "kernel": kernel.name, "params": decode_params.to_dict(), "kernel_16bit": built16[0].name,
                      "params_16bit": built16[0].params.to_dict(), "copy_gbs": copy,
                      "verification": report.to_dict(), "verification_16bit": built16[3].to_dict(), "rows": rows}
            problem = write_record(Path(out_json), record)
            if problem is not None:
                return usage(problem)
        return 0
    if spec.variant == "mla":
        rows = _mla_rows(k, spec, heads, page_size, copy, batches, kv_lens)
        table = Table(title=f"absorbed MLA decode {spec.label()} h{heads[0]} on {torch.cuda.get_device_name()} "
                            f"({profile.name}): GB/s of the latent cache read once, TFLOPS; copy bandwidth "
                            f"{copy:.0f} GB/s (FA4 has no absorbed-MLA path)")
        for col in ("point", "splits", "us", "GB/s", "of copy", "TFLOPS"):
            table.add_column(col)
        for r in rows:
            table.add_row(r["point"], str(r["splits"]), f"{r['ms'] * 1e3:.0f}", f"{r['ours_gbs']:.0f}",
                          f"{r['copy_frac']:.2f}", f"{r['ours_tflops']:.0f}")
    else:
        rows = []
        for p in decode_grid(batches or BATCHES, kv_lens or KV_LENS, heads_q=heads[0], heads_kv=heads[1],
                             head_dim=spec.d_qk, page_size=page_size, causal=spec.causal, dtype=spec.dtype,
                             **options.problem_changes(spec.causal)):
            row = measure_point(k, p)
            row["copy_frac"] = row["ours_gbs"] / copy
            if "fa4_gbs" in row:
                row["vs_fa4"] = row["ours_gbs"] / row["fa4_gbs"]
            rows.append(row)
        table = Table(title=f"decode {spec.label()} on {torch.cuda.get_device_name()} ({profile.name}), GB/s of K/V "
                            f"read; copy bandwidth {copy:.0f} GB/s")
        for col in ("point", "splits", "ours", "FA4", "ours/FA4", "of copy"):
            table.add_column(col)
        for r in rows:
            table.add_row(r["point"], str(r["splits"]), f"{r['ours_gbs']:.0f}",
                          f"{r['fa4_gbs']:.0f}" if "fa4_gbs" in r else r.get("fa4_error", "-")[:30],
                          f"{r['vs_fa4']:.2f}" if "vs_fa4" in r else "-", f"{r['copy_frac']:.2f}")
    console.print(table)
    if out_json is not None:
        record = {"tool": "tune bench --phase decode", **environment_record(profile, compiled.nvcc_version),
                  "spec": spec.label(), "model": model_name, "kernel": kernel.name,
                  "params": decode_params.to_dict(), "copy_gbs": copy, "verification": report.to_dict(),
                  "rows": rows}
        problem = write_record(Path(out_json), record)
        if problem is not None:
            return usage(problem)
    return 0


def _fp8_rows(fp8_kernel, kernel, spec, heads, page_size, copy, options, batches, kv_lens, profile):
    """The FP8 cache bench's rows and table: per point the e4m3 bytes' GB/s and its fraction of the copy bandwidth,
    new tokens a second of both kernels and the FP8 one's speedup, and FlashInfer's FP8 decode on the same cache where
    it runs (its time / ours; no FA4 column: FA4 reads no FP8 cache)."""
    import torch

    from tuner.measure.decode import BATCHES, KV_LENS, decode_grid, measure_fp8_point

    rows = []
    for p in decode_grid(batches or BATCHES, kv_lens or KV_LENS, heads_q=heads[0], heads_kv=heads[1],
                         head_dim=spec.d_qk, page_size=page_size, causal=spec.causal, dtype=spec.dtype,
                         kv_dtype=spec.kv_dtype, **options.problem_changes(spec.causal)):
        row = measure_fp8_point(fp8_kernel, kernel, p)
        row["copy_frac"] = row["fp8_gbs"] / copy
        rows.append(row)
    table = Table(title=f"decode over an FP8 cache {spec.label()} h{heads[0]}/{heads[1]} on "
                        f"{torch.cuda.get_device_name()} ({profile.name}): GB/s of the e4m3 K/V read, copy bandwidth "
                        f"{copy:.0f} GB/s; tokens/s against the {spec.dtype} cache's kernel, same process")
    for col in ("point", "splits", "fp8 us", "fp8 GB/s", "of copy", f"{spec.dtype} us", "fp8 tok/s",
                f"{spec.dtype} tok/s", "speedup", "FlashInfer fp8 us", "vs FlashInfer"):
        table.add_column(col)
    for r in rows:
        fi = ("–", "–") if "flashinfer_us" not in r else (f"{r['flashinfer_us']:.1f}", f"{r['vs_flashinfer']:.2f}")
        table.add_row(r["point"], str(r["splits"]), f"{r['fp8_us']:.1f}", f"{r['fp8_gbs']:.0f}", f"{r['copy_frac']:.2f}",
                      f"{r['base_us']:.1f}", f"{r['fp8_tokens_s']:.3g}", f"{r['base_tokens_s']:.3g}",
                      f"{r['speedup']:.2f}", *fi)
    reasons = sorted({r["flashinfer_error"] for r in rows if "flashinfer_error" in r})
    if reasons:
        table.caption = "FlashInfer: " + "; ".join(reasons)
    return rows, table


def _fp8_mla_rows(fp8_kernel, kernel, spec, heads, page_size, copy, options, batches, kv_lens, profile):
    """The FP8 latent-cache MLA bench's rows and table on the MLA grid (_mla_rows'): per point the e4m3 latent's GB/s
    and its fraction of the copy bandwidth, TFLOPS and new tokens a second of both kernels (the 16-bit latent cache's
    default beside it, in this process) and the FP8 one's speedup; the two outputs' relative difference (the same
    values, one cache rounded to e4m3)."""
    import torch

    from tuner.measure.decode import measure_fp8_mla_point, mla_grid

    rows = []
    for p in mla_grid(heads=(heads[0],), batches=batches or MLA_BATCHES, kv_lens=kv_lens or MLA_KV_LENS,
                      seqlens_q=MLA_SEQLENS_Q, page_size=page_size, causal=spec.causal, dtype=spec.dtype,
                      kv_dtype=spec.kv_dtype):
        row = measure_fp8_mla_point(fp8_kernel, kernel, p)
        row["copy_frac"] = row["fp8_gbs"] / copy
        rows.append(row)
    table = Table(title=f"absorbed MLA decode over an FP8 latent cache {spec.label()} h{heads[0]} on "
                        f"{torch.cuda.get_device_name()} ({profile.name}): GB/s of the e4m3 latent read once, copy "
                        f"bandwidth {copy:.0f} GB/s; against the {spec.dtype} latent cache's default kernel, same "
                        "process")
    for col in ("point", "splits", "fp8 us", "fp8 GB/s", "of copy", "fp8 TFLOPS", f"{spec.dtype} us",
                f"{spec.dtype} TFLOPS", "fp8 tok/s", "speedup", "rel diff"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["point"], str(r["splits"]), f"{r['fp8_us']:.1f}", f"{r['fp8_gbs']:.0f}",
                      f"{r['copy_frac']:.2f}", f"{r['fp8_tflops']:.0f}", f"{r['base_us']:.1f}",
                      f"{r['base_tflops']:.0f}", f"{r['fp8_tokens_s']:.3g}", f"{r['speedup']:.2f}",
                      f"{r['rel_diff']:.2g}")
    return rows, table


MLA_BATCHES, MLA_KV_LENS, MLA_SEQLENS_Q = (64, 128), (4096, 8192, 16384), (1, 2, 4)   # served MLA batches, key lengths, draft lengths


def _mla_rows(kernel, spec, heads, page_size, copy, batches=None, kv_lens=None) -> list[dict]:
    """Absorbed MLA on batch 64/128 x KV 4k/8k/16k x 1/2/4 new tokens (tuner.measure.decode.mla_grid)."""
    from tuner.measure.decode import measure_mla_point, mla_grid

    rows = []
    for p in mla_grid(heads=(heads[0],), batches=batches or MLA_BATCHES, kv_lens=kv_lens or MLA_KV_LENS,
                      seqlens_q=MLA_SEQLENS_Q, page_size=page_size, causal=spec.causal, dtype=spec.dtype):
        row = measure_mla_point(kernel, p)
        row["copy_frac"] = row["ours_gbs"] / copy
        rows.append(row)
    return rows
