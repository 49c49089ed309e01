"""The kernel store: the best verified kernel per (arch, variant, dtype, head dims, causal, shape bucket).

Layout under the store root (the study dir)::

    kernels/<arch>/<variant>/<dtype>-d<d_qk>x<d_v>-<causal|noncausal>/<bucket>/
        record.json        everything but the source, cubin and TL program (verification included)
        kernel.cu          the CuTe C++ source
        kernel.cubin       the compiled kernel; its sha256 is in record.json and checked on load
        program.tl         the TL program it was translated from
        verification.json  the verification report on its own, for people

A record is written whole or not at all: it is built in a hidden sibling directory, fsynced and renamed
into place, so a ``kill -9`` at any moment leaves either the old record or the new one. Replacing a
record takes two renames (old aside, new in); a crash between them leaves the old record aside, and
readers and the next writer use it. A kernel whose verification did not pass is never written.

Two ways in: ``offer`` compares the records' TFLOPS (numbers measured in different processes, so within
their noise: for records made by hand); the campaign uses ``replace``, whose decision was taken by timing
both kernels again side by side (tuner/campaign/confirm.py), and which writes only if the store still holds
the kernel that decision was taken against.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import shutil
import uuid
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Iterator

from kernel_abi.spec import FEATURES
from tuner.serving.buckets.names import bucket_errors, bucket_sort_key
from tuner.serving.buckets.decode import decode_bucket_errors, decode_bucket_sort_key, is_decode_bucket

FORMAT_VERSION = 1
RECORD_FILE = "record.json"
SOURCE_FILE = "kernel.cu"
CUBIN_FILE = "kernel.cubin"
PROGRAM_FILE = "program.tl"
VERIFICATION_FILE = "verification.json"

# Fields kept in their own files, not in record.json.
_BLOB_FIELDS = {"source": SOURCE_FILE, "cubin": CUBIN_FILE, "tl_program": PROGRAM_FILE}
_NEW_PREFIX, _OLD_PREFIX = ".new-", ".old-"


class StoreError(Exception):
    """Base of the store's errors."""


class UnverifiedKernelError(StoreError, ValueError):
    """A kernel whose verification did not pass was offered to the store."""


class InvalidRecordError(StoreError, ValueError):
    """A record that cannot be stored (no TFLOPS, no cubin, bad key fields)."""


class CorruptRecordError(StoreError):
    """A stored record that cannot be read back; the message names the file."""


