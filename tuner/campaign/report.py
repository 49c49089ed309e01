"""What the user sees of a finished campaign: the final table, the report with plots (the live view while it
runs: tuner/campaign/liveview.py).

Inputs are plain dicts so that the campaign driver, a replayed study and the tests build them alike:

* a trial: ``number`` (int), ``state`` (``complete``, ``infeasible``, ``failed``, ``running``, ``cached``,
  ``stopped early``; Optuna's ``COMPLETE``/``PRUNED``/``FAIL``/``RUNNING`` are read the same), ``tflops`` (or
  ``value``; None unless complete), optional ``reason``, ``params``, ``source``;
* a bucket's winner: winners.Decision.to_dict() (``winners_table``).
* a benchmark row: ``seqlen`` (or ``seqlen_k``), optional ``causal`` and ``label``, and TFLOPS for
  ``ours`` (or ``tflops``), ``flash``, ``cudnn``, ``efficient``, ``fa4`` (None where a backend cannot run
  or is not installed; ``<library>_err`` then says why).
"""
from __future__ import annotations

import math
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from tuner.measure.fa4 import NOT_INSTALLED, is_not_installed

BASELINES = (("flash", "torch flash"), ("cudnn", "cuDNN"), ("efficient", "efficient"), ("fa4", "FA4"))
_STATE_ALIASES = {"complete": "complete", "pruned": "infeasible", "infeasible": "infeasible", "fail": "failed",
                  "failed": "failed", "running": "running", "waiting": "running", "cached": "cached",
                  "stopped early": "stopped early"}


def finite_number(value) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def trial_state(trial: dict) -> str:
    state = str(trial.get("state", "complete")).split(".")[-1].lower()
    return _STATE_ALIASES.get(state, state)


def trial_tflops(trial: dict) -> float | None:
    return finite_number(trial.get("tflops", trial.get("value")))


def best_so_far(trials: list[dict]) -> list[tuple[int, float]]:
    """(trial number, best TFLOPS among complete trials up to it), for trials after the first success."""
    out, best = [], None
    for t in sorted(trials, key=lambda t: t.get("number", 0)):
        tf = trial_tflops(t) if trial_state(t) == "complete" else None
        if tf is not None and (best is None or tf > best):
            best = tf
        if best is not None:
            out.append((int(t.get("number", 0)), best))
    return out


def _row_ours(row: dict) -> float | None:
    return finite_number(row.get("ours", row.get("tflops")))


def _row_seqlen(row: dict) -> int:
    value = row.get("seqlen", row.get("seqlen_k", 0))
    return int(value) if isinstance(value, int) or str(value).isdigit() else 0   # (a serving mix: its name)


SERVING_COLUMNS = (("fa4", "FA4 varlen"), ("flashinfer", "FlashInfer"), ("sdpa", "SDPA padded"))
# decode (tuner/measure/decode.py): FA4's paged decode, and the TFLOPS of reading the cache at the copy
# bandwidth (ours/copy bound is the fraction of the copy bandwidth reached)
DECODE_COLUMNS = (("fa4", "FA4 decode"), ("copy_bound", "copy bound"))


def _columns(rows: list[dict]):
    """The libraries of these rows: a decode campaign's (decode buckets), a serving campaign's (rows with a
    bucket), or the dense grid's."""
    from tuner.serving.buckets.decode import is_decode_bucket

    if any(is_decode_bucket(r.get("bucket")) for r in rows):
        return DECODE_COLUMNS
    return SERVING_COLUMNS if any("bucket" in r for r in rows) else BASELINES


def _row_label(row: dict) -> str:
    if row.get("label"):
        return str(row["label"])
    causal = row.get("causal")
    prefix = "" if causal is None else ("causal " if causal else "non-causal ")
    if "bucket" in row:
        return f"{prefix}{row.get('seqlen')} [{row['bucket']}]"
    return f"{prefix}s{_row_seqlen(row)}"


def _ratio(ours, base) -> float | None:
    ours, base = finite_number(ours), finite_number(base)
    return ours / base if ours is not None and base else None


def fmt_number(x: float | None, spec: str = ".1f") -> str:
    return "–" if x is None else format(x, spec)


def _base_cell(row: dict, key: str) -> str:
    """A library's TFLOPS, or "not installed" where that is why it has none, else "–"."""
    value = finite_number(row.get(key))
    if value is None and is_not_installed(row.get(f"{key}_err")):
        return NOT_INSTALLED
    return fmt_number(value)


def _by_shape(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (str(r.get("causal")), _row_seqlen(r)))


