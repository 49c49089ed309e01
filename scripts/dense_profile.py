"""Where the dense Hopper kernels lose to FA4: ncu of ours and FA4 on the same
shape, and the SM clock and board power while each runs at free clocks.

    python3 scripts/dense_profile.py --gpu h100 --points mha64n:8192,mha128n:16384 --out DIR \
        [--changes '{"emu": {"exp2_emulation": 4}}'] [--cache-dir .kcache] [--seconds 3] [--no-ncu] [--build-only]

A point is a spec (as param_ab_check.py's --specs: variant, head dim, c or n; tuner.defaults.table.parse_spec_label)
and a key length on the paper grid (16k tokens, hidden 2048), e.g. mha64n:8192. Ours is the bucket default `tune
bench` runs there (tuner.defaults.table), and each named change on top of it. Every kernel passes the verification
gate (tuner.measure.verify) first; exit 1 when one does not.

1. Clocks: each kernel runs back to back for ``--seconds`` (ours, FA4, ours, FA4, ... in turn), with
   ``nvidia-smi`` sampling the SM clock, power and throttle reasons every 50 ms: per window the ms a call, the
   median clock and power.
2. ncu (``--set full`` with source counters): one call of each kernel inside cudaProfilerStart/Stop, the script
   re-run under ncu with ``--one POINT``. Per kernel under DIR: ``POINT.details.csv`` and ``POINT.raw.csv`` (every
   metric) and ``POINT.source.csv`` (the SASS with executed instructions and stall samples per instruction).
   Then a table: duration, clock, instructions, issue-active, the pipes (tensor, xu = MUFU, fma, alu) and the
   top stall reasons. ``scripts/ncu_sass_stalls.py POINT.source.csv --diff A B`` compares two kernels' stall samples
   per opcode.

``--build-only`` compiles the kernels into the cache (CPU, no GPU) so a device run can carry them.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

SMI_FIELDS = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def parse_point(text: str):
    """``mha64n:8192`` -> (label, KernelSpec, Problem) on the paper grid; ValueError saying what is wrong."""
    from kernel_abi.spec import grid_problems
    from tuner.defaults.table import parse_spec_label

    spec_text, _, seqlen = text.partition(":")
    if not seqlen.isdigit():
        raise ValueError(f"a point is SPEC:SEQLEN, e.g. mha64n:8192; got {text!r}")
    spec = parse_spec_label(spec_text)
    problem = grid_problems(spec.variant, spec.d_qk if spec.variant != "mla" else 192, spec.dtype, spec.causal,
                            seqlens=(int(seqlen),))[0]
    return text.replace(":", "_"), spec, problem


def build(gpu: str, points, changes: dict[str, dict], cache_dir: Path):
    """{label: {"ours": (gen, result), name: ...}}: the bucket default at the point's key length, and each change
    on top of it."""
    from hardware_profiles import load_profile
    from tuner.defaults.export import compile_changes
    from tuner.defaults.table import bucket_change
    from tuner.serving.buckets.seqlen import bucket_for

    profile = load_profile(gpu)
    items = []
    for _, spec, problem in points:
        entry = bucket_change(profile, spec, bucket_for(problem.seqlen_k))
        bucket = entry.as_dict() if entry is not None else {}
        items.append((spec, {"ours": bucket, **{name: {**bucket, **c} for name, c in changes.items()}}))
    built = compile_changes(gpu, items, cache_dir)
    return {label: kernels for (label, _, _), kernels in zip(points, built)}


def load_verified(built: dict, points) -> dict:
    """{(label, name): kernel} of the kernels that pass the gate; prints each verdict."""
    from tuner.defaults.export import load_verified as verified

    return {(label, name): kernel for label, spec, _ in points
            for name, kernel in verified(built[label], spec, label).items()}


def calls_of(kernels: dict, label: str, problem) -> dict:
    """{name: () -> out} of our kernels at the point and FA4 (when importable), on one input set."""
    from tuner.measure import fa4
    from tuner.measure import dense
    from tuner.measure import timer

    q, k, v = dense.make_inputs(problem, 1)[0]
    calls = {name: (lambda kern=kern: kern(q, k, v)) for (lab, name), kern in kernels.items() if lab == label}
    try:
        fa4_call = fa4.attention_call(problem)
        fa4_call(q, k, v)
        calls["fa4"] = lambda: fa4_call(q, k, v)
    except Exception as exc:  # noqa: BLE001 - not installed, or this shape: no FA4 column
        print(f"{label} FA4: {timer.first_line(exc)}", flush=True)
    return calls


def smi_window(call, seconds: float) -> dict:
    """Run ``call`` back to back for ``seconds`` while nvidia-smi samples; ms a call and the median samples."""
    import torch

    smi = shutil.which("nvidia-smi")
    sampler = (subprocess.Popen([smi, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits", "-lms", "50"],
                                stdout=subprocess.PIPE, text=True) if smi else None)
    for _ in range(20):   # warm: the clock settles under load before the timed part
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n, t0 = 0, time.time()
    start.record()
    while time.time() - t0 < seconds:
        for _ in range(10):
            call()
        n += 10
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    row = {"ms": start.elapsed_time(end) / n, "calls": n}
    if sampler is not None:
        sampler.terminate()
        lines = [ln.split(",") for ln in sampler.communicate()[0].splitlines() if ln.count(",") == 3]
        lines = lines[len(lines) // 5:]   # the first fifth: nvidia-smi starting and the warm-up
        if lines:
            row["sm_mhz"] = statistics.median(float(x[0]) for x in lines)
            row["power_w"] = statistics.median(float(x[1]) for x in lines)
            row["temp_c"] = statistics.median(float(x[2]) for x in lines)
            row["throttle"] = sorted({x[3].strip() for x in lines})
    return row


def clocks_phase(kernels: dict, points, seconds: float, rounds: int = 2) -> list[dict]:
    rows = []
    for label, _, problem in points:
        calls = calls_of(kernels, label, problem)
        for r in range(rounds):
            for name, call in calls.items():
                row = {"point": label, "kernel": name, "round": r, **smi_window(call, seconds)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def one(args) -> int:
    """Under ncu: warm each kernel of one point, then one call each inside cudaProfilerStart/Stop."""
    import torch

    points = [parse_point(args.one)]
    changes = json.loads(args.changes) if args.changes else {}
    kernels = {}
    from tuner.serving.launch import load_kernel
    for label, kinds in build(args.gpu, points, changes, Path(args.cache_dir)).items():
        for name, (gen, res) in kinds.items():
            if res.ok:
                kernels[(label, name)] = load_kernel(res.cubin, gen.meta())
    calls = calls_of(kernels, points[0][0], points[0][2])
    for _ in range(3):
        for call in calls.values():
            call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for call in calls.values():
        call()
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("profiled", ", ".join(calls), flush=True)
    return 0


# ncu raw metrics the table reads (first match wins); the raw CSVs keep everything else.
TABLE_METRICS = {
    "us": ["gpu__time_duration.sum"],
    "mhz": ["smsp__cycles_elapsed.avg.per_second", "gpc__cycles_elapsed.avg.per_second"],
    "inst_M": ["smsp__inst_executed.sum"],
    "issue%": ["smsp__issue_active.avg.pct_of_peak_sustained_active"],
    "tensor%": ["sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
                "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"],
    "xu%": ["sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"],
    "fma%": ["sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active"],
    "alu%": ["sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active"],
    "l2%": ["lts__throughput.avg.pct_of_peak_sustained_elapsed"],
    "l2hit%": ["lts__t_sector_hit_rate.pct"],
    "dram%": ["gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "dram__throughput.avg.pct_of_peak_sustained_elapsed"],
}
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"


def _number(text: str):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


_SCALE = {"us": {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6,
                  "second": 1e6},
          "mhz": {"hz": 1e-6, "khz": 1e-3, "mhz": 1.0, "ghz": 1e3},
          "inst_M": {"inst": 1e-6, "": 1e-6}}


def summarize_raw(path: Path) -> list[dict]:
    """Per kernel of an ncu ``--page raw --csv`` export: the table's metrics (duration in us, clock in MHz,
    instructions in millions, the rest in %) and the stall reasons (warps stalled per issued instruction, largest
    first)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 3:
        return []
    header, units, data = rows[0], rows[1], rows[2:]   # row 1 holds the units
    col = {name: i for i, name in enumerate(header)}
    out = []
    for row in data:
        entry = {"kernel": row[col["Kernel Name"]][:48] if "Kernel Name" in col else "?"}
        for key, names in TABLE_METRICS.items():
            for name in names:
                value = _number(row[col[name]]) if name in col else None
                if value is None:
                    continue
                scale = _SCALE.get(key)
                unit = units[col[name]].strip().lower()
                if scale is not None and unit not in scale:
                    continue   # a unit this table does not know: leave the column empty rather than wrong
                entry[key] = value * scale[unit] if scale is not None else value
                break
        stalls = {name[len(STALL_PREFIX):-len(STALL_SUFFIX)]: _number(row[i]) for name, i in col.items()
                  if name.startswith(STALL_PREFIX) and name.endswith(STALL_SUFFIX) and _number(row[i])}
        entry["stalls"] = dict(sorted(stalls.items(), key=lambda kv: -kv[1])[:6])
        out.append(entry)
    return out


