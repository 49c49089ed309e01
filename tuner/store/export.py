"""`tune export`: the stored best kernels of one GPU as production configs.

One JSON per (variant, head dims, dtype, causal, device), named the way vLLM names its tuned configs::

    variant=mha,head_dim=128,dtype=bf16,causal=1,device_name=NVIDIA_H100_80GB_HBM3.json
    variant=mla,head_dim=192_128,dtype=bf16,causal=1,device_name=NVIDIA_H100_80GB_HBM3.json

``head_dim`` is one number when q/k and v share it, else ``<d_qk>_<d_v>``. ``device_name`` is
``torch.cuda.get_device_name()`` of the GPU the kernels were measured on, with every character outside
``[A-Za-z0-9._-]`` (spaces included) turned into ``_``.

Content: a ``_metadata`` block (format, tool version, nvcc, CUTLASS, driver, GPU name, sm, the spec,
exported_at) and, beside it, one entry per shape bucket (``"s4096"``, see tuner.serving.buckets.seqlen) with params,
kernel name and sha256, the cubin / source / TL file names, the runtime meta, TFLOPS, baselines and
ratios, and the verification summary. The files ``<sha256>.cubin``, ``<sha256>.cu`` and
``<sha256>.tl`` lie beside the JSON (content-addressed: a kernel shared by two buckets is one file).
Nothing unverified is ever exported: one such record refuses the whole export.

Varlen and paged configs (``,layout=varlen`` / ``,layout=paged`` in the name; ``layout`` in the metadata)
are bucketed by the serving rule (tuner/measure/mixes.py): an entry ``"t16k-even"`` or ``"t4k-even-p16"`` carries
the rule's fields ``tokens``, ``mix`` and, paged, ``page_size`` where a key-length entry has ``seqlen_k``;
the metadata says ``"bucket_rule": "serving"`` and a paged config lists the ``page_sizes`` its buckets were
tuned on. Varlen configs of key-length buckets (stored before the serving rule) are written as before.
Dense configs are unchanged.

Decode kernels (records of phase ``decode``: split-KV kernels of translate/decode, launched by
tuner/serving/launch/decode_kernel.py) get configs of their own: ``,phase=decode`` follows the layout token in the name
(``...,causal=1,layout=paged,phase=decode,device_name=...json``; a dense cache has no layout token, as for
prefill: ``...,causal=1,phase=decode,device_name=...json``), the metadata says ``"phase": "decode"`` and
``"bucket_rule": "decode"`` (tuner/serving/buckets/decode.py) and, paged, the ``page_sizes``; an entry ``"d-b8-kv8k-p16"``
carries the rule's fields ``batch``, ``kv_capacity`` and, paged, ``page_size``. Its meta is the decode kernel's
(``"grid": "decode"``: tuner.serving.launch.decode_kernel.load_decode_kernel loads it). A baseline in GB/s (``copy_gbs``) is
compared with the record's achieved ``problem["kv_gbs"]``, not its TFLOPS. One config holds one phase only.
Prefill configs carry no ``phase`` and are written exactly as before.
"""
from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from tuner.serving.buckets.names import SERVING_RULE, bucket_fields, bucket_rule, bucket_sort_key, mixed_rules
from tuner.serving.buckets.decode import DECODE_RULE, decode_bucket_fields, decode_bucket_sort_key, is_decode_bucket
from tuner.serving.configs import METADATA_KEY, device_file_token
from tuner.store.records import CorruptRecordError, KernelRecord, KernelStore, verification_passed

EXPORT_FORMAT = 1
def head_dim_token(d_qk: int, d_v: int) -> str:
    return str(d_qk) if d_qk == d_v else f"{d_qk}_{d_v}"


def config_file_name(variant: str, d_qk: int, d_v: int, dtype: str, causal: bool, device_name: str,
                     layout: str = "dense", phase: str = "prefill", features: tuple = (), kv_dtype: str = "") -> str:
    """The dense layout's names are what they were; another layout says so after causal, a decode
    config says ``,phase=decode`` after that, a config of kernels built with options names them
    (``,features=local+sinks``) after that, and one of kernels over an FP8 cache ``,kv_dtype=fp8`` last."""
    layout_token = "" if layout == "dense" else f",layout={layout}"
    phase_token = "" if phase == "prefill" else f",phase={phase}"
    features_token = f",features={'+'.join(features)}" if features else ""
    kv_token = f",kv_dtype={kv_dtype}" if kv_dtype else ""
    return (f"variant={variant},head_dim={head_dim_token(d_qk, d_v)},dtype={dtype},"
            f"causal={int(bool(causal))}{layout_token}{phase_token}{features_token}{kv_token},"
            f"device_name={device_file_token(device_name)}.json")


def verification_summary(verification: dict) -> dict:
    """``passed`` plus the report's scalar facts (errors, tolerances) and how many checks it ran."""
    out = {"passed": verification_passed(verification)}
    for key, value in verification.items():
        if isinstance(value, (str, int, float, bool)) or value is None:
            if isinstance(value, float) and not math.isfinite(value):
                value = None
            out[key] = value
        elif isinstance(value, list):
            out[f"{key}_count"] = len(value)
    return out