def _against_libraries(rows: list[dict]) -> list[str]:
    """The markdown table of our kernel against each library per shape: TFLOPS, then our ratio to each."""
    cols = _columns(rows)
    header = ["shape", "ours"] + [n for _, n in cols] + [f"ours/{n}" for _, n in cols]
    table = []
    for r in _by_shape(rows):
        ours = _row_ours(r)
        table.append([_row_label(r), fmt_number(ours)] + [_base_cell(r, k) for k, _ in cols]
                     + [fmt_number(_ratio(ours, r.get(k)), ".2f") for k, _ in cols])
    return _md_table(header, table)


def _missing_baselines(rows: list[dict]) -> list[str]:
    """One line per library and reason: why it has no number at which shapes."""
    cols = _columns(rows)
    names = dict(cols)
    by_reason: dict[tuple[str, str], list[str]] = {}
    for r in _by_shape(rows):
        for key, _ in cols:
            why = r.get(f"{key}_err")
            if why and finite_number(r.get(key)) is None:
                by_reason.setdefault((key, str(why).splitlines()[0]), []).append(_row_label(r))
    return [f"- {names[key]} ({', '.join(labels)}): {why}" for (key, why), labels in by_reason.items()]


# ---- plots -------------------------------------------------------------------------------------------

class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed: the report is written without its plots."""


def plots_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:  # GPU images often lack it; the report says so instead of failing
        raise PlotsUnavailable("matplotlib is not installed (pip install matplotlib for the plots)") from exc
    matplotlib.use("Agg")  # no display on build machines or Ray nodes
    import matplotlib.pyplot as plt

    return plt


def plot_best_so_far(trials: list[dict], path: Path, baselines: dict | None = None) -> Path | None:
    curve = best_so_far(trials)
    if not curve:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    done = [(t.get("number", 0), trial_tflops(t)) for t in trials
            if trial_state(t) == "complete" and trial_tflops(t) is not None]
    ax.scatter([d[0] for d in done], [d[1] for d in done], s=10, alpha=0.5, color="gray", label="trial")
    ax.step([c[0] for c in curve], [c[1] for c in curve], where="post", linewidth=2, label="best so far")
    for key, name in BASELINES:
        value = finite_number((baselines or {}).get(key))
        if value is not None:
            ax.axhline(value, linestyle="--", linewidth=1, label=f"{name} {value:.0f}", color=f"C{2 + BASELINES.index((key, name))}")
    _label(ax, "trial", "Best TFLOPS so far")
    return _save(plt, fig, path)


def plot_tflops_vs_seqlen(rows: list[dict], path: Path, title: str = "") -> Path | None:
    if not rows or any("bucket" in r for r in rows):   # serving mixes: no seqlen axis; the table says it
        return None
    plt = _pyplot()
    groups = sorted({row.get("causal") for row in rows}, key=lambda c: (c is None, c))
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4), squeeze=False)
    for ax, causal in zip(axes[0], groups):
        part = sorted((r for r in rows if r.get("causal") == causal), key=_row_seqlen)
        xs = [_row_seqlen(r) for r in part]
        series = [("ours", "ours", _row_ours)] + [(k, n, (lambda r, k=k: finite_number(r.get(k)))) for k, n in BASELINES]
        for i, (key, name, get) in enumerate(series):
            pts = [(x, get(r)) for x, r in zip(xs, part) if get(r) is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                        linewidth=2.5 if key == "ours" else 1.2, label=name, color=f"C{i}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(set(xs)), [str(x) for x in sorted(set(xs))])
        _label(ax, "seqlen", " ".join(filter(None, [title, {True: "causal", False: "non-causal"}.get(causal, "")])))
    return _save(plt, fig, path)


def _label(ax, xlabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel("TFLOPS")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---- report ------------------------------------------------------------------------------------------

def _curve_steps(curve: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The points where the best-so-far curve rises."""
    out: list[tuple[int, float]] = []
    for n, v in curve:
        if not out or v > out[-1][1]:
            out.append((n, v))
    return out


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def winners_table(winners: list[dict]) -> list[str]:
    """Each bucket's winner after its re-timing (tuner/campaign/winners.py, ``Decision.to_dict``): the run's
    best single measurement against the best seed's, the re-timed ratio with its interval, and the store."""
    lines = ["Each bucket's fastest kernel (by its single measurement) was timed again side by side with the best "
             "seed and the stored kernel, interleaved, in one fresh process; it wins only when the lower bound of "
             "the interval of its median speed-up is above 1.", ""]
    rows = []
    for w in winners:
        c, seed, stored = w["challenger"], w["seed"], w["stored"]
        vs_seed, vs_stored = w.get("vs_seed"), w.get("vs_stored")
        winner = w[w["winner"]]
        rows.append([w["bucket"], f"trial {c['trial']} ({c['source']}) {fmt_number(finite_number(c['tflops']))}",
                     ("the same" if c.get("seeded") else "none verified") if seed is None
                     else f"trial {seed['trial']} {fmt_number(finite_number(seed['tflops']))}",
                     _verdict_cell(vs_seed),
                     f"trial {winner['trial']} ({'search' if w['search_beat_seeds'] else winner['source']})",
                     "–" if stored is None else f"{stored['kernel_name']} ({stored['source']})",
                     _verdict_cell(vs_stored), _store_cell(w, winner, stored)])
    lines += _md_table(["bucket", "best single (TFLOPS)", "best seed", "re-timed ×seed [interval]", "winner",
                        "stored kernel", "re-timed ×stored [interval]", "store"], rows)
    notes = [f"- {w['bucket']}: {w['note']}" for w in winners]
    return lines + [""] + notes


