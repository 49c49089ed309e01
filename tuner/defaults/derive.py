"""A GPU's bucket-defaults table from its campaigns: the confirmed wins over the per-spec default, as table entries.

A campaign over a dense prefill spec seeds the per-spec default (translate.defaults) and re-times every bucket's
winner against it in fresh processes (tuner/campaign/winners.py, ``vs_default``; the rule of
tuner/campaign/confirm.py in each of ``processes`` processes). A bucket whose winner was confirmed faster than the
default that way, whose winner is the default's schedule with other KernelParams, gives the change
``{field: winner's value}`` over the fields where the two differ: what the hand workflow (scripts/param_ab_check.py
records, scripts/bucket_table.py) puts in a table, with the same rule. Buckets with the same change for the same
(variant, head dim, causal) make one entry. Where two campaigns (say bf16 and fp16, or two study dirs) both
confirmed a change for one bucket, the one with the higher median ratio is kept and the other is reported.

Inputs are campaign summaries (``<study dir>/<study>/summary.json``) or the records `tune defaults` keeps beside a
table (the same fields), so a table can be derived again from its records. Pure: no GPU, no files written here.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from kernel_abi.spec import KernelSpec
from tuner.defaults.table import entry_toml, table_dtype
from tuner.serving.buckets.seqlen import BUCKETS, bucket_name

RECORD_FIELDS = ("study", "gpu", "device_name", "spec", "confirm_rule", "winners")
BUCKET_ORDER = [bucket_name(e) for e in BUCKETS]


class DeriveError(ValueError):
    """Campaign results that cannot give a table; the message says which and why."""


@dataclass(frozen=True)
class Win:
    """One bucket's winner confirmed against the per-spec default."""

    study: str
    spec: KernelSpec
    bucket: str
    change: tuple[tuple[str, object], ...]     # sorted (field, value): hashable
    ratios: tuple[float, ...]                   # per fresh process: median of default ms / winner ms over the rounds
    low: float                                  # the rule's interval over the processes
    high: float
    kernel_name: str

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)


@dataclass(frozen=True)
class Entry:
    """One table entry: a change for these buckets of one (variant, head dim, causal)."""

    variant: str
    head_dim: int
    causal: bool
    change: tuple[tuple[str, object], ...]
    wins: tuple[Win, ...]
    dtype: str = ""          # "fp8": an entry for the e4m3 kernels (table.table_dtype); "": bf16 and fp16

    @property
    def buckets(self) -> list[str]:
        return [w.bucket for w in self.wins]

    def measured(self) -> str:
        """``MHA s512 x1.024 x1.021, s1024 x1.011 x1.013``: the per-process ratios, as the hand table writes them."""
        parts = [f"{w.bucket} " + " ".join(f"x{r:.3f}" for r in w.ratios) for w in self.wins]
        return f"{self.variant.upper()} " + ", ".join(parts)


@dataclass
class Derivation:
    entries: list[Entry] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)        # what was left out, and why
    records: list[dict] = field(default_factory=list)     # the inputs' RECORD_FIELDS, one per campaign used


