"""Varlen prefill (packed sequences) and paged prefill, ours against FlashAttention-4's flash_attn_varlen_func
and torch SDPA on the padded equivalent, in one process (issue 14's cases: llama3-8b heads 32q/8kv, d128,
causal, bf16; 16k tokens as 8x2k, 1x8k + 32x256, 64 random lengths 1-512; paged: 2 sequences of 2k queries
on a cached prefix of 6k, pages of 16 and 128, the table shuffled).

    python scripts/bench_varlen.py --gpu h100 --out $OUT/varlen.json [--cache-dir .kcache]

Each of our kernels passes tuner.verify_varlen first. TFLOPS count the visible (query, key) pairs:
4 * heads * d * sum over sequences of s(s+1)/2 (causal). Timing: triton.testing.do_bench, median.
Prints a table last.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

HQ, HKV, D = 32, 8, 128


def mixes() -> dict:
    """name -> (query lengths, key lengths); the last is the paged rows' shape with contiguous keys."""
    g = torch.Generator().manual_seed(0)
    random = torch.randint(1, 513, (64,), generator=g).tolist()
    return {"8x2k": ([2048] * 8,) * 2, "1x8k+32x256": ([8192] + [256] * 32,) * 2,
            "64 random 1-512": (random, random), "2x(2k on 6k)": ([2048] * 2, [8192] * 2)}


