"""Does an export serve a model's decode calls on the kernel path, correctly and fast? 

    python3 scripts/decode_serve_check.py EXPORT_DIR --model llama3-8b --page-size 16 --json out.json
    python3 scripts/decode_serve_check.py EXPORT_DIR --model deepseek-v3 --page-size 64

EXPORT_DIR is what `tune export` wrote after a decode campaign (`tune --phase decode`); on a GPU machine.

For each decode bucket's point (tuner/measure/decode_problem.py: batch 1/8/32/128 x KV 2k/8k/32k, one new token, the
model's heads; MLA absorbed: V the first 512 columns of the latent cache, passed as that view): the inputs of a
campaign trial, one call of the export's ``flash_attn_with_kvcache`` (``block_table=``), the path it took (kernel or
the reference, with the reason and the bucket), the error of the first and last sequence against the fp32
reference, and the time of the call against FA4's paged decode on the same inputs (GQA; FA4 has no absorbed MLA)
and the copy bandwidth. Exit 0 only when every point ran on the kernel path within 2% relative error. A table last.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("export", metavar="EXPORT_DIR", help="a `tune export` folder with decode configs")
    ap.add_argument("--model", default="llama3-8b", help="the model whose heads and dims are served (tuner.models)")
    ap.add_argument("--page-size", type=int, default=16, help="tokens per page of the paged cache")
    ap.add_argument("--json", help="write every row here")
    a = ap.parse_args(argv)

    import torch

    from hardware_profiles import load_profile
    from tuner.campaign.combos import expand_combinations
    from tuner.measure import decode, timer
    from tuner.measure.trial import BENCH_CROSS_CHECK_REL_ERR
    from tuner.serving import load_exported

    attn = load_exported(a.export)
    (combo,) = expand_combinations(load_profile("h100"), None, None, None, None, a.model, "paged", a.page_size,
                                   "decode")[:1]
    copy = decode.copy_gbs("cuda")
    rows, ok = [], True
    for p in combo.problems():
        x = decode.problem_inputs(p, "cuda")
        v = x["v"] if x["v"] is not None else x["k"][..., : p.d_v]    # MLA: the latent cache's first d_v columns

        def ours():
            return attn.flash_attn_with_kvcache(x["q"], x["k"], v, cache_seqlens=x["seqused_k"],
                                                block_table=x["page_table"], causal=p.causal,
                                                softmax_scale=p.softmax_scale)

        out = ours()
        torch.cuda.synchronize()
        row = {"point": p.key, "bucket": p.bucket, "path": attn.last_path, "served_bucket": attn.last_bucket,
               "reason": attn.last_reason, "rel_err": decode.cross_check(out, x, p)}
        ms = timer.time_ms(ours)
        row["ours_gbs"] = p.kv_bytes / ms / 1e6
        row["of_copy"] = row["ours_gbs"] / copy
        if p.variant != "mla":
            try:
                fa = decode.fa4_decode_call(p.point(), x)
                fa()
                row["fa4_gbs"] = p.kv_bytes / timer.time_ms(fa) / 1e6
                row["vs_fa4"] = row["ours_gbs"] / row["fa4_gbs"]
            except Exception as exc:  # noqa: BLE001 - FA4 not installed here: a reason, not a crash
                row["fa4_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
        row["ok"] = row["path"] == "kernel" and row["rel_err"] <= BENCH_CROSS_CHECK_REL_ERR
        ok &= row["ok"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        x = v = out = None
        torch.cuda.empty_cache()
    if a.json:
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "export": a.export,
                                            "model": a.model, "copy_gbs": copy, "rows": rows}, indent=1))
    print(f"\ncopy bandwidth {copy:.0f} GB/s; {torch.cuda.get_device_name()}")
    print("| point | bucket | path | rel err | ours GB/s | of copy | FA4 GB/s | ours/FA4 |")
    for r in rows:
        print(f"| {r['point']} | {r['served_bucket'] or '-'} | {r['path']} | {r['rel_err']:.1e} | {r['ours_gbs']:.0f} | "
              f"{r['of_copy']:.2f} | {r.get('fa4_gbs', float('nan')):.0f} | {r.get('vs_fa4', float('nan')):.2f} |")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
