"""A sliding window's decode time against the same kernel without one: the work should scale with the window.

    python3 scripts/decode_window_time.py [--gpu h100] [--heads 32/8] [--head-dim 128] [--page-size 16]
        [--points 8x32768,32x8192,1x131072] [--windows -1,4096,128] [--cache-dir DIR]

Builds the grouped decode kernel with a window (the reference decode sketch through tl.options.with_options, the
profile's decode default), then per point (batch x cache length, every sequence's cache full, one new token, causal)
times each window on the same random paged cache. GPU time: a sleep kernel is queued first, then 20 calls back to
back between two events (the host's launch cost hidden), median of 7 such windows. GB/s counts the K/V bytes the
window shows (min(cache, left + 1) keys a sequence). Prints a table last.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path


def build(gpu: str, heads_q: int, head_dim: int, cache_dir: Path | None):
    import tl
    from hardware_profiles import load_profile
    from kernel_abi.spec import KernelSpec
    from tl.options import with_options
    from translate import nvcc
    from translate.compiler import generate
    from translate.decode.params import default_decode_params
    from tuner.serving.launch.decode_kernel import load_decode_kernel

    profile = load_profile(gpu)
    spec = KernelSpec("gqa", head_dim, head_dim, True, "bf16", "paged", "decode", local=True)
    program = with_options(tl.parse_program(tl.load_sketch("gqa", True, "decode", "paged")), local=True)
    gen = generate(program, default_decode_params(spec, heads_q, profile), profile, spec)
    result = nvcc.compile_kernel(gen, profile.nvcc_arch, cache_dir=cache_dir or nvcc.default_cache_dir())
    if not result.ok:
        raise SystemExit(f"{gen.name} did not compile: {result.log[-2000:]}")
    return gen.name, load_decode_kernel(result.cubin, gen.meta())


def gpu_us(call, rounds: int = 7, calls: int = 20) -> float:
    import torch

    for _ in range(3):
        call()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(5_000_000)
        start.record()
        for _ in range(calls):
            call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--heads", default="32/8")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--points", default="8x32768,32x8192,1x131072")
    ap.add_argument("--windows", default="-1,4096,128", help="left sizes; -1: no window")
    ap.add_argument("--cache-dir", type=Path)
    args = ap.parse_args(argv)
    try:
        hq, hkv = (int(x) for x in args.heads.split("/"))
        points = [tuple(int(x) for x in p.split("x")) for p in args.points.split(",")]
        lefts = [int(w) for w in args.windows.split(",")]
        if hq % hkv or any(len(p) != 2 or p[1] % args.page_size for p in points):
            raise ValueError("heads q a multiple of kv; each point BATCHxCACHE with the cache a multiple of the page")
    except ValueError as exc:
        print(f"bad input: {exc}", file=sys.stderr)
        return 2

    import torch

    name, kernel = build(args.gpu, hq, args.head_dim, args.cache_dir)
    print(f"{torch.cuda.get_device_name()}  {name}", flush=True)
    d, page = args.head_dim, args.page_size
    rows = []
    for batch, cap in points:
        per = cap // page
        q = torch.randn(batch, 1, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(batch * per, page, hkv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        table = torch.randperm(batch * per, device="cuda", dtype=torch.int32).view(batch, per)
        lens = torch.full((batch,), cap, dtype=torch.int32, device="cuda")
        for left in lefts:
            window = (left, 0) if left >= 0 else (-1, -1)
            us = gpu_us(lambda: kernel(q, k, v, lens, table, window_size=window))
            keys = cap if left < 0 else min(cap, left + 1)
            rows.append((f"{batch} x {cap}", "none" if left < 0 else str(left), us,
                         batch * keys * hkv * d * 2 * 2 / (us * 1e-6) / 1e9))
    print("| batch x cache | window | µs | GB/s of the visible K/V |\n|---|---|---|---|")
    for point, window, us, gbs in rows:
        print(f"| {point} | {window} | {us:.1f} | {gbs:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