def _ratio(ours: float, base) -> float | None:
    if isinstance(base, (int, float)) and not isinstance(base, bool) and math.isfinite(base) and base > 0:
        return round(ours / base, 4)
    return None


def _gbs_ratio(rec: KernelRecord, base) -> float | None:
    """A GB/s baseline (``copy_gbs``) against the bandwidth the record achieved (``problem["kv_gbs"]``)."""
    ours = rec.problem.get("kv_gbs")
    if isinstance(ours, (int, float)) and not isinstance(ours, bool) and math.isfinite(ours):
        return _ratio(ours, base)
    return None


def _ratios(rec: KernelRecord) -> dict:
    return {k: _gbs_ratio(rec, v) if k.endswith("_gbs") else _ratio(rec.tflops, v) for k, v in rec.baselines.items()}


def _sort_key(rec: KernelRecord) -> tuple:
    return decode_bucket_sort_key(rec.bucket) if rec.phase == "decode" else bucket_sort_key(rec.bucket)


def phase_errors(recs: list[KernelRecord]) -> list[str]:
    """Why these records cannot share one config: two phases, or a bucket of the other phase's rule."""
    phases = sorted({r.phase for r in recs})
    if len(phases) > 1:
        return [f"records of phases {', '.join(phases)} in one config: prefill and decode kernels are exported "
                "to configs of their own"]
    errors = []
    for r in recs:
        if (r.phase == "decode") != is_decode_bucket(r.bucket):
            errors.append(f"{r.kernel_name}: a {r.phase} record in bucket {r.bucket!r} (decode records take decode "
                          "buckets such as d-b8-kv8k-p16, prefill records never do)")
    return errors


def bucket_entry(rec: KernelRecord) -> dict:
    sha = rec.kernel_sha256
    # seqlen_k, or the serving rule's tokens, mix (and page_size), or the decode rule's batch, kv_capacity (page_size)
    fields = decode_bucket_fields(rec.bucket) if rec.phase == "decode" else bucket_fields(rec.bucket)
    return {
        **fields,
        "params": rec.params,
        "kernel_name": rec.kernel_name,
        "kernel_sha256": sha,
        "cubin": f"{sha}.cubin",
        "source": f"{sha}.cu",
        "program": f"{sha}.tl",
        "meta": rec.kernel_meta,
        "tflops": rec.tflops,
        "baselines": {k: (v if isinstance(v, (int, float)) and math.isfinite(v) else None)
                      for k, v in rec.baselines.items()},
        "ratios": _ratios(rec),
        "problem": rec.problem,
        "verification": verification_summary(rec.verification),
        "study": rec.study,
        "trial": rec.trial,
        "provenance": rec.provenance,
        # how it won its bucket: re-timed against the best seed and the kernel it replaced (tuner/campaign/winners.py)
        "confirmation": rec.confirmation or None,
    }


def build_configs(records: list[KernelRecord], profile, exported_at: str | None = None) -> dict[str, dict]:
    """File name -> JSON document for verified records. ValueError if any record is unverified."""
    import tuner

    bad = [r for r in records if not verification_passed(r.verification)]
    if bad:
        names = ", ".join(f"{r.kernel_name} ({r.variant} {r.dtype} d{r.d_qk}x{r.d_v} {r.bucket})" for r in bad)
        raise ValueError(f"refusing to export kernels that did not pass verification: {names}")
    exported_at = exported_at or datetime.now(timezone.utc).isoformat(timespec="seconds")
    groups: dict[str, list[KernelRecord]] = {}
    for r in records:
        groups.setdefault(config_file_name(r.variant, r.d_qk, r.d_v, r.dtype, r.causal, r.device_name, r.layout,
                                           r.phase, r.features, r.kv_dtype), []).append(r)
    docs = {}
    for name, recs in sorted(groups.items()):
        errors = phase_errors(recs)
        if not errors and recs[0].phase == "prefill":
            mixed = mixed_rules([r.bucket for r in recs])
            errors = [mixed] if mixed else []
        if errors:
            raise ValueError(f"{name}: {errors[0]}")
        recs = sorted(recs, key=_sort_key)
        # The newest record's tools describe the file; each bucket keeps its own provenance too.
        newest = max(recs, key=lambda r: str(r.provenance.get("date", "")))
        prov = newest.provenance
        first = recs[0]
        meta = {
            "format": EXPORT_FORMAT,
            "tool": "attn-autotuner",
            "tool_version": prov.get("tool_version"),
            "exported_by": tuner.__version__,
            "nvcc": prov.get("nvcc"),
            "cutlass": prov.get("cutlass"),
            "driver": prov.get("driver"),
            "cuda_driver_api": prov.get("cuda_driver_api"),
            "torch": prov.get("torch"),
            "cudnn": prov.get("cudnn"),
            "gpu_name": prov.get("gpu_name") or first.device_name,
            "device_name": first.device_name,
            "gpu": profile.name,
            "device_names": sorted({first.device_name, *profile.device_names}),
            "sm": profile.sm,
            "arch": first.arch,
            "variant": first.variant,
            "d_qk": first.d_qk,
            "d_v": first.d_v,
            "dtype": first.dtype,
            "causal": first.causal,
            "layout": first.layout,
            "exported_at": exported_at,
        }
        if first.features:
            meta["features"] = list(first.features)
        if first.kv_dtype:   # its kernels read an e4m3 cache (tuner/serving/decode.py: FP8 caches)
            meta["kv_dtype"] = first.kv_dtype
        if first.phase == "decode":
            meta["phase"] = "decode"
            meta["bucket_rule"] = DECODE_RULE
            if first.layout == "paged":
                meta["page_sizes"] = sorted({decode_bucket_fields(r.bucket)["page_size"] for r in recs})
        elif bucket_rule(first.bucket) == SERVING_RULE:   # dense and key-length varlen metadata as before
            meta["bucket_rule"] = SERVING_RULE
            if first.layout == "paged":
                meta["page_sizes"] = sorted({bucket_fields(r.bucket)["page_size"] for r in recs})
        doc = {METADATA_KEY: meta}
        for r in recs:
            doc[r.bucket] = bucket_entry(r)
        docs[name] = doc
    return docs


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def find_stores(study_dir: Path) -> list[KernelStore]:
    """The store of a study dir: ``study_dir/kernels``, or those of its studies one level down."""
    study_dir = Path(study_dir)
    if (study_dir / "kernels").is_dir():
        return [KernelStore(study_dir)]
    if not study_dir.is_dir():
        return []
    return [KernelStore(p) for p in sorted(study_dir.iterdir()) if (p / "kernels").is_dir()]


