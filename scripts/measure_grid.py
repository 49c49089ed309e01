"""An exhaustive measured grid of one search space: every valid point compiled here, verified and timed on
the GPU machine with a campaign trial's own protocol, written as a replay file (tuner/campaign/backends.py).

    python3 scripts/measure_grid.py build --space tests/campaign/fixtures/h100_mha_d128_ws_space.toml \\
        --gpu h100 --variant mha --head-dim 128 --causal --out .grid          # here: translate + nvcc
    python3 scripts/measure_grid.py run --kernels .grid --out .grid/grid.jsonl --budget-s 500   # there (the GPU)

``run`` measures each kernel as a campaign trial does (tuner.campaign.backends.measure with the gpu backend:
verification, the SDPA cross-check at each benchmark shape, do_bench with the campaign's timing over the paper
grid's seqlens)
and appends one replay line per kernel; it resumes from the lines already in ``--out`` (copy a partial
file from an earlier call back into the carried folder and pass it again), records a kernel that kills
its process as ``oob`` and one that hangs as ``hang``, and stops taking new kernels once ``--budget-s``
has passed, so that one device call returns what it measured.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


def _spec(args):
    from kernel_abi.spec import spec_for

    return spec_for(args.variant, None if args.variant == "mla" else args.head_dim, args.dtype, args.causal)


def build(args) -> int:
    import tl
    import translate
    from hardware_profiles import load_profile
    from search_spaces import parse_space
    from search_spaces.feasible import feasible_space
    from translate import nvcc
    from kernel_abi.spec import grid_problems

    profile, spec = load_profile(args.gpu), _spec(args)
    space = parse_space(tomllib.loads(Path(args.space).read_text()), args.space)
    problems = grid_problems(spec.variant, spec.d_qk, spec.dtype, spec.causal)
    fs = feasible_space(space, profile, spec.d_qk, spec.dtype, problems)
    print(f"{len(fs.points)} valid points of {fs.enumerated}")
    kernels = []
    for point in fs.points:
        program = tl.parse_program(tl.load_sketch(spec.variant, spec.causal, fs.base_of(point.sketch)))
        kernels.append(translate.generate(program, point.params, profile, spec))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    results = nvcc.compile_kernels(kernels, profile.nvcc_arch, cache_dir=nvcc.default_cache_dir(), jobs=args.jobs,
                                   batch_size=args.batch)
    failed = 0
    index = []
    for i, (point, kernel, result) in enumerate(zip(fs.points, kernels, results)):
        entry = {"index": i, "schedule": point.sketch, "params": point.params.to_dict(), "name": kernel.name}
        if not result.ok:
            failed += 1
            entry["compile_error"] = f"{result.error_kind}: {result.log[-500:]}"
        else:   # a batch's kernels share one cubin: stored once (the carry to the GPU machine is limited)
            name = hashlib.sha256(result.cubin).hexdigest()[:16] + ".cubin"
            if not (out / name).exists():
                (out / name).write_bytes(result.cubin)
            entry["cubin"], entry["meta"] = name, kernel.meta()
            entry["registers"], entry["spill_stores"] = result.registers, result.spill_stores
        index.append(entry)
    (out / "index.json").write_text(json.dumps({"gpu": args.gpu, "spec": spec.__dict__, "space": args.space,
                                                "kernels": index}, indent=1, default=str))
    print(f"compiled {len(kernels) - failed}/{len(kernels)} in {time.monotonic() - start:.0f} s")
    return 1 if failed == len(kernels) else 0


def _done(out: Path) -> set[int]:
    if not out.exists():
        return set()
    return {json.loads(line)["index"] for line in out.read_text().splitlines() if line.strip() and "_meta" not in line}


def run(args) -> int:
    """The supervisor: runs `worker` in a child process and restarts it after a crash or a hang, recording
    the kernel it was on; stops when every kernel has a line or the budget is spent."""
    out = Path(args.out)
    started = time.monotonic()
    while True:
        remaining = args.budget_s - (time.monotonic() - started)
        if remaining <= 5:
            print("budget spent")
            break
        current = out.with_suffix(".current")
        current.unlink(missing_ok=True)
        cmd = [sys.executable, __file__, "worker", "--kernels", args.kernels, "--out", args.out,
               "--budget-s", str(remaining), "--hang-s", str(args.hang_s), "--warmup-ms", str(args.warmup_ms),
               "--rep-ms", str(args.rep_ms)]
        rc = subprocess.call(cmd)
        if rc == 0:
            break
        if current.exists():   # the kernel that killed its process (crash) or stopped answering (hang)
            index = int(current.read_text())
            fault = "hang" if rc == 3 else "oob"
            _append(out, {"index": index, **_entry(args.kernels, index), "fault": fault,
                          "reason": f"worker exit {rc} on this kernel"})
            print(f"kernel {index}: {fault} (exit {rc}); going on")
        else:
            print(f"worker exit {rc} outside a kernel; stopping")
            return rc
    _summary(out)
    return 0


def _entry(kernels_dir: str, index: int) -> dict:
    item = json.loads((Path(kernels_dir) / "index.json").read_text())["kernels"][index]
    return {"schedule": item["schedule"], "params": item["params"]}


def _append(out: Path, row: dict) -> None:
    with out.open("a") as fh:
        fh.write(json.dumps(row) + "\n")


def worker(args) -> int:
    import threading

    import torch

    from tuner.measure import dense
    from tuner.measure import timer
    from tuner.campaign import backends
    from tuner.campaign.options import CampaignOptions
    from kernel_abi.spec import KernelSpec, grid_problems

    out = Path(args.out)
    index = json.loads((Path(args.kernels) / "index.json").read_text())
    spec = KernelSpec(**index["spec"])
    problems = grid_problems(spec.variant, spec.d_qk, spec.dtype, spec.causal)
    timing = CampaignOptions(gpu=index["gpu"], variant=spec.variant, bench_warmup_ms=args.warmup_ms,
                             bench_rep_ms=args.rep_ms).timing()
    if not out.exists() or not out.read_text().strip():
        base = {}
        for p in problems:
            errors: dict = {}
            base[str(p.seqlen_k)] = dense.measure_baselines(p, timing=timer.Timing(**timing), errors=errors)
        _append(out, {"_meta": {"device_name": torch.cuda.get_device_name(), "gpu": index["gpu"],
                                "spec": index["spec"], "timing": timing, "baselines": base,
                                "torch": torch.__version__, "space": index["space"]}})
    done = _done(out)
    current = out.with_suffix(".current")
    state = {"since": time.monotonic()}

    def watchdog():
        while True:
            time.sleep(2)
            if time.monotonic() - state["since"] > args.hang_s:
                os._exit(3)

    threading.Thread(target=watchdog, daemon=True).start()
    started = time.monotonic()
    gpu = backends.parse_backend("gpu")
    for item in index["kernels"]:
        i = item["index"]
        if i in done:
            continue
        if time.monotonic() - started > args.budget_s:
            return 0
        row = {"index": i, "schedule": item["schedule"], "params": item["params"]}
        if "compile_error" in item:
            _append(out, {**row, "fault": "compile", "reason": item["compile_error"]})
            continue
        current.write_text(str(i))
        state["since"] = time.monotonic()
        payload = {"cubin": (Path(args.kernels) / item["cubin"]).read_bytes(), "meta": item["meta"],
                   "spec": spec, "problems": problems, "timing": timing}
        result = backends.measure(gpu, payload)
        if result["verified"]:
            _append(out, {**row, "tflops": result["tflops"], "seconds": result.get("seconds")})
        else:
            _append(out, {**row, "fault": "wrong", "reason": result["reason"]})
        current.unlink(missing_ok=True)
    return 0


def _summary(out: Path) -> None:
    import math

    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    measured = [r for r in rows if "tflops" in r]
    faults = [r for r in rows if "fault" in r]
    print(f"{len(measured)} measured, {len(faults)} faults ({', '.join(sorted({r['fault'] for r in faults}))})")
    geo = lambda r: math.exp(sum(math.log(v) for v in r["tflops"].values()) / len(r["tflops"]))  # noqa: E731
    for r in sorted(measured, key=geo, reverse=True)[:10]:
        p = r["params"]
        print(f"{geo(r):7.1f}  {r['schedule']:10} {p['block_m']}x{p['block_n']} {p['pv_operand']} s{p['kv_stages']} "
              f"pp={p['pingpong']} per={p['persistent']} pr={p['producer_regs']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="translate and compile every valid point of --space (CPU, nvcc)")
    b.add_argument("--space", required=True)
    b.add_argument("--gpu", default="h100")
    b.add_argument("--variant", default="mha")
    b.add_argument("--head-dim", type=int, default=128)
    b.add_argument("--dtype", default="bf16")
    b.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    b.add_argument("--out", required=True)
    b.add_argument("--jobs", type=int, default=2)
    b.add_argument("--batch", type=int, default=8)
    for name, text in (("run", "measure the built kernels on the GPU, restarting after a crash or hang"),
                       ("worker", "(run's child process)")):
        r = sub.add_parser(name, help=text)
        r.add_argument("--kernels", required=True)
        r.add_argument("--out", required=True)
        r.add_argument("--budget-s", type=float, default=540)
        r.add_argument("--hang-s", type=float, default=60)
        # do_bench windows: the campaign's by default; shorter ones fit a few hundred kernels in one device call
        r.add_argument("--warmup-ms", type=float, default=25.0)
        r.add_argument("--rep-ms", type=float, default=100.0)
    args = ap.parse_args(argv)
    return {"build": build, "run": run, "worker": worker}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
