"""`tune bench --layout varlen|paged`: our serving-layout kernel on the mixes of tuner/measure/mixes.toml against
the serving baselines (tuner/measure/serving.py: the protocol of one mix).

The kernel is built from the layout's reference sketch (or --sketch) with the default parameters (or --params) and
must pass tuner.measure.verify_varlen first: a failed verification is exit 1 with the reason, and nothing is timed.
Heads: the variant's paper-grid heads, or a --model preset's. Paged: the cache's page size is --page-size, else
DEFAULT_PAGE_SIZES (pages smaller than a tile and one tile large), those the kernel's block N can tile
(tuner.serving.launch.paging).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional, Sequence

from rich.console import Console
from rich.table import Table

from kernel_abi.abi import TMA_KV
from kernel_abi.spec import options_text
from tuner import build
from tuner.commands import bench as bench_cmd
from tuner.measure import fa4, flashinfer_fp8, timer
from tuner.measure.mixes import serving_problems
from tuner.measure.serving import mix_rows
from tuner.measure.serving_baselines import BASELINES, NOT_APPLICABLE
from tuner.serving.launch.paging import compatible_page_sizes, page_misfit, page_size_error

DEFAULT_PAGE_SIZES = (16, 128)
LABELS = {"fa4": "FA4", "flashinfer": "FI", "sdpa": "SDPA pad"}   # table headers (|Δ|: max abs difference)


def _cell(row: dict, name: str) -> str:
    value, err = row.get(name), row.get(f"{name}_err")
    if value is not None:
        return f"{value:g}"
    if fa4.is_not_installed(err):
        return fa4.NOT_INSTALLED
    return "n/a" if err and err.startswith(NOT_APPLICABLE) else ("error" if err else "–")


def results_table(rows: Sequence[dict], title: str, baselines: Sequence[str] = tuple(b.name for b in BASELINES)
                  ) -> Table:
    """Ours and each baseline in TFLOPS, the ratios, max |ours - baseline|; the caption notes how SDPA ran and
    why a cell has no number."""
    table = Table(title=title)
    short = [LABELS.get(b, b) for b in baselines]
    twin = any("ours_bf16" in r for r in rows)   # an FP8 bench: our bf16 default beside
    for col in ("mix", "page", "bucket", "causal", "ours", *(("ours bf16", "ours/bf16") if twin else ()), *short,
                *(f"ours/{b}" for b in short), *(f"|Δ| {b}" for b in short), "status"):
        table.add_column(col, justify="left" if col in ("mix", "bucket", "causal", "status") else "right")
    notes = []
    for r in rows:
        status = r["status"] if r["status"] == "ok" else f"{r['status']} {r.get('reason', '')}"
        diffs = (("–" if r.get(f"{b}_max_abs_diff") is None else f"{r[f'{b}_max_abs_diff']:.3g}") for b in baselines)
        twin_cells = (_cell(r, "ours_bf16"), "–" if r.get("ours/ours_bf16") is None else f"{r['ours/ours_bf16']:g}")
        table.add_row(r["mix"], str(r["page_size"] or "–"), r["bucket"], "yes" if r["causal"] else "no",
                      "–" if r.get("ours") is None else f"{r['ours']:g}", *(twin_cells if twin else ()),
                      *(_cell(r, b) for b in baselines),
                      *("–" if r.get(f"ours/{b}") is None else f"{r[f'ours/{b}']:g}" for b in baselines),
                      *diffs, status)
        where = f"{r['mix']}" + (f" p{r['page_size']}" if r["page_size"] else "")
        for b in (*baselines, "ours_bf16"):
            for key in (f"{b}_note", f"{b}_err"):
                if r.get(key) and not fa4.is_not_installed(r[key]):
                    notes.append(f"{b} on '{where}': {r[key]}")
    if notes:
        table.caption = "\n".join(dict.fromkeys(notes))
    return table


def _fitting_check_mixes(spec, block_n: int, g2s_atom: str = TMA_KV):
    """verify_varlen's mixes a kernel can read: paged ones only at page sizes its K/V copy reads (tuner.serving.launch.paging)."""
    from tuner.measure.verify_varlen import CHECK_MIXES, readable_paged_mixes

    if spec.layout != "paged":
        return CHECK_MIXES
    return readable_paged_mixes(block_n, g2s_atom)


