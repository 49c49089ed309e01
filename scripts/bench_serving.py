"""The exported kernel inside a model, measured (issue 13's targets), in one process on one GPU:

1. an export of the profile's default kernels (tuner.default_export: built, verified by the campaign's gate,
   stored, exported) loaded with tuner.serving.load_exported;
2. host time per call: ours (FlashAttention layout, SDPA drop-in, the op as a compiled graph calls it,
   fresh tensors every call) against torch SDPA on the same shapes. The GPU is kept busy by a sleep kernel
   queued first, so a call's wall time is its host cost alone; rounds interleave the callers;
3. GPU time per call (CUDA events) for context;
4. a Llama-3-8B-shaped transformers model (random weights, bf16, few layers) prefilling b1 s4096 and b4 s2048:
   our attention against SDPA's best backend (transformers' sdpa as it is, and given is_causal where the
   kernels are; default, flash and cuDNN backends), eager and compiled (torch.compile, inductor), rounds
   interleaved; ours' graph breaks counted with torch._dynamo.explain.

    python scripts/bench_serving.py --gpu h100 --out $OUT/serving.json [--layers 2] [--skip-model]

Prints a table last; writes every number to --out.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

HOST_SHAPES = [  # (label, batch, seqlen, heads_q, heads_kv)
    ("b1 s128 mha16", 1, 128, 16, 16), ("b1 s128 gqa32/8", 1, 128, 32, 8),
    ("b8 s1024 mha16", 8, 1024, 16, 16), ("b8 s1024 gqa32/8", 8, 1024, 32, 8),
]
MODEL_SHAPES = [(1, 4096), (4, 2048)]


def host_us(callers: dict, n: int = 200, rounds: int = 7) -> dict:
    """Median / min / max host microseconds per call of each caller, rounds interleaved."""
    for call in callers.values():
        for _ in range(5):
            call()
    torch.cuda.synchronize()
    samples = {name: [] for name in callers}
    for _ in range(rounds):
        for name, call in callers.items():
            torch.cuda._sleep(400_000_000)          # ~0.2 s of GPU: the calls below only queue
            t = time.perf_counter()
            for _ in range(n):
                call()
            samples[name].append((time.perf_counter() - t) / n * 1e6)
            torch.cuda.synchronize()
    return {name: {"median": statistics.median(s), "min": min(s), "max": max(s)} for name, s in samples.items()}


def gpu_us(call, reps: int = 50) -> float:
    for _ in range(5):
        call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            call()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps * 1e3)
    return statistics.median(times)


def bench_host(attn) -> list[dict]:
    import torch.nn.functional as F

    from tuner.serving import op

    rows = []
    for label, b, s, hq, hkv in HOST_SHAPES:
        sets = []
        for seed in range(4):
            g = torch.Generator(device="cuda").manual_seed(seed)
            sets.append([torch.randn(b, s, h, 128, device="cuda", dtype=torch.bfloat16, generator=g)
                         for h in (hq, hkv, hkv)])
        q, k, v = sets[0]
        qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        gqa = hq != hkv
        scale = 1 / math.sqrt(128)
        route = attn.route(q, k, v, True, scale)
        turn = [0]

        def fresh():
            turn[0] = (turn[0] + 1) % len(sets)
            return attn(*sets[turn[0]], causal=True)

        callers = {
            "sdpa": lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=gqa),
            "ours": lambda: attn(q, k, v, causal=True),
            "ours_sdpa_api": lambda: attn.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=gqa),
            "ours_op": lambda: op.attention_op(q, k, v, None, True, scale, route),
            "ours_fresh_tensors": fresh,
        }
        attn(q, k, v, causal=True)
        assert attn.last_path == "kernel", attn.last_reason
        host = host_us(callers)
        row = {"shape": label, "host_us": host,
               "gpu_us": {"sdpa": gpu_us(callers["sdpa"]), "ours": gpu_us(callers["ours"])},
               "ratio_host_ours_over_sdpa": host["ours"]["median"] / host["sdpa"]["median"]}
        rows.append(row)
        print(f"host {label}: " + ", ".join(f"{n} {v['median']:.1f} us [{v['min']:.1f}-{v['max']:.1f}]"
                                            for n, v in host.items()), flush=True)
    return rows


def _model(transformers, config: dict, attn_implementation: str, state=None):
    model = transformers.LlamaForCausalLM._from_config(transformers.LlamaConfig(**config),
                                                       attn_implementation=attn_implementation)
    model = model.to("cuda", torch.bfloat16).eval()
    if state is not None:
        model.load_state_dict(state)
    return model


def interleaved_ms(calls: dict, rounds: int = 6, reps: int = 8) -> dict:
    """Per call, the median ms of each round; rounds alternate the calls (A B C A B C ...), so a drift of
    the clock or the power state hits them alike."""
    with torch.no_grad():
        for call in calls.values():
            for _ in range(3):
                call()
        torch.cuda.synchronize()
        out = {name: [] for name in calls}
        for _ in range(rounds):
            for name, call in calls.items():
                times = []
                for _ in range(reps):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    call()
                    end.record()
                    torch.cuda.synchronize()
                    times.append(start.elapsed_time(end))
                out[name].append(statistics.median(times))
    return out


def _summary(per_round: dict, ours: str) -> dict:
    """Median of the round medians per call; the best SDPA call; ours' speed-up over it per round."""
    med = {k: statistics.median(v) for k, v in per_round.items()}
    sdpa = [k for k in med if not k.startswith("ours")]
    best = min(sdpa, key=med.get)
    ratios = [b / a for a, b in zip(per_round[ours], per_round[best])]
    return {"ms": med, "round_ms": per_round, "best_sdpa": best, "ratio": statistics.median(ratios),
            "ratio_min": min(ratios), "ratio_max": max(ratios)}