# The pages of an ncu report the analysis reads, as CSV: per-kernel details, every metric (summarize_raw), and the
# SASS with its stall samples (scripts/ncu_sass_stalls.py).
NCU_PAGES = (("details", []), ("raw", []), ("source", ["--print-source", "sass"]))


def find_ncu() -> str | None:
    """ncu on PATH, else under a /usr/local CUDA install; None when there is none."""
    return shutil.which("ncu") or next((str(p) for p in sorted(Path("/usr/local").glob("cuda*/bin/ncu"))), None)


def export_report(ncu: str, report: Path, prefix: Path, pages=NCU_PAGES) -> None:
    """Each of ``pages`` of ``report`` into PREFIX.PAGE.csv (an export that fails is said, not raised), then the
    report goes: the CSVs hold what the analysis reads, and the report is tens of MB."""
    for page, extra in pages:
        with open(f"{prefix}.{page}.csv", "w") as f:
            res = subprocess.run([ncu, "--import", str(report), "--page", page, "--csv", *extra], stdout=f,
                                 stderr=subprocess.PIPE, text=True)
        if res.returncode:
            print(f"{prefix.name} {page}: ncu export rc {res.returncode}: {res.stderr[-300:]}", flush=True)
    report.unlink()


def ncu_phase(args, points, out: Path) -> list[dict]:
    ncu = find_ncu()
    if ncu is None:
        print("ncu: not found, skipped", flush=True)
        return []
    summary = []
    for label, _, _ in points:
        rep = out / f"{label}.ncu-rep"
        cmd = [ncu, "--profile-from-start", "off", "--set", "full", "--import-source", "no", "-f", "-o",
               str(rep.with_suffix("")), sys.executable, __file__, "--one", label.replace("_", ":", 1),
               "--gpu", args.gpu, "--cache-dir", args.cache_dir]
        if args.changes:
            cmd += ["--changes", args.changes]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.ncu_timeout)
        print(f"{label}: ncu rc {proc.returncode} {proc.stdout.strip().splitlines()[-1:]}", flush=True)
        if not rep.is_file():
            print(proc.stderr[-2000:], flush=True)
            continue
        export_report(ncu, rep, out / label)
        for entry in summarize_raw(out / f"{label}.raw.csv"):
            summary.append({"point": label, **entry})
            print(json.dumps(summary[-1]), flush=True)
    return summary


