"""The paged producer's two K/V copies side by side: one thread's TMA boxes (g2s_atom SM90_TMA) against the
producer warpgroup's cp.async through the page table (SM80_CP_ASYNC_CACHEGLOBAL), and FlashAttention-4's
paged ``flash_attn_varlen_func``, on issue 14's paged mixes (llama3-8b heads, d128, causal, bf16; pages of 16
and 128 in a shuffled cache), in one process.

Each kernel passes tuner.measure.verify_varlen first (the mixes it reads, NaN spare pages; a failure is exit 1 and
nothing of it is timed) and must agree with FA4 on the benchmark inputs (tuner.measure.dense.CROSS_CHECK_REL_ERR).
Timing: `--rounds` interleaved rounds, each timing every kernel and FA4 once per mix with tuner.measure.timer.time_ms
(triton's do_bench median, L2 flushed), so clock and power drift fall on all alike, in an order rotated every round
(FA4 included: no kernel always runs right after the same one); the table gives each one's
median TFLOPS [min, max] over the rounds and the median of the per-round ratios to FA4.

    python scripts/paged_copy_check.py --out $OUT/paged_copy.json [--rounds 5] [--cache-dir .kcache] [--layout varlen]
        [--variants '{"tma": {}, "cp_async": {"g2s_atom": "SM80_CP_ASYNC_CACHEGLOBAL", "producer_regs": 56}}']

``--built NAME=RECORD.json`` (repeatable) adds a kernel that ``tune build -o`` wrote (its .cubin beside the record),
e.g. one built from another commit: a change to the generator, not to a parameter, timed against the current code in
one process. It passes the same gate.

``--ncu DIR`` profiles instead of timing: the script re-runs itself under ncu (``--set full``) with ``--profile``,
so each kernel's benchmark call and FA4's run once inside the NVTX range 'profile'; DIR gets the raw and SASS
pages as CSV (``ncu_sass_stalls.py DIR/paged.source.csv`` compares the kernels per opcode), and the table of
dense_profile.py (duration, instructions, issue and pipe activity, L2 and DRAM, top stalls) is printed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CP_ASYNC = {"g2s_atom": "SM80_CP_ASYNC_CACHEGLOBAL", "producer_regs": 56}
DEFAULT_VARIANTS = {"tma": {"g2s_atom": "SM90_TMA", "producer_regs": 40}, "cp_async": CP_ASYNC}
PAGE_SIZES = (16, 128)


def build(variants: dict, cache_dir: Path, gpu: str, layout: str = "paged"):
    """(spec, {name: (GeneratedKernel, CompileResult)}) for llama3-8b's spec in ``layout``, the defaults plus each
    change."""
    from tuner.defaults.export import compile_changes
    from kernel_abi.spec import KernelSpec

    spec = KernelSpec("gqa", 128, 128, True, "bf16", layout)
    return spec, compile_changes(gpu, [(spec, variants)], cache_dir)[0]


class _Built:
    """A ``tune build`` record in the shape the loop reads of compile_changes' (GeneratedKernel, CompileResult)."""

    def __init__(self, record: dict, cubin: bytes):
        from translate.params import KernelParams

        self.name, self._meta = record["meta"]["name"], record["meta"]
        self.params = KernelParams.from_dict(record["params"])
        self.ok, self.cubin = True, cubin
        self.registers = record["resources"].get("registers")
        self.spill_stores = record["resources"].get("spill_stores")

    def meta(self) -> dict:
        return self._meta


def built_records(items: list[str], spec) -> dict:
    """{name: (kernel, result)} of ``NAME=RECORD.json`` items; a record of another spec is an error."""
    from kernel_abi.spec import KernelSpec

    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--built takes NAME=RECORD.json, got {item!r}")
        record = json.loads(Path(path).read_text())
        if KernelSpec(**record["spec"]) != spec:   # (a record's spec is KernelSpec's fields, as param_ab_check reads it)
            raise SystemExit(f"--built {name}: {path} is a kernel for {record['spec']}, not {spec}")
        b = _Built(record, Path(path).with_suffix(".cubin").read_bytes())
        out[name] = (b, b)
    return out