def resolve_page_sizes(layout: str, page_size: Optional[int], block_n: int,
                       defaults: Sequence[int] = DEFAULT_PAGE_SIZES, g2s_atom: str = TMA_KV) -> tuple:
    """The cache page sizes to time (``(None,)`` for varlen): ``page_size``, which must fit block N (ValueError
    naming both), else those of ``defaults`` that fit (ValueError when none does)."""
    if layout != "paged":
        return (None,)
    if page_size is not None:
        misfit = page_misfit(page_size, block_n, g2s_atom)
        if misfit is not None:
            raise ValueError(misfit)
        return (page_size,)
    sizes = tuple(p for p in defaults if page_misfit(p, block_n, g2s_atom) is None)
    if not sizes:
        raise ValueError(f"none of the page sizes {', '.join(map(str, defaults))} fits block N {block_n}; give "
                         f"--page-size, one of {', '.join(map(str, compatible_page_sizes(block_n, g2s_atom)))}")
    return sizes


def run_mix_bench(gpu: str, variant: Optional[str], model: Optional[str], layout: str, page_size: Optional[int],
                  params: Optional[str], sketch: Optional[Path], head_dim: Optional[int], dtype: Optional[str],
                  causal: Optional[bool], schedule: Optional[str], out_json: Optional[Path],
                  console: Optional[Console] = None, cache_dir: Optional[Path] = None,
                  page_sizes: Optional[Sequence[int]] = None, record_out: Optional[dict] = None,
                  options=None, layer: Optional[str] = None) -> int:
    """0 measured (rows may be FAILED: see the table); 1 compile or verification failed; 2 bad input, no GPU.
    ``page_sizes`` (paged) replaces the defaults; ``record_out`` receives the JSON record. ``options`` (--window,
    --softcap, --sinks) or a preset's ``layer`` kind are built into the kernel, checked by the gate's option cases and
    given to every timed call, ours and the libraries' (a library with no form for one is "n/a" in its column)."""
    from translate.defaults import default_params
    from tuner.build import NO_OPTIONS, UsageError, parse_params_arg, resolve_schedule, resolve_target

    console = console or Console()
    err = Console(stderr=True, soft_wrap=True)

    def usage(msg: str) -> int:
        err.print(f"tune bench: error: {msg}", markup=False, highlight=False)
        return 2

    try:
        target = bench_cmd.resolve_bench_target(variant, model, head_dim, dtype, causal)
        options, options_note = bench_cmd.preset_options(model, layer, options or NO_OPTIONS)
        targets = [resolve_target(gpu, target.variant, target.head_dim, target.dtype, c, layout, options=options)
                   for c in target.causals]
        profile = targets[0][0]
        schedule = resolve_schedule(schedule, profile)
        if not schedule.startswith("ws_"):
            raise UsageError(f"the {layout} layout is built by the warp-specialised Hopper schedules (ws_overlap, "
                             f"ws_serial); {profile.name} builds {schedule}")
        problem = page_size_error(layout, page_size)
        if problem is not None:
            raise UsageError(problem)
        # The page sizes are checked against the kernel's block N before anything is compiled.
        # with --page-size the default is the one for that page size (TMA where pages are whole tiles)
        copies = {(p.block_n, p.g2s_atom) for p in (parse_params_arg(params, default_params(prof, spec, "ws_overlap",
                                                                                            page_size=page_size))
                                                    for prof, spec in targets)}
        sizes = {c: resolve_page_sizes(layout, page_size, c[0], page_sizes or DEFAULT_PAGE_SIZES, c[1]) for c in copies}
    except (UsageError, ValueError) as exc:
        return usage(str(exc))
    if options_note:
        err.print(f"tune bench: {options_note}", markup=False, highlight=False)
    problem = bench_cmd.device_problem(profile, err)
    if problem is not None:
        return usage(problem)

    built, code = build.build_kernels(targets, target.variant, params, sketch, profile, err, cache_dir, schedule,
                                       page_size=page_size)
    if built is None:
        return code
    kernels, info = _load_and_verify(built)
    if kernels is None:
        _print_unverified(err, info, "", "nothing is timed")
        return 1

    twins = {}   # an FP8 bench times our bf16 default of each spec too, in the same rounds on the same values
    if target.dtype == "fp8" and params is None and sketch is None:
        bf16_targets = [resolve_target(gpu, target.variant, target.head_dim, "bf16", c, layout, options=options)
                        for c in target.causals]
        more, code = build.build_kernels(bf16_targets, target.variant, None, None, profile, err, cache_dir, schedule,
                                         page_size=page_size)
        if more is None:
            return code
        twin_kernels, twin_info = _load_and_verify(more)
        if twin_kernels is None:
            _print_unverified(err, twin_info, "bf16 twin ", "FP8 is timed without it")
        else:
            twins = {b.spec.causal: k for b, k in zip(more, twin_kernels)}
            info.update({f"{label} (bf16 twin)": item for label, item in twin_info.items()})

    heads = target.heads or _grid_heads(target.variant, target.head_dim)
    rows: list[dict] = []
    for b, kernel in zip(built, kernels):
        problems = [dataclasses.replace(p, **options.problem_changes(b.spec.causal))
                    for size in sizes[(b.params.block_n, b.params.g2s_atom)]
                    for p in serving_problems(layout, target.variant, heads[0], heads[1], b.spec.d_qk, b.spec.d_v,
                                              b.spec.causal, b.spec.dtype, size)]
        console.print(f"[bold]{b.spec.label()}[/bold]: {b.kernel.name} {b.params.key()} "
                      f"({b.compiled.registers} regs, {b.compiled.spill_stores} B spills), heads {heads[0]}/{heads[1]}")
        rows += mix_rows(kernel, problems, twin=twins.get(b.spec.causal), on_row=lambda r: console.print(
            f"  {r['mix']:<18} page={r['page_size']} ours={r.get('ours')} fa4={r.get('fa4')} "
            f"flashinfer={r.get('flashinfer')} sdpa={r.get('sdpa')}"
            + (f" ours_bf16={r.get('ours_bf16')}" if "ours_bf16" in r else "") + f" {r['status']}",
            markup=False, highlight=False, soft_wrap=True))
    env = bench_cmd.environment_record(profile, built[0].compiled.nvcc_version)
    who = target.model or target.variant
    console.print(results_table(rows, f"{who} {layout} prefill{options_text(options.window, options.softcap, options.sinks)} on {env['device']} "
                                      f"({profile.name}), TFLOPS"))
    record = {"tool": "tune bench", **env, "flashinfer": flashinfer_fp8.library_status(), "layout": layout,
              "variant": target.variant, "model": target.model, "heads": list(heads),
              "page_sizes": sorted({s for v in sizes.values() for s in v if s is not None}),
              "kernels": info, "rows": rows}
    if record_out is not None:
        record_out.update(record)
    if out_json is not None:
        problem = bench_cmd.write_record(out_json, record)
        if problem is not None:
            return usage(problem)
        console.print(f"wrote {out_json}", markup=False, highlight=False)
    return 0


