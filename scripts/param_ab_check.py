"""One parameter change of the dense Hopper defaults, re-timed against the defaults (issue 16: defaults from
measurement, not from one pass of single measurements).

    python scripts/param_ab_check.py --gpu h100 --change '{"rescale_threshold": 8}' \
        [--specs gqa128c,mha128n,mha64c] [--seqlens 1024,2048,4096,8192,16384] [--rounds 15] [--out ab.json]

For each spec (variant, head dim, c = causal / n = not; bf16) it builds what `tune build` gives (the profile's
default, warp-specialised) and the same kernel with CHANGE, passes both through the verification gate
(tuner.verify), then at each paper-grid point times the two and cuDNN in paired rounds on the same rotating
inputs (the order of the two kernels flipped every round; the confirm rule's do_bench windows). Per point: the
default's ms over the changed kernel's, median of the rounds with the confirm rule's 95% interval
(tuner/campaign/confirm.py), and each kernel's TFLOPS over cuDNN's. Prints a table last; exit 1 when a kernel
does not build or does not pass the gate.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_SPECS = "mha128c,mha128n,gqa128c,gqa128n,mha64c,mha64n,mqa64c"


def parse_spec(text: str):
    """``gqa128c`` -> KernelSpec("gqa", 128, 128, True, "bf16")."""
    from tuner.problem import KernelSpec

    body, causal = text[:-1], text[-1]
    variant = body.rstrip("0123456789")
    if causal not in "cn" or variant not in ("mha", "gqa", "mqa", "mla") or not body[len(variant):].isdigit():
        raise ValueError(f"a spec is variant, head dim and c or n, e.g. gqa128c; got {text!r}")
    head_dim = int(body[len(variant):])
    if variant == "mla":
        return KernelSpec("mla", 192, 128, causal == "c", "bf16")
    return KernelSpec(variant, head_dim, head_dim, causal == "c", "bf16")


def build(gpu: str, specs: list, change: dict, cache_dir: Path):
    """{spec label: {"default": (gen, result), "changed": (gen, result)}}, compiled in one pool."""
    from tuner.default_export import compile_changes

    built = compile_changes(gpu, [(spec, {"default": {}, "changed": change}) for _, spec in specs], cache_dir)
    return {label: kernels for (label, _), kernels in zip(specs, built)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--change", required=True, help="JSON object of KernelParams fields")
    ap.add_argument("--specs", default=DEFAULT_SPECS)
    ap.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default="param_ab.json")
    ap.add_argument("--cache-dir", default=".kcache")
    args = ap.parse_args(argv)
    try:
        change = json.loads(args.change)
        specs = [(text, parse_spec(text)) for text in args.specs.split(",")]
        seqlens = tuple(int(s) for s in args.seqlens.split(","))
    except (ValueError, json.JSONDecodeError) as exc:
        print(f"bad input: {exc}", file=sys.stderr)
        return 2
    if not isinstance(change, dict) or not change:
        print("bad input: --change must be a non-empty JSON object", file=sys.stderr)
        return 2

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tuner import bench
    from tuner.campaign.confirm import ConfirmRule, verdict
    from tuner.problem import grid_problems
    from tuner.runtime import load_kernel
    from tuner.verify import verify

    rule = ConfirmRule(rounds=args.rounds)
    timing = bench.Timing(**rule.timing())
    built = build(args.gpu, specs, change, Path(args.cache_dir))
    record = {"device": torch.cuda.get_device_name(), "change": change, "rule": rule.to_dict(), "kernels": {},
              "rows": []}
    kernels: dict = {}
    for label, spec in specs:
        for role, (gen, res) in built[label].items():
            info = {"name": gen.name, "ok": res.ok, "registers": res.registers, "spill_stores": res.spill_stores}
            if res.ok:
                kernel = load_kernel(res.cubin, gen.meta())
                report = verify(kernel, spec)
                info.update(verified=bool(report.passed), reason=report.reason)
                if report.passed:
                    kernels[(label, role)] = kernel
            record["kernels"][f"{label}/{role}"] = info
            print(f"{label} {role}: {gen.name} regs {res.registers} spills {res.spill_stores} "
                  f"verified={info.get('verified')} {info.get('reason') or ''}", flush=True)
    if len(kernels) != 2 * len(specs):
        Path(args.out).write_text(json.dumps(record, indent=1, default=str))
        return 1

    for label, spec in specs:
        for problem in grid_problems(spec.variant, spec.d_qk if spec.variant != "mla" else 192, "bf16", spec.causal,
                                     seqlens=seqlens):
            inputs = bench.make_inputs(problem, timing.rotate)
            calls = {role: bench._rotating(kernels[(label, role)], inputs) for role in ("default", "changed")}
            sdpa = bench._rotating(bench._sdpa_call(problem), inputs)
            ms = {"default": [], "changed": [], "cudnn": []}
            for r in range(rule.rounds):
                order = ("default", "changed") if r % 2 == 0 else ("changed", "default")
                for role in order:
                    ms[role].append(bench.time_ms(calls[role], timing=timing))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    ms["cudnn"].append(bench.time_ms(sdpa, timing=timing))
            v = verdict(ms["changed"], ms["default"], rule)
            row = {"spec": label, "seqlen": problem.seqlen_q, "verdict": v.to_dict(), "ms": ms,
                   "default_over_cudnn": statistics.median(c / d for d, c in zip(ms["default"], ms["cudnn"])),
                   "changed_over_cudnn": statistics.median(c / d for d, c in zip(ms["changed"], ms["cudnn"])),
                   "default_tflops": bench.tflops(problem, statistics.median(ms["default"]))}
            record["rows"].append(row)
            print(f"{label} s{problem.seqlen_q}: changed {v.text()}  default/cuDNN {row['default_over_cudnn']:.3f} "
                  f"changed/cuDNN {row['changed_over_cudnn']:.3f}", flush=True)
            inputs = calls = sdpa = None
            torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(record, indent=1, default=str))
    print(f"\n{record['device']}: {json.dumps(change)} against the default, {rule.rounds} paired rounds "
          "(default ms / changed ms, median [95%])")
    print(f"{'spec':<10}{'seqlen':>7}  {'changed':<26}{'default/cuDNN':>14}{'changed/cuDNN':>14}{'TFLOPS':>8}")
    for row in record["rows"]:
        v = row["verdict"]
        print(f"{row['spec']:<10}{row['seqlen']:>7}  x{v['ratio']:.3f} [{v['low']:.3f}, {v['high']:.3f}]"
              f"{'*' if v['confirmed'] else ' ':<5}{row['default_over_cudnn']:>14.3f}{row['changed_over_cudnn']:>14.3f}"
              f"{row['default_tflops']:>8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