def main(argv=None) -> int:
    import torch

    from tuner.measure import dense
    from tuner.measure import timer
    from tuner.measure.serving import ours_call
    from tuner.measure.serving_baselines import BASELINES
    from tuner.measure.serving_inputs import make_mix_inputs
    from tuner.measure.mixes import serving_problems
    from tuner.models import load_models
    from tuner.serving.launch import load_kernel
    from tuner.measure.verify_varlen import verify_varlen

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--out", default="paged_copy.json")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cache-dir", default=".kcache")
    ap.add_argument("--variants", default=None, help="JSON {name: parameter changes}")
    ap.add_argument("--mix", default=None, help="only this mix (tuner/measure/mixes.toml name)")
    ap.add_argument("--page-size", type=int, default=None, help="only this page size")
    ap.add_argument("--layout", default="paged", choices=("paged", "varlen"),
                    help="varlen: the same comparison on the packed-sequence mixes (no pages), e.g. for a variant "
                         "that is not about the copy")
    ap.add_argument("--profile", action="store_true",
                    help="for ncu: no timing; each kernel's benchmark call runs once inside the NVTX range "
                         "'profile' (ncu --nvtx --nvtx-include 'profile/')")
    ap.add_argument("--idle", type=float, default=0.0,
                    help="seconds the GPU idles before each round (the first timing of a round then follows idle "
                         "time, as a single `tune bench` pass's first library call does)")
    ap.add_argument("--built", action="append", default=[], metavar="NAME=RECORD.json",
                    help="an extra kernel from `tune build -o` (its record; the .cubin beside it)")
    ap.add_argument("--ncu", metavar="DIR", help="profile every kernel and FA4 under ncu into DIR (no timing)")
    args = ap.parse_args(argv)
    if args.ncu:
        return ncu_profile(argv if argv is not None else sys.argv[1:], Path(args.ncu))
    variants = json.loads(args.variants) if args.variants else DEFAULT_VARIANTS

    spec, built = build(variants, Path(args.cache_dir), args.gpu, args.layout)
    built.update(built_records(args.built, spec))
    kernels, record = {}, {"device": torch.cuda.get_device_name(), "rounds": args.rounds, "kernels": {}, "rows": []}
    for name, (gen, res) in built.items():
        info = {"name": gen.name, "params": gen.params.to_dict(), "ok": res.ok, "registers": res.registers,
                "spill_stores": res.spill_stores}
        if res.ok:
            kernel = load_kernel(res.cubin, gen.meta())
            report = verify_varlen(kernel, spec)
            info.update(verified=bool(report.passed), reason=report.reason,
                        mixes=[c.problem for c in report.checks])
            if report.passed:
                kernels[name] = kernel
        record["kernels"][name] = info
        print(f"{name}: {gen.name} regs {res.registers} spills {res.spill_stores} "
              f"verified={info.get('verified')} {info.get('reason') or ''}", flush=True)
    if len(kernels) != len(built):
        Path(args.out).write_text(json.dumps(record, indent=2, default=str))
        return 1

    model = load_models()["llama3-8b"]
    fa4 = next(b for b in BASELINES if b.name == "fa4")
    pages = (None,) if args.layout == "varlen" else (args.page_size,) if args.page_size else PAGE_SIZES
    for page in pages:
        names = [args.mix] if args.mix else None
        for problem in serving_problems(args.layout, "gqa", model.heads_q, model.heads_kv, 128, 128, True, "bf16", page,
                                        names=names):
            x = make_mix_inputs(problem, "cuda")
            calls = {name: ours_call(kernel, problem, x) for name, kernel in kernels.items()}
            prep = fa4.prepare(problem, x)
            theirs = prep.packed(prep.call()).float()
            row = {"mix": problem.name, "page_size": page, "flops": problem.flops}
            for name, call in calls.items():   # agreement on the benchmark inputs before any timing
                out = call().float()
                rel = ((out - theirs).norm() / theirs.norm()).item()
                row[f"{name}_rel_err_vs_fa4"] = rel
                if not rel <= dense.CROSS_CHECK_REL_ERR:
                    print(f"{name} differs from FA4 on {problem.name} p{page}: rel err {rel:.3g}", flush=True)
                    return 1
            if args.profile:   # ours, then FA4 (its compile ran above, outside the range)
                calls["fa4"] = prep.call
                torch.cuda.synchronize()
                for name, call in calls.items():
                    with torch.cuda.nvtx.range("profile"):
                        call()
                    torch.cuda.synchronize()
                continue
            calls["fa4"] = prep.call
            tflops = {name: [] for name in calls}
            names = list(calls)
            first = {name: [] for name in calls}   # each round's first timing, after --idle seconds of an idle GPU
            for r in range(args.rounds):   # the order rotated every round
                order = names[r % len(names):] + names[:r % len(names)]
                if args.idle:
                    torch.cuda.synchronize()
                    time.sleep(args.idle)
                for name in order:
                    tflops[name].append(problem.flops / (timer.time_ms(calls[name]) * 1e-3) / 1e12)
                first[order[0]].append(tflops[order[0]][-1])
            row["first_in_round"] = first
            for name, values in tflops.items():
                row[name] = values
                if name != "fa4":
                    row[f"{name}/fa4"] = statistics.median(a / b for a, b in zip(values, tflops["fa4"]))
            record["rows"].append(row)
            cells = "  ".join(f"{n} {statistics.median(v):.1f} [{min(v):.1f}, {max(v):.1f}]" for n, v in tflops.items())
            ratios = "  ".join(f"{n}/fa4 {row[f'{n}/fa4']:.3f}" for n in kernels)
            print(f"{problem.name:<14} p{page or '-':<4} {cells}  |  {ratios}", flush=True)
            x = theirs = prep = calls = None   # the mix's tensors go before the next mix's
            torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(record, indent=2, default=str))
    print("\nmix            page  " + "  ".join(f"{n:>10}" for n in kernels) + "   (median ratio to FA4 over "
          f"{args.rounds} interleaved rounds)")
    for row in record["rows"]:
        print(f"{row['mix']:<14} {row['page_size'] or '-':<5} " + "  ".join(f"{row[f'{n}/fa4']:>10.3f}" for n in kernels))
    return 0


