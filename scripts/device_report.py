"""The two Python steps of scripts/device_campaign.sh.

    python3 scripts/device_report.py check EXPORT_DIR OUT_JSON [--fake-gpu]
        load the export with tuner.loader.load_exported and compare attention(q, k, v, causal=True) with
        torch SDPA on fresh random inputs; exit 0 when every call ran the exported kernel and matched.
    python3 scripts/device_report.py summary STUDY_SUMMARY_JSON CHECK_JSON STEPS_JSON [GPU_UTIL_CSV]
        print the run's summary table (trials, wall time, trials per GPU-hour, best against flash/cuDNN).

--fake-gpu (local rehearsal only): CPU tensors pose as the campaign's GPU and the kernels are the CPU
stand-ins of tests/campaign/gpu_fakes.py, so the dispatch to the exported kernel still runs.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (batch, seqlen, heads): the benchmark buckets' shapes, a ragged one and a short one with fewer heads
CHECK_SHAPES = ((2, 1024, 16), (1, 4096, 16), (1, 3000, 16), (4, 777, 8))
FAKE_SHAPES = ((2, 128, 4), (1, 300, 4))
REL_ERR_BOUND = 2e-2


def _rel(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


def model_shapes(model: str) -> tuple[list[tuple[int, int, int, int]], int, int]:
    """(batch, seqlen, heads_q, heads_kv) shapes of a model preset's prefill, and its head dims: the
    benchmark buckets' seqlens, a ragged one and a short one."""
    from tuner.models import get_model

    m = get_model(model)
    shapes = [(2, 1024), (1, 4096), (1, 3000), (4, 777), (8, 512), (1, 8192)]   # (fp32 references fit)
    return [(b, s, m.heads_q, m.heads_kv) for b, s in shapes], m.d_qk, m.d_v


def check(export_dir: str, out_json: str, fake_gpu: bool = False, model: str | None = None) -> int:
    import torch

    from tuner.serving import ExportedAttention, load_exported, read_configs, sdpa_attention

    result = {"export_dir": export_dir, "calls": [], "ok": False}
    try:
        if fake_gpu:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from tests.campaign import gpu_fakes

            from tuner.serving import DeviceFacts

            attention = ExportedAttention(read_configs(Path(export_dir)), kernel_loader=gpu_fakes.fake_load_kernel,
                                          devices={("cpu", None): DeviceFacts(gpu_fakes.DEVICE_NAME, (9, 0))})
            device, shapes = "cpu", FAKE_SHAPES
        else:
            attention = load_exported(export_dir)
            device, shapes = "cuda", CHECK_SHAPES
        d_qk = d_v = 128
        shapes = [(b, s, h, h) for b, s, h in shapes]
        if model:
            shapes, d_qk, d_v = model_shapes(model)
            result["model"] = model
        result["configs"] = [c.path.name for c in attention.configs]
        for b, s, h, hkv in shapes:
            g = torch.Generator(device=device).manual_seed(b * 100003 + s)
            q = torch.randn(b, s, h, d_qk, device=device, dtype=torch.bfloat16, generator=g)
            k = torch.randn(b, s, hkv, d_qk, device=device, dtype=torch.bfloat16, generator=g)
            v = torch.randn(b, s, hkv, d_v, device=device, dtype=torch.bfloat16, generator=g)
            out = attention(q, k, v, causal=True)
            path, reason, bucket = attention.last_path, attention.last_reason, attention.last_bucket
            sdpa = sdpa_attention(q, k, v, causal=True)
            ref = sdpa_attention(q.float(), k.float(), v.float(), causal=True)
            row = {"shape": f"b{b} s{s} hq{h} hkv{hkv} d{d_qk}/{d_v} causal bf16", "path": path, "reason": reason,
                   "bucket": bucket,
                   "finite": bool(torch.isfinite(out).all()),
                   "max_abs_err_vs_fp32": float((out.float() - ref).abs().max()),
                   "rel_err_vs_fp32": _rel(out, ref),
                   "sdpa_bf16_max_abs_err_vs_fp32": float((sdpa.float() - ref).abs().max()),
                   "sdpa_bf16_rel_err_vs_fp32": _rel(sdpa, ref),
                   "max_abs_diff_vs_sdpa_bf16": float((out.float() - sdpa.float()).abs().max()),
                   "rel_diff_vs_sdpa_bf16": _rel(out, sdpa)}
            # Within the error torch's own bf16 SDPA makes (x2, + one bf16 ulp at |x| ~ 1), and 2% relative.
            row["ok"] = (path == "kernel" and row["finite"] and row["rel_err_vs_fp32"] < REL_ERR_BOUND
                         and row["max_abs_err_vs_fp32"] <= 2 * row["sdpa_bf16_max_abs_err_vs_fp32"] + 2 ** -7)
            result["calls"].append(row)
            print(f"check {row['shape']}: path={path} ({reason}) rel_err={row['rel_err_vs_fp32']:.2e} "
                  f"max_abs={row['max_abs_err_vs_fp32']:.2e} (sdpa bf16 {row['sdpa_bf16_max_abs_err_vs_fp32']:.2e}) "
                  f"{'OK' if row['ok'] else 'FAIL'}", flush=True)
        result["stats"] = dict(attention.stats)
        result["ok"] = bool(result["calls"]) and all(r["ok"] for r in result["calls"])
    except Exception as exc:  # noqa: BLE001 - the summary must still say what happened
        result["error"] = f"{type(exc).__name__}: {exc}"
        print(f"check error: {result['error']}", flush=True)
    Path(out_json).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["ok"] else 1