def visible_pairs(lens_q, lens_k, causal: bool) -> int:
    """(query, key) pairs computed: causal aligns bottom-right, so a query sees the keys before its own."""
    return sum(sq * (sk - sq) + sq * (sq + 1) // 2 if causal else sq * sk for sq, sk in zip(lens_q, lens_k))


def build(gpu: str, cache_dir: Path, changes: dict | None = None, causal: bool = True, layout: str = "varlen"):
    import tl
    import translate
    from hardware_profiles import load_profile
    from translate import nvcc
    from translate.defaults import default_params
    from translate.params import KernelParams
    from tuner import runtime
    from tuner.problem import KernelSpec
    from tuner.verify_varlen import verify_varlen

    profile = load_profile(gpu)
    spec = KernelSpec("gqa", D, D, causal, "bf16", layout)
    params = KernelParams.from_dict({**default_params(profile, spec, "ws_overlap").to_dict(), **(changes or {})})
    gen = translate.generate(tl.parse_program(tl.load_sketch("gqa", causal, "ws_overlap", layout)), params,
                             profile, spec)
    result = nvcc.compile_kernels([gen], profile.nvcc_arch, batch_size=1, cache_dir=cache_dir)[0]
    if not result.ok:
        raise RuntimeError(result.log[-3000:])
    kernel = runtime.load_kernel(result.cubin, gen.meta())
    report = verify_varlen(kernel, spec)
    if not report.passed:
        raise RuntimeError(f"{gen.name}: {report.reason}")
    return gen, kernel


def paged_row(ours, fa4, page: int, do_bench, batch: int = 2, sq: int = 2048, sk: int = 8192) -> dict:
    """2k queries per sequence after a cached prefix of 6k keys, the keys in a shuffled paged cache."""
    g = torch.Generator().manual_seed(page)
    pages_per = sk // page
    table = torch.randperm(batch * pages_per, generator=g).to("cuda", torch.int32).view(batch, pages_per)
    kc = torch.randn(batch * pages_per, page, HKV, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    q = torch.randn(batch * sq, HQ, D, device="cuda", dtype=torch.bfloat16)
    cq = torch.arange(0, (batch + 1) * sq, sq, dtype=torch.int32, device="cuda")
    used = torch.full((batch,), sk, dtype=torch.int32, device="cuda")
    flops = 4 * HQ * D * batch * (sq * (sk - sq) + sq * (sq + 1) // 2)
    row = {"mix": f"paged {page}: 2x(2k on 6k)", "tokens": batch * sq}
    calls = {"ours": lambda: ours.paged(q, kc, vc, cq, used, table, sq)}
    if fa4 is not None:
        calls["fa4"] = lambda: fa4.flash_attn_varlen_func(q, kc, vc, cu_seqlens_q=cq, cu_seqlens_k=None,
                                                          seqused_k=used, page_table=table, max_seqlen_q=sq,
                                                          causal=True)
    outs = {}
    for key, call in calls.items():
        try:
            outs[key] = call()
            row[key] = flops / do_bench(call, warmup=25, rep=100, return_mode="median") / 1e9
        except Exception as exc:  # noqa: BLE001 - a baseline that cannot run is reported
            row[f"{key}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    if "fa4" in outs and "ours" in outs:
        fa4_out = outs["fa4"][0] if isinstance(outs["fa4"], tuple) else outs["fa4"]
        row["max_abs_diff_vs_fa4"] = float((outs["ours"].float() - fa4_out.float()).abs().max())
    if "fa4" in row and "ours" in row:
        row["ours_over_fa4"] = row["ours"] / row["fa4"]
    return row


def main(argv=None) -> int:
    from triton.testing import do_bench

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--out", default="varlen.json")
    ap.add_argument("--cache-dir", default=".kcache")
    args = ap.parse_args(argv)
    try:
        import flash_attn.cute as fa4
    except ImportError as exc:
        fa4, fa4_error = None, str(exc)
    gen, ours = build(args.gpu, Path(args.cache_dir))
    result = {"device": torch.cuda.get_device_name(), "kernel": gen.name, "params": gen.params.to_dict(), "rows": []}
    for name, (lens, lens_k) in mixes().items():
        total, total_k = sum(lens), sum(lens_k)
        q = torch.randn(total, HQ, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(total_k, HKV, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        cuk = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        m, mk = max(lens), max(lens_k)
        flops = 4 * HQ * D * visible_pairs(lens, lens_k, True)
        row = {"mix": name, "tokens": total}
        calls = {"ours": lambda: ours.varlen(q, k, v, cu, cuk, m, mk)}
        if fa4 is not None:
            calls["fa4"] = lambda: fa4.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cuk,
                                                              max_seqlen_q=m, max_seqlen_k=mk, causal=True)
        if lens == lens_k:   # SDPA's is_causal is top-left: only self-attention pads to the same result
            padded = [torch.zeros(len(lens), h, m, D, device="cuda", dtype=torch.bfloat16) for h in (HQ, HKV, HKV)]
            for b, s in enumerate(lens):
                for dst, src in zip(padded, (q, k, v)):
                    dst[b, :, :s] = src[cu[b]:cu[b] + s].transpose(0, 1)
            calls["sdpa_padded"] = lambda: torch.nn.functional.scaled_dot_product_attention(
                *padded, is_causal=True, enable_gqa=True)
        outs = {}
        for key, call in calls.items():
            try:
                outs[key] = call()
                ms = do_bench(call, warmup=25, rep=100, return_mode="median")
                row[key] = flops / ms / 1e9
            except Exception as exc:  # noqa: BLE001 - a baseline that cannot run is reported
                row[f"{key}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        if "fa4" in outs:   # same inputs: the two must agree to bf16 rounding
            fa4_out = outs["fa4"][0] if isinstance(outs["fa4"], tuple) else outs["fa4"]
            row["max_abs_diff_vs_fa4"] = float((outs["ours"].float() - fa4_out.float()).abs().max())
        if "fa4" in row:
            row["ours_over_fa4"] = row["ours"] / row["fa4"]
        result["rows"].append(row)
        print(row, flush=True)
    _, paged = build(args.gpu, Path(args.cache_dir), layout="paged")
    for page in (16, 128):
        result["rows"].append(paged_row(paged, fa4, page, do_bench))
        print(result["rows"][-1], flush=True)
    if fa4 is None:
        result["fa4_error"] = fa4_error
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"\n{result['device']}: varlen / paged prefill, 32q/8kv d128 causal bf16, TFLOPS (do_bench median)")
    print(f"{'mix':<26}{'ours':>8}{'fa4':>8}{'sdpa pad':>10}{'ours/fa4':>10}")
    for r in result["rows"]:
        print(f"{r['mix']:<26}{r.get('ours', float('nan')):>8.1f}{r.get('fa4', float('nan')):>8.1f}"
              f"{r.get('sdpa_padded', float('nan')):>10.1f}{r.get('ours_over_fa4', float('nan')):>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