def ncu_profile(argv: list[str], out: Path) -> int:
    """This script under ncu with ``--profile`` (every kernel's call and FA4's inside the NVTX range), its pages
    exported to CSV under ``out`` and summarised with dense_profile.py's table."""
    import subprocess

    # scripts/ is on sys.path when run as a script
    from dense_profile import NCU_PAGES, export_report, find_ncu, print_tables, summarize_raw

    ncu = find_ncu()
    if ncu is None:
        print("ncu: not found", flush=True)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    rest, skip = [], False
    for a in argv:   # the same arguments without --ncu DIR
        if skip:
            skip = False
        elif a == "--ncu":
            skip = True
        elif not a.startswith("--ncu="):
            rest.append(a)
    rep = out / "paged"
    cmd = [ncu, "--nvtx", "--nvtx-include", "profile/", "--set", "full", "--import-source", "no", "-f", "-o", str(rep),
           sys.executable, __file__, "--profile", *rest]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    print("\n".join(proc.stdout.strip().splitlines()[-12:]), flush=True)
    report = rep.with_suffix(".ncu-rep")
    if proc.returncode or not report.is_file():
        print(f"ncu rc {proc.returncode}: {proc.stderr[-2000:]}", flush=True)
        return 1
    export_report(ncu, report, out / "paged", pages=[p for p in NCU_PAGES if p[0] != "details"])
    summary = [{"point": "paged", **e} for e in summarize_raw(out / "paged.raw.csv")]
    Path(out / "summary.json").write_text(json.dumps(summary, indent=2))
    print_tables([], summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
