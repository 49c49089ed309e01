"""The live view of a running campaign: tuner.campaign.liveview.LiveView (one panel for the run, a row per combination),
or a one-line rich status without it."""
from __future__ import annotations

import contextlib
import time

from .study import geomean


def baseline_geomeans(baselines: dict) -> dict[str, float]:
    """Library name -> geometric mean TFLOPS over the campaign's shapes (the trial value's yardstick)."""
    names = sorted({n for row in baselines.values() for n in row})
    out = {}
    for n in names:
        vals = [row[n] for row in baselines.values() if isinstance(row.get(n), (int, float))]
        if vals:
            out[n] = round(geomean(vals), 2)
    return out


def combo_row(camp) -> dict:
    """One combination's state for the live view."""
    t = camp.tally
    geo = baseline_geomeans(camp.baselines)
    name, value = max(geo.items(), key=lambda kv: kv[1]) if geo else (None, None)
    return {"label": camp.label, "done": t.done, "infeasible": t.infeasible, "rejected": t.rejected,
            "cached": t.cached, "failed": t.failed, "trials": camp.options.trials, "inflight": camp.inflight,
            "best_tflops": t.best or None, "baseline": name, "baseline_tflops": value,
            "state": camp.exhausted and "converged"}


class _Status:
    def __init__(self, camps, start, deadline, view, structured: bool):
        self.camps, self.start, self.deadline, self.view = camps, start, deadline, view
        self.structured = structured
        self._last = 0.0

    def refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < 0.25:
            return
        self._last = now
        rows = [combo_row(c) for c in self.camps]
        best = max(rows, key=lambda r: r["best_tflops"] or 0.0)
        remaining = None if self.deadline is None else max(0.0, self.deadline - now)
        total = {k: sum(r[k] for r in rows) for k in ("done", "infeasible", "failed", "rejected", "cached")}
        if self.structured:
            self.view.update(total["done"], total["infeasible"], total["failed"], best["best_tflops"],
                             best["baseline"], best["baseline_tflops"], now - self.start, remaining,
                             rejected=total["rejected"], cached=total["cached"],
                             combos=rows if len(rows) > 1 else None)
        else:
            text = (f"trials done {total['done']}  infeasible {total['infeasible']}  failed {total['failed']}  "
                    f"rejected before compile {total['rejected']}  cached {total['cached']}  "
                    f"best {best['best_tflops'] or 0:.1f} TFLOPS  elapsed {now - self.start:.0f}s"
                    + (f"  remaining {remaining:.0f}s" if remaining is not None else ""))
            self.view.update(text)


@contextlib.contextmanager
def live_view(camps, start, deadline):
    if not camps[0].options.live:
        yield _Status(camps, start, deadline, _Null(), False)
        return
    try:
        from tuner.campaign.liveview import LiveView
    except ImportError:
        LiveView = None
    title = camps[0].profile.name + (f" · {len(camps)} combinations" if len(camps) > 1 else f" {camps[0].label}")
    if LiveView is not None:
        with LiveView(title) as view:
            yield _Status(camps, start, deadline, view, True)
        return
    with camps[0].console.status("starting trials…") as status:
        yield _Status(camps, start, deadline, status, False)


class _Null:
    def update(self, *args, **kwargs) -> None:
        pass
