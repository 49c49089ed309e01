"""Hopper kernels on the GPU machine: build a set here (CPU), verify and time it there (GPU).

    python scripts/hopper_check.py build --set first --out .hopper/      # here: translate + nvcc, cubins + meta
    python scripts/hopper_check.py run --kernels .hopper/ --out $OUT      # there: verify, then time vs the baselines

``run`` verifies every kernel with the protocol of tuner/measure/verify.py (fresh random inputs, NaN-poisoned
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
from kernel_abi.spec import KernelSpec, grid_problems  # noqa: E402

HOPPER = dict(mma_atom="SM90_GMMA", g2s_atom="SM90_TMA")


def P(bm, bn, stages=2, pv="rs", pingpong=False, regs=24, persistent=False, **extra):
    return KernelParams(block_m=bm, block_n=bn, num_warps=bm // 16, kv_stages=stages, pv_operand=pv,
                        pingpong=pingpong, producer_regs=regs, persistent=persistent, **{**HOPPER, **extra})


def S(variant, causal, dtype="bf16", hd=128):
    d_qk = 192 if variant == "mla" else hd
    return KernelSpec(variant, d_qk, 128 if variant == "mla" else hd, causal, dtype)


# (tag, spec, schedule, params)
SETS = {
    "sixth": [
        ("plain_mha128c", S("mha", True), "fa2", P(128, 128, stages=1, g2s_atom="SM80_CP_ASYNC_CACHEGLOBAL")),
        ("plain_mha128n_s2", S("mha", False), "fa2", P(128, 128, stages=2, g2s_atom="SM80_CP_ASYNC_CACHEGLOBAL")),
        ("plain_mha128n_ss", S("mha", False), "fa2", P(128, 128, stages=1, pv="ss",
                                                          g2s_atom="SM80_CP_ASYNC_CACHEGLOBAL")),
        ("plain_mha64c", S("mha", True, hd=64), "fa2", P(128, 128, stages=2, g2s_atom="SM80_CP_ASYNC_CACHEGLOBAL")),
        ("plain_gqa128c", S("gqa", True, "fp16"), "fa2", P(128, 128, stages=1, g2s_atom="SM80_CP_ASYNC_CACHEGLOBAL")),
        ("plain_mqa128n", S("mqa", False), "fa2", P(64, 128, stages=2, g2s_atom="SM80_CP_ASYNC_CACHEGLOBAL")),
        ("plain_mlac", S("mla", True), "fa2", P(128, 96, stages=2, g2s_atom="SM80_CP_ASYNC_CACHEGLOBAL")),
        ("mha64c_192pp_per", S("mha", True, hd=64), "ws_overlap", P(192, 128, regs=32, pingpong=True,
                                                                     persistent=True)),
        ("mha64c_192pp", S("mha", True, hd=64), "ws_overlap", P(192, 128, regs=32, pingpong=True)),
        ("mha64n_192pp_per", S("mha", False, hd=64), "ws_overlap", P(192, 128, regs=32, pingpong=True,
                                                                      persistent=True)),
        ("mha64c_per_s3", S("mha", True, hd=64), "ws_overlap", P(128, 128, stages=3, pingpong=True, persistent=True)),
        ("mha128n_pp_per", S("mha", False), "ws_overlap", P(128, 128, pingpong=True, persistent=True)),
        ("mqa128n_pp_per", S("mqa", False), "ws_overlap", P(128, 128, pingpong=True, persistent=True)),
        ("mha128c_serial_per", S("mha", True), "ws_serial", P(128, 128, persistent=True)),
    ],
    "fifth": [
        ("mha128c", S("mha", True), "ws_overlap", P(128, 128)),
        ("mha128c_per", S("mha", True), "ws_overlap", P(128, 128, persistent=True)),
        ("mha128c_pp_per", S("mha", True), "ws_overlap", P(128, 128, pingpong=True, persistent=True)),
        ("mha128n", S("mha", False), "ws_overlap", P(128, 128)),
        ("mha128n_per", S("mha", False), "ws_overlap", P(128, 128, persistent=True)),
        ("mha128n_pp_per", S("mha", False), "ws_overlap", P(128, 128, pingpong=True, persistent=True)),
        ("mha128n_176pp_per", S("mha", False), "ws_overlap", P(128, 176, pingpong=True, persistent=True)),
        ("mha64n_per", S("mha", False, hd=64), "ws_overlap", P(192, 128, regs=32, persistent=True)),
        ("mha64n_192_per", S("mha", False, hd=64), "ws_overlap", P(192, 192, pv="ss", regs=32, persistent=True)),
        ("mha64c_192_per", S("mha", True, hd=64), "ws_overlap", P(192, 128, regs=32, persistent=True)),
        ("mha64c_pp_per", S("mha", True, hd=64), "ws_overlap", P(128, 128, pingpong=True, persistent=True)),
        ("gqa128c_per", S("gqa", True), "ws_overlap", P(128, 128, persistent=True)),
        ("gqa128n_pp_per", S("gqa", False), "ws_overlap", P(128, 128, pingpong=True, persistent=True)),
        ("mqa128c_per", S("mqa", True), "ws_overlap", P(128, 128, persistent=True)),
        ("mqa128n_per", S("mqa", False), "ws_overlap", P(128, 128, persistent=True)),
        ("mlac_per", S("mla", True), "ws_overlap", P(128, 128, persistent=True)),
        ("mlan_per", S("mla", False), "ws_overlap", P(128, 128, persistent=True)),
        ("mha128c_fp16_per", S("mha", True, "fp16"), "ws_overlap", P(128, 128, persistent=True)),
    ],
    "fourth": [
        ("mha128c", S("mha", True), "ws_overlap", P(128, 128)),
        ("mha128c_pp", S("mha", True), "ws_overlap", P(128, 128, pingpong=True)),
        ("mha128n_per", S("mha", False), "ws_overlap", P(128, 128, persistent=True)),
        ("mha128n_pp_per", S("mha", False), "ws_overlap", P(128, 128, pingpong=True, persistent=True)),
        ("mha128n_176pp_per", S("mha", False), "ws_overlap", P(128, 176, pingpong=True, persistent=True)),
        ("mha64n_per", S("mha", False, hd=64), "ws_overlap", P(192, 128, regs=32, persistent=True)),
        ("mha64c_192", S("mha", True, hd=64), "ws_overlap", P(192, 128, regs=32)),
        ("mha64c", S("mha", True, hd=64), "ws_overlap", P(128, 128)),
        ("gqa128c", S("gqa", True), "ws_overlap", P(128, 128)),
        ("gqa128n_pp_per", S("gqa", False), "ws_overlap", P(128, 128, pingpong=True, persistent=True)),
        ("mqa128c", S("mqa", True), "ws_overlap", P(128, 128)),
        ("mqa128n_per", S("mqa", False), "ws_overlap", P(128, 128, persistent=True)),
        ("mlac", S("mla", True), "ws_overlap", P(128, 128)),
        ("mlan_per", S("mla", False), "ws_overlap", P(128, 128, persistent=True)),
        ("mha128c_fp16", S("mha", True, "fp16"), "ws_overlap", P(128, 128)),
    ],
    "third": [
        ("mha128c_per", S("mha", True), "ws_overlap", P(128, 128, persistent=True)),
        ("mha128c_pp_per", S("mha", True), "ws_overlap", P(128, 128, pingpong=True, persistent=True)),
        ("mha128c", S("mha", True), "ws_overlap", P(128, 128)),
        ("mha128n_per", S("mha", False), "ws_overlap", P(128, 128, persistent=True)),
        ("mha128n_pp_per", S("mha", False), "ws_overlap", P(128, 128, pingpong=True, persistent=True)),
        ("mha128n_176_per", S("mha", False), "ws_overlap", P(128, 176, persistent=True)),
        ("mha128n_176pp_per", S("mha", False), "ws_overlap", P(128, 176, pingpong=True, persistent=True)),
        ("mha64n_per", S("mha", False, hd=64), "ws_overlap", P(192, 128, regs=32, persistent=True)),
        ("mha64n_192pp_per", S("mha", False, hd=64), "ws_overlap", P(128, 192, pingpong=True, persistent=True)),
        ("mha64n_128_per", S("mha", False, hd=64), "ws_overlap", P(128, 128, persistent=True)),
        ("mha64c_per", S("mha", True, hd=64), "ws_overlap", P(128, 128, persistent=True)),
        ("mha64c_192_per", S("mha", True, hd=64), "ws_overlap", P(192, 128, regs=32, persistent=True)),
        ("mha64c_pp_per", S("mha", True, hd=64), "ws_overlap", P(128, 128, pingpong=True, persistent=True)),
        ("gqa128c_per", S("gqa", True), "ws_overlap", P(128, 128, persistent=True)),
        ("gqa128n_per", S("gqa", False), "ws_overlap", P(128, 128, persistent=True)),
        ("gqa128n_pp_per", S("gqa", False), "ws_overlap", P(128, 128, pingpong=True, persistent=True)),
        ("mqa128c_per", S("mqa", True), "ws_overlap", P(128, 128, persistent=True)),
        ("mqa128n_per", S("mqa", False), "ws_overlap", P(128, 128, persistent=True)),
        ("mlac_per", S("mla", True), "ws_overlap", P(128, 128, persistent=True)),
        ("mlan_per", S("mla", False), "ws_overlap", P(128, 128, persistent=True)),
        ("mha128c_fp16_per", S("mha", True, "fp16"), "ws_overlap", P(128, 128, persistent=True)),
        ("mha128c_serial_per", S("mha", True), "ws_serial", P(128, 128, persistent=True)),
    ],
    "second": [
        ("mha128c", S("mha", True), "ws_overlap", P(128, 128)),
        ("mha128c_per", S("mha", True), "ws_overlap", P(128, 128, persistent=True)),
        ("mha128c_pp_per", S("mha", True), "ws_overlap", P(128, 128, pingpong=True, persistent=True)),
        ("mha128n", S("mha", False), "ws_overlap", P(128, 128)),
        ("mha128n_per", S("mha", False), "ws_overlap", P(128, 128, persistent=True)),
        ("mha128n_pp_per", S("mha", False), "ws_overlap", P(128, 128, pingpong=True, persistent=True)),
        ("mha128n_176_per", S("mha", False), "ws_overlap", P(128, 176, persistent=True)),
        ("mha128n_176pp_per", S("mha", False), "ws_overlap", P(128, 176, pingpong=True, persistent=True)),
        ("mha64n_per", S("mha", False, hd=64), "ws_overlap", P(192, 128, regs=32, persistent=True)),
        ("mha64n_128pp_per", S("mha", False, hd=64), "ws_overlap", P(128, 192, pingpong=True, persistent=True)),
        ("mha64c_per", S("mha", True, hd=64), "ws_overlap", P(128, 128, persistent=True)),
        ("mha64c_192_per", S("mha", True, hd=64), "ws_overlap", P(192, 128, regs=32, persistent=True)),
        ("gqa128c_per", S("gqa", True), "ws_overlap", P(128, 128, persistent=True)),
        ("gqa128n_per", S("gqa", False), "ws_overlap", P(128, 128, persistent=True)),
        ("mqa128c_per", S("mqa", True), "ws_overlap", P(128, 128, persistent=True)),
        ("mqa128n_per", S("mqa", False), "ws_overlap", P(128, 128, persistent=True)),
        ("mlac_per", S("mla", True), "ws_overlap", P(128, 128, persistent=True)),
        ("mlan_per", S("mla", False), "ws_overlap", P(128, 128, persistent=True)),
        ("mha128c_fp16_per", S("mha", True, "fp16"), "ws_overlap", P(128, 128, persistent=True)),
    ],
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


def _rescale_set() -> list:
    """Issue 16's trailing shapes with the defaults `tune build` gives, each as it is and with the softmax's
    conditional rescale (rescale_threshold 8, FA4's): the same kernel but for the skipped O multiplies."""
    from dataclasses import replace

    from translate.defaults import default_params

    profile = load_profile("h100")
    out = []
    for tag, spec in (("mha64c", S("mha", True, hd=64)), ("mha64n", S("mha", False, hd=64)),
                      ("mqa64c", S("mqa", True, hd=64)), ("mha128n", S("mha", False)), ("gqa128n", S("gqa", False)),
                      ("mha128c", S("mha", True))):
        base = default_params(profile, spec, "ws_overlap")
        out += [(tag, spec, "ws_overlap", base), (f"{tag}_rt8", spec, "ws_overlap", replace(base, rescale_threshold=8))]
    return out


def build(set_name: str, out: Path, jobs: int) -> int:
    profile = load_profile("h100")
    items = _rescale_set() if set_name == "rescale" else SETS[set_name]
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

    from tuner.measure import dense
    from tuner.serving.launch import load_kernel
    from tuner.measure.verify import verify

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
        for row in dense.bench_rows(kernel, problems):
            state["since"] = time.monotonic()
            row["tag"] = tag
            if fa4 is not None and row.get("status") == "ok":
                row["fa4"] = _time_fa4(fa4, problems[[p.seqlen_q for p in problems].index(row["seqlen"])])
            rows.append(row)
            rows_path.write_text(json.dumps({"device": device, "torch": torch.__version__, "rows": rows},
                                            indent=1, default=str))
    print(f"# {device}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    print(f"{'kernel':16} {'sq':>6} {'ours':>7} {'flash':>7} {'cudnn':>7} {'fa4':>7} {'x cudnn':>8} {'x fa4':>6}")
    for r in rows:
        o, fl, cu, f4 = (r.get(k) for k in ("ours", "flash", "cudnn", "fa4"))
        fmt = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
        print(f"{r['tag']:16} {r['seqlen']:>6} {fmt(o):>7} {fmt(fl):>7} {fmt(cu):>7} {fmt(f4):>7} "
              f"{(o / cu if o and cu else 0):8.2f} {(o / f4 if o and f4 else 0):6.2f}  {r.get('status')}")
    return 1 if failures else 0


def _time_fa4(fa4, problem):
    from tuner.measure import dense

    inputs = dense.make_inputs(problem, 3)

    def call(q, k, v):
        return fa4(q, k, v, causal=problem.causal, softmax_scale=problem.softmax_scale)

    try:
        call(*inputs[0])   # JIT compile outside the timing
        return round(dense.tflops(problem, dense.measure_problem(call, problem, inputs=inputs)), 1)
    except Exception as exc:  # noqa: BLE001
        print(f"fa4 failed on {problem.label()}: {exc}")
        return None


def profile(kernels_dir: Path, tag: str, seqlen: int, fa4: bool) -> int:
    """Run one kernel (or FA4 on its shape) a few times on one grid problem: the target of an ncu run."""
    import torch

    from tuner.measure import dense
    from tuner.serving.launch import load_kernel

    record = json.loads((kernels_dir / f"{tag}.json").read_text())
    spec = KernelSpec(**record["meta"]["spec"])
    head_dim = 128 if spec.variant == "mla" else spec.d_qk
    (problem,) = grid_problems(spec.variant, head_dim, spec.dtype, spec.causal, seqlens=(seqlen,))
    q, k, v = dense.make_inputs(problem, 1)[0]
    if fa4:
        fn = _fa4()
        call = lambda: fn(q, k, v, causal=problem.causal, softmax_scale=problem.softmax_scale)  # noqa: E731
    else:
        kernel = load_kernel(kernels_dir / f"{tag}.cubin", record["meta"])
        call = lambda: kernel(q, k, v)  # noqa: E731
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--set", default="first", choices=sorted(SETS) + ["rescale"])
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--jobs", type=int, default=2)
    r = sub.add_parser("run")
    r.add_argument("--kernels", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--seqlens", default="1024,4096,16384")
    r.add_argument("--only", default="")
    pr = sub.add_parser("profile")
    pr.add_argument("--kernels", type=Path, required=True)
    pr.add_argument("--tag", required=True)
    pr.add_argument("--seqlen", type=int, default=4096)
    pr.add_argument("--fa4", action="store_true")
    args = ap.parse_args()
    if args.cmd == "profile":
        return profile(args.kernels, args.tag, args.seqlen, args.fa4)
    if args.cmd == "build":
        return build(args.set, args.out, args.jobs)
    args.out.mkdir(parents=True, exist_ok=True)
    return run(args.kernels, args.out, tuple(int(x) for x in args.seqlens.split(",")),
               set(filter(None, args.only.split(","))))


if __name__ == "__main__":
    sys.exit(main())
