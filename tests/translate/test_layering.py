"""The compiler sits below the tuner: importing every translate/ and tl/ module loads no tuner module."""
import pkgutil
import subprocess
import sys

import translate


def test_translate_imports_no_tuner_module():
    modules = ["tl", "translate"] + [f"translate.{m.name}" for m in pkgutil.iter_modules(translate.__path__)]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "bad = sorted(m for m in sys.modules if m == 'tuner' or m.startswith('tuner.'))\n"
            "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"translate/ pulls in tuner modules: {out}"
