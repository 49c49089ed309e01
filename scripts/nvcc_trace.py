"""Where one nvcc compile's time goes: a summary of its ``--fdevice-time-trace`` JSON (CUDA 12.8+).

    nvcc ... --fdevice-time-trace trace.json KERNEL.cu      # nvcc writes trace.json.json (1 GB for an sm80 kernel)
    python3 scripts/nvcc_trace.py trace.json.json [--depth 3] [--min-s 0.25] [--top 25]

Prints the outline of the device compiler's events (gcc preprocessing, cicc's front end and its template
instantiations, LibNVVM's optimizer, ptxas), each at least ``--min-s`` seconds and at most ``--depth`` levels deep
(nesting from the events' time spans), then the ``--top`` template families by self time (their own time, not their
children's: ``cute::ThrCopy::partition_S`` apart from the CuTe algebra it calls). The trace itself slows the front
end (about 1.5x on the sm80 prefill kernel), so compare shares, not seconds, with untraced builds
(scripts/compile_cost.py).
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys


def load_events(path: str) -> list[dict]:
    """The complete ('X') events, ordered by start, the longer first at one start (a parent before its children)."""
    with open(path) as f:
        data = json.load(f)
    events = [e for e in data.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e and "ts" in e]
    events.sort(key=lambda e: (e.get("pid", 0), e["ts"], -e["dur"]))
    return events


def nest(events: list[dict]) -> tuple[list[int], list[float]]:
    """(depth, self time in µs) of each event: its parents are the open events of its process that contain it."""
    depth, self_us = [0] * len(events), [0.0] * len(events)
    stack: list[int] = []
    for i, e in enumerate(events):
        while stack and (events[stack[-1]].get("pid") != e.get("pid")
                         or events[stack[-1]]["ts"] + events[stack[-1]]["dur"] <= e["ts"]):
            stack.pop()
        depth[i] = len(stack)
        self_us[i] += e["dur"]
        if stack:
            self_us[stack[-1]] -= e["dur"]
        stack.append(i)
    return depth, self_us


def family(detail: str) -> str:
    """A template's name without its arguments: 'cute::ThrCopy::partition_S [cute::ThrCopy<...' -> the part
    before the first '<' or ' ['."""
    return re.split(r"<| \[", detail, maxsplit=1)[0].strip()


def summary(events: list[dict], depth: int = 3, min_s: float = 0.25, top: int = 25) -> list[str]:
    levels, self_us = nest(events)
    lines = ["outline (s, inclusive):"]
    for e, level in zip(events, levels):
        if level <= depth and e["dur"] >= min_s * 1e6:
            detail = (e.get("args") or {}).get("detail", "")
            lines.append(f"{'  ' * level}{e['dur'] / 1e6:7.2f} {e['name']}" + (f": {detail[:120]}" if detail else ""))
    by_family: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    for e, own in zip(events, self_us):
        if e["name"].startswith("Instantiat"):
            key = (e["name"], family((e.get("args") or {}).get("detail", "")))
            by_family[key] += own
            count[key] += 1
    lines.append(f"template families by self time (top {top}; s, instantiations):")
    for (name, fam), us in by_family.most_common(top):
        lines.append(f"  {us / 1e6:7.2f} {count[(name, fam)]:6d}  {fam}  ({name})")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--min-s", type=float, default=0.25)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    try:
        events = load_events(args.trace)
    except (OSError, json.JSONDecodeError) as exc:
        print(f"nvcc_trace: cannot read {args.trace}: {exc}", file=sys.stderr)
        return 2
    print("\n".join(summary(events, args.depth, args.min_s, args.top)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