def collect_records(study_dir: Path, arch: str, gpu: str, variant: str | None) -> list[KernelRecord]:
    """The best record per key across the stores found under ``study_dir``."""
    best: dict[tuple, KernelRecord] = {}
    for store in find_stores(study_dir):
        for r in store.records(arch=arch, gpu=gpu, variant=variant):
            if r.key not in best or r.tflops > best[r.key].tflops:
                best[r.key] = r
    return list(best.values())


def export_records(records: list[KernelRecord], profile, out_dir: Path) -> list[Path]:
    """Write the configs and the kernel files; returns the JSON paths."""
    docs = build_configs(records, profile)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    by_sha = {r.kernel_sha256: r for r in records}
    # Kernel files first: a JSON never points at a file that is not there yet.
    for sha, r in by_sha.items():
        _atomic_write(out_dir / f"{sha}.cubin", bytes(r.cubin))
        _atomic_write(out_dir / f"{sha}.cu", r.source.encode())
        _atomic_write(out_dir / f"{sha}.tl", r.tl_program.encode())
    paths = []
    for name, doc in docs.items():
        path = out_dir / name
        _atomic_write(path, (json.dumps(doc, indent=2, allow_nan=False) + "\n").encode())
        paths.append(path)
    return paths


def run_export(gpu: str, variant: str | None, study_dir: Path, out_dir: Path) -> int:
    """CLI entry: 0 exported, 1 nothing to export or a refused kernel, 2 usage or I/O error."""
    from hardware_profiles import ProfileError, load_profile
    from kernel_abi.spec import VARIANTS

    def err(msg: str) -> None:
        print(f"tune export: error: {msg}", file=sys.stderr)

    try:
        profile = load_profile(gpu)
    except ProfileError as exc:
        err(str(exc))
        return 2
    if variant is not None and variant not in VARIANTS:
        err(f"unknown variant {variant!r}; choose one of: {', '.join(VARIANTS)}")
        return 2
    try:
        records = collect_records(Path(study_dir), profile.arch_family, profile.name, variant)
    except CorruptRecordError as exc:
        err(f"corrupt kernel store: {exc}")
        return 2
    except OSError as exc:
        err(f"cannot read the kernel store under {study_dir}: {exc}")
        return 2
    if not records:
        what = f"{variant} kernels" if variant else "kernels"
        hint = ""
        others = collect_records_any_gpu(Path(study_dir), profile.arch_family, variant)
        if others:
            hint = (f" ({profile.arch_family} kernels measured on {', '.join(sorted(others))} exist: "
                    f"export them with --gpu {sorted(others)[0]})")
        err(f"no stored {what} for {profile.name} under {Path(study_dir)}; run a campaign first: "
            f"tune --gpu {profile.name} --variant {variant or 'mha'}{hint}")
        return 1
    try:
        paths = export_records(records, profile, out_dir)
    except ValueError as exc:
        err(str(exc))
        return 1
    except OSError as exc:
        err(f"cannot write to {out_dir}: {exc}")
        return 2
    for p in paths:
        print(f"wrote {p}")
    print(f"exported {len(records)} kernel(s) in {len(paths)} config file(s) to {out_dir}")
    return 0


def collect_records_any_gpu(study_dir: Path, arch: str, variant: str | None) -> set[str]:
    """GPU profile names with stored records of ``arch`` (for the hint when --gpu has none)."""
    names = set()
    try:
        for store in find_stores(study_dir):
            names |= {r.gpu for r in store.records(arch=arch, variant=variant)}
    except (CorruptRecordError, OSError):
        pass
    return names
