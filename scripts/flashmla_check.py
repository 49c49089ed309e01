"""Our absorbed-MLA decode kernel against FlashMLA's Hopper dense decode, in one process, on the same inputs (issue 15's
FlashMLA column). FlashMLA is not a dependency: `scripts/flashmla/build.sh FLASHMLA_DIR CUTLASS_INCLUDE OUT.so`
builds its bf16 split kernel, combine and scheduler with a C entry point (scripts/flashmla/shim.cu), and this script
loads that library with ctypes.

    python3 scripts/flashmla_check.py LIB.so OURS_DIR [--rounds 5] [--out FILE]

OURS_DIR: what `tune build --gpu h100 --variant mla --phase decode --layout paged --dtype bf16 --causal` wrote (one
kernel, the 128-head default); `--ours16 DIR` the same built with the 16-head default's parameters (`--params
'{"block_m": 16, "block_n": 64, "warps_m": 1, "warps_n": 4, "kv_stages": 2, "mma":
"sm80", "kv_load": "gather"}'`), which adds 16-head points.

Both are called on the same shuffled 64-token pages (tuner.measure.decode.make_mla_inputs), must agree (max |a - b| <=
2e-2 on bf16 outputs of unit-normal inputs) before anything is timed, and are then timed interleaved over ``--rounds``
rounds, the order alternating (tuner.measure.timer.time_ms: triton's do_bench median, L2 flushed). FlashMLA's
schedule (its get_mla_metadata) is computed once per point, outside the timing, as a server does once per step.
GB/s is the latent cache read once over the time.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

AGREE = 2e-2


def load_flashmla(path: Path):
    lib = ctypes.CDLL(str(path))
    p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    lib.flashmla_num_sm_parts.argtypes = [i, i, i]
    lib.flashmla_meta_words.argtypes = []
    lib.flashmla_schedule.argtypes = [p, i, i, p, p, i, p]
    lib.flashmla_decode.argtypes = [p] * 10 + [i] * 5 + [f, i, i, p]
    return lib


def flashmla_call(lib, x: dict, scale: float, causal: bool):
    """A no-argument callable running FlashMLA's decode on the inputs ``x`` (make_mla_inputs), and its output."""
    import torch

    q, k, table, used = x["q"], x["k"], x["page_table"], x["seqused_k"]
    b, s_q, h_q, _ = q.shape
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    parts = lib.flashmla_num_sm_parts(sms, s_q, h_q)
    meta = torch.empty(parts, lib.flashmla_meta_words(), dtype=torch.int32, device=q.device)
    splits = torch.empty(b + 1, dtype=torch.int32, device=q.device)
    stream = torch.cuda.current_stream().cuda_stream
    err = lib.flashmla_schedule(used.data_ptr(), b, s_q, meta.data_ptr(), splits.data_ptr(), parts, stream)
    if err:
        raise RuntimeError(f"FlashMLA's scheduler failed (CUDA error {err})")
    rows = s_q * h_q
    out = torch.empty(b, s_q, h_q, 512, dtype=q.dtype, device=q.device)
    lse = torch.empty(b, rows, dtype=torch.float32, device=q.device)
    lse_accum = torch.empty(b + parts, rows, dtype=torch.float32, device=q.device)
    o_accum = torch.empty(b + parts, rows, 512, dtype=torch.float32, device=q.device)
    args = (q.data_ptr(), k.data_ptr(), table.data_ptr(), used.data_ptr(), out.data_ptr(), lse.data_ptr(),
            lse_accum.data_ptr(), o_accum.data_ptr(), meta.data_ptr(), splits.data_ptr(), b, s_q, h_q,
            k.shape[0], table.shape[1], scale, int(causal), parts, stream)

    def call():
        e = lib.flashmla_decode(*args)
        if e:
            raise RuntimeError(f"FlashMLA's decode failed (CUDA error {e})")
        return out
    return call, (meta, splits, lse, lse_accum, o_accum)


