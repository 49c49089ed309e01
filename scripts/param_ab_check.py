"""Parameter changes of the dense Hopper defaults, re-timed against the defaults (defaults from
measurement, not from one pass of single measurements).

    python3 scripts/param_ab_check.py --gpu h100 --change '{"rescale_threshold": 8}' \
        [--specs gqa128c,mha128n,mha64c] [--seqlens 1024,2048,4096,8192,16384] [--rounds 15] [--out ab.json]
    python3 scripts/param_ab_check.py --gpu h100 --changes '{"n96": {"block_n": 96}, "pp": {"pingpong": true}}' ...
    python3 scripts/param_ab_check.py --gpu h200 --dtype fp8 --change '{"block_n": 224}' --specs mha128n,mha128c

For each spec (variant, head dim, c = causal / n = not; bf16, or e4m3 with ``--dtype fp8``) it builds what
`tune build` gives (the profile's
default, warp-specialised) and the same kernel with each CHANGE (``--change``: one, named "changed";
``--changes``: several by name, in one set of rounds), passes them through the verification gate
(tuner.measure.verify), then at each paper-grid point times the default, every changed kernel, cuDNN and FA4 (when
importable) in paired rounds on the same rotating inputs (the kernels' order rotated every round; the confirm
rule's do_bench windows). Per point and change: the default's ms over the changed kernel's, median of the
rounds with the confirm rule's 95% interval (tuner/campaign/confirm.py), and each kernel's time against cuDNN's
and FA4's (medians of per-round ratios). A change that does not validate for a spec is skipped there, with its
reasons. ``--before DIR`` adds the change "before": the spec's kernel among DIR's `tune build` outputs (cubin and
JSON sidecar), built by an earlier translator, so a change to the translator itself is timed against the kernel it
replaces in the same rounds. Prints a table last; exit 1 when a kernel does not build or does not pass the gate.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

DEFAULT_SPECS = "mha128c,mha128n,gqa128c,gqa128n,mha64c,mha64n,mqa64c"


def parse_changes(change: str | None, changes: str | None, before: bool = False) -> dict[str, dict]:
    """{name: KernelParams changes} from ``--change`` (one JSON object, named "changed") or ``--changes`` (JSON
    object of named objects, or @FILE holding one); none at all with ``before`` (--before alone: the default against
    the earlier translator's kernel); ValueError saying what is wrong."""
    from translate.params import KernelParams

    if before and change is None and changes is None:
        return {}
    if (change is None) == (changes is None):
        raise ValueError("give exactly one of --change and --changes (or --before alone)")
    if changes is not None and changes.startswith("@"):
        try:
            changes = Path(changes[1:]).read_text()
        except OSError as exc:
            raise ValueError(f"cannot read {changes[1:]}: {exc.strerror or exc}") from None
    named = {"changed": json.loads(change)} if change is not None else json.loads(changes)
    if not isinstance(named, dict) or not named:
        raise ValueError("--changes must be a non-empty JSON object of named changes")
    fields = set(KernelParams.__dataclass_fields__)
    for name, fields_changed in named.items():
        if name in ("default", "before", "cudnn", "fa4"):
            raise ValueError(f"a change may not be named {name!r} (a column of the table)")
        if not isinstance(fields_changed, dict) or not fields_changed:
            raise ValueError(f"change {name!r} must be a non-empty JSON object of KernelParams fields")
        unknown = sorted(set(fields_changed) - fields)
        if unknown:
            raise ValueError(f"change {name!r}: not KernelParams fields: {', '.join(unknown)}")
    return named


def legal_changes(gpu: str, spec, named: dict[str, dict]) -> tuple[dict[str, dict], dict[str, list[str]]]:
    """The changes that validate on the spec's default (warp-specialised), and the reasons of those that do not."""
    from hardware_profiles import load_profile
    from translate.defaults import default_params, probe_problem
    from translate.params import KernelParams, validate

    profile = load_profile(gpu)
    base = default_params(profile, spec, "ws_overlap").to_dict()
    legal, refused = {}, {}
    for name, change in named.items():
        reasons = validate(KernelParams.from_dict({**base, **change}), profile, probe_problem(spec),
                           warp_specialized=True)
        if reasons:
            refused[name] = reasons
        else:
            legal[name] = change
    return legal, refused


def build(gpu: str, specs: list, changes: dict[str, dict[str, dict]], cache_dir: Path):
    """{spec label: {"default": (gen, result), name: (gen, result), ...}}, compiled in one pool; ``changes``
    holds each spec's legal changes."""
    from tuner.defaults.export import compile_changes

    built = compile_changes(gpu, [(spec, {"default": {}, **changes[label]}) for label, spec in specs], cache_dir)
    return {label: kernels for (label, _), kernels in zip(specs, built)}


def load_before(folder: Path, specs: list) -> dict:
    """{spec label: (name, cubin path, meta)} of the `tune build` outputs in ``folder`` whose spec is one of
    ``specs`` (one each); ValueError naming what is missing or doubled."""
    from kernel_abi.spec import KernelSpec

    found: dict = {}
    for sidecar in sorted(folder.glob("**/*.json")):
        data = json.loads(sidecar.read_text())
        if not isinstance(data, dict) or "meta" not in data or not sidecar.with_suffix(".cubin").is_file():
            continue
        built_for = KernelSpec(**data["spec"])   # (a sidecar's spec is KernelSpec's fields)
        for label, spec in specs:
            if built_for == spec:
                if label in found:
                    raise ValueError(f"--before {folder}: two kernels for {label} ({found[label][0]}, {data['name']})")
                found[label] = (data["name"], sidecar.with_suffix(".cubin"), data["meta"])
    missing = [label for label, _ in specs if label not in found]
    if missing:
        raise ValueError(f"--before {folder}: no `tune build` output for {', '.join(missing)}")
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--change", help="JSON object of KernelParams fields (named \"changed\")")
    ap.add_argument("--changes", help="JSON object (or @FILE): name -> object of KernelParams fields")
    ap.add_argument("--specs", default=DEFAULT_SPECS,
                    help="comma list of variant, head dim, c or n (default %(default)s)")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp8"),
                    help="the specs' dtype: fp8 builds e4m3 kernels (FP8 gate; cuDNN and FA4 timed in bf16)")
    ap.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default="param_ab.json", help="the record (bucket_table.py reads it)")
    ap.add_argument("--cache-dir", default=".kcache")
    ap.add_argument("--before", help="folder of `tune build` outputs of an earlier translator, timed as 'before'")
    args = ap.parse_args(argv)
    from tuner.defaults.table import parse_spec_label

    try:
        named = parse_changes(args.change, args.changes, bool(args.before))
        specs = [(text, dataclasses.replace(parse_spec_label(text), dtype=args.dtype)) for text in args.specs.split(",")]
        seqlens = tuple(int(s) for s in args.seqlens.split(","))
        before = load_before(Path(args.before), specs) if args.before else {}
    except (ValueError, json.JSONDecodeError, OSError) as exc:
        print(f"bad input: {exc}", file=sys.stderr)
        return 2

    import torch

    from tuner.measure import timer
    from tuner.measure import dense
    from tuner.measure.paired import paired_point
    from tuner.campaign.confirm import ConfirmRule, verdict
    from kernel_abi.spec import grid_problems
    from tuner.serving.launch import load_kernel
    from tuner.measure.verify import verify

    rule = ConfirmRule(rounds=args.rounds)
    timing = timer.Timing(**rule.timing())
    from translate.sm90.emit import KERNEL_REVISION, PINGPONG_REVISION

    per_spec, record = {}, {"device": torch.cuda.get_device_name(), "changes": named, "rule": rule.to_dict(),
                            "pingpong_revision": PINGPONG_REVISION, "kernel_revision": KERNEL_REVISION,
                            "kernels": {}, "refused": {}, "rows": []}
    for label, spec in specs:
        per_spec[label], refused = legal_changes(args.gpu, spec, named)
        for name, reasons in refused.items():
            record["refused"][f"{label}/{name}"] = reasons
            print(f"{label} {name}: not legal, skipped ({'; '.join(reasons)})", flush=True)
    built = build(args.gpu, specs, per_spec, Path(args.cache_dir))
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
        if label in before:   # the earlier translator's kernel: through the same gate
            name, cubin, meta = before[label]
            kernel = load_kernel(cubin, meta)
            report = verify(kernel, spec)
            record["kernels"][f"{label}/before"] = {"name": name, "verified": bool(report.passed),
                                                    "reason": report.reason}
            if report.passed:
                kernels[(label, "before")] = kernel
            print(f"{label} before: {name} verified={report.passed} {report.reason or ''}", flush=True)
    if len(kernels) != sum(1 + len(per_spec[label]) + (label in before) for label, _ in specs):
        Path(args.out).write_text(json.dumps(record, indent=1, default=str))
        return 1

    for label, spec in specs:
        roles = ["default", *per_spec[label], *(["before"] if label in before else [])]
        for problem in grid_problems(spec.variant, spec.d_qk if spec.variant != "mla" else 192, spec.dtype,
                                     spec.causal, seqlens=seqlens):
            ms = paired_point(problem, {role: kernels[(label, role)] for role in roles}, rule.rounds, timing)

            def over(lib, role):
                return statistics.median(c / d for d, c in zip(ms[role], ms[lib])) if ms[lib] else None

            row = {"spec": label, "seqlen": problem.seqlen_q, "ms": ms,
                   "default_tflops": dense.tflops(problem, statistics.median(ms["default"])),
                   "over_cudnn": {role: over("cudnn", role) for role in roles},
                   "over_fa4": {role: over("fa4", role) for role in roles},
                   "verdicts": {role: verdict(ms[role], ms["default"], rule).to_dict() for role in roles[1:]}}
            record["rows"].append(row)
            print(f"{label} s{problem.seqlen_q}: " + "  ".join(
                f"{role} x{v['ratio']:.3f} [{v['low']:.3f}, {v['high']:.3f}]" for role, v in row["verdicts"].items()),
                flush=True)
    Path(args.out).write_text(json.dumps(record, indent=1, default=str))
    print(f"\n{record['device']}: changes against the default, {rule.rounds} paired rounds (default ms / changed "
          "ms, median [95%], * = above 1.001); cuDNN's and FA4's ms over each kernel's")
    for name, change in named.items():
        print(f"  {name}: {json.dumps(change)}")
    if before:
        print(f"  before: the kernels of {args.before}")
    print(f"{'spec':<9}{'seqlen':>7} {'change':<10}{'x default':<25}{'/cuDNN':>8}{'/FA4':>7}{'TFLOPS':>8}")

    def fmt(x):
        return f"{x:.3f}" if x is not None else "-"

    for row in record["rows"]:
        print(f"{row['spec']:<9}{row['seqlen']:>7} {'default':<10}{'':<25}{fmt(row['over_cudnn']['default']):>8}"
              f"{fmt(row['over_fa4']['default']):>7}{row['default_tflops']:>8.0f}")
        for role, v in row["verdicts"].items():
            print(f"{'':<16} {role:<10}x{v['ratio']:.3f} [{v['low']:.3f}, {v['high']:.3f}]"
                  f"{'*' if v['confirmed'] else ' ':<3}{fmt(row['over_cudnn'][role]):>8}{fmt(row['over_fa4'][role]):>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
