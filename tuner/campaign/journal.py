"""A journal file checked before Optuna opens it: a torn last record is cut off, a corrupt one elsewhere
is an error that names its line.

Optuna's ``JournalFileBackend`` appends each record as one write of ``json + "\\n"`` under its lock file.
A write cut short (a power loss, a kill during the write) leaves a last line without its newline. Optuna's
reader skips that line, but its next append lands on it: the two make one line that is not JSON, and once
anything is appended after it every open of the journal fails with a ``JSONDecodeError``
(optuna/optuna#5138). So, under Optuna's own lock (a writer holds it for the whole append, so a record
being appended is never taken for a torn one), a last line without its newline or that is not a journal
record is cut off, after the whole file is copied beside it; a bad record before the last line is not
guessed at: the error names the file, the line and how to recover, and the file is left as it is.
"""
from __future__ import annotations

import glob
import io
import json
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from optuna.storages.journal import JournalFileSymlinkLock

BACKUP_GLOB = "{name}.torn-*.bak"


class JournalError(RuntimeError):
    """The journal cannot be read or repaired; the message says where and how to recover."""


@dataclass(frozen=True)
class TornTail:
    """What cutting a torn last record did."""

    path: Path
    dropped: int          # bytes cut off the end
    kept: int             # bytes left: the file's new size
    reason: str           # why the last line is not a complete record
    backup: Path          # the whole original file

    def message(self) -> str:
        return (f"journal {self.path}: cut off a torn last record ({self.dropped} bytes, {self.reason}) at byte "
                f"{self.kept}; the original is kept as {self.backup}")


def record_problem(line: bytes) -> Optional[str]:
    """Why ``line`` (as read, with its newline if it has one) is not a complete journal record; None when it is."""
    if not line.endswith(b"\n"):
        return "no newline at its end"
    try:
        record = json.loads(line)
    except UnicodeDecodeError:
        return "not UTF-8 text"
    except json.JSONDecodeError as exc:   # (some of json's messages end in "at": "Invalid control character at")
        return f"not JSON: {exc.msg.removesuffix(' at')} at column {exc.colno}"
    if not isinstance(record, dict) or "op_code" not in record:
        return "not a journal record (a JSON object with an op_code)"
    return None


def last_line_start(data: bytes) -> int:
    """The offset of the last line of ``data`` (its own newline, if any, belongs to it)."""
    return data.rfind(b"\n", 0, max(0, len(data) - 1)) + 1


def first_corrupt(data: bytes) -> Optional[tuple[int, int, str]]:
    """(line number from 1, its byte offset, why) of the first line of ``data`` that is not a complete
    record, as Optuna's reader splits lines; None when every line is one."""
    offset = 0
    for number, line in enumerate(io.BytesIO(data), start=1):
        problem = record_problem(line)
        if problem is not None:
            return number, offset, problem
        offset += len(line)
    return None


def check_journal(path: Path) -> Optional[TornTail]:
    """Make the journal at ``path`` safe to open and append to: cut a torn last record (with a backup),
    and raise JournalError, changing nothing, when a record before the last line is corrupt. None when
    nothing was cut."""
    path = Path(path)
    if not path.is_file():
        return None   # Optuna creates it
    lock = JournalFileSymlinkLock(str(path))   # JournalFileBackend's default lock: the same lock file
    try:
        lock.acquire()   # (Optuna's wait: a lock left by a killed writer is broken after its grace period)
    except OSError as exc:
        raise JournalError(f"journal {path}: cannot take its lock {path}.lock: {exc.strerror or exc}") from None
    try:
        data = path.read_bytes()
        start = last_line_start(data)
        problem = record_problem(data[start:]) if start < len(data) else None
        if problem is not None:
            _raise_if_corrupt(path, data[:start])
            return _cut(path, data, start, problem)
    finally:
        lock.release()
    # A healthy tail: the bytes read never change (the journal is append-only), so no lock is needed to
    # look for a bad record before it.
    _raise_if_corrupt(path, data)
    return None


def corrupt_message(path: Path, number: int, offset: int, problem: str, backups: list[Path]) -> str:
    """One line: where, why, and the two ways back (a copy from before, or the records before that line)."""
    restore = (f"restore a copy from before the damage (the newest kept beside it: {backups[-1]})"
               if backups else "restore a copy from before the damage")
    q = shlex.quote(str(path))
    return (f"journal {path} is corrupt at line {number} ({problem}); Optuna cannot read past it, nothing was "
            f"changed. To recover, {restore}, or cut the journal before that line (what lines {number} and after "
            f"record is lost): cp {q} {q}.corrupt && truncate -s {offset} {q}")


def _raise_if_corrupt(path: Path, data: bytes) -> None:
    bad = first_corrupt(data)
    if bad is not None:
        number, offset, problem = bad
        raise JournalError(corrupt_message(path, number, offset, problem, _backups(path)))


def _cut(path: Path, data: bytes, start: int, problem: str) -> TornTail:
    """Keep ``data`` (the whole file) beside it, then cut the file at ``start``; under the journal's lock."""
    backup = _backup_path(path)
    try:
        with open(backup, "xb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(path.parent)
        with open(path, "r+b") as fh:
            fh.truncate(start)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        q = shlex.quote(str(path))
        raise JournalError(f"journal {path}: its last record is torn ({problem}) but it cannot be cut off: "
                           f"{exc.strerror or exc} ({exc.filename or path}); cut it by hand, keeping a copy: "
                           f"cp {q} {q}.torn && truncate -s {start} {q}") from None
    return TornTail(path, len(data) - start, start, problem, backup)


def _backup_path(path: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate, n = path.with_name(f"{path.name}.torn-{stamp}.bak"), 1
    while candidate.exists():
        candidate, n = path.with_name(f"{path.name}.torn-{stamp}-{n}.bak"), n + 1
    return candidate


def _backups(path: Path) -> list[Path]:
    return sorted(path.parent.glob(BACKUP_GLOB.format(name=glob.escape(path.name))), key=lambda p: p.stat().st_mtime)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
