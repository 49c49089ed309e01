"""Samples the host's CPU use during a device campaign: is the compile pipeline short of CPUs, or of work?

    python3 scripts/cpu_sampler.py OUT.csv [--every 2]      # until killed

One CSV row per sample: unix time, CPUs, busy share of all CPUs since the last sample (from /proc/stat: not
idle, not iowait), and the processes running then by kind: the compiler's stages (cicc, ptxas, cudafe++,
the host preprocessor cc1plus; nvcc itself only waits on them), and every other process on a CPU
(state R). ``device_report.py summary`` reads it for the campaign's steady state.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

COMPILER = ("cicc", "ptxas", "cudafe++", "cc1plus")
FIELDS = ("time", "cpus", "busy", "compiler_procs", "compiler_running", "other_running")


def cpu_times() -> tuple[int, int]:
    """(busy jiffies, total jiffies) of all CPUs."""
    with open("/proc/stat") as f:
        cells = [int(x) for x in f.readline().split()[1:]]
    idle = cells[3] + (cells[4] if len(cells) > 4 else 0)
    return sum(cells) - idle, sum(cells)


def processes() -> tuple[int, int, int]:
    """(compiler processes, of them on a CPU now, other processes on a CPU now)."""
    compiler = compiler_running = other_running = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.find("(") + 1:stat.rfind(")")]
        running = stat[stat.rfind(")") + 2] == "R"
        if name in COMPILER:
            compiler += 1
            compiler_running += running
        elif running:
            other_running += 1
    return compiler, compiler_running, other_running


def main() -> int:
    out = Path(sys.argv[1])
    every = float(sys.argv[sys.argv.index("--every") + 1]) if "--every" in sys.argv else 2.0
    cpus = os.cpu_count() or 1
    with out.open("w") as f:
        f.write(",".join(FIELDS) + "\n")
        busy0, total0 = cpu_times()
        while True:
            time.sleep(every)
            busy1, total1 = cpu_times()
            share = (busy1 - busy0) / max(1, total1 - total0)
            busy0, total0 = busy1, total1
            row = (f"{time.time():.1f}", cpus, f"{share:.3f}", *processes())
            f.write(",".join(map(str, row)) + "\n")
            f.flush()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(0)
