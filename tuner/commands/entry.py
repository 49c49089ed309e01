"""The ``tune`` console script: the command line needs the ``tune`` extra (a serving host installs without it), so
a missing dependency is one line naming the install command, not a traceback."""
from __future__ import annotations

import importlib.util
import sys

# What the `tune` extra brings that the command line imports (pyproject.toml); cmaes and pydantic load later.
NEEDED = ("typer", "rich", "optuna", "ray", "openai", "lark", "jinja2", "numpy")


def main() -> None:
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if missing:
        print(f"tune: error: the tune command needs the tool's dependencies ({', '.join(missing)} missing): "
              "pip install 'attn-autotuner[tune]' (from a clone: pip install -e \".[tune]\")", file=sys.stderr)
        raise SystemExit(2)
    from tuner.commands.cli import main as cli_main

    cli_main()