def _grid_heads(variant: str, head_dim: Optional[int]) -> tuple[int, int]:
    from kernel_abi.spec import heads_for

    hq, hkv, _, _ = heads_for(variant, 128 if head_dim is None else head_dim)
    return hq, hkv


def _load_and_verify(built):
    """(kernels, info by spec label); kernels None when one failed to load or verify."""
    from tuner.serving.launch import load_kernel
    from tuner.measure.verify_varlen import verify_varlen

    kernels, info, ok = [], {}, True
    for b in built:
        report, reason = None, ""
        try:
            kernel = load_kernel(b.compiled.cubin, b.kernel.meta())
            report = verify_varlen(kernel, b.spec, mixes=_fitting_check_mixes(b.spec, b.params.block_n, b.params.g2s_atom))
            reason = report.reason or ""
        except Exception as exc:  # noqa: BLE001 - a kernel that cannot load or run fails verification
            kernel, reason = None, f"{type(exc).__name__}: {timer.first_line(exc)}"
        verified = report is not None and bool(report.passed)
        ok = ok and verified
        kernels.append(kernel)
        info[b.spec.label()] = {"name": b.kernel.name, "params": b.params.to_dict(),
                                "resources": b.compiled.resources(), "verified": verified, "reason": reason,
                                "verification": report.to_dict() if report is not None else None}
    return (kernels if ok else None), info


def _print_unverified(err: Console, info: dict, prefix: str, consequence: str) -> None:
    for label, item in info.items():
        if not item["verified"]:
            err.print(f"{prefix}{item['name']} ({label}): verification FAILED: {item['reason']}; {consequence}",
                      markup=False, highlight=False)