def _store_cell(w: dict, winner: dict, stored: dict | None) -> str:
    if w["store"]:
        return "stored"
    if stored is None:
        return "–"
    return "already stored" if stored["sha256"] == winner["sha256"] else "kept the stored kernel"


def _verdict_cell(v: dict | None) -> str:
    if not v:
        return "–"
    text = f"×{v['ratio']:.3f} [{v['low']:.3f}, {v['high']:.3f}]"
    return f"**{text}**" if v["confirmed"] else text


def write_report(study_dir, trials: list[dict], best=None, bench_rows: list[dict] | None = None,
                 winners: list[dict] | None = None) -> Path:
    """Write ``report.md`` and its PNG plots into ``study_dir``; returns the report's path.

    ``best`` is the stored KernelRecord of the campaign (or None when nothing passed); ``winners`` each
    bucket's decision after its re-timing (``winners_table``).
    """
    study_dir = Path(study_dir)
    study_dir.mkdir(parents=True, exist_ok=True)
    bench_rows = list(bench_rows or [])
    counts = {s: sum(1 for t in trials if trial_state(t) == s)
              for s in ("complete", "infeasible", "failed", "running", "cached", "stopped early")}
    lines = [f"# Campaign report: {study_dir.name}", ""]
    lines.append(f"Trials: {len(trials)} — complete {counts['complete']}, infeasible {counts['infeasible']}, "
                 f"failed {counts['failed']}" + (f", running {counts['running']}" if counts["running"] else "")
                 + (f", answered from the measurement cache {counts['cached']}" if counts["cached"] else "")
                 + (f", stopped early (far behind at the longest seqlen) {counts['stopped early']}"
                    if counts["stopped early"] else "") + ".")
    lines.append("")

    lines += ["## Best kernel", ""]
    if best is None:
        lines += ["No verified kernel: nothing was stored.", ""]
    else:
        lines += [f"- kernel: `{best.kernel_name}` (sha256 `{best.kernel_sha256[:16]}…`)",
                  f"- GPU: {best.device_name} ({best.gpu}, {best.arch}); {best.variant} {best.dtype} "
                  f"d{best.d_qk}x{best.d_v} {'causal' if best.causal else 'non-causal'}, bucket {best.bucket}",
                  f"- **{best.tflops:.1f} TFLOPS** (study {best.study!r}, trial {best.trial})"]
        for key, name in BASELINES:
            base = finite_number(best.baselines.get(key))
            if base is not None:
                lines.append(f"- {name}: {base:.1f} TFLOPS — ours ×{best.tflops / base:.2f}")
        lines.append(f"- verification: {'passed' if best.verification.get('passed') is True else 'NOT PASSED'}")
        lines.append("- params: `" + ", ".join(f"{k}={v}" for k, v in sorted(best.params.items())) + "`")
        prov = best.provenance
        lines.append("- built with: " + ", ".join(f"{k} {prov.get(k)}" for k in ("tool_version", "nvcc", "cutlass",
                                                                                  "torch", "driver") if prov.get(k)))
        lines.append("")

    if winners:
        lines += ["## Bucket winners, re-timed", ""] + winners_table(winners) + [""]
    baselines = best.baselines if best is not None else None
    no_plots = None if plots_available() else "plots skipped: matplotlib is not installed here"
    if no_plots is None and plot_best_so_far(trials, study_dir / "best_so_far.png", baselines):
        lines += ["## Search", "", "![best TFLOPS so far against trials](best_so_far.png)", ""]
    elif no_plots is not None and best_so_far(trials):
        lines += ["## Search", "", f"({no_plots}.) Best TFLOPS so far: "
                  + ", ".join(f"trial {n}: {v:.1f}" for n, v in _curve_steps(best_so_far(trials))), ""]
    complete = sorted((t for t in trials if trial_state(t) == "complete" and trial_tflops(t) is not None),
                      key=lambda t: -trial_tflops(t))[:10]
    if complete:
        lines += ["Top trials:", ""]
        lines += _md_table(["trial", "TFLOPS", "source", "params"],
                           [[str(t.get("number", "")), f"{trial_tflops(t):.1f}", str(t.get("source", "")),
                             ", ".join(f"{k}={v}" for k, v in sorted((t.get("params") or {}).items()))]
                            for t in complete])
        lines.append("")
    reasons: dict[str, int] = {}
    for t in trials:
        if trial_state(t) == "infeasible":
            why = str(t.get("reason") or "unknown").splitlines()[0][:100]
            reasons[why] = reasons.get(why, 0) + 1
    if reasons:
        lines += ["Infeasible candidates by reason:", ""]
        lines += _md_table(["reason", "trials"], [[r, str(n)] for r, n in sorted(reasons.items(), key=lambda x: -x[1])])
        lines.append("")

    if bench_rows:
        title = f"{best.variant} d{best.d_qk}x{best.d_v} {best.dtype}" if best is not None else ""
        lines += ["## Against the libraries", ""]
        if no_plots is None and plot_tflops_vs_seqlen(bench_rows, study_dir / "tflops_vs_seqlen.png", title):
            lines += ["![TFLOPS against seqlen](tflops_vs_seqlen.png)", ""]
        elif no_plots is not None:
            lines += [f"({no_plots}.)", ""]
        lines += _against_libraries(bench_rows) + [""]
        missing = _missing_baselines(bench_rows)
        if missing:
            lines += ["Libraries without a number:", ""] + missing + [""]
    path = study_dir / "report.md"
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
    return path


