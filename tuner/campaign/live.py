"""The live view of a running campaign: tuner.report.LiveView, or a one-line rich status without it."""
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


class _Status:
    def __init__(self, camp, tally, start, deadline, view, structured: bool):
        self.camp, self.tally, self.start, self.deadline, self.view = camp, tally, start, deadline, view
        self.structured = structured
        self._last = 0.0

    def refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < 0.25:
            return
        self._last = now
        geo = baseline_geomeans(self.camp.baselines)
        name, value = max(geo.items(), key=lambda kv: kv[1]) if geo else (None, None)
        remaining = None if self.deadline is None else max(0.0, self.deadline - now)
        t = self.tally
        if self.structured:
            self.view.update(done=t.done, infeasible=t.infeasible, failed=t.failed, best_tflops=t.best or None,
                             best_baseline_name=name, best_baseline_tflops=value, elapsed=now - self.start,
                             remaining=remaining)
        else:
            text = (f"trials done {t.done}  infeasible {t.infeasible}  failed {t.failed}  best {t.best:.1f} TFLOPS"
                    + (f" (vs {name} {value:.1f})" if name else "") + f"  elapsed {now - self.start:.0f}s"
                    + (f"  remaining {remaining:.0f}s" if remaining is not None else ""))
            self.view.update(text)


@contextlib.contextmanager
def live_view(camp, tally, start, deadline):
    if not camp.options.live:
        yield _Status(camp, tally, start, deadline, _Null(), False)
        return
    try:
        from tuner.report import LiveView
    except ImportError:
        LiveView = None
    if LiveView is not None:
        with LiveView() as view:
            yield _Status(camp, tally, start, deadline, view, True)
        return
    with camp.console.status("starting trials…") as status:
        yield _Status(camp, tally, start, deadline, status, False)


class _Null:
    def update(self, *args, **kwargs) -> None:
        pass