@dataclass(frozen=True)
class KernelRecord:
    arch: str                 # "sm90": cubins run on one architecture family
    gpu: str                  # hardware profile name, "h100"
    device_name: str          # torch.cuda.get_device_name(), "NVIDIA H100 80GB HBM3"
    variant: str
    dtype: str
    d_qk: int
    d_v: int
    causal: bool
    bucket: str               # "s4096" (tuner.serving.buckets.seqlen); varlen/paged: "t16k-even", "t4k-even-p16" (tuner.serving.buckets.names)
    params: dict
    kernel_name: str
    kernel_meta: dict         # GeneratedKernel.meta(): what tuner.serving.launch.load_kernel needs
    source: str
    cubin: bytes
    tl_program: str
    verification: dict        # must hold "passed": True
    tflops: float
    baselines: dict           # {"flash": x, "cudnn": y, "efficient": z, "fa4": w}, None where a backend cannot run
    problem: dict             # the shape the TFLOPS were measured on
    provenance: dict          # tuner.store.provenance.collect()
    study: str = ""
    trial: int = -1
    sketch: str = ""          # the campaign's name of the TL sketch (tl_program) the kernel was built from
    # How it won its bucket: its re-timing against the best seed and the kernel it replaced (ratios with their
    # intervals, the rule; tuner/campaign/winners.py); empty for a record stored without one
    confirmation: dict = field(default_factory=dict)
    layout: str = "dense"     # how the kernel finds rows (tl/layout.py): dense, varlen, paged
    phase: str = "prefill"    # or "decode": a split-KV decode kernel (translate/decode), bucketed by
                              # tuner/serving/buckets/decode.py (``d-b8-kv8k-p16``)

    @property
    def kernel_sha256(self) -> str:
        return hashlib.sha256(self.cubin).hexdigest()

    @property
    def features(self) -> tuple[str, ...]:
        """The options the kernel is built with (kernel_abi.spec.FEATURES), as its metadata's spec states them."""
        spec = self.kernel_meta.get("spec") if isinstance(self.kernel_meta, dict) else None
        return tuple(f for f in FEATURES if isinstance(spec, dict) and spec.get(f))

    @property
    def kv_dtype(self) -> str:
        """A decode kernel's KV cache dtype where it is not ``dtype`` ("fp8": an e4m3 cache), as its metadata's spec
        states it; "" otherwise."""
        spec = self.kernel_meta.get("spec") if isinstance(self.kernel_meta, dict) else None
        return str(spec.get("kv_dtype") or "") if isinstance(spec, dict) else ""

    @property
    def key(self) -> tuple:
        # an FP8 cache's kernel is another key than the 16-bit cache's of the same bucket (the others keep theirs)
        return (self.arch, self.variant, self.dtype, self.d_qk, self.d_v, self.causal, self.bucket, self.layout,
                self.phase, self.features) + ((self.kv_dtype,) if self.kv_dtype else ())

    def to_json(self) -> dict:
        """record.json's content: every field but the blobs, plus the cubin hash."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _BLOB_FIELDS}
        data["baselines"] = {k: _finite_or_none(v) for k, v in self.baselines.items()}
        data["kernel_sha256"] = self.kernel_sha256
        data["format"] = FORMAT_VERSION
        return data


def _finite_or_none(value):
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def verification_passed(verification) -> bool:
    return isinstance(verification, dict) and verification.get("passed") is True


def validate_record(record: KernelRecord) -> list[str]:
    """Every reason a record cannot be stored, except failed verification (its own error)."""
    errors = []
    t = record.tflops
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
        errors.append(f"tflops must be a positive finite number, got {t!r}")
    if not isinstance(record.cubin, (bytes, bytearray)) or not record.cubin:
        errors.append("cubin is empty")
    if record.phase == "decode":
        errors.extend(decode_bucket_errors(record.bucket, record.layout))
    elif record.phase == "prefill":
        errors.extend(bucket_errors(record.bucket, record.layout))
    else:
        errors.append(f"phase must be prefill or decode, got {record.phase!r}")
    if not (isinstance(record.arch, str) and record.arch.startswith("sm") and record.arch[2:].isdigit()):
        errors.append(f"arch must look like sm90, got {record.arch!r}")
    for name in ("gpu", "variant", "dtype", "kernel_name"):
        value = getattr(record, name)
        if not isinstance(value, str) or not value or "/" in value or value.startswith("."):
            errors.append(f"{name} must be a plain non-empty name, got {value!r}")
    for name in ("d_qk", "d_v"):
        value = getattr(record, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errors.append(f"{name} must be a positive integer, got {value!r}")
    if not isinstance(record.causal, bool):
        errors.append(f"causal must be a bool, got {record.causal!r}")
    for name in ("params", "kernel_meta", "baselines", "problem", "provenance", "confirmation"):
        if not isinstance(getattr(record, name), dict):
            errors.append(f"{name} must be a dict")
    if not errors:
        try:
            json.dumps(record.to_json(), allow_nan=False)
        except (TypeError, ValueError) as exc:
            errors.append(f"record is not JSON-serialisable: {exc}")
    return errors


def shape_dir_name(dtype: str, d_qk: int, d_v: int, causal: bool, layout: str = "dense",
                   phase: str = "prefill", features: tuple = (), kv_dtype: str = "") -> str:
    # a kernel built with options (a window, a cap, sinks) never serves a plain call: a folder of its own
    name = "-".join([f"{dtype}-d{d_qk}x{d_v}-{'causal' if causal else 'noncausal'}", *features])
    if phase == "decode":   # decode kernels of every cache layout apart from the prefill ones (an FP8 cache's too)
        return f"{name}-{layout}-decode" + (f"-kv{kv_dtype}" if kv_dtype else "")
    return name if layout == "dense" else f"{name}-{layout}"   # dense names as before: stores stay readable


class KernelStore:
    """Best verified kernels under ``root/kernels``. Safe against kill -9 and several processes."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.kernels_dir = self.root / "kernels"

    # ---- writing -------------------------------------------------------------------------------

    def record_dir(self, arch: str, variant: str, dtype: str, d_qk: int, d_v: int, causal: bool,
                   bucket: str, layout: str = "dense", phase: str = "prefill", features: tuple = (),
                   kv_dtype: str = "") -> Path:
        return (self.kernels_dir / arch / variant
                / shape_dir_name(dtype, d_qk, d_v, causal, layout, phase, features, kv_dtype) / bucket)

    def offer(self, record: KernelRecord) -> bool:
        """Store ``record`` if it beats the stored one of its key (or there is none); True if stored.

        Raises UnverifiedKernelError when its verification did not pass and InvalidRecordError when
        it has no usable TFLOPS or cubin; nothing is written then.
        """
        self._check(record)
        final = self.record_dir(*record.key)
        final.parent.mkdir(parents=True, exist_ok=True)
        with self._lock(exclusive=True):
            _recover(final)
            if final.exists():
                current = _load_record(final)
                if current.tflops >= record.tflops:
                    return False
            _commit(record, final)
        return True

    def replace(self, record: KernelRecord, expected_sha256: str | None) -> bool:
        """Store ``record`` in place of the stored kernel whose cubin's sha256 is ``expected_sha256`` (None:
        nothing stored), whatever the TFLOPS say: the caller timed both side by side. False, and nothing
        written, when the store holds something else now (another driver stored meanwhile: the decision was
        not taken against it). The same errors as ``offer``."""
        self._check(record)
        final = self.record_dir(*record.key)
        final.parent.mkdir(parents=True, exist_ok=True)
        with self._lock(exclusive=True):
            _recover(final)
            current = _load_record(final).kernel_sha256 if final.exists() else None
            if current != expected_sha256:
                return False
            _commit(record, final)
        return True

    def _check(self, record: KernelRecord) -> None:
        if not verification_passed(record.verification):
            raise UnverifiedKernelError(
                f"kernel {record.kernel_name!r} ({record.key}) did not pass verification; it cannot be stored")
        errors = validate_record(record)
        if errors:
            raise InvalidRecordError(f"kernel {record.kernel_name!r} cannot be stored: " + "; ".join(errors))

    # ---- reading -------------------------------------------------------------------------------

    def records(self, arch: str | None = None, gpu: str | None = None,
                variant: str | None = None) -> list[KernelRecord]:
        """Every stored record, filtered; CorruptRecordError names the file of a broken one."""
        if not self.kernels_dir.is_dir():
            return []
        out = []
        with self._lock(exclusive=False):
            for rdir in self._record_dirs(arch, variant):
                rec = _load_record(rdir)
                if gpu is None or rec.gpu == gpu:
                    out.append(rec)
        return sorted(out, key=lambda r: (r.arch, r.variant, r.dtype, r.d_qk, r.d_v, r.causal, r.layout, r.phase,
                                          _bucket_order(r.bucket)))

    def best(self, arch: str, variant: str, dtype: str, d_qk: int, d_v: int, causal: bool,
             layout: str = "dense", phase: str = "prefill", features: tuple = (),
             kv_dtype: str = "") -> dict[str, KernelRecord]:
        """The stored kernels of one kernel spec, by bucket name."""
        shape = self.kernels_dir / arch / variant / shape_dir_name(dtype, d_qk, d_v, causal, layout, phase,
                                                                   tuple(features), kv_dtype)
        if not shape.is_dir():
            return {}
        with self._lock(exclusive=False):
            recs = [_load_record(d) for d in _bucket_dirs(shape)]
        return {r.bucket: r for r in sorted(recs, key=lambda r: _bucket_order(r.bucket))}

    def _record_dirs(self, arch, variant) -> Iterator[Path]:
        for adir in _visible_dirs(self.kernels_dir):
            if arch is not None and adir.name != arch:
                continue
            for vdir in _visible_dirs(adir):
                if variant is not None and vdir.name != variant:
                    continue
                for sdir in _visible_dirs(vdir):
                    yield from _bucket_dirs(sdir)

    @contextlib.contextmanager
    def _lock(self, exclusive: bool):
        # flock: several drivers may share one study dir; the lock dies with its process (kill -9).
        self.kernels_dir.mkdir(parents=True, exist_ok=True)
        with open(self.kernels_dir / ".lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


def _bucket_order(bucket: str) -> tuple:
    if is_decode_bucket(bucket):
        return (3, *decode_bucket_sort_key(bucket))
    return bucket_sort_key(bucket)


def _visible_dirs(path: Path) -> list[Path]:
    if not path.is_dir():
        return []
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))


