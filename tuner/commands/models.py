"""`tune models`: the model presets (`--model NAME`) as a table."""
from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tuner.models import ModelError, load_models


def show_models(console: Console | None = None, path: Path | str | None = None) -> int:
    # Wide enough for the descriptions to fold less when stdout is not a terminal.
    console = console or Console(width=200)
    try:
        models = load_models(path)
    except ModelError as exc:
        print(f"tune: error: {exc}", file=sys.stderr)
        return 2
    table = Table(title="Model presets (tune --gpu GPU --model NAME)")
    for col in ("model", "variant", "heads q/kv", "head dims", "causal", "dtypes", "layers", "description"):
        table.add_column(col, overflow="fold", no_wrap=col != "description")
    for m in models.values():
        dims = str(m.d_qk) if m.d_qk == m.d_v else f"{m.d_qk}/{m.d_v}"
        if m.kernel_support():
            dims += " (not yet)"
        table.add_row(m.name, m.variant, f"{m.heads_q}/{m.heads_kv}", dims,
                      ", ".join("causal" if c else "noncausal" for c in m.causal), ", ".join(m.dtypes),
                      layer_text(m), m.description)
    console.print(table)
    return 0


def layer_text(m) -> str:
    """The attention options of a preset's layers, short: ``LG: window 4096, softcap 50``; ``-`` for none."""
    parts = [x for x in (m.sliding_window is not None and f"window {m.sliding_window}",
                         m.softcap and f"softcap {m.softcap:g}", m.sinks and "sinks") if x]
    return f"{m.layers}: {', '.join(parts)}" if parts else "-"
