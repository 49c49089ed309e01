"""``tune check FILE...``: parse and check TL programs, one verdict per file.

Exit 0 when every file is valid, 1 when any has diagnostics (a file that holds no program at all, empty or
only comments, included: it was read, and is an invalid sketch, reported with its diagnostic), 2 when a file
cannot be read as text (missing, a directory, unreadable, not UTF-8): an I/O error, which wins over
diagnostics. `tune build --sketch` answers the same files with the same codes (tuner.build.read_sketch).
Whatever a file holds, the answer is diagnostics, never a traceback.
"""
from __future__ import annotations

import sys
from pathlib import Path

from tl.checker import check_source


def run_check(paths: list[Path]) -> int:
    from tuner.build import UsageError, read_sketch

    if not paths:
        print("tune check: error: no files given", file=sys.stderr)
        return 2
    io_error = found = False    # io_error: exit 2 (a file that cannot be read as text)
    for path in paths:
        path = Path(path)
        try:
            text = read_sketch(path)
        except UsageError as exc:
            print(f"tune check: error: {exc}", file=sys.stderr)
            io_error = True
            continue
        _, diagnostics = check_source(text, str(path))
        if diagnostics:
            found = True
            for diagnostic in diagnostics:
                print(diagnostic)
            print(f"{path}: {len(diagnostics)} error{'s' if len(diagnostics) != 1 else ''}")
        else:
            print(f"{path}: ok")
    return 2 if io_error else 1 if found else 0
