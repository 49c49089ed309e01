"""nvcc seconds per kernel, alone and batched (several kernels in one translation unit), for a set of
Hopper candidates of one spec: the compile cost a campaign pays per trial (BENCHMARKS.md).

    python3 scripts/compile_cost.py [--gpu h100] [--variant mha] [--head-dim 128] [--batch 4[,8,...]] [--jobs 1]
                                    [--mix neighbours|diverse] [--count 4] [--phases]

No cache: every kernel is compiled afresh. Prints one line per kernel alone, then the batched wall time (per
unit size of ``--batch``, a comma list to compare sizes: kernels per second against batch size);
each with the CPU seconds of nvcc and its children (user + sys), which a machine shared with other work
inflates less than the wall time. ``--mix neighbours``: the default kernel and three neighbours that share
most of its CuTe types (the same tile but one); ``--mix diverse``: ``--count`` warp-specialised points of the
valid space with pairwise different tiles (block M, block N, stages, P·V operand), as the sampler proposes
them. ``--phases``: ``nvcc --time`` of the first kernel alone and of the batch (preprocessing, cicc, ptxas).

    python3 scripts/compile_cost.py --kinds [--repeat 2]

``--kinds``: the default kernel of each kind of kernel the translator writes (Hopper prefill dense d64 causal,
d128 non-causal, GQA d128 causal, paged, varlen; the sm80 prefill on the A100; the split-KV GQA decode kernel and
the absorbed-MLA seesaw decode kernel on the H100), each alone, ``--repeat`` times: CPU seconds and the
``nvcc --time`` phases of each build.
"""
from __future__ import annotations

import argparse
import csv
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

import tl
import translate
from hardware_profiles import load_profile
from kernel_abi.spec import KernelSpec
from translate import nvcc
from translate.defaults import hopper_params
from translate.params import KernelParams

# Four distinct Hopper candidates: the default and three neighbours a search would try. Block N 96 is one of
# CuTe's base wgmma shapes, 112 is not and the kernel declares its op (translate/sm90/wgmma_ops.py):
# --neighbour-n picks.
CHANGES = [{}, {"block_n": 96}, {"pingpong": True}, {"pv_operand": "ss", "persistent": False}]


def neighbours(profile, spec, neighbour_n: int) -> list:
    from translate.defaults import probe_problem
    from translate.params import validate

    base = hopper_params(profile, spec).to_dict()
    program = tl.parse_program(tl.load_sketch(spec.variant, spec.causal, "ws_overlap"))
    changes = [{**c, "block_n": neighbour_n} if "block_n" in c else c for c in CHANGES]
    candidates = [KernelParams.from_dict({**base, **c}) for c in changes]
    candidates = [p for p in candidates if not validate(p, profile, probe_problem(spec), warp_specialized=True)]
    return [translate.generate(program, p, profile, spec) for p in candidates]


def diverse(profile, spec, count: int, seed: int) -> list:
    """``count`` warp-specialised points of the valid space, each of another tile (seeded draw)."""
    from search_spaces import load_space
    from search_spaces.feasible import default_sketches, feasible_space
    from kernel_abi.spec import grid_problems

    space = load_space(spec.variant)
    fs = feasible_space(space, profile, spec.d_qk, spec.dtype, grid_problems(spec.variant, spec.d_qk, spec.dtype,
                        spec.causal), default_sketches(space, profile, spec.d_qk, spec.dtype))
    points = [pt for pt in fs.points if pt.sketch.startswith("ws_")]
    rng = random.Random(seed)
    by_tile: dict[tuple, list] = {}
    for pt in points:
        p = pt.params
        by_tile.setdefault((p.block_m, p.block_n, p.kv_stages, p.pv_operand), []).append(pt)
    chosen = [rng.choice(by_tile[t]) for t in rng.sample(sorted(by_tile), count)]
    return [translate.generate(tl.parse_program(tl.load_sketch(spec.variant, spec.causal, pt.sketch)), pt.params,
                               profile, spec) for pt in chosen]


def timed(kernels, arch, **options):
    """(results, wall seconds, CPU seconds of the nvcc processes)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    results = nvcc.compile_kernels(kernels, arch, **options)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return results, wall, cpu


def phases(kernels, arch, batch: int) -> str:
    """nvcc --time of ``kernels`` in units of ``batch``: seconds per phase, summed over the units."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "time.csv"
        timed(kernels, arch, jobs=1, batch_size=batch, extra_flags=("--time", str(report)))
        totals = _phase_totals(report)
    return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in totals.items() if seconds >= 0.05)


def _phase_totals(report: Path) -> dict[str, float]:
    """Seconds per phase of an ``nvcc --time`` report, summed over its units."""
    totals: dict[str, float] = {}
    with report.open() as f:
        for row in csv.reader(f):
            if len(row) >= 8 and row[7].strip() == "ms":
                name = row[1].strip()
                totals[name] = totals.get(name, 0.0) + float(row[6]) / 1000
    return totals


