"""The ``tune`` console script: the command line needs the ``tune`` extra (a serving host installs without it), so
a missing dependency is one line naming the install command, not a traceback."""
from __future__ import annotations

import importlib.util
import sys

# What the `tune` extra brings (pyproject.toml): the command line imports the first two at once, the sub-commands
# the others when they run (a campaign needs optuna, ray and openai; `tune build` and `tune bench` do not).
TUNE_EXTRA = ("typer", "rich", "optuna", "cmaes", "ray", "openai", "numpy", "lark", "jinja2", "pydantic",
              "matplotlib", "cutlass_library")


def _missing(names) -> str:
    return (f"tune: error: the tune command needs the tool's dependencies ({', '.join(names)} missing): "
            "pip install 'attn-autotuner[tune]' (from a clone: pip install -e \".[tune]\")")


def main() -> None:
    missing = [name for name in TUNE_EXTRA[:2] if importlib.util.find_spec(name) is None]
    if missing:
        print(_missing(missing), file=sys.stderr)
        raise SystemExit(2)
    from tuner.commands.cli import main as cli_main

    try:
        cli_main()
    except ModuleNotFoundError as exc:   # a sub-command's dependency of the extra
        if (exc.name or "").split(".")[0] not in TUNE_EXTRA:
            raise
        print(_missing([exc.name.split(".")[0]]), file=sys.stderr)
        raise SystemExit(2) from None
