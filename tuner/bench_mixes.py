"""`tune bench --layout varlen|paged`: our serving-layout kernel on the mixes of tuner/mixes.toml against
FlashAttention-4's ``flash_attn_varlen_func``, FlashInfer's batch prefill and torch SDPA on the zero-padded
batch (tuner.mix_baselines), each on the same inputs in this process.

Protocol: the kernel is built from the layout's reference sketch (or --sketch) with the default parameters
(or --params) and must pass tuner.verify_varlen first: a failed verification is exit 1 with the reason, and
nothing is timed. Per mix: every backend's first call is untimed (FA4 JIT-compiles per shape) and gives the
output; max |ours - baseline| is taken on it. Our output must agree with SDPA (else the first baseline that
ran) within tuner.bench.CROSS_CHECK_REL_ERR or the row is FAILED and not timed; a baseline that disagrees with
a cross-checked kernel is reported, not timed (a library called wrongly would be a fast, meaningless bar).
Timing: tuner.bench.time_ms (triton's do_bench median, which flushes L2 between runs; one input set), ours and
every baseline in TIMING_ROUNDS rounds, ours first in every other round, each the median of its rounds: the first
timing after the untimed calls ran on a GPU that had idled and clocked higher (FA4 618 TFLOPS against 568-574 on
2x(2k on 6k), pages of 16, H100, BENCHMARKS.md 2026-11-27), and a single pass gave it to whichever ran first. TFLOPS
count the visible (query, key) pairs (ServingProblem.flops). Heads: the variant's paper-grid heads, or a
--model preset's. Paged: the cache's page size is --page-size, else DEFAULT_PAGE_SIZES (issue 14's: pages
smaller than a tile and one tile large), those the kernel's block N can tile (tuner.serving.launch.paging).
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Callable, Optional, Sequence

from rich.console import Console
from rich.table import Table

from tuner import bench
from tuner.mix_baselines import BASELINES, Baseline, Unavailable
from tuner.mix_inputs import make_mix_inputs
from tuner.mixes import ServingProblem, serving_problems
from tuner.serving.launch.paging import TMA_KV, compatible_page_sizes, page_misfit, page_size_error

# Rounds of ours and the baselines per mix (module doc): three, so that one round's first timing, after idle time,
# is not the median.
TIMING_ROUNDS = 3


DEFAULT_PAGE_SIZES = (16, 128)
CROSS_CHECK_ORDER = ("sdpa", "fa4", "flashinfer")
LABELS = {"fa4": "FA4", "flashinfer": "FI", "sdpa": "SDPA pad"}   # table headers (|Δ|: max abs difference)


# -- rows ---------------------------------------------------------------------------------------------


def problem_row(p: ServingProblem) -> dict:
    return {"layout": p.layout, "mix": p.name, "bucket": p.bucket, "page_size": p.page_size, "batch": p.batch,
            "total_q": p.total_q, "total_k": p.total_k, "max_seqlen_q": p.max_seqlen_q,
            "max_seqlen_k": p.max_seqlen_k, "variant": p.variant, "heads_q": p.heads_q, "heads_kv": p.heads_kv,
            "d_qk": p.d_qk, "d_v": p.d_v, "causal": p.causal, "dtype": p.dtype, "flops": p.flops}


def ours_call(kernel, p: ServingProblem, x) -> Callable[[], object]:
    """Our kernel's call on the mix's inputs (AttentionKernel.varlen or .paged)."""
    if p.layout == "paged":
        return lambda: kernel.paged(x.q, x.k_cache, x.v_cache, x.cu_seqlens_q, x.seqused_k, x.page_table,
                                    p.max_seqlen_q, softmax_scale=p.softmax_scale)
    return lambda: kernel.varlen(x.q, x.k, x.v, x.cu_seqlens_q, x.cu_seqlens_k, p.max_seqlen_q, p.max_seqlen_k,
                                 softmax_scale=p.softmax_scale)


def _diffs(out, ref) -> tuple[float, float]:
    """(max |out - ref|, relative L2 error)."""
    d = out.float() - ref.float()
    base = ref.float().norm().item()
    return d.abs().max().item(), (d.norm().item() / base if base else math.inf)


def mix_row(kernel, problem: ServingProblem, *, baselines: Sequence[Baseline] = BASELINES,
            device: str = "cuda", timer: Optional[Callable] = None) -> dict:
    """One mix: ours and each baseline, TFLOPS, max |ours - baseline|, ratios (module doc: the protocol)."""
    import torch

    timer = timer or bench.time_ms
    row, raw, rel = problem_row(problem), {}, {}
    x = make_mix_inputs(problem, device)
    ours = ours_call(kernel, problem, x)
    try:
        out = ours()
        _sync()
        finite = bool(torch.isfinite(out).all().item())
    except Exception as exc:  # noqa: BLE001 - a launch failure is this row's result
        out, finite = None, False
        row.update(status="error", reason=bench._first_line(exc))
    prepared = {}
    for b in baselines:
        try:
            prep = b.prepare(problem, x)
            theirs = prep.packed(prep.call())
            _sync()
            if prep.note:
                row[f"{b.name}_note"] = prep.note
            if out is not None:
                row[f"{b.name}_max_abs_diff"], rel[b.name] = _diffs(out, theirs)
            prepared[b.name] = prep
            del theirs
        except Unavailable as exc:
            row[f"{b.name}_err"] = str(exc)
        except Exception as exc:  # noqa: BLE001 - "cannot run this mix" comes in many exception types
            row[f"{b.name}_err"] = f"{type(exc).__name__}: {bench._first_line(exc)}"
    ref = next((n for n in CROSS_CHECK_ORDER if n in rel), None)
    if out is not None:
        if not finite or (ref is not None and not rel[ref] <= bench.CROSS_CHECK_REL_ERR):
            row.update(status="FAILED", reason="output is not finite" if not finite else
                       f"output differs from {ref} on the benchmark inputs (rel err {rel[ref]:.3g})")
        else:
            row["cross_check_against"] = ref
            for name, r in rel.items():   # a cross-checked kernel disagreeing with a library: the library's call
                if name != ref and not r <= bench.CROSS_CHECK_REL_ERR:
                    prepared.pop(name)
                    row[f"{name}_err"] = f"output differs from ours and {ref} (rel err {r:.3g}); not timed"
    calls = {name: prep.call for name, prep in prepared.items()}
    if "status" not in row:
        calls["ours"] = ours
    times = {name: [] for name in calls}
    # bench.alternating_rounds' order (ours first in the even rounds, last in the odd ones), with this row's timer
    # and a baseline that fails dropped from the rounds (ours failing raises, as a single timing did)
    for r in range(TIMING_ROUNDS):
        for name in (list(reversed(calls)) if r % 2 == 0 else list(calls)):
            if name not in calls:
                continue
            try:
                times[name].append(timer(calls[name]))
            except Exception as exc:  # noqa: BLE001
                if name == "ours":
                    raise
                row[f"{name}_err"] = f"{type(exc).__name__}: {bench._first_line(exc)}"
                calls.pop(name)
    for name in calls:
        raw[name] = problem.flops / (statistics.median(times[name]) * 1e-3) / 1e12
    if "status" not in row:
        row.update(ours_ms=round(statistics.median(times["ours"]), 5), status="ok")
    row["ours"] = _round(raw.get("ours"))
    for b in baselines:
        row[b.name] = _round(raw.get(b.name))
        row[f"ours/{b.name}"] = round(raw["ours"] / raw[b.name], 3) if "ours" in raw and raw.get(b.name) else None
    return row


def mix_rows(kernel, problems: Sequence[ServingProblem], *, on_row: Optional[Callable[[dict], None]] = None,
             **kwargs) -> list[dict]:
    rows = []
    for problem in problems:
        rows.append(mix_row(kernel, problem, **kwargs))
        _empty_cache()
        if on_row is not None:
            on_row(rows[-1])
    return rows


def _round(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(x, 2)


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _empty_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# -- the table ----------------------------------------------------------------------------------------


def _cell(row: dict, name: str) -> str:
    value, err = row.get(name), row.get(f"{name}_err")
    if value is not None:
        return f"{value:g}"
    return bench.fa4.NOT_INSTALLED if bench.fa4.is_not_installed(err) else ("error" if err else "–")


def results_table(rows: Sequence[dict], title: str, baselines: Sequence[str] = tuple(b.name for b in BASELINES)
                  ) -> Table:
    """Ours and each baseline in TFLOPS, the ratios, max |ours - baseline|; the caption notes how SDPA ran and
    why a cell has no number."""
    table = Table(title=title)
    short = [LABELS.get(b, b) for b in baselines]
    for col in ("mix", "page", "bucket", "causal", "ours", *short, *(f"ours/{b}" for b in short),
                *(f"|Δ| {b}" for b in short), "status"):
        table.add_column(col, justify="left" if col in ("mix", "bucket", "causal", "status") else "right")
    notes = []
    for r in rows:
        status = r["status"] if r["status"] == "ok" else f"{r['status']} {r.get('reason', '')}"
        diffs = (("–" if r.get(f"{b}_max_abs_diff") is None else f"{r[f'{b}_max_abs_diff']:.3g}") for b in baselines)
        table.add_row(r["mix"], str(r["page_size"] or "–"), r["bucket"], "yes" if r["causal"] else "no",
                      "–" if r.get("ours") is None else f"{r['ours']:g}", *(_cell(r, b) for b in baselines),
                      *("–" if r.get(f"ours/{b}") is None else f"{r[f'ours/{b}']:g}" for b in baselines),
                      *diffs, status)
        where = f"{r['mix']}" + (f" p{r['page_size']}" if r["page_size"] else "")
        for b in baselines:
            for key in (f"{b}_note", f"{b}_err"):
                if r.get(key) and not bench.fa4.is_not_installed(r[key]):
                    notes.append(f"{b} on '{where}': {r[key]}")
    if notes:
        table.caption = "\n".join(dict.fromkeys(notes))
    return table


# -- the command --------------------------------------------------------------------------------------


def _fitting_check_mixes(spec, block_n: int, g2s_atom: str = TMA_KV):
    """verify_varlen's mixes a kernel can read: paged ones only at page sizes its K/V copy reads (tuner.serving.launch.paging)."""
    from tuner.verify_varlen import CHECK_MIXES, readable_paged_mixes

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
                  page_sizes: Optional[Sequence[int]] = None, record_out: Optional[dict] = None) -> int:
    """0 measured (rows may be FAILED: see the table); 1 compile or verification failed; 2 bad input, no GPU.
    ``page_sizes`` (paged) replaces the defaults; ``record_out`` receives the JSON record."""
    from translate.defaults import default_params
    from tuner.build_cmd import UsageError, parse_params_arg, resolve_schedule, resolve_target

    console = console or Console()
    err = Console(stderr=True, soft_wrap=True)

    def usage(msg: str) -> int:
        err.print(f"tune bench: error: {msg}", markup=False, highlight=False)
        return 2

    try:
        target = bench.resolve_bench_target(variant, model, head_dim, dtype, causal)
        targets = [resolve_target(gpu, target.variant, target.head_dim, target.dtype, c, layout)
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
    problem = bench.device_problem(profile, err)
    if problem is not None:
        return usage(problem)

    built, code = bench._build_kernels(targets, target.variant, params, sketch, profile, err, cache_dir, schedule,
                                       page_size=page_size)
    if built is None:
        return code
    kernels, info = _load_and_verify(built)
    if kernels is None:
        for label, item in info.items():
            if not item["verified"]:
                err.print(f"{item['name']} ({label}): verification FAILED: {item['reason']}; nothing is timed",
                          markup=False, highlight=False)
        return 1

    heads = target.heads or _grid_heads(target.variant, target.head_dim)
    rows: list[dict] = []
    for b, kernel in zip(built, kernels):
        problems = [p for size in sizes[(b.params.block_n, b.params.g2s_atom)]
                    for p in serving_problems(layout, target.variant, heads[0], heads[1], b.spec.d_qk, b.spec.d_v,
                                              b.spec.causal, b.spec.dtype, size)]
        console.print(f"[bold]{b.spec.label()}[/bold]: {b.kernel.name} {b.params.key()} "
                      f"({b.compiled.registers} regs, {b.compiled.spill_stores} B spills), heads {heads[0]}/{heads[1]}")
        rows += mix_rows(kernel, problems, on_row=lambda r: console.print(
            f"  {r['mix']:<18} page={r['page_size']} ours={r.get('ours')} fa4={r.get('fa4')} "
            f"flashinfer={r.get('flashinfer')} sdpa={r.get('sdpa')} {r['status']}", markup=False, highlight=False))
    env = bench.environment_record(profile, built[0].compiled.nvcc_version)
    who = target.model or target.variant
    console.print(results_table(rows, f"{who} {layout} prefill on {env['device']} ({profile.name}), TFLOPS"))
    record = {"tool": "tune bench", **env, "flashinfer": _flashinfer_status(), "layout": layout,
              "variant": target.variant, "model": target.model, "heads": list(heads),
              "page_sizes": sorted({s for v in sizes.values() for s in v if s is not None}),
              "kernels": info, "rows": rows}
    if record_out is not None:
        record_out.update(record)
    if out_json is not None:
        problem = bench.write_record(out_json, record)
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
    from tuner.verify_varlen import verify_varlen

    kernels, info, ok = [], {}, True
    for b in built:
        report, reason = None, ""
        try:
            kernel = load_kernel(b.compiled.cubin, b.kernel.meta())
            report = verify_varlen(kernel, b.spec, mixes=_fitting_check_mixes(b.spec, b.params.block_n, b.params.g2s_atom))
            reason = report.reason or ""
        except Exception as exc:  # noqa: BLE001 - a kernel that cannot load or run fails verification
            kernel, reason = None, f"{type(exc).__name__}: {bench._first_line(exc)}"
        verified = report is not None and bool(report.passed)
        ok = ok and verified
        kernels.append(kernel)
        info[b.spec.label()] = {"name": b.kernel.name, "params": b.params.to_dict(),
                                "resources": b.compiled.resources(), "verified": verified, "reason": reason,
                                "verification": report.to_dict() if report is not None else None}
    return (kernels if ok else None), info


def _flashinfer_status() -> dict:
    try:
        import flashinfer
    except Exception as exc:  # noqa: BLE001
        return {"installed": False, "reason": f"{type(exc).__name__}: {bench._first_line(exc)}"}
    return {"installed": True, "version": getattr(flashinfer, "__version__", None)}
