"""The campaign's live status: a rich panel on a terminal (a row per combination), plain log lines otherwise."""
from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tuner.campaign.report import finite_number, fmt_number


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:d}:{s:02d}"


class LiveView:
    """The campaign's status line: a rich Live panel on a terminal, plain log lines otherwise.

    ``remaining`` is seconds (a number, from --timeout) or any text (e.g. ``"12 trials"``). In plain
    mode a line is printed when a count or the best changes, and at most every ``plain_interval``
    seconds otherwise, so a log file stays readable overnight.
    """

    def __init__(self, title: str = "tune", console: Console | None = None, plain: bool | None = None,
                 plain_interval: float = 60.0):
        self.title = title
        self.console = console or Console()
        self.plain = (not self.console.is_terminal) if plain is None else plain
        self.plain_interval = plain_interval
        self._live = None
        self._last_key = None
        self._last_print = 0.0
        self.state: dict = {}

    def __enter__(self) -> "LiveView":
        if not self.plain:
            from rich.live import Live

            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.__exit__(*exc)
            self._live = None
        elif self.state:
            self.console.print(self.line(), markup=False, highlight=False, soft_wrap=True)

    def update(self, done: int, infeasible: int, failed: int, best_tflops: float | None,
               best_baseline_name: str | None, best_baseline_tflops: float | None, elapsed: float,
               remaining, *, rejected: int = 0, cached: int = 0, combos: list[dict] | None = None) -> None:
        """``rejected``: proposals refused before compiling; ``cached``: answered from the measurement cache
        (neither counts as a trial); ``combos``: one row per combination of a multi-combination run."""
        self.state = dict(done=done, infeasible=infeasible, failed=failed, best_tflops=finite_number(best_tflops),
                          baseline=best_baseline_name, baseline_tflops=finite_number(best_baseline_tflops),
                          elapsed=elapsed, remaining=remaining, rejected=rejected, cached=cached,
                          combos=combos or [])
        if self._live is not None:
            self._live.update(self._render())
            return
        if self.plain:
            key = (done, infeasible, failed, rejected, cached, self.state["best_tflops"])
            now = time.monotonic()
            if key != self._last_key or now - self._last_print >= self.plain_interval:
                self.console.print(self.line(), markup=False, highlight=False, soft_wrap=True)
                for row in self.state["combos"]:
                    self.console.print("  " + _combo_text(row), markup=False, highlight=False, soft_wrap=True)
                self._last_key, self._last_print = key, now

    def _best_text(self) -> str:
        s = self.state
        if s.get("best_tflops") is None:
            return "best –"
        text = f"best {s['best_tflops']:.1f} TFLOPS"
        if s.get("baseline") and s.get("baseline_tflops"):
            ratio = s["best_tflops"] / s["baseline_tflops"]
            verb = "beats" if ratio >= 1 else "vs"
            text += f" ({verb} {s['baseline']} {s['baseline_tflops']:.1f}, ×{ratio:.2f})"
        return text

    def _remaining_text(self) -> str:
        r = self.state.get("remaining")
        return _duration(r) if isinstance(r, (int, float)) and not isinstance(r, bool) else ("–" if r is None else str(r))

    def line(self) -> str:
        s = self.state
        return (f"[{self.title}] trials {counts_text(s)} | {self._best_text()} | "
                f"elapsed {_duration(s.get('elapsed'))}, remaining {self._remaining_text()}")

    def _render(self):
        from rich.console import Group
        from rich.panel import Panel

        s = self.state
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        grid.add_row("trials", f"[green]{s.get('done', 0)} done[/green]  [yellow]{s.get('infeasible', 0)} infeasible"
                               f"[/yellow]  [red]{s.get('failed', 0)} failed[/red]" + escape(_extra_counts(s)))
        grid.add_row("best", self._best_text())
        grid.add_row("time", f"elapsed {_duration(s.get('elapsed'))}, remaining {self._remaining_text()}")
        if not s.get("combos"):
            return Panel(grid, title=escape(self.title), expand=False)
        table = Table(box=None, padding=(0, 1))
        for col in ("combination", "measured", "failed to build/verify", "rejected", "cached", "in flight", "best"):
            table.add_column(col, justify="left" if col == "combination" else "right")
        for r in s["combos"]:
            table.add_row(escape(r["label"]) + (f" [dim]({r['state']})[/dim]" if r.get("state") else ""),
                          f"{r['done']}/{r['trials']}", str(r["infeasible"]), str(r["rejected"]), str(r["cached"]),
                          str(r["inflight"]), fmt_number(finite_number(r.get("best_tflops"))))
        return Panel(Group(grid, table), title=escape(self.title), expand=False)


def counts_text(counts: dict) -> str:
    """The trial counts in the words of the live line; the run's last lines say them the same way (finish.py)."""
    return (f"{counts.get('done', 0)} done, {counts.get('infeasible', 0)} infeasible, {counts.get('failed', 0)} "
            f"failed{_extra_counts(counts)}")


def _extra_counts(state: dict) -> str:
    parts = [f"{state[k]} {name}" for k, name in (("rejected", "rejected before compile"), ("cached", "cached"))
             if state.get(k)]
    return (", " + ", ".join(parts)) if parts else ""


def _combo_text(row: dict) -> str:
    best = finite_number(row.get("best_tflops"))
    return (f"{row['label']}: {row['done'] + row['infeasible']}/{row['trials']} trials ({row['done']} measured, "
            f"{row['infeasible']} failed to build or verify), {row['rejected']} rejected, {row['cached']} cached, "
            f"best {'–' if best is None else f'{best:.1f}'}" + (f" ({row['state']})" if row.get("state") else ""))