def main(argv=None) -> int:
    import torch

    from tuner.measure.timer import alternating_rounds
    from tuner.measure.decode import MLAPoint, copy_bandwidth_gbs, make_mla_inputs, parse_mla_points
    from tuner.serving.launch.decode_kernel import load_decode_kernel

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib", type=Path)
    ap.add_argument("ours", type=Path)
    ap.add_argument("--ours16", type=Path, help="our kernel for 16 heads (the default there is another tile)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="flashmla_check.json")
    ap.add_argument("--points", help="BxKV[xTOKENS] points at 128 heads, comma-separated (e.g. 64x4096,64x8192x2) "
                                     "instead of the default list")
    args = ap.parse_args(argv)
    try:
        custom = parse_mla_points(args.points) if args.points else None
    except ValueError as exc:
        ap.error(f"--points: {exc}")

    lib = load_flashmla(args.lib)

    def load(folder: Path):
        record_path = next(folder.glob("*.json"))
        meta = json.loads(record_path.read_text())["meta"]
        return load_decode_kernel(record_path.with_suffix(".cubin").read_bytes(), meta), meta

    ours128, meta = load(args.ours)
    ours16 = load(args.ours16)[0] if args.ours16 else None
    copy = copy_bandwidth_gbs()
    result = {"device": torch.cuda.get_device_name(), "copy_gbs": copy, "ours": meta["name"], "rounds": args.rounds,
              "rows": []}
    print(f"{result['device']}: copy bandwidth {copy:.0f} GB/s; ours {meta['name']}", flush=True)
    points = ([MLAPoint(b, kv) for b, kv in ((64, 4096), (128, 8192), (64, 16384), (128, 16384))]
              + [MLAPoint(64, 8192, seqlen_q=sq) for sq in (2, 4)]
              + ([MLAPoint(b, kv, heads_q=16) for b, kv in ((64, 4096), (128, 8192))] if ours16 else []))
    points = custom or points
    scale = 1.0 / math.sqrt(576)
    for p in points:
        x = make_mla_inputs(p)
        ours = ours128 if p.heads_q > 16 else ours16
        calls = {"ours": lambda: ours(x["q"], x["k"], None, cache_seqlens=x["seqused_k"], page_table=x["page_table"],
                                      softmax_scale=scale)}
        fm, keep = flashmla_call(lib, x, scale, p.causal)
        calls["flashmla"] = fm
        a, b = calls["ours"](), calls["flashmla"]()
        torch.cuda.synchronize()
        diff = float((a.float() - b.float()).abs().max())
        if not diff <= AGREE:
            print(f"  {p.label()}: ours and FlashMLA disagree (max |a - b| {diff:.3g}); not timed", flush=True)
            result["rows"].append({"point": p.label(), "max_diff": diff, "agree": False})
            continue
        gbs = {label: [p.kv_bytes / t / 1e6 for t in ms] for label, ms in alternating_rounds(calls, args.rounds).items()}
        ratio = statistics.median(o / f for o, f in zip(gbs["ours"], gbs["flashmla"]))
        row = {"point": p.label(), "max_diff": diff, **gbs, "ours/flashmla": ratio,
               "ours_tflops": statistics.median(gbs["ours"]) * p.flops / p.kv_bytes / 1e3,
               "flashmla_tflops": statistics.median(gbs["flashmla"]) * p.flops / p.kv_bytes / 1e3}
        result["rows"].append(row)
        cells = "  ".join(f"{k} {statistics.median(g):.0f} [{min(g):.0f}, {max(g):.0f}] ({statistics.median(g) / copy:.2f})"
                          for k, g in gbs.items())
        print(f"  {p.label():<26} GB/s (of copy) {cells}  ours/flashmla {ratio:.3f}  TFLOPS {row['ours_tflops']:.0f} / "
              f"{row['flashmla_tflops']:.0f}", flush=True)
        del keep
        x = calls = a = b = None
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
