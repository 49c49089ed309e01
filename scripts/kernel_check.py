"""One GPU-machine run of the kernel engine: translate -> compile (all cores) -> verify -> benchmark.

    python scripts/kernel_check.py --out $OUT [--sweep small|full] [--seqlens 1024,4096,16384]

1. builds the correctness set (every problem kind with the profile's default parameters, fp16 and bf16,
   the moved-prefetch sketch, the sm75 kernel as compute_75 PTX) and a sweep of parameters for the
   speed targets; compiles them in parallel (translate.nvcc, one nvcc per core);
2. verifies every kernel by the protocol of tuner/measure/verify.py (ragged, sq != sk, GQA/MQA mapping...);
3. times the verified sweep kernels on the paper grid against torch SDPA flash / cuDNN / efficient,
   all in this process on the same inputs, and prints a table (last), JSON under --out.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tl  # noqa: E402
import translate  # noqa: E402
from hardware_profiles import load_profile  # noqa: E402
from translate import nvcc  # noqa: E402
from translate.defaults import default_params  # noqa: E402
from translate.params import KernelParams  # noqa: E402
from kernel_abi.spec import KernelSpec, grid_problems  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from sketch_edits import moved_prefetch  # noqa: E402  (the edit the schedule tests use)

SKETCHES = Path(__file__).resolve().parents[1] / "tl" / "sketches"


def sketch_text(variant: str, causal: bool) -> str:
    return (SKETCHES / f"{variant}_{'causal' if causal else 'noncausal'}.tl").read_text()


def P(bm, bn, w, st=1, q_regs=False, s2r="SM75_U32x4_LDSM_N", g2s="SM80_CP_ASYNC_CACHEGLOBAL", sw=3):
    return KernelParams(block_m=bm, block_n=bn, num_warps=w, kv_stages=st, mma_atom="SM80_16x8x16",
                        g2s_atom=g2s, s2r_atom=s2r, swizzle=sw, q_in_regs=q_regs)


SWEEP = {  # (variant, head_dim) -> candidate params, FA2/FA3 seeds and neighbours (CUTE.md §2.3)
    ("mha", 128): [P(128, 64, 4), P(128, 64, 4, 2), P(128, 64, 4, 1, True), P(128, 32, 4, 2), P(64, 64, 4, 2),
                   P(128, 128, 8, 1)],
    ("mha", 64): [P(128, 128, 4), P(128, 64, 4), P(128, 128, 4, 2), P(128, 64, 4, 2), P(128, 128, 8, 2)],
    ("mla", 192): [P(128, 64, 8), P(128, 64, 8, 2), P(128, 96, 8, 2, True), P(64, 64, 4, 2), P(128, 32, 4, 2)],
}


def build_set(profile, sweep: str):
    """[(tag, spec, params, sketch_text, arch)]"""
    items = []
    for variant, hd in (("mha", 128), ("mha", 64), ("gqa", 128), ("mqa", 128), ("mla", 192)):
        for causal in (False, True):
            for dtype in (("bf16", "fp16") if variant == "mha" else ("bf16",)):
                spec = KernelSpec(variant, hd, 128 if variant == "mla" else hd, causal, dtype)
                items.append(("check", spec, default_params(profile, spec), sketch_text(variant, causal), "sm_90a"))
    spec = KernelSpec("mha", 128, 128, False, "bf16")
    items.append(("moved-prefetch", spec, default_params(profile, spec), moved_prefetch(sketch_text("mha", False)),
                  "sm_90a"))
    # Odd atoms: the combinations validate() accepts must build and verify too.
    odd = [P(64, 64, 4, 2, True, "SM75_U32x2_LDSM_N", "SM80_CP_ASYNC_CACHEALWAYS", 2),
           P(64, 32, 2, 3, False, "UniversalCopy", "UniversalCopy128", 0)]
    for p in odd:
        items.append(("odd-atoms", KernelSpec("gqa", 128, 128, True, "fp16"), p, sketch_text("gqa", True), "sm_90a"))
    t4 = load_profile("t4")
    for causal in (False, True):
        s75 = KernelSpec("mha", 128, 128, causal, "fp16")
        items.append(("sm75-ptx", s75, default_params(t4, s75), sketch_text("mha", causal), "compute_75"))
    if sweep != "none":
        for (variant, hd), cands in SWEEP.items():
            for causal in (False, True):
                spec = KernelSpec(variant, hd, 128 if variant == "mla" else hd, causal, "bf16")
                for p in cands[: (3 if sweep == "small" else None)]:
                    items.append(("sweep", spec, p, sketch_text(variant, causal), "sm_90a"))
    return items


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--sweep", default="full", choices=("none", "small", "full"))
    ap.add_argument("--seqlens", default="1024,4096,16384")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--cache", default=os.environ.get("KERNEL_CACHE_DIR", "/tmp/kernel-cache"),
                    help="compile cache (content-addressed), shared with tests/gpu via KERNEL_CACHE_DIR")
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = open(out_dir / "kernel_check.log", "w")

    def say(*a):
        msg = " ".join(str(x) for x in a)
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    h100 = load_profile("h100")
    t0 = time.time()
    items = build_set(h100, args.sweep)
    gens = []
    for tag, spec, params, text, arch in items:
        prof = load_profile("t4") if arch == "compute_75" else h100
        try:
            k = translate.generate(tl.parse_program(text), params, prof, spec)
            gens.append((tag, spec, params, arch, k))
        except Exception as exc:
            say(f"TRANSLATE FAIL {tag} {spec.label()} {params.key()}: {exc}")
    # dedupe identical kernels (same name + same source)
    seen, uniq = {}, []
    for g in gens:
        key = (g[4].name, g[4].source, g[3])
        if key not in seen:
            seen[key] = g
            uniq.append(g)
    say(f"translated {len(gens)} ({len(uniq)} unique) in {time.time() - t0:.1f}s")

    t1 = time.time()
    cubin_items = [g for g in uniq if g[3] == "sm_90a"]
    results = nvcc.compile_kernels([g[4] for g in cubin_items], "sm_90a", jobs=args.jobs, batch_size=2, timeout=600,
                                   cache_dir=Path(args.cache))
    compiled = {}
    for g, r in zip(cubin_items, results):
        compiled[id(g)] = r
    for g in uniq:
        if g[3] == "compute_75":
            compiled[id(g)] = nvcc.compile_ptx(g[4], "compute_75", timeout=600, cache_dir=Path(args.cache))
    say(f"compiled in {time.time() - t1:.1f}s")
    records = []
    for g in uniq:
        r = compiled[id(g)]
        rec = {"tag": g[0], "spec": g[1].label(), "params": g[2].to_dict(), "name": g[4].name, "arch": g[3],
               "compile_ok": r.ok, "error_kind": r.error_kind, "registers": r.registers,
               "spill_stores": r.spill_stores, "compile_s": round(r.compile_seconds, 1)}
        if not r.ok:
            say(f"COMPILE FAIL {g[4].name}: {r.error_kind}\n{r.log[-2500:]}")
        records.append((g, r, rec))

    import torch
    from tuner.measure import dense
    from tuner.serving.launch import load_kernel
    from tuner.measure.verify import verify

    say(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    t2 = time.time()
    kernels = {}
    for g, r, rec in records:
        if not r.ok:
            continue
        try:
            binary = r.ptx.encode() if g[3] == "compute_75" else r.cubin
            kern = load_kernel(binary, g[4].meta())
            rep = verify(kern, g[1], seed=1234)
            rec["verified"] = rep.passed
            rec["verify_reason"] = rep.reason
            rec["worst_rel_err"] = max(c.rel_err for c in rep.checks)
            rec["resources"] = kern.resources()
            if rep.passed:
                kernels[id(g)] = kern
            say(f"{'PASS' if rep.passed else 'FAIL'} {g[0]:14s} {g[4].name}  regs={r.registers} "
                f"spill={r.spill_stores} worst_rel={rec['worst_rel_err']:.2e} {rep.reason[:300]}")
        except Exception as exc:
            rec["verified"] = False
            rec["verify_reason"] = f"{type(exc).__name__}: {exc}"
            say(f"ERROR {g[4].name}: {traceback.format_exc()[-1500:]}")
    say(f"verified in {time.time() - t2:.1f}s")

    # Planted wrong kernel: a correct kernel whose output is perturbed must be rejected.
    some = next(((g, kernels[id(g)]) for g, r, rec in records if id(g) in kernels and g[0] == "check"), None)
    if some is not None:
        g, kern = some

        def wrong(q, k, v, out=None):
            o = kern(q, k, v, out=out)
            o[:, -1:, :, :5] += 0.05
            return o
        rep = verify(wrong, g[1], seed=7)
        say(f"planted wrong kernel rejected: {not rep.passed} ({rep.reason[:160]})")

    # Benchmark: the sweep kernels that verified, per spec, on the grid.
    t3 = time.time()
    seqlens = tuple(int(x) for x in args.seqlens.split(","))
    bench_rows = []
    by_spec = {}
    for g, r, rec in records:
        if id(g) in kernels and g[0] in ("sweep", "check") and g[3] == "sm_90a" and g[1].dtype == "bf16":
            by_spec.setdefault(g[1], []).append((g, kernels[id(g)]))
    for spec, ks in by_spec.items():
        hd = spec.d_qk if spec.variant != "mla" else 192
        for prob in grid_problems(spec.variant, hd, "bf16", spec.causal, seqlens=seqlens):
            inputs = dense.make_inputs(prob, 3)
            base = dense.measure_baselines(prob, inputs)
            for g, kern in ks:
                try:
                    ms = dense.measure_problem(kern, prob, inputs=inputs)
                    ours = dense.tflops(prob, ms)
                except Exception as exc:
                    ours = None
                    say(f"bench error {g[4].name}: {exc}")
                row = {"spec": spec.label(), "seqlen": prob.seqlen_q, "batch": prob.batch, "params": g[2].key(),
                       "tag": g[0], "ours": ours, **base}
                bench_rows.append(row)
            del inputs
            torch.cuda.empty_cache()
    say(f"benchmarked in {time.time() - t3:.1f}s")
    json.dump({"records": [rec for _, _, rec in records], "bench": bench_rows, "gpu": torch.cuda.get_device_name()},
              open(out_dir / "results.json", "w"), indent=1, default=str)

    # Table: best of ours per (spec, seqlen) vs baselines.
    best = {}
    for row in bench_rows:
        key = (row["spec"], row["seqlen"])
        if row["ours"] is not None and (key not in best or row["ours"] > best[key]["ours"]):
            best[key] = row
    say("\nverification: " + ", ".join(f"{rec['tag']}:{rec['spec']}={'ok' if rec.get('verified') else 'FAIL'}"
                                       for _, _, rec in records if rec["tag"] != "sweep"))
    say(f"sweep verified: {sum(1 for _, _, rec in records if rec['tag'] == 'sweep' and rec.get('verified'))}/"
        f"{sum(1 for _, _, rec in records if rec['tag'] == 'sweep')}")
    say(f"\n{'spec':34s} {'seq':>5s} {'best params':38s} {'ours':>6s} {'flash':>6s} {'cudnn':>6s} {'eff':>6s} "
        f"{'x flash':>7s} {'x eff':>6s}")
    for (spec, s), row in sorted(best.items()):
        f, c, e = row.get("flash"), row.get("cudnn"), row.get("efficient")
        fmt = lambda x: f"{x:6.0f}" if x else "     -"
        say(f"{spec:34s} {s:5d} {row['params']:38s} {fmt(row['ours'])} {fmt(f)} {fmt(c)} {fmt(e)} "
            f"{(row['ours'] / f if f else float('nan')):7.2f} {(row['ours'] / e if e else float('nan')):6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
