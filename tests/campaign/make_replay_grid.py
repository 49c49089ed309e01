"""Write a recorded grid for the replay backend: every valid configuration of a search space, valued by
the performance model (tuner/campaign/perfmodel.py), plus optional planted faults.

    python tests/campaign/make_replay_grid.py --gpu h100 --variant mha --head-dim 128 --dtype bf16 \
        --causal -o tests/campaign/fixtures/h100_mha_d128_bf16_causal.jsonl.gz
"""
from __future__ import annotations

import argparse
import gzip
import itertools
import json
from pathlib import Path

from hardware_profiles import load_profile
from search_spaces import load_space
from translate.params import KernelParams, validate
from tuner.campaign.perfmodel import model_tflops
from kernel_abi.spec import grid_problems, spec_for

SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
# Library numbers measured on an H100 (BENCHMARKS.md) (bf16, d128): flash / cuDNN / efficient, per seqlen.
H100_BASELINES = {512: (182, 318, 100), 1024: (240, 420, 130), 2048: (290, 500, 150), 4096: (310, 550, 160),
                  8192: (320, 580, 168), 16384: (327, 594, 171)}


def all_configs(space, profile, head_dim: int, dtype: str):
    domains = space.domains(profile, head_dim, dtype)
    names = [p.name for p in space.params]
    for combo in itertools.product(*(domains[n] for n in names)):
        values = dict(zip(names, combo))
        if any(not space.active(p, values) and values[p.name] != p.default for p in space.params):
            continue  # an inactive conditional parameter takes its default only
        yield KernelParams(**values)


def build(gpu: str, variant: str, head_dim: int | None, dtype: str, causal: bool, faults: dict[str, dict]):
    profile, space = load_profile(gpu), load_space(variant)
    spec = spec_for(variant, head_dim, dtype, causal)
    problems = grid_problems(variant, spec.d_qk, dtype, causal, seqlens=SEQLENS)
    meta = {"gpu": gpu, "device_name": profile.device_names[0], "variant": variant, "d_qk": spec.d_qk,
            "d_v": spec.d_v, "dtype": dtype, "causal": causal, "seqlens": list(SEQLENS), "model": "perfmodel",
            "baselines": {str(s): dict(zip(("flash", "cudnn", "efficient"), v)) for s, v in H100_BASELINES.items()}}
    rows = [{"_meta": meta}]
    for params in all_configs(space, profile, spec.d_qk, dtype):
        if any(validate(params, profile, p) for p in problems):
            continue
        rows.append({"params": params.to_dict(),
                     "tflops": {str(p.seqlen_k): model_tflops(params, p, profile) for p in problems}})
    for key, fault in faults.items():
        rows.append(fault)
    return rows


def write(rows, out: Path) -> None:
    opener = gzip.open if out.suffix == ".gz" else open
    with opener(out, "wt") as fh:
        for r in rows:
            fh.write(json.dumps(r, separators=(",", ":")) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--variant", default="mha")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("-o", "--out", type=Path, required=True)
    a = ap.parse_args()
    rows = build(a.gpu, a.variant, a.head_dim, a.dtype, a.causal, {})
    write(rows, a.out)
    print(f"{len(rows) - 1} configurations -> {a.out}")


if __name__ == "__main__":
    main()
