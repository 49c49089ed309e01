"""``tune check FILE...``: parse and check TL programs, one verdict per file.

Exit 0 when every file is valid, 1 when any has diagnostics, 2 when a file cannot be read as text
(missing, a directory, not UTF-8) or holds no program at all (empty, or only comments: bad input, as
issue 17 asks, reported with its diagnostic). Whatever a file holds, the answer is diagnostics, never a
traceback.
"""
from __future__ import annotations

import sys
from pathlib import Path

from tl.checker import check_source


def _read(path: Path) -> str:
    """The file's text; raises OSError / UnicodeDecodeError with the reason."""
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory, not a TL file")
    return path.read_bytes().decode("utf-8")


def run_check(paths: list[Path]) -> int:
    if not paths:
        print("tune check: error: no files given", file=sys.stderr)
        return 2
    io_error = found = False    # io_error: exit 2 (unreadable, or no program at all)
    for path in paths:
        path = Path(path)
        try:
            text = _read(path)
        except UnicodeDecodeError as exc:
            print(f"tune check: error: {path}: not UTF-8 text (byte {exc.start})", file=sys.stderr)
            io_error = True
            continue
        except OSError as exc:
            reason = exc.strerror or str(exc)
            print(f"tune check: error: {path}: {reason}", file=sys.stderr)
            io_error = True
            continue
        _, diagnostics = check_source(text, str(path))
        if diagnostics:
            found = True
            io_error = io_error or any(d.code == "empty-program" for d in diagnostics)
            for diagnostic in diagnostics:
                print(diagnostic)
            print(f"{path}: {len(diagnostics)} error{'s' if len(diagnostics) != 1 else ''}")
        else:
            print(f"{path}: ok")
    return 2 if io_error else 1 if found else 0