def kinds() -> list[tuple[str, str, object]]:
    """(label, nvcc arch, kernel): the default kernel of each kind (module doc, ``--kinds``)."""

    from tl.pipelines import has_roles
    from translate.decode import default_decode_params
    from translate.defaults import default_params

    h100, a100 = load_profile("h100"), load_profile("a100")
    out = []
    for label, profile, spec, schedule in (
            ("hopper mha d64 causal", h100, KernelSpec("mha", 64, 64, True, "bf16"), "ws_overlap"),
            ("hopper mha d128 noncausal", h100, KernelSpec("mha", 128, 128, False, "bf16"), "ws_overlap"),
            ("hopper gqa d128 causal", h100, KernelSpec("gqa", 128, 128, True, "bf16"), "ws_overlap"),
            ("hopper gqa d128 causal paged", h100, KernelSpec("gqa", 128, 128, True, "bf16", "paged"), "ws_overlap"),
            ("hopper gqa d128 causal varlen", h100, KernelSpec("gqa", 128, 128, True, "bf16", "varlen"), "ws_overlap"),
            ("sm80 mha d128 causal", a100, KernelSpec("mha", 128, 128, True, "bf16"), "fa2")):
        program = tl.parse_program(tl.load_sketch(spec.variant, spec.causal, schedule, spec.layout))
        params = default_params(profile, spec, "ws_overlap" if has_roles(program.statements) else "fa2")
        out.append((label, profile.nvcc_arch, translate.generate(program, params, profile, spec)))
    decode = Path(tl.__file__).parent / "sketches" / "decode"
    for label, spec, heads in (("decode gqa d128 paged", KernelSpec("gqa", 128, 128, True, "bf16", "paged", "decode"), 32),
                               ("decode mla seesaw paged", KernelSpec("mla", 576, 512, True, "bf16", "paged", "decode"), 128)):
        params = default_decode_params(spec, heads, h100)
        program = tl.parse_program((decode / f"{spec.variant}_{spec.layout}.tl").read_text())
        out.append((label, h100.nvcc_arch, translate.generate(program, params, h100, spec)))
    return out


def main_kinds(repeat: int) -> int:
    ok = True
    for label, arch, k in kinds():
        for _ in range(repeat):
            with tempfile.TemporaryDirectory() as tmp:
                report = Path(tmp) / "time.csv"
                (r,), wall, cpu = timed([k], arch, jobs=1, batch_size=1, extra_flags=("--time", str(report)))
                split = _phase_totals(report) if report.is_file() else {}
            ok = ok and r.ok
            print(f"{label} ({arch}): {cpu:.2f} s CPU, {wall:.2f} s wall ({'ok' if r.ok else r.error_kind}); "
                  + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in split.items() if seconds >= 0.05), flush=True)
    return 0 if ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--variant", default="mha")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--batch", default="4", help="kernels per translation unit; a comma list tries each")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--neighbour-n", type=int, default=96, help="block N of the second candidate (112: not a base wgmma shape)")
    ap.add_argument("--mix", choices=("neighbours", "diverse"), default="neighbours")
    ap.add_argument("--count", type=int, default=4, help="candidates of --mix diverse")
    ap.add_argument("--seed", type=int, default=0, help="the draw of --mix diverse")
    ap.add_argument("--phases", action="store_true", help="nvcc --time split of the first kernel and of the batch")
    ap.add_argument("--kinds", action="store_true", help="the default kernel of each kind, alone (module doc)")
    ap.add_argument("--repeat", type=int, default=1, help="builds of each kernel with --kinds")
    args = ap.parse_args(argv)
    if args.kinds:
        return main_kinds(args.repeat)
    profile = load_profile(args.gpu)
    d_qk = 192 if args.variant == "mla" else args.head_dim
    spec = KernelSpec(args.variant, d_qk, 128 if args.variant == "mla" else args.head_dim, args.causal, "bf16")
    kernels = (neighbours(profile, spec, args.neighbour_n) if args.mix == "neighbours"
               else diverse(profile, spec, args.count, args.seed))
    alone, alone_cpu = [], []
    for k in kernels:
        (r,), wall, cpu = timed([k], profile.nvcc_arch, jobs=1, batch_size=1)
        alone.append(wall)
        alone_cpu.append(cpu)
        extended = "declares its wgmma op" if "struct TL_MMA_" in k.body else "base wgmma shapes"
        print(f"alone   {k.name}: {wall:.1f} s, {cpu:.1f} s CPU ({'ok' if r.ok else r.error_kind}; {extended})",
              flush=True)
    n = len(kernels)
    ok = n
    sizes = [int(b) for b in str(args.batch).split(",")]
    for size in sizes:
        results, wall, cpu = timed(kernels, profile.nvcc_arch, jobs=args.jobs, batch_size=size)
        ok = min(ok, sum(r.ok for r in results))
        print(f"batched {n} kernels, {size} per translation unit, {args.jobs} job(s): {wall:.1f} s wall, "
              f"{wall / n:.1f} s per kernel ({n / wall:.2f} kernels/s), {cpu / n:.1f} s CPU per kernel "
              f"({sum(r.ok for r in results)}/{n} ok); alone: mean {sum(alone) / n:.1f} s, {sum(alone_cpu) / n:.1f} s CPU",
              flush=True)
    if args.phases:
        print(f"phases, first kernel alone: {phases(kernels[:1], profile.nvcc_arch, 1)}")
        print(f"phases, {n} kernels in units of {sizes[0]}: {phases(kernels, profile.nvcc_arch, sizes[0])}")
    return 0 if ok == n else 1


if __name__ == "__main__":
    sys.exit(main())
