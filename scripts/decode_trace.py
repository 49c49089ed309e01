"""Where an MLA decode call's time goes, CTA by CTA: the seesaw kernel (attn_decode_sm90_seesaw.cuh) built with
-DATTN_DECODE_TRACE stamps %globaltimer at its phases (translate/include/attn_trace.cuh): start, Q loaded, the first
scores, the loop's end, the output staged, the end. ncu gives a kernel's totals; this gives the prologue, the loop's
time per pair of tiles, the output store and how far apart the CTAs end (BENCHMARKS.md 2026-11-26: the
old output store was 12 us of a 150 us call).

    python3 scripts/decode_trace.py build DIR OUT [--waits]   (nvcc and CUTLASS: DIR is `tune build --phase decode` output)
    python3 scripts/decode_trace.py run OUT [--plain DIR] [--points 64x4096,8x16384x2] [--reps 5]   (the GPU)

With --waits the build also sums, per CTA and warpgroup, the SM cycles spent at each of the loop's wait sites
(-DATTN_DECODE_WAITS: clock64 around the waits the seesaw names in its WaitSite enum) and `run` prints them as a share
of the warpgroup's loop: what the loop waits for, where the stamps only say how long it took.

`run` calls each point once per rep on fresh stamps with L2 flushed, keeps the rep of the shortest span, and prints
medians and 10th/90th percentiles over the CTAs (microseconds from the first CTA's start); with --plain the
untraced build is timed beside it (triton's do_bench), which shows what the stamps cost.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

SLOTS = 8
WAIT_SLOTS = 32   # attn_trace.cuh kAttnWaitSites
PHASES = ("start", "q_loaded", "first_scores", "loop_end", "staged", "end")
DEFAULT_POINTS = "64x4096,64x16384,128x8192,8x16384,64x8192x2"


def seesaw_header() -> Path:
    """The seesaw kernel's header among the translator's includes (translate.INCLUDE_DIR)."""
    import translate

    return Path(translate.INCLUDE_DIR) / "attn_decode_sm90_seesaw.cuh"


def wait_sites(header: Path | None = None) -> dict[int, str]:
    """{site: label} of the seesaw's WaitSite enum (``kWait... = N,  // label``): the kernel names its sites once."""
    header = header or seesaw_header()
    sites = {}
    for m in re.finditer(r"^\s*kWait\w+\s*=\s*(\d+),\s*//\s*(.+?)\s*$", header.read_text(), re.M):
        if int(m.group(1)) in sites or int(m.group(1)) >= WAIT_SLOTS:
            raise ValueError(f"{header.name}: wait site {m.group(1)} taken twice or past {WAIT_SLOTS}")
        sites[int(m.group(1))] = m.group(2)
    if not sites:
        raise ValueError(f"{header.name} names no wait sites")
    return sites


def summarise_waits(waits, sites: dict[int, str]) -> list[dict]:
    """Per site: median cycles per CTA and the median share of its warpgroup's loop span (the ``loop`` site of the
    same warpgroup: label prefix ``wg0:`` / ``wg1:``), from (ctas, WAIT_SLOTS) cycle sums."""
    import numpy as np

    w = np.asarray(waits, dtype=np.float64)
    loops = {label.split(":")[0]: site for site, label in sites.items() if label.endswith("the whole loop")}
    w = w[w[:, list(loops.values())].min(axis=1) > 0] if loops else w
    rows = []
    for site, label in sorted(sites.items()):
        loop = loops.get(label.split(":")[0])
        share = float(np.median(w[:, site] / w[:, loop])) if loop is not None and len(w) else float("nan")
        rows.append({"site": site, "label": label, "kcycles": round(float(np.median(w[:, site])) / 1e3, 1),
                     "share": round(share, 3)})
    return rows


def build(src: Path, out: Path, waits: bool = False) -> int:
    """Each kernel source of ``src`` compiled with the trace on (and with ``waits`` the wait sums) into ``out``
    (cubin + its record)."""
    import translate
    from translate import nvcc

    out.mkdir(parents=True, exist_ok=True)
    sources = sorted(src.glob("*.cu"))
    if not sources:
        raise SystemExit(f"{src} holds no .cu: point at what `tune build --phase decode -o DIR` wrote")
    for cu in sources:
        record = cu.with_suffix(".json")
        if "seesaw" not in cu.read_text():
            print(f"skip {cu.name}: not the seesaw kernel (the only one with trace stamps)")
            continue
        flags = ["-DATTN_DECODE_TRACE", *(["-DATTN_DECODE_WAITS"] if waits else [])]
        cmd = [str(nvcc.find_nvcc()), *nvcc.BASE_FLAGS, *flags, "-cubin", "-arch=sm_90a",
               f"-I{nvcc.cutlass_include_dir()}", f"-I{translate.INCLUDE_DIR}", "-o",
               str(out / cu.with_suffix(".cubin").name), str(cu)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"nvcc failed on {cu.name}:\n{done.stderr[-3000:]}")
        shutil.copy(record, out / record.name)
        print(f"built {out / cu.with_suffix('.cubin').name}")
    return 0