def read_results(directory: Path) -> list[tuple[str, dict]]:
    """(where, data) of every campaign summary under ``directory`` (``*/summary.json``) and every record
    (``*.json`` with the record fields) in it. DeriveError when it is not a folder."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DeriveError(f"{directory} {'is not a directory' if directory.exists() else 'does not exist'}")
    out = []
    for path in sorted(directory.glob("*/summary.json")) + sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DeriveError(f"{path}: not readable JSON ({exc})") from None
        if isinstance(data, dict) and "winners" in data:
            out.append((str(path), data))
    return out


def _spec_of(data: dict, where: str) -> KernelSpec | None:
    raw = data.get("spec")
    if not isinstance(raw, dict):
        return None
    try:
        return KernelSpec(**raw)
    except TypeError as exc:
        raise DeriveError(f"{where}: spec {raw!r} is not a kernel spec ({exc})") from None


def _process_ratios(winner: dict) -> list[float]:
    """Per fresh process: the median over the rounds of the default's time over the winner's."""
    out = []
    for times in winner.get("ms_per_process") or []:
        mine, theirs = times.get(winner["winner"]), times.get("default")
        if not mine or not theirs or len(mine) != len(theirs):
            return []
        out.append(statistics.median(d / w for w, d in zip(mine, theirs)))
    return out


def wins_of(data: dict, where: str, gpu: str, default_for, min_processes: int = 2,
            field_defaults: dict | None = None) -> tuple[list[Win], list[str]]:
    """The confirmed wins over the per-spec default in one campaign's results, and a note per bucket left out.
    ``default_for(spec)``: the per-spec default's {field: value} today (a campaign that timed another default says
    nothing about this one)."""
    from tuner.defaults.table import applies_to

    study = str(data.get("study") or Path(where).parent.name)
    if data.get("gpu") != gpu:
        return [], []
    spec = _spec_of(data, where)
    if spec is None:
        return [], [f"{study}: its summary names no spec (a campaign older than `tune defaults`): run it again"]
    if not applies_to(spec, "ws_overlap"):
        return [], [f"{study}: {spec.label()} takes no bucket defaults (dense prefill without options only)"]
    wins, notes = [], []
    base = default_for(spec)
    for w in data.get("winners") or []:
        bucket, role = w.get("bucket"), w.get("winner")
        verdict, winner, default = w.get("vs_default"), w.get(role) or {}, w.get("default")
        if default is None:
            notes.append(f"{study} {bucket}: the per-spec default was not timed here (it failed, or the campaign "
                         "did not seed it)")
            continue
        if default.get("sha256") == winner.get("sha256"):
            continue                                       # the default won the bucket: nothing to change
        if not verdict:
            notes.append(f"{study} {bucket}: the winner was not re-timed against the per-spec default")
            continue
        if not verdict.get("confirmed"):
            notes.append(f"{study} {bucket}: {winner.get('kernel_name')} x{verdict['ratio']:.3f} "
                         f"[{verdict['low']:.3f}, {verdict['high']:.3f}] against the default: not confirmed")
            continue
        ratios = _process_ratios(w)
        if len(ratios) < min_processes:
            notes.append(f"{study} {bucket}: confirmed in {len(ratios)} fresh process(es), the table needs "
                         f"{min_processes}")
            continue
        if winner.get("schedule") != "ws_overlap":
            notes.append(f"{study} {bucket}: the winner's schedule {winner.get('schedule')!r} is not the default's "
                         "(ws_overlap): a table changes KernelParams only")
            continue
        # (a parameter added after the campaign ran took its field default there: ``field_defaults``)
        timed_default = {**{k: v for k, v in (field_defaults or {}).items() if k in base},
                         **{k: v for k, v in (default.get("params") or {}).items() if k != "schedule"}}
        if timed_default != base:
            notes.append(f"{study} {bucket}: the per-spec default has changed since the campaign timed it: "
                         "run it again")
            continue
        params = {k: v for k, v in (winner.get("params") or {}).items() if k != "schedule"}
        change = tuple(sorted((k, v) for k, v in params.items() if base.get(k) != v))
        if not change:
            continue
        wins.append(Win(study, spec, bucket, change, tuple(ratios), float(verdict["low"]), float(verdict["high"]),
                        str(winner.get("kernel_name"))))
    return wins, notes


def derive(results: list[tuple[str, dict]], gpu: str, default_for, min_processes: int = 2,
           field_defaults: dict | None = None) -> Derivation:
    """The table of ``gpu`` from campaign results (read_results): see the module doc."""
    out = Derivation()
    chosen: dict[tuple, Win] = {}
    for where, data in results:
        wins, notes = wins_of(data, where, gpu, default_for, min_processes, field_defaults)
        out.notes += notes
        if data.get("gpu") == gpu and data.get("spec"):
            out.records.append({k: data.get(k) for k in RECORD_FIELDS})
        for win in wins:
            key = (win.spec.variant, win.spec.d_qk, win.spec.causal, win.bucket, table_dtype(win.spec))
            held = chosen.get(key)
            if held is None or win.median > held.median:
                if held is not None:
                    out.notes.append(f"{held.study} {held.bucket}: x{held.median:.3f} left for {win.study}'s "
                                     f"x{win.median:.3f}")
                chosen[key] = win
            else:
                out.notes.append(f"{win.study} {win.bucket}: x{win.median:.3f} left for {held.study}'s "
                                 f"x{held.median:.3f}")
    groups: dict[tuple, list[Win]] = {}
    for (variant, head_dim, causal, _, dtype), win in chosen.items():
        groups.setdefault((variant, head_dim, causal, dtype, win.change), []).append(win)
    for (variant, head_dim, causal, dtype, change), wins in groups.items():
        wins.sort(key=lambda w: BUCKET_ORDER.index(w.bucket))
        out.entries.append(Entry(variant, head_dim, causal, change, tuple(wins), dtype))
    out.entries.sort(key=lambda e: (e.dtype, not e.causal, e.head_dim, e.variant, BUCKET_ORDER.index(e.buckets[0])))
    return out


def render(derivation: Derivation, gpu: str, source: str, date: str, records_dir: str) -> str:
    """The table as TOML (tuner/defaults/table.py's format), with what it rests on in comments."""
    lines = [
        f"# The {gpu} dense prefill defaults per key-length bucket, derived by `tune defaults` on {date} from the",
        f"# campaigns in {source}: changes to translate.defaults' per-spec default. An entry is a bucket winner",
        "# re-timed against the per-spec default in fresh processes and faster by the confirm rule",
        "# (tuner/campaign/confirm.py) in each of them; `measured` lists the per-process median ratios (default ms /",
        f"# winner ms). The campaigns' records are in {records_dir} (from this table's folder); `tune defaults --gpu",
        f"# {gpu} --study-dir {records_dir}` there derives this table again from them. Specs and buckets not listed keep the per-spec",
        "# default. An entry without a dtype was measured on bf16 or fp16 kernels and applies to both (the same tiles",
        "# and schedule); one with dtype = \"fp8\" applies to the e4m3 kernels only.",
    ]
    if not derivation.entries:
        lines.append("# No change was confirmed: every bucket keeps the per-spec default.")
    for entry in derivation.entries:
        lines.append("")
        for win in entry.wins:
            lines.append(f"# {win.study} {win.bucket}: {win.kernel_name}, interval [{win.low:.3f}, {win.high:.3f}]")
        item = {"variants": [entry.variant], "head_dim": entry.head_dim, "causal": entry.causal,
                "buckets": entry.buckets, "change": dict(entry.change), "measured": entry.measured()}
        if entry.dtype:
            item["dtype"] = entry.dtype
        lines += entry_toml(item).splitlines()
    if derivation.notes:
        lines += ["", "# Left out:"] + [f"#   {n}" for n in derivation.notes]
    return "\n".join(lines) + "\n"
