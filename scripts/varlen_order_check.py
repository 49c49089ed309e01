"""The persistent scheduler's sequence order on packed sequences: longest first (attn_sm90::order_sequences, the
default) against the order given (``longest_first: false``), and FlashAttention-4's ``flash_attn_varlen_func``, in one
process, on varlen mixes whose long sequence comes last, first, or among random ones (llama3-8b heads, d128,
causal, bf16).

Both kernels pass tuner.measure.verify_varlen first and must give bit-identical outputs on every mix (the order moves tiles
between CTAs, not their arithmetic). Timing: `--rounds` interleaved rounds of tuner.measure.timer.time_ms (triton's
do_bench median, L2 flushed) per kernel and FA4; the table gives median TFLOPS [min, max] and the median of the
per-round ratios.

    python scripts/varlen_order_check.py --out $OUT/varlen_order.json [--rounds 5] [--cache-dir .kcache]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

VARIANTS = {"longest_first": {}, "given": {"longest_first": False}}


def mixes() -> dict[str, tuple[int, ...]]:
    """Query lengths per sequence (keys = queries): a long sequence last, the same first, among random ones."""
    import torch

    gen = torch.Generator().manual_seed(14)
    short = [int(x) for x in torch.randint(1, 513, (48,), generator=gen)]
    spread = [int(x) for x in torch.randint(1, 4097, (12,), generator=gen)]
    return {"32x256 then 8k": (256,) * 32 + (8192,), "8k then 32x256": (8192,) + (256,) * 32,
            "48 random 1-512 then 4k": tuple(short) + (4096,), "12 random 1-4096": tuple(spread),
            "8x2k": (2048,) * 8}


def main(argv=None) -> int:
    import torch

    from paged_copy_check import build
    from tuner.measure import timer
    from tuner.measure.serving import ours_call
    from tuner.measure.serving_baselines import BASELINES
    from tuner.measure.serving_inputs import make_mix_inputs
    from tuner.measure.mixes import ServingProblem
    from tuner.models import load_models
    from tuner.serving.launch import load_kernel
    from tuner.measure.verify_varlen import verify_varlen

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--out", default="varlen_order.json")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cache-dir", default=".kcache")
    args = ap.parse_args(argv)

    spec, built = build(VARIANTS, Path(args.cache_dir), args.gpu, "varlen")
    kernels, record = {}, {"device": torch.cuda.get_device_name(), "rounds": args.rounds, "kernels": {}, "rows": []}
    for name, (gen, res) in built.items():
        report = verify_varlen(load_kernel(res.cubin, gen.meta()), spec) if res.ok else None
        ok = report is not None and report.passed
        record["kernels"][name] = {"name": gen.name, "ok": res.ok, "verified": ok,
                                   "reason": report.reason if report is not None else res.log[-500:]}
        print(f"{name}: {gen.name} verified={ok}", flush=True)
        if not ok:
            Path(args.out).write_text(json.dumps(record, indent=2, default=str))
            return 1
        kernels[name] = load_kernel(res.cubin, gen.meta())

    model = load_models()["llama3-8b"]
    fa4 = next(b for b in BASELINES if b.name == "fa4")
    for label, lengths in mixes().items():
        problem = ServingProblem("varlen", label, lengths, lengths, "gqa", model.heads_q, model.heads_kv, 128, 128,
                                 True, "bf16")
        x = make_mix_inputs(problem, "cuda")
        calls = {name: ours_call(kernel, problem, x) for name, kernel in kernels.items()}
        outs = [call() for call in calls.values()]
        if not all(torch.equal(outs[0], o) for o in outs[1:]):
            print(f"{label}: the orders give different outputs", flush=True)
            return 1
        try:
            prep = fa4.prepare(problem, x)
            prep.call()
            calls["fa4"] = prep.call
        except Exception as exc:  # noqa: BLE001 - FA4 missing: ours are still compared
            print(f"fa4 not timed: {type(exc).__name__}: {exc}", flush=True)
        tflops = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, call in calls.items():
                tflops[name].append(problem.flops / (timer.time_ms(call) * 1e-3) / 1e12)
        row = {"mix": label, "batch": len(lengths), "flops": problem.flops, **tflops}
        row["longest_first/given"] = statistics.median(a / b for a, b in zip(tflops["longest_first"], tflops["given"]))
        for name in kernels:
            if "fa4" in tflops:
                row[f"{name}/fa4"] = statistics.median(a / b for a, b in zip(tflops[name], tflops["fa4"]))
        record["rows"].append(row)
        cells = "  ".join(f"{n} {statistics.median(v):.1f} [{min(v):.1f}, {max(v):.1f}]" for n, v in tflops.items())
        print(f"{label:<24} {cells}  |  longest_first/given {row['longest_first/given']:.3f}", flush=True)
        x = outs = calls = None
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(record, indent=2, default=str))
    print(f"\nmix                      longest_first/given  longest_first/fa4  given/fa4   ({args.rounds} rounds)")
    for row in record["rows"]:
        print(f"{row['mix']:<24} {row['longest_first/given']:>19.3f}  {row.get('longest_first/fa4', float('nan')):>17.3f}"
              f"  {row.get('given/fa4', float('nan')):>9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