def summarise(stamps, ctas_per_sm_wave: int) -> dict:
    """Phase times (us) over the CTAs of one call from its (ctas, SLOTS) stamps."""
    import numpy as np

    t = stamps[:, :len(PHASES)].astype(np.int64)
    rel = (t - t[:, 0].min()) / 1000.0

    def pct(a):
        return [round(float(np.percentile(a, q)), 1) for q in (10, 50, 90)]

    return {"ctas": int(len(t)), "sms": int(len(set(stamps[:, SLOTS - 1].tolist()))),
            "span": round(float(rel[:, 5].max()), 1),
            "q_loaded": pct(rel[:, 1] - rel[:, 0]), "first_scores": pct(rel[:, 2] - rel[:, 0]),
            "loop": pct(rel[:, 3] - rel[:, 2]), "staging": pct(rel[:, 4] - rel[:, 3]),
            "store": pct(rel[:, 5] - rel[:, 4]), "end": pct(rel[:, 5]),
            "waves": int(math.ceil(len(t) / ctas_per_sm_wave))}


def run(traced: Path, plain: Path | None, points: list, reps: int, out: str | None) -> int:
    import numpy as np
    import torch

    from tuner.measure.decode import make_mla_inputs
    from tuner.measure.timer import time_ms
    from tuner.serving.launch import driver as cuda
    from tuner.serving.launch.decode_kernel import load_decode_kernel

    def load(folder: Path):
        record = next(folder.glob("*.json"))
        return load_decode_kernel(record.with_suffix(".cubin").read_bytes(), json.loads(record.read_text())["meta"])

    kernel = load(traced)
    untraced = load(plain) if plain else None
    driver = cuda.api()
    try:
        stamps_ptr, size = kernel.base.module_global("attn_trace")
    except cuda.KernelLoadError:
        raise SystemExit(f"{traced} was not built with the trace (scripts/decode_trace.py build)") from None
    try:
        waits_ptr, waits_size = kernel.base.module_global("attn_waits")
        sites = wait_sites()
    except cuda.KernelLoadError:
        waits_ptr = None   # built without --waits
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for p in points:
        x = make_mla_inputs(p)
        scale = 1.0 / math.sqrt(576)

        def call(k, x=x):
            return k(x["q"], x["k"], None, cache_seqlens=x["seqused_k"], page_table=x["page_table"],
                     softmax_scale=scale)

        row = {"point": p.label(), "traced_us": time_ms(lambda: call(kernel)) * 1e3}
        if untraced:
            row["plain_us"] = time_ms(lambda: call(untraced)) * 1e3
        best = None
        for _ in range(reps):
            cuda.check(driver.cuMemsetD8(stamps_ptr, 0, size), "clear the stamps")
            if waits_ptr is not None:
                cuda.check(driver.cuMemsetD8(waits_ptr, 0, waits_size), "clear the wait sums")
            flush.zero_()
            torch.cuda.synchronize()
            call(kernel)
            torch.cuda.synchronize()
            host = np.zeros(size // 8, dtype=np.uint64)
            cuda.check(driver.cuMemcpyDtoH(host.ctypes.data, stamps_ptr, size), "read the stamps")
            stamps = host.reshape(-1, SLOTS)
            stamps = stamps[stamps[:, 0] > 0]
            s = summarise(stamps, sms)
            if waits_ptr is not None:
                sums = np.zeros(waits_size // 8, dtype=np.uint64)
                cuda.check(driver.cuMemcpyDtoH(sums.ctypes.data, waits_ptr, waits_size), "read the wait sums")
                s["waits"] = summarise_waits(sums.reshape(-1, WAIT_SLOTS), sites)
            if best is None or s["span"] < best["span"]:
                best = s
        row.update(best)
        rows.append(row)
        plain_cell = f" plain {row['plain_us']:.1f}" if untraced else ""
        print(f"{p.label():<26} {row['ctas']} CTAs on {row['sms']} SMs ({row['waves']} waves) | call: traced "
              f"{row['traced_us']:.1f}{plain_cell} us, stamps span {row['span']:.1f}", flush=True)
        print(f"    Q loaded {row['q_loaded']}  first scores {row['first_scores']}  loop {row['loop']}  staging "
              f"{row['staging']}  store {row['store']}  end {row['end']}   (us: 10th/50th/90th pct over CTAs)",
              flush=True)
        for w in row.get("waits", []):
            print(f"      {w['label']:<36} {w['kcycles']:8.1f} kcycles  {w['share']:6.3f} of the loop", flush=True)
        x = None
        torch.cuda.empty_cache()
    if out:
        Path(out).write_text(json.dumps(rows, indent=2))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile a build's seesaw kernel with the trace stamps")
    b.add_argument("src", type=Path)
    b.add_argument("out", type=Path)
    b.add_argument("--waits", action="store_true", help="also sum the cycles at the loop's wait sites")
    r = sub.add_parser("run", help="stamp calls on the GPU and print the phases")
    r.add_argument("traced", type=Path)
    r.add_argument("--plain", type=Path, help="the same kernel without stamps, timed beside")
    r.add_argument("--points", default=DEFAULT_POINTS, help="BxKV[xTOKENS] at 128 heads, comma-separated")
    r.add_argument("--reps", type=int, default=5)
    r.add_argument("--out")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        return build(args.src, args.out, args.waits)
    from tuner.measure.decode import parse_mla_points

    try:
        points = parse_mla_points(args.points)
    except ValueError as exc:
        ap.error(f"--points: {exc}")
    return run(args.traced, args.plain, points, args.reps, args.out)


if __name__ == "__main__":
    sys.exit(main())