def print_tables(clocks: list[dict], summary: list[dict]) -> None:
    if clocks:
        print("\npoint | kernel | ms (per window) | SM MHz | W")
        keys = sorted({(r["point"], r["kernel"]) for r in clocks}, key=lambda k: (k[0], k[1] != "ours", k[1]))
        for key in keys:
            rs = [r for r in clocks if (r["point"], r["kernel"]) == key]
            print(f"{key[0]} | {key[1]} | " + " ".join(f"{r['ms']:.3f}" for r in rs) + " | " +
                  " ".join(f"{r.get('sm_mhz', 0):.0f}" for r in rs) + " | " +
                  " ".join(f"{r.get('power_w', 0):.0f}" for r in rs))
    if summary:
        cols = list(TABLE_METRICS)
        print("\npoint | kernel | " + " | ".join(cols) + " | top stalls (warps per issue)")
        for e in summary:
            print(f"{e['point']} | {e['kernel'][:40]} | " +
                  " | ".join(f"{e[c]:.1f}" if c in e else "-" for c in cols) + " | " +
                  ", ".join(f"{k} {v:.2f}" for k, v in list(e["stalls"].items())[:5]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--points", default="mha64n:8192,mha64c:4096,mqa64c:16384,mha128n:16384",
                    help="comma list of SPEC:SEQLEN (default %(default)s)")
    ap.add_argument("--changes", help="JSON object: name -> KernelParams fields changed on top of the bucket default")
    ap.add_argument("--out", default="dense_profile", help="the folder of the CSVs and profile.json")
    ap.add_argument("--cache-dir", default=".kcache")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--ncu-timeout", type=int, default=300)
    ap.add_argument("--no-ncu", action="store_true")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        return one(args)
    try:
        points = [parse_point(p) for p in args.points.split(",")]
        changes = json.loads(args.changes) if args.changes else {}
    except (ValueError, json.JSONDecodeError) as exc:
        print(f"bad input: {exc}", file=sys.stderr)
        return 2
    built = build(args.gpu, points, changes, Path(args.cache_dir))
    failed = [f"{label} {name}" for label, kinds in built.items() for name, (_, res) in kinds.items() if not res.ok]
    if args.build_only:
        print("built" if not failed else f"did not compile: {failed}")
        return 1 if failed else 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kernels = load_verified(built, points)
    if len(kernels) < sum(len(k) for k in built.values()):
        print("a kernel did not build or pass the gate", flush=True)
        return 1
    clocks = clocks_phase(kernels, points, args.seconds)
    del kernels
    summary = [] if args.no_ncu else ncu_phase(args, points, out)
    (out / "profile.json").write_text(json.dumps({"clocks": clocks, "ncu": summary}, indent=1))
    print_tables(clocks, summary)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