def _bucket_dirs(shape_dir: Path) -> list[Path]:
    """Committed bucket dirs; a bucket whose replacement was cut between its two renames is read from
    the old copy set aside (the last committed state)."""
    found = {p.name: p for p in _visible_dirs(shape_dir)}
    for p in sorted(shape_dir.glob(_OLD_PREFIX + "*")):
        bucket = p.name[len(_OLD_PREFIX):].split(".", 1)[0]
        if bucket not in found and (p / RECORD_FILE).is_file():
            found[bucket] = p
    return [found[b] for b in sorted(found, key=_bucket_order)]


def _recover(final: Path) -> None:
    """Called under the exclusive lock before a write: restore a record set aside by a writer that died
    between its renames, and remove half-written directories."""
    parent = final.parent
    olds = sorted(parent.glob(f"{_OLD_PREFIX}{final.name}.*"))
    if not final.exists() and olds:
        os.rename(olds[-1], final)
        olds = olds[:-1]
    for stale in olds + sorted(parent.glob(f"{_NEW_PREFIX}{final.name}.*")):
        shutil.rmtree(stale, ignore_errors=True)


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _commit(record: KernelRecord, final: Path) -> None:
    tag = uuid.uuid4().hex[:12]
    new = final.parent / f"{_NEW_PREFIX}{final.name}.{tag}"
    old = final.parent / f"{_OLD_PREFIX}{final.name}.{tag}"
    try:
        new.mkdir()
        _write_file(new / SOURCE_FILE, record.source.encode())
        _write_file(new / CUBIN_FILE, bytes(record.cubin))
        _write_file(new / PROGRAM_FILE, record.tl_program.encode())
        _write_file(new / VERIFICATION_FILE, json.dumps(record.verification, indent=2, allow_nan=False).encode())
        # record.json last: a directory without it was never committed.
        _write_file(new / RECORD_FILE, json.dumps(record.to_json(), indent=2, sort_keys=True, allow_nan=False).encode())
        _fsync_dir(new)
        if final.exists():
            os.rename(final, old)
        os.rename(new, final)
        _fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        if old.exists() and not final.exists():
            os.rename(old, final)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _has_default(f) -> bool:
    return f.default is not MISSING or f.default_factory is not MISSING