def _load(path: str | None) -> dict:
    try:
        return json.loads(Path(path).read_text()) if path else {}
    except (OSError, ValueError):
        return {}


def _util_samples(csv_path: str | None) -> list[tuple[float | None, int]]:
    """(host time or None, utilization.gpu %) per nvidia-smi sample (one a second). Rows are
    ``timestamp, utilization, memory`` (``YYYY/MM/DD HH:MM:SS.mmm`` in the host's local time, as Python's
    ``time.time()`` of the same host sees it) or, from older runs, ``utilization, memory``."""
    import datetime as dt

    if not csv_path:
        return []
    out = []
    try:
        lines = Path(csv_path).read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        cells = [c.strip() for c in line.split(",")]
        try:
            if len(cells) >= 3:
                when = dt.datetime.strptime(cells[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                out.append((when, int(cells[1])))
            elif cells and cells[0].isdigit():
                out.append((None, int(cells[0])))
        except ValueError:
            continue
    return out


def _util(csv_path: str | None, window: tuple[float, float] | None = None) -> dict:
    """Mean and busy share of the utilization samples, all of them or those inside ``window``."""
    samples = _util_samples(csv_path)
    if window is not None:
        samples = [(t, v) for t, v in samples if t is not None and window[0] <= t <= window[1]]
    vals = [v for _, v in samples]
    if not vals:
        return {}
    return {"samples": len(vals), "mean_pct": round(sum(vals) / len(vals), 1),
            "busy_share": round(sum(1 for v in vals if v > 0) / len(vals), 3)}


def _cpu(csv_path: str | None, window: tuple[float, float] | None = None) -> dict:
    """Means of scripts/cpu_sampler.py's samples (all, or those inside ``window``): the busy share of the
    host's CPUs, compiler processes alive and on a CPU, other processes on a CPU."""
    try:
        lines = Path(csv_path).read_text().splitlines()[1:] if csv_path else []
    except OSError:
        return {}
    rows = []
    for line in lines:
        try:
            t, cpus, busy, procs, running, other = line.split(",")
            rows.append((float(t), int(cpus), float(busy), int(procs), int(running), int(other)))
        except ValueError:
            continue
    if window is not None:
        rows = [r for r in rows if window[0] <= r[0] <= window[1]]
    if not rows:
        return {}
    n = len(rows)
    return {"samples": n, "cpus": rows[0][1], "busy_pct": round(100 * sum(r[2] for r in rows) / n, 1),
            "compiler_procs": round(sum(r[3] for r in rows) / n, 1),
            "compiler_running": round(sum(r[4] for r in rows) / n, 1),
            "other_running": round(sum(r[5] for r in rows) / n, 1)}


def _cpu_line(label: str, cpu: dict) -> str:
    if not cpu:
        return f"{label}: no CPU samples"
    return (f"{label}: CPUs busy {cpu['busy_pct']}% of {cpu['cpus']} ({cpu['samples']} samples); compiler "
            f"processes alive {cpu['compiler_procs']}, on a CPU {cpu['compiler_running']}; other processes on a "
            f"CPU {cpu['other_running']}")


def _num(x) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _f(x, spec=".1f") -> str:
    return "–" if x is None else format(x, spec)


def _window_line(label: str, occ: dict | None, util_csv: str | None) -> str:
    if not occ:
        return f"{label}: none"
    window = _window(occ)
    util = _util(util_csv, window) if window else {}
    return (f"{label} ({occ['window_s']} s, {occ['trials']} trials): GPU locked {_f((occ.get('held_fraction') or 0) * 100)}%, "
            f"{_f(occ.get('measured_per_gpu_hour'))} measured trials per GPU-hour"
            + (f"; nvidia-smi utilization mean {util['mean_pct']}%, >0 in {util['busy_share'] * 100:.0f}% of "
               f"{util['samples']} samples" if util else "; no timestamped utilization samples in the window"))


def _window(occ: dict | None) -> tuple[float, float] | None:
    return (occ["from"], occ["to"]) if occ and occ.get("from") and occ.get("to") else None


def _steady_line(steady: dict | None, util_csv: str | None) -> str:
    if not steady:
        return "steady state: no trial held a GPU"
    return "\n".join([_window_line("first lock to last release", steady, util_csv),
                      _window_line("pipeline full (from the first trial that waited for the lock)",
                                   steady.get("saturated"), util_csv)])


def _pipeline_line(p: dict | None) -> str:
    if not p:
        return "compiles: none recorded"
    return (f"compiles: {p['kernels']} kernels ({p['nvcc_cached']} from nvcc's cache), {p['mean_batch']} per batch; "
            f"per kernel: batch latency {p['latency_s']} s, of it waiting for a CPU {p['cpu_wait_s']} s, nvcc share "
            f"{p['nvcc_s_per_kernel']} s; {_f(p.get('compiled_per_s'), '.3f')} kernels/s compiled over the loop, the GPUs "
            f"take {_f(p.get('gpus_take_per_s'), '.3f')}/s")


def summary(summary_json: str, check_json: str, steps_json: str, util_csv: str | None = None,
            cpu_csv: str | None = None) -> int:
    s, c, steps = _load(summary_json), _load(check_json), _load(steps_json)
    util = _util(util_csv)
    t = s.get("trials", {})
    lines = ["", "=" * 100,
             f"DEVICE CAMPAIGN SUMMARY  gpu={steps.get('gpu')} device={s.get('device_name')!r} "
             f"backend={s.get('backend')} mode={steps.get('mode')}"]
    if not s:
        lines.append(f"no campaign summary ({summary_json} missing): see campaign.log; campaign exit code "
                     f"{steps.get('campaign_rc')}")
    else:
        camp_s = _num(steps.get("campaign_s"))
        fin = t.get("finished_this_run") or 0
        per_cmd = round(fin / (camp_s * max(1, s.get("gpus") or 1) / 3600), 1) if camp_s else None
        lines += [
            f"trials this run: {fin} finished = {t.get('done')} done + {t.get('infeasible')} infeasible; "
            f"{t.get('failed')} failed (infrastructure / cut by the budget); {t.get('measured_this_run')} reached the GPU "
            f"({_f((s.get('measured_fraction') or 0) * 100)}% of the finished); "
            f"{t.get('rejected_before_compile')} rejected before compile, {t.get('cache_hits')} cache hits, "
            f"{s.get('remeasured')} re-measurements, {t.get('compiled_unmeasured_at_stop')} compiled but unmeasured at "
            f"the stop",
            f"wall: campaign loop {_f(s.get('elapsed_s'))} s, campaign command {camp_s} s (exit {steps.get('campaign_rc')}), "
            f"whole script {steps.get('total_s')} s",
            f"trials per GPU-hour: {_f(s.get('trials_per_gpu_hour'))} over the loop, {_f(per_cmd)} over the command",
            f"GPU locked for verify+benchmark: {_f((s.get('gpu_held_fraction') or 0) * 100)}% of the loop"
            + (f"; nvidia-smi utilization mean {util['mean_pct']}%, >0 in {util['busy_share'] * 100:.0f}% of "
               f"{util['samples']} samples (whole script)" if util else ""),
            _steady_line(s.get("steady_state"), util_csv),
            _cpu_line("host CPUs, whole campaign", _cpu(cpu_csv)),
            _cpu_line("host CPUs, first lock to last release", _cpu(cpu_csv, _window(s.get("steady_state")))),
            _pipeline_line(s.get("compile_pipeline")),
            f"measured trials per GPU-hour: {_f(s.get('measured_per_gpu_hour'))} over the loop; "
            f"stage seconds (sums) {s.get('stage_seconds')}",
            f"trial timing: {s.get('timing')}"]
        best = s.get("best")
        if best:
            lines.append(f"best kernel: {best['kernel_name']} (trial {best['trial']}, {best['tflops']} TFLOPS at "
                         f"{best['bucket']}) params {best['params']}")
        lines.append(f"{'seqlen':>7} {'ours TF':>9} {'flash TF':>9} {'ours/flash':>11} {'cuDNN TF':>9} "
                     f"{'ours/cuDNN':>11} {'eff TF':>8} {'trial':>6}")
        for r in s.get("rows", []):
            ra = r.get("ratios", {})
            lines.append(f"{r['seqlen']:>7} {_f(r.get('ours')):>9} {_f(r.get('flash')):>9} {_f(ra.get('flash'), '.3f'):>11} "
                         f"{_f(r.get('cudnn')):>9} {_f(ra.get('cudnn'), '.3f'):>11} {_f(r.get('efficient')):>8} "
                         f"{r.get('trial'):>6}")
        if not s.get("rows"):
            lines.append("(no verified kernel: no rows)")
        for r in s.get("search_vs_seeds") or []:
            re = r.get("retimed")
            retimed = (f"; re-timed x{re['ratio']:.3f} [{re['low']:.3f}, {re['high']:.3f}]: "
                       f"{'the search beat the seeds' if r.get('search_beat_seeds') else 'not clearly faster'}"
                       if re else "")
            lines.append(f"search vs seeds at {r['seqlen']:>6}: best {_f(r['best'])} (trial {r['best_trial']}, "
                         f"{'a seed' if r['best_is_seed'] else 'found by the search'}: {r['best_schedule']} "
                         f"{r['best_params']}) vs best seed {_f(r['best_seed'])} (trial {r['best_seed_trial']}): "
                         f"single x{_f(r['ratio'], '.3f')}{retimed}")
        early = s.get("early_stop") or {}
        if early.get("enabled"):
            lines.append(f"early stop: {early.get('stopped')} trial(s) stopped after their probe, "
                         f"{early.get('measured_in_full')} measured in full; mean GPU hold {early.get('mean_held_s')}; "
                         f"saved ~{_f(early.get('saved_gpu_s'))} s of GPU")
    if c:
        calls = c.get("calls", [])
        worst = max((r["rel_err_vs_fp32"] for r in calls), default=None)
        worst_abs = max((r["max_abs_err_vs_fp32"] for r in calls), default=None)
        lines.append(f"exported loader check: {'PASS' if c.get('ok') else 'FAIL'}; paths "
                     f"{[r['path'] for r in calls]}; worst rel err vs fp32 {_f(worst, '.2e')}, worst max abs "
                     f"{_f(worst_abs, '.2e')} (torch bf16 SDPA: "
                     f"{_f(max((r['sdpa_bf16_max_abs_err_vs_fp32'] for r in calls), default=None), '.2e')})"
                     + (f"; error {c['error']}" if c.get("error") else ""))
    else:
        lines.append(f"exported loader check: not run (export exit {steps.get('export_rc')})")
    lines.append(f"steps: {steps}")
    lines.append("=" * 100)
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["check"] and len(args) >= 3:
        model = args[args.index("--model") + 1] if "--model" in args else None
        sys.exit(check(args[1], args[2], fake_gpu="--fake-gpu" in args[3:], model=model))
    if args[:1] == ["summary"] and len(args) >= 4:
        sys.exit(summary(*args[1:6]))
    print(__doc__, file=sys.stderr)
    sys.exit(2)
