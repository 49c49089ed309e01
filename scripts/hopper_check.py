"""Hopper kernels on the GPU machine: build a set here (CPU), verify and time it there (GPU).

    python scripts/hopper_check.py build --set first --out .hopper/      # here: translate + nvcc, cubins + meta
    python scripts/hopper_check.py run --kernels .hopper/ --out $OUT      # there: verify, then time vs the baselines

``run`` verifies every kernel with the protocol of tuner/verify.py (fresh random inputs, NaN-poisoned
output, ragged tiles, sq != sk both ways, GQA/MQA mapping), then times the verified ones on the paper
grid's seqlens against torch's flash / cuDNN (and FA4 when importable) in this process, and prints a
table last. ``--ncu NAME`` profiles one kernel at one seqlen with Nsight Compute instead.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tl  # noqa: E402
import translate  # noqa: E402
from hardware_profiles import load_profile  # noqa: E402
from translate import nvcc  # noqa: E402
from translate.params import KernelParams  # noqa: E402
from translate.problem import KernelSpec, grid_problems  # noqa: E402

HOPPER = dict(mma_atom="SM90_GMMA", g2s_atom="SM90_TMA")


def P(bm, bn, stages=2, pv="rs", pingpong=False, regs=24, **extra):
    return KernelParams(block_m=bm, block_n=bn, num_warps=bm // 16, kv_stages=stages, pv_operand=pv,
                        pingpong=pingpong, producer_regs=regs, **{**HOPPER, **extra})


def S(variant, causal, dtype="bf16", hd=128):
    d_qk = 192 if variant == "mla" else hd
    return KernelSpec(variant, d_qk, 128 if variant == "mla" else hd, causal, dtype)


# (tag, spec, schedule, params)
SETS = {
    "first": [
        ("mha128c", S("mha", True), "ws_overlap", P(128, 128)),
        ("mha128c_serial", S("mha", True), "ws_serial", P(128, 128)),
        ("mha128c_pp", S("mha", True), "ws_overlap", P(128, 128, pingpong=True)),
        ("mha128n", S("mha", False), "ws_overlap", P(128, 128)),
        ("mha128n_176", S("mha", False), "ws_overlap", P(128, 176)),
        ("mha128n_176pp", S("mha", False), "ws_overlap", P(128, 176, pingpong=True)),
        ("mha128n_ss", S("mha", False), "ws_serial", P(128, 128, pv="ss")),
        ("mha128c_fp16", S("mha", True, "fp16"), "ws_overlap", P(128, 128)),
        ("mha64n", S("mha", False, hd=64), "ws_overlap", P(192, 128, regs=32)),
        ("mha64c", S("mha", True, hd=64), "ws_overlap", P(128, 128)),
        ("gqa128c", S("gqa", True), "ws_overlap", P(128, 128)),
        ("mqa128n", S("mqa", False), "ws_overlap", P(128, 128)),
        ("mlac", S("mla", True), "ws_overlap", P(128, 128)),
        ("mlan", S("mla", False), "ws_overlap", P(128, 128)),
    ],
}


def build(set_name: str, out: Path, jobs: int) -> int:
    profile = load_profile("h100")
    items = SETS[set_name]
    kernels, metas = [], []
    for tag, spec, schedule, params in items:
        program = tl.parse_program(tl.load_sketch(spec.variant, spec.causal, schedule))
        kernel = translate.generate(program, params, profile, spec)
        kernels.append(kernel)
        metas.append({"tag": tag, "schedule": schedule, "meta": kernel.meta()})
    start = time.monotonic()
    results = nvcc.compile_kernels(kernels, profile.nvcc_arch, cache_dir=nvcc.default_cache_dir(), jobs=jobs,
                                   batch_size=4)
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for kernel, result, record in zip(kernels, results, metas):
        if not result.ok:
            failed += 1
            print(f"{record['tag']}: {result.error_kind}\n{result.log[-3000:]}")
            continue
        (out / f"{record['tag']}.cubin").write_bytes(result.cubin)
        record["resources"] = result.resources()
        (out / f"{record['tag']}.json").write_text(json.dumps(record, indent=1, default=str))
        print(f"{record['tag']:16} {kernel.name}: {result.registers} regs, {result.spill_stores} B spills, "
              f"{kernel.smem_bytes} B smem, {result.compile_seconds:.1f} s{' (cached)' if result.cached else ''}")
    print(f"built {len(kernels) - failed}/{len(kernels)} in {time.monotonic() - start:.0f} s")
    return 1 if failed else 0


def _fa4():
    try:
        from flash_attn.cute import flash_attn_func
    except Exception:  # noqa: BLE001 - not installed, or its import fails: no FA4 column
        return None
    return flash_attn_func


def _watchdog(state: dict, limit_s: float) -> None:
    """A hung kernel (a pipeline deadlock) never returns: name it and leave, so the caller can go on."""
    import os
    import threading

    def watch():
        while True:
            time.sleep(5)
            if time.monotonic() - state["since"] > limit_s:
                print(f"HANG: {state['tag']} made no progress for {limit_s:.0f} s", flush=True)
                os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def run(kernels_dir: Path, out: Path, seqlens: tuple[int, ...], only: set[str], hang_s: float = 90) -> int:
    import torch

    from tuner import bench
    from tuner.runtime import load_kernel
    from tuner.verify import verify

    fa4 = _fa4()
    rows_path = out / "hopper_rows.json"
    rows = json.loads(rows_path.read_text())["rows"] if rows_path.exists() else []
    failures = 0
    device = torch.cuda.get_device_name()
    started = out / "started.txt"   # tags already tried (a rerun after a hang skips them)
    tried = set(started.read_text().split()) if started.exists() else set()
    state = {"tag": "", "since": time.monotonic()}
    _watchdog(state, hang_s)
    for meta_path in sorted(kernels_dir.glob("*.json")):
        record = json.loads(meta_path.read_text())
        tag = record["tag"]
        if (only and tag not in only) or tag in tried:
            continue
        with started.open("a") as f:
            f.write(tag + "\n")
        state.update(tag=tag, since=time.monotonic())
        spec = KernelSpec(**record["meta"]["spec"])
        try:
            kernel = load_kernel(meta_path.with_suffix(".cubin"), record["meta"])
            t0 = time.monotonic()
            report = verify(kernel, spec)
            verify_s = time.monotonic() - t0
        except Exception as exc:  # noqa: BLE001 - one broken kernel must not stop the run
            print(f"{tag}: load/verify raised {type(exc).__name__}: {exc}")
            traceback.print_exc()
            failures += 1
            continue
        worst = max((c.rel_err for c in report.checks), default=float("nan"))
        print(f"{tag:16} verify {'PASS' if report.passed else 'FAIL'} ({verify_s:.1f} s, worst rel err {worst:.2e}, "
              f"seed {report.seed}) {report.reason}", flush=True)
        (out / f"verify_{tag}.json").write_text(json.dumps(report.to_dict(), indent=1))
        if not report.passed:
            failures += 1
            continue
        head_dim = 128 if spec.variant == "mla" else spec.d_qk
        problems = grid_problems(spec.variant, head_dim, spec.dtype, spec.causal, seqlens=seqlens)
        for row in bench.bench_rows(kernel, problems):
            state["since"] = time.monotonic()
            row["tag"] = tag
            if fa4 is not None and row.get("status") == "ok":
                row["fa4"] = _time_fa4(fa4, problems[[p.seqlen_q for p in problems].index(row["seqlen_q"])])
            rows.append(row)
            rows_path.write_text(json.dumps({"device": device, "torch": torch.__version__, "rows": rows},
                                            indent=1, default=str))
    print(f"# {device}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    print(f"{'kernel':16} {'sq':>6} {'ours':>7} {'flash':>7} {'cudnn':>7} {'fa4':>7} {'x cudnn':>8} {'x fa4':>6}")
    for r in rows:
        o, fl, cu, f4 = (r.get(k) for k in ("ours", "flash", "cudnn", "fa4"))
        fmt = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
        print(f"{r['tag']:16} {r['seqlen_q']:>6} {fmt(o):>7} {fmt(fl):>7} {fmt(cu):>7} {fmt(f4):>7} "
              f"{(o / cu if o and cu else 0):8.2f} {(o / f4 if o and f4 else 0):6.2f}  {r.get('status')}")
    return 1 if failures else 0


def _time_fa4(fa4, problem):
    from tuner import bench

    inputs = bench.make_inputs(problem, 3)

    def call(q, k, v):
        return fa4(q, k, v, causal=problem.causal, softmax_scale=problem.softmax_scale)

    try:
        call(*inputs[0])   # JIT compile outside the timing
        return round(bench.tflops(problem, bench.measure_problem(call, problem, inputs=inputs)), 1)
    except Exception as exc:  # noqa: BLE001
        print(f"fa4 failed on {problem.label()}: {exc}")
        return None


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--set", default="first", choices=sorted(SETS))
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--jobs", type=int, default=2)
    r = sub.add_parser("run")
    r.add_argument("--kernels", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--seqlens", default="1024,4096,16384")
    r.add_argument("--only", default="")
    args = ap.parse_args()
    if args.cmd == "build":
        return build(args.set, args.out, args.jobs)
    args.out.mkdir(parents=True, exist_ok=True)
    return run(args.kernels, args.out, tuple(int(x) for x in args.seqlens.split(",")),
               set(filter(None, args.only.split(","))))


if __name__ == "__main__":
    sys.exit(main())
