"""nvcc seconds per kernel, alone and batched (several kernels in one translation unit), for a set of
Hopper candidates of one spec: the compile cost a campaign pays per trial (BENCHMARKS.md).

    python scripts/compile_cost.py [--gpu h100] [--variant mha] [--head-dim 128] [--batch 4] [--jobs 1]

No cache: every kernel is compiled afresh. Prints one line per kernel alone, then the batched wall time.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tl  # noqa: E402
import translate  # noqa: E402
from hardware_profiles import load_profile  # noqa: E402
from translate import nvcc  # noqa: E402
from translate.defaults import hopper_params  # noqa: E402
from translate.params import KernelParams  # noqa: E402
from translate.problem import KernelSpec  # noqa: E402

# Four distinct Hopper candidates: the default and three neighbours a search would try. Block N 96 is one of
# CuTe's base wgmma shapes, 112 is not and the kernel declares its op (translate/sm90/wgmma_ops.py):
# --neighbour-n picks.
CHANGES = [{}, {"block_n": 96}, {"pingpong": True}, {"pv_operand": "ss", "persistent": False}]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--variant", default="mha")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--causal", action="store_true", default=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--neighbour-n", type=int, default=96, help="block N of the second candidate (112: not a base wgmma shape)")
    args = ap.parse_args()
    profile = load_profile(args.gpu)
    d_qk = 192 if args.variant == "mla" else args.head_dim
    spec = KernelSpec(args.variant, d_qk, 128 if args.variant == "mla" else args.head_dim, args.causal, "bf16")
    base = hopper_params(profile, spec).to_dict()
    program = tl.parse_program(tl.load_sketch(spec.variant, spec.causal, "ws_overlap"))
    from translate.defaults import probe_problem
    from translate.params import validate

    changes = [{**c, "block_n": args.neighbour_n} if "block_n" in c else c for c in CHANGES]
    candidates = [KernelParams.from_dict({**base, **c}) for c in changes]
    candidates = [p for p in candidates if not validate(p, profile, probe_problem(spec), warp_specialized=True)]
    kernels = [translate.generate(program, p, profile, spec) for p in candidates]
    alone = []
    for k in kernels:
        t0 = time.monotonic()
        (r,) = nvcc.compile_kernels([k], profile.nvcc_arch, jobs=1, batch_size=1)
        alone.append(time.monotonic() - t0)
        extended = "declares its wgmma op" if "struct TL_MMA_" in k.body else "base wgmma shapes"
        print(f"alone   {k.name}: {alone[-1]:.1f} s ({'ok' if r.ok else r.error_kind}; {extended})", flush=True)
    t0 = time.monotonic()
    results = nvcc.compile_kernels(kernels, profile.nvcc_arch, jobs=args.jobs, batch_size=args.batch)
    wall = time.monotonic() - t0
    ok = sum(r.ok for r in results)
    print(f"batched {len(kernels)} kernels, {args.batch} per translation unit, {args.jobs} job(s): {wall:.1f} s wall, "
          f"{wall / len(kernels):.1f} s per kernel ({ok}/{len(kernels)} ok); alone: mean {sum(alone) / len(alone):.1f} s")
    return 0 if ok == len(kernels) else 1


if __name__ == "__main__":
    sys.exit(main())