# (records written before a field with a default existed load with that default)
_REQUIRED = [f.name for f in fields(KernelRecord) if f.name not in _BLOB_FIELDS and not _has_default(f)]
_OPTIONAL = [f.name for f in fields(KernelRecord) if f.name not in _BLOB_FIELDS and _has_default(f)]


def _load_record(rdir: Path) -> KernelRecord:
    path = rdir / RECORD_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CorruptRecordError(f"{path}: missing (the record directory is incomplete)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"{path}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise CorruptRecordError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CorruptRecordError(f"{path}: expected a JSON object, got {type(data).__name__}")
    missing = [k for k in _REQUIRED + ["kernel_sha256"] if k not in data]
    if missing:
        raise CorruptRecordError(f"{path}: missing field(s): {', '.join(missing)}")
    blobs = {}
    for name, fname in _BLOB_FIELDS.items():
        fpath = rdir / fname
        try:
            raw = fpath.read_bytes()
            blobs[name] = raw if name == "cubin" else raw.decode()
        except (OSError, UnicodeDecodeError) as exc:
            raise CorruptRecordError(f"{fpath}: cannot read: {exc}") from None
    values = {k: data[k] for k in _REQUIRED + [k for k in _OPTIONAL if k in data]}
    try:
        record = KernelRecord(**values, **blobs)
    except TypeError as exc:
        raise CorruptRecordError(f"{path}: {exc}") from None
    if record.kernel_sha256 != data["kernel_sha256"]:
        raise CorruptRecordError(f"{rdir / CUBIN_FILE}: sha256 {record.kernel_sha256} does not match "
                                 f"{data['kernel_sha256']} recorded in {path}")
    return record
