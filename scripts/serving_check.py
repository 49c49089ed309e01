"""Does an export serve every serving mix of a layout on the kernel path, correctly?

    python3 scripts/serving_check.py EXPORT_DIR --layout paged --page-size 16 --model llama3-8b --json out.json

EXPORT_DIR is what `tune export` wrote after a varlen or paged campaign (`tune --layout ...`); on a GPU machine.

For each mix of tuner/measure/mixes.toml of the layout (the model's heads and dims): the inputs of a campaign trial
(tuner.measure.serving.seeded_inputs: packed q, K/V packed or in a shuffled paged cache), one call of the
export's ``flash_attn_varlen_func`` (``block_table=`` for paged, FA2's name), then the path it took (kernel or
SDPA, with the reason and the bucket) and the error against the fp32 reference computed sequence by sequence,
beside torch's own bf16 error there. A row is OK on the kernel path within 2x SDPA's bf16 error plus one bf16
ulp, and 2% relative. Exit 0 only when every mix is OK. Prints a table last.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REL_ERR_BOUND = 2e-2


def _rel(a, b) -> float:
    base = float(b.float().norm())
    return float((a.float() - b.float()).norm()) / base if base else float("inf")


def check_mix(attention, problem) -> dict:
    import torch

    from tuner.measure.serving import seeded_inputs
    from tuner.measure.verify import reference

    x = seeded_inputs(problem, 1, "cuda")[0]
    kwargs = dict(causal=problem.causal, softmax_scale=problem.softmax_scale)
    if problem.layout == "paged":
        out = attention.flash_attn_varlen_func(x.q, x.k_cache, x.v_cache, x.cu_seqlens_q, x.cu_seqlens_k,
                                               problem.max_seqlen_q, problem.max_seqlen_k, block_table=x.page_table,
                                               seqused_k=x.seqused_k, **kwargs)
    else:
        out = attention.flash_attn_varlen_func(x.q, x.k, x.v, x.cu_seqlens_q, x.cu_seqlens_k, problem.max_seqlen_q,
                                               problem.max_seqlen_k, **kwargs)
    torch.cuda.synchronize()
    path, reason, bucket = attention.last_path, attention.last_reason, attention.last_bucket
    ref = torch.zeros_like(out, dtype=torch.float32)
    lowp = torch.zeros_like(out, dtype=torch.float32)
    cu_q, cu_k = x.cu_seqlens_q.tolist(), x.cu_seqlens_k.tolist()
    for b in range(problem.batch):
        qs = x.q[cu_q[b]:cu_q[b + 1]][None]
        ks, vs = x.k[cu_k[b]:cu_k[b + 1]][None], x.v[cu_k[b]:cu_k[b + 1]][None]
        if qs.shape[1] == 0:
            continue
        ref[cu_q[b]:cu_q[b + 1]] = reference(qs, ks, vs, problem.causal)[0]
        lowp[cu_q[b]:cu_q[b + 1]] = reference(qs, ks, vs, problem.causal, dtype=qs.dtype)[0].float()
    row = {"mix": problem.name, "rule_bucket": problem.bucket, "path": path, "reason": reason, "bucket": bucket,
           "finite": bool(torch.isfinite(out).all()),
           "max_abs_err_vs_fp32": float((out.float() - ref).abs().max()), "rel_err_vs_fp32": _rel(out, ref),
           "torch_bf16_max_abs_err_vs_fp32": float((lowp - ref).abs().max())}
    row["ok"] = (path == "kernel" and row["finite"] and row["rel_err_vs_fp32"] < REL_ERR_BOUND
                 and row["max_abs_err_vs_fp32"] <= 2 * row["torch_bf16_max_abs_err_vs_fp32"] + 2 ** -7)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("export_dir", metavar="EXPORT_DIR", help="a `tune export` folder with varlen or paged configs")
    ap.add_argument("--layout", choices=("varlen", "paged"), required=True)
    ap.add_argument("--page-size", type=int, default=None, help="tokens per page (paged)")
    ap.add_argument("--model", default="llama3-8b", help="the model whose heads and dims are served (tuner.models)")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--json", default=None, help="write every row here")
    args = ap.parse_args(argv)
    from tuner.serving import load_exported
    from tuner.measure.mixes import serving_problems
    from tuner.models import get_model

    m = get_model(args.model)
    attention = load_exported(args.export_dir)
    problems = serving_problems(args.layout, m.variant, m.heads_q, m.heads_kv, m.d_qk, m.d_v, True, args.dtype,
                                args.page_size)
    rows = []
    for p in problems:
        try:
            rows.append(check_mix(attention, p))
        except Exception as exc:  # noqa: BLE001 - a failing mix is a row with its reason
            rows.append({"mix": p.name, "rule_bucket": p.bucket, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
    result = {"export_dir": args.export_dir, "layout": args.layout, "page_size": args.page_size, "model": args.model,
              "rows": rows, "stats": dict(attention.stats), "ok": bool(rows) and all(r["ok"] for r in rows)}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nexport {args.export_dir}: {args.layout}{f' page {args.page_size}' if args.page_size else ''}, "
          f"{args.model}")
    print(f"{'mix':<20}{'rule bucket':<18}{'path':<8}{'bucket':<18}{'rel err':>10}{'max abs':>10}{'torch bf16':>12}  ok")
    for r in rows:
        if "error" in r:
            print(f"{r['mix']:<20}{r['rule_bucket']:<18}error: {r['error'][:100]}")
            continue
        print(f"{r['mix']:<20}{r['rule_bucket']:<18}{r['path']:<8}{str(r['bucket']):<18}{r['rel_err_vs_fp32']:>10.2e}"
              f"{r['max_abs_err_vs_fp32']:>10.2e}{r['torch_bf16_max_abs_err_vs_fp32']:>12.2e}  {r['ok']}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