def kernel_breakdown(call, steps: int = 3, top: int = 12) -> list:
    """The GPU kernels of ``call`` (torch.profiler): (name, µs per call, launches per call), longest first."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                call()
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0:
            rows.append((e.key[:90], round(t / steps, 1), e.count / steps))
    return sorted(rows, key=lambda r: -r[1])[:top]


def attention_kernels(attn) -> list[dict]:
    """GPU µs of one attention call at the model's shapes: ours and SDPA's backends given is_causal."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = []
    for b, s in MODEL_SHAPES:
        g = torch.Generator(device="cuda").manual_seed(b * s)
        q, k, v = (torch.randn(b, 32 if i == 0 else 8, s, 128, device="cuda", dtype=torch.bfloat16, generator=g)
                   for i in range(3))
        row = {"shape": f"b{b} s{s} h32/8", "ours": gpu_us(lambda: attn(q, k, v, causal=True, layout="bhsd"))}
        for name, kind in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel([kind]):
                    row[name] = gpu_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                             enable_gqa=True))
            except RuntimeError as exc:
                row[name] = str(exc).splitlines()[0][:120]
        out.append(row)
        print(f"attention kernel {row}", flush=True)
    return out


def bench_model(attn, layers: int) -> dict:
    import contextlib

    import transformers
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface

    from tuner.serving import hf

    ours_name = hf.register_transformers(attn)
    # SDPA given is_causal=True wherever our kernels are (transformers' own sdpa materialises the causal mask
    # while torch.compile traces): the fairest SDPA baseline, next to transformers' sdpa as it is
    AttentionInterface.register("sdpa_causal", sdpa_attention_forward)
    AttentionMaskInterface.register("sdpa_causal", hf.attention_mask)
    config = dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=8192,
                  rope_theta=500000.0)
    torch.manual_seed(0)
    base = _model(transformers, config, "sdpa")
    state = base.state_dict()
    models = {"ours": _model(transformers, config, ours_name, state), "sdpa": base,
              "sdpa_causal": _model(transformers, config, "sdpa_causal", state)}
    backends = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}

    def in_backend(fn, backend):
        kind = backends[backend]

        def call(ids):
            with sdpa_kernel([kind]) if kind is not None else contextlib.nullcontext():
                return fn(ids)
        return call

    result = {"config": config, "shapes": [], "attention_kernels": attention_kernels(attn)}
    for b, s in MODEL_SHAPES:
        ids = torch.randint(0, 32000, (b, s), device="cuda", generator=torch.Generator(device="cuda").manual_seed(s))
        row = {"shape": f"b{b} s{s}", "errors": {}}
        with torch.no_grad():
            want = models["sdpa_causal"](ids).logits.float()
            got = models["ours"](ids).logits.float()
        row["max_abs_logit_diff_vs_sdpa"] = (got - want).abs().max().item()
        del want, got
        eager = {"ours/default": in_backend(models["ours"], "default")}
        for name in ("sdpa", "sdpa_causal"):
            for backend in backends:
                eager[f"{name}/{backend}"] = in_backend(models[name], backend)
        usable = {}
        for key, call in eager.items():         # a backend that cannot run this shape is reported, not timed
            try:
                with torch.no_grad():
                    call(ids)
                usable[key] = lambda call=call: call(ids)
            except RuntimeError as exc:
                row["errors"][key] = str(exc).splitlines()[0][:200]
        row["eager"] = _summary(interleaved_ms(usable), "ours/default")
        torch._dynamo.reset()
        if (b, s) == MODEL_SHAPES[0]:
            row["ours_graph_breaks"] = torch._dynamo.explain(models["ours"])(ids).graph_break_count
            torch._dynamo.reset()
        compiled = {}
        best_backend = row["eager"]["best_sdpa"].split("/")[1]
        for name, backend in (("ours", "default"), ("sdpa", "default"), ("sdpa_causal", "default"),
                              ("sdpa_causal", best_backend)):
            key = f"{name}/{backend}"
            if key in compiled:
                continue
            fn = in_backend(torch.compile(models[name], fullgraph=name == "ours"), backend)
            t0 = time.time()
            try:
                with torch.no_grad():
                    fn(ids)
                compiled[key] = lambda fn=fn: fn(ids)
                row.setdefault("compile_s", {})[key] = round(time.time() - t0, 1)
            except Exception as exc:  # noqa: BLE001 - a baseline that does not compile is reported, not fatal
                row["errors"][f"compiled {key}"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        row["compiled"] = _summary(interleaved_ms(compiled), "ours/default")
        for key in ("ours/default", row["compiled"]["best_sdpa"]):
            row.setdefault("compiled_kernels", {})[key] = kernel_breakdown(compiled[key])
        torch._dynamo.reset()
        result["shapes"].append(row)
        print(f"model {row['shape']}: eager {row['eager']['ms']} compiled {row['compiled']['ms']}", flush=True)
    result["reasons"] = dict(attn.reasons)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--out", default="serving.json")
    parser.add_argument("--export-dir", default="/tmp/serving-export")
    parser.add_argument("--cache-dir", default=".kcache")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--skip-model", action="store_true")
    parser.add_argument("--skip-host", action="store_true")
    parser.add_argument("--model-shapes", default=None, help="batch x seqlen list, e.g. 4x2048,1x4096")
    args = parser.parse_args(argv)
    if args.model_shapes:
        MODEL_SHAPES[:] = [tuple(int(x) for x in item.split("x")) for item in args.model_shapes.split(",")]

    from tuner.default_export import export_defaults
    from tuner.problem import KernelSpec
    from tuner.serving import load_exported

    t0 = time.time()
    specs = [KernelSpec("gqa", 128, 128, True, "bf16"), KernelSpec("gqa", 128, 128, False, "bf16")]
    export_defaults(args.gpu, specs, Path(args.export_dir), cache_dir=Path(args.cache_dir))
    attn = load_exported(args.export_dir)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "export_s": round(time.time() - t0, 1)}
    print(f"export ready in {result['export_s']} s", flush=True)
    result["host"] = [] if args.skip_host else bench_host(attn)
    Path(args.out).write_text(json.dumps(result, indent=1))
    if not args.skip_model:
        result["model"] = bench_model(attn, args.layers)
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"\n{result['device']}, torch {result['torch']}: host us per call, median [min-max] of 7 interleaved rounds")
    print(f"{'shape':<20}{'sdpa':>18}{'ours':>18}{'ours/sdpa':>10}{'op':>18}{'fresh':>18}{'sdpa_api':>18}")
    for r in result["host"]:
        h = r["host_us"]
        cell = lambda n: f"{h[n]['median']:.1f} [{h[n]['min']:.0f}-{h[n]['max']:.0f}]"  # noqa: E731
        print(f"{r['shape']:<20}{cell('sdpa'):>18}{cell('ours'):>18}{r['ratio_host_ours_over_sdpa']:>10.2f}"
              f"{cell('ours_op'):>18}{cell('ours_fresh_tensors'):>18}{cell('ours_sdpa_api'):>18}")
    for r in result.get("model", {}).get("shapes", []):
        for mode in ("eager", "compiled"):
            m = r[mode]
            print(f"model {r['shape']} {mode}: ours {m['ms']['ours/default']:.2f} ms, best SDPA {m['best_sdpa']} "
                  f"{m['ms'][m['best_sdpa']]:.2f} ms: {m['ratio']:.3f}x [{m['ratio_min']:.3f}-{m['ratio_max']:.3f}]")
        print(f"model {r['shape']}: graph breaks {r.get('ours_graph_breaks', '-')}, max |logit diff| vs sdpa "
              f"{r['max_abs_logit_diff_vs_sdpa']:.4f}, errors {r['errors']}")
        for key, rows in r.get("compiled_kernels", {}).items():
            print(f"  compiled {key} kernels (us per forward): "
                  + "; ".join(f"{n[:48]} {t:.0f}x{c:g}" for n, t, c in rows[:7]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