def write_campaign_report(study_dir, gpu: str, sections: list[dict]) -> Path:
    """The report of a run of several combinations: per combination its counts and a table of our best
    kernel against the libraries per shape (from each study's summary.json); written to
    ``<study_dir>/campaign-<gpu>.md``."""
    study_dir = Path(study_dir)
    lines = [f"# Campaign on {gpu}: {len(sections)} combinations", ""]
    lines += _md_table(["combination", "study", "measured", "failed to build/verify", "rejected before compile",
                        "cache hits", "verified kernel"],
                       [[s["label"], s["study"], str(s["summary"]["trials"]["done"]),
                         str(s["summary"]["trials"]["infeasible"]),
                         str(s["summary"]["trials"].get("rejected_before_compile", 0)),
                         str(s["summary"]["trials"].get("cache_hits", 0)), "yes" if s["ok"] else "no"]
                        for s in sections])
    lines.append("")
    for s in sections:
        lines += [f"## {s['label']}", "", f"Study `{s['study']}`: its own report is `{s['study']}/report.md`."]
        if s.get("exhausted"):
            lines.append(f"Stopped asking: {s['exhausted']}.")
        lines.append("")
        rows = s["summary"].get("rows") or []
        if not rows:
            lines += ["No verified kernel.", ""]
            continue
        lines += _against_libraries(rows) + [""]
        if s["summary"].get("winners"):
            lines += winners_table(s["summary"]["winners"]) + [""]
    path = study_dir / f"campaign-{gpu}.md"
    study_dir.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def final_table(best_rows: list[dict], title: str = "Best kernel against torch SDPA backends and FA4") -> Table:
    """Ours against torch's flash and cuDNN backends (and efficient where measured) and FA4 (measured, or
    "not installed"), with ratios."""
    with_eff = any(finite_number(r.get("efficient")) is not None for r in best_rows)
    table = Table(title=title)
    table.add_column("shape")
    table.add_column("ours TFLOPS", justify="right")
    cols = ([("flash", "torch flash"), ("cudnn", "cuDNN")] + ([("efficient", "efficient")] if with_eff else [])
            + [("fa4", "FA4")])
    if any("bucket" in r for r in best_rows):
        cols = list(SERVING_COLUMNS)
    for _, name in cols:
        table.add_column(name, justify="right")
        table.add_column(f"ours/{name}", justify="right")
    for r in best_rows:
        ours = _row_ours(r)
        cells = [escape(_row_label(r)), fmt_number(ours)]
        for key, _ in cols:
            ratio = _ratio(ours, r.get(key))
            style = "" if ratio is None else ("green" if ratio >= 1 else "red")
            cells += [_base_cell(r, key), f"[{style}]{fmt_number(ratio, '.2f')}×[/{style}]" if style else "–"]
        table.add_row(*cells)
    return table
