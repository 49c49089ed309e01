"""The measurement cache: a kernel measured once on a GPU for a problem set is not measured again.

A measurement is keyed by what decides its outcome: the GPU (the profile's name), the backend (a replay
file is not a GPU), the kernel spec and the benchmark problems with their timing, and the kernel's source
(its sha256: the same parameters through another sketch are another kernel). TPE re-proposes parameter
sets it has seen (~20% of the measured trials of the H100 campaigns of 2026-11-21); with the cache such a
proposal costs no compile and no GPU time, within a study and across the studies of one study dir.

Entries live in ``<study dir>/measurements.jsonl``, one JSON object per line, appended under an exclusive
flock so that campaigns sharing the directory can write at once. A line that cannot be read (a torn
write of a killed driver) is skipped.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

CACHE_FILE = "measurements.jsonl"


def measurement_key(gpu: str, backend: str, spec, problems, timing: dict, source: str) -> str:
    """The identity of a measurement (see the module doc)."""
    payload = {"gpu": gpu, "backend": backend, "spec": asdict(spec), "problems": [p.label() for p in problems],
               "timing": timing, "source": hashlib.sha256(source.encode()).hexdigest()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Measurement:
    key: str
    verified: bool
    value: Optional[float]                 # the trial value (geomean TFLOPS) when verified
    tflops: dict                           # seqlen -> TFLOPS
    reason: Optional[str]                  # why verification failed
    study: str
    trial: int
    kernel_name: str
    kernel_stem: str                       # the kernel's files (.cubin/.cu/.meta.json), relative to the study dir
    verification: Optional[dict] = None
    device_name: Optional[str] = None
    recorded_at: float = 0.0
    early_stop: Optional[dict] = None      # stopped after its probe (earlystop.py): ``tflops`` holds the probe only


class MeasurementCache:
    def __init__(self, study_dir: Path):
        self.path = Path(study_dir) / CACHE_FILE
        self.entries: dict[str, Measurement] = {}
        self.reload()

    def reload(self) -> None:
        if not self.path.exists():
            return
        for line in self.path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
                entry = Measurement(**row)
            except (ValueError, TypeError):
                continue
            self.entries[entry.key] = entry

    def get(self, key: str) -> Optional[Measurement]:
        return self.entries.get(key)

    def put(self, entry: Measurement) -> None:
        if not entry.recorded_at:
            entry = Measurement(**{**asdict(entry), "recorded_at": round(time.time(), 3)})
        self.entries[entry.key] = entry
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(asdict(entry), default=str) + "\n"
        with self.path.open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                fh.write(line)
                fh.flush()
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def __len__(self) -> int:
        return len(self.entries)


def from_result(key: str, result: dict, value: Optional[float], study: str, trial: int, kernel_name: str,
                kernel_stem: str) -> Measurement:
    """The cache entry of a trial's measurement (a GPU worker's result dict)."""
    verification: Any = result.get("verification")
    return Measurement(key=key, verified=bool(result.get("verified")), value=value,
                       tflops=dict(result.get("tflops") or {}), reason=result.get("reason"), study=study,
                       trial=trial, kernel_name=kernel_name, kernel_stem=kernel_stem,
                       verification=verification, device_name=result.get("device_name"),
                       early_stop=result.get("early_stop"))
