"""nvcc driver: generated CuTe kernels -> cubins, batched, cached, with per-kernel ptxas resources.

Why batching: cicc's C++ front end dominates a compile and most of it is shared between
configs, so 8-16 configs in one translation unit cost ~4 s each instead of ~16 s alone (§1.6). One bad
config would sink its whole batch, so a failed batch is split: configs that the error log points at are
compiled alone, the rest together again.

Nothing here raises on a bad kernel: a compiler error, a crash (signal), a timeout or a missing nvcc is a
``CompileResult(ok=False, error_kind=..., log=...)``.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Protocol, Sequence

# -- errors -------------------------------------------------------------------------------------------


class ToolNotFound(RuntimeError):
    """A toolchain piece (nvcc, CUTLASS headers, cuobjdump) is not installed; the message says how to fix it."""


class NvccNotFound(ToolNotFound):
    pass


class CutlassNotFound(ToolNotFound):
    pass


ERROR_KINDS = ("compile-error", "timeout", "crash", "nvcc-missing")

# Flags every kernel is built with. -DNDEBUG matters for speed (FA3 sets it).
BASE_FLAGS = ("-std=c++17", "--expt-relaxed-constexpr", "-O3", "-DNDEBUG", "-Xptxas", "-v")


class KernelSource(Protocol):
    """What this module needs of a ``translate.GeneratedKernel``."""

    name: str
    preamble: str
    body: str
    source: str


# -- toolchain discovery ------------------------------------------------------------------------------


def find_nvcc() -> Path:
    """nvcc from PATH, then $CUDA_HOME/bin (or $CUDA_PATH/bin); NvccNotFound with the places looked at."""
    found = shutil.which("nvcc")
    if found:
        return Path(found)
    looked = ["PATH"]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root:
            candidate = Path(root) / "bin" / "nvcc"
            looked.append(f"${var}/bin ({candidate})")
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
        else:
            looked.append(f"${var} (unset)")
    raise NvccNotFound(
        "nvcc not found (looked in " + ", ".join(looked) + "). Install the CUDA toolkit (12.4+; 13.0 is "
        "tested) and put its bin/ on PATH or set CUDA_HOME.")


@functools.lru_cache(maxsize=8)
def _nvcc_version_of(nvcc: str, mtime: float) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    release = re.search(r"release [\d.]+, (V[\d.]+)", out)
    build = re.search(r"Build (\S+)", out)
    parts = [m.group(1) for m in (release, build) if m]
    return " ".join(parts) if parts else out.strip().splitlines()[-1] if out.strip() else "unknown"


def nvcc_version(nvcc: Optional[Path] = None) -> str:
    """E.g. ``V13.0.88 cuda_13.0.r13.0/compiler.36424714_0``; part of every cache key."""
    nvcc = Path(nvcc) if nvcc else find_nvcc()
    return _nvcc_version_of(str(nvcc), nvcc.stat().st_mtime)


def cutlass_include_dir() -> Path:
    """``cutlass_library/source/include`` of the installed ``nvidia-cutlass`` wheel (not imported, only located)."""
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        raise CutlassNotFound("the CUTLASS headers are missing: `pip install nvidia-cutlass==4.2.0.0` "
                              "(the wheel ships them under cutlass_library/source/include)")
    for location in spec.submodule_search_locations:
        include = Path(location) / "source" / "include"
        if (include / "cute" / "tensor.hpp").is_file():
            return include
    raise CutlassNotFound(f"the nvidia-cutlass package at {list(spec.submodule_search_locations)} has no "
                          "source/include/cute/tensor.hpp; reinstall nvidia-cutlass==4.2.0.0")


def cutlass_version(include: Optional[Path] = None) -> str:
    text = ((include or cutlass_include_dir()) / "cutlass" / "version.h").read_text(errors="replace")
    nums = [re.search(rf"#define CUTLASS_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in nums if m) or "unknown"


def _helper_include_dir() -> Optional[Path]:
    """translate.INCLUDE_DIR (device helper headers of the translator), when the translator provides it."""
    try:
        import translate
    except ImportError:  # pragma: no cover - the package is always there in this repo
        return None
    include = getattr(translate, "INCLUDE_DIR", None)
    return Path(include) if include else None


def trim_include_dir() -> Optional[Path]:
    """translate/include/cutlass_trim: empty stand-ins for CUTLASS headers no generated kernel uses (sm90 sparse
    GMMA, sm100/sm120 MMA and copy traits, print_latex). CuTe's mma_atom.hpp and copy_atom.hpp include every
    architecture's traits; put before the CUTLASS directory on the include path, these stand-ins keep those out
    of every translation unit (README.md there; tests/translate/test_preamble_size.py)."""
    helper = _helper_include_dir()
    trim = helper / "cutlass_trim" if helper is not None else None
    return trim if trim is not None and trim.is_dir() else None


def _tree_digest(directory: Optional[Path]) -> str:
    """Hash of every file under a header directory: an edited helper header must not hit a stale cubin."""
    h = hashlib.sha256()
    if directory and directory.is_dir():
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            h.update(str(path.relative_to(directory)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


# -- results ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelResources:
    """ptxas -v figures for one entry function."""

    registers: Optional[int] = None
    spill_stores: Optional[int] = None
    spill_loads: Optional[int] = None
    smem_static: Optional[int] = None
    stack_bytes: Optional[int] = None


@dataclass(frozen=True)
class CompileResult:
    """The outcome of building one kernel. ``cubin`` may hold other kernels of the same batch too; load
    the function by ``name``. ``compile_seconds`` is the kernel's share of its batch's wall time."""

    name: str
    ok: bool
    arch: str
    cubin: Optional[bytes] = field(default=None, repr=False)
    log: str = field(default="", repr=False)
    registers: Optional[int] = None
    spill_stores: Optional[int] = None
    spill_loads: Optional[int] = None
    smem_static: Optional[int] = None
    stack_bytes: Optional[int] = None
    compile_seconds: float = 0.0
    cached: bool = False
    error_kind: Optional[str] = None   # None when ok; else one of ERROR_KINDS
    key: str = ""                      # content hash: source + flags + toolchain
    nvcc_version: str = ""
    batch_size: int = 1                # kernels in the translation unit that produced this result
    ptx: Optional[str] = field(default=None, repr=False)   # compile_ptx only

    def resources(self) -> dict:
        return {"registers": self.registers, "spill_stores": self.spill_stores, "spill_loads": self.spill_loads,
                "smem_static": self.smem_static, "stack_bytes": self.stack_bytes}

    def to_dict(self) -> dict:
        """Everything but the binary, for JSON sidecars and logs."""
        d = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("cubin", "ptx")}
        d["cubin_bytes"] = len(self.cubin) if self.cubin else 0
        return d


# -- ptxas -v parsing ---------------------------------------------------------------------------------

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas_resources(log: str) -> dict[str, KernelResources]:
    """Per-entry-function resources from ``-Xptxas -v`` output.

    ptxas prints, per entry: ``Compiling entry function 'NAME'``, ``Function properties for NAME`` then a
    ``N bytes stack frame, N bytes spill stores, N bytes spill loads`` line, then ``Used N registers, ...
    [N bytes smem]``. Properties of non-entry device functions are printed too; they are ignored.
    """
    figures: dict[str, dict] = {}
    current_entry: Optional[str] = None   # the entry whose "Used" line comes next
    props_of: Optional[str] = None        # the function whose frame line comes next
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current_entry = m.group(1)
            figures.setdefault(current_entry, {})
            props_of = None
            continue
        if m := _PROPS.search(line):
            props_of = m.group(1)
            continue
        if (m := _FRAME.search(line)) and props_of is not None:
            if props_of in figures:
                figures[props_of].update(stack_bytes=int(m.group(1)), spill_stores=int(m.group(2)),
                                         spill_loads=int(m.group(3)))
            props_of = None
            continue
        if (m := _USED.search(line)) and current_entry is not None:
            s = _SMEM.search(line)
            figures[current_entry].update(registers=int(m.group(1)), smem_static=int(s.group(1)) if s else 0)
            current_entry = None
    return {name: KernelResources(**vals) for name, vals in figures.items()}


# -- the compile itself -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Toolchain:
    nvcc: Path
    version: str
    flags: tuple[str, ...]        # without -o / input; include paths included
    key_material: str             # what identifies the toolchain in cache keys (no machine paths)


def _toolchain(arch: str, extra_flags: Sequence[str], mode: str) -> _Toolchain:
    nvcc = find_nvcc()
    version = nvcc_version(nvcc)
    cutlass = cutlass_include_dir()
    helper = _helper_include_dir()
    target = ["-cubin", f"-arch={arch}"] if mode == "cubin" else ["-ptx", f"-arch={arch}"]
    flags = list(BASE_FLAGS if mode == "cubin" else [f for f in BASE_FLAGS if f not in ("-Xptxas", "-v")])
    # The stand-ins first: 8.9 -> 7.0 MB of preprocessed device code for a Hopper kernel, 0.3-0.45 CPU seconds
    # less per translation unit (gcc -E and cicc; nvcc 13.0, CUTLASS 4.2, 2 cores; BENCHMARKS.md, nvcc cost
    # per kernel); the cubins are byte for byte the same.
    trim = trim_include_dir()
    flags += target + [*extra_flags, *([f"-I{trim}"] if trim is not None else []), f"-I{cutlass}"]
    if helper is not None:
        flags.append(f"-I{helper}")
    semantic = [f for f in flags if not f.startswith("-I")]
    key_material = json.dumps({"nvcc": version, "cutlass": cutlass_version(cutlass), "flags": semantic,
                               "helpers": _tree_digest(helper)}, sort_keys=True)
    return _Toolchain(nvcc, version, tuple(flags), key_material)


def cache_key(source: str, toolchain_material: str) -> str:
    return hashlib.sha256(toolchain_material.encode() + b"\0" + source.encode()).hexdigest()


@dataclass
class _RunOutcome:
    returncode: Optional[int]
    log: str
    seconds: float
    timed_out: bool


def _run_nvcc(cmd: list[str], timeout: float, cwd: Path) -> _RunOutcome:
    """Run nvcc in its own process group so a timeout also kills cicc/ptxas, not just the driver."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", start_new_session=True)
    except OSError as exc:
        return _RunOutcome(None, f"cannot start {cmd[0]}: {exc}", time.monotonic() - start, False)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return _RunOutcome(proc.returncode, out, time.monotonic() - start, False)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, _ = proc.communicate()
        return _RunOutcome(proc.returncode, (out or "") + f"\nnvcc timed out after {timeout:g} s and was killed",
                           time.monotonic() - start, True)


_CRASH = re.compile(r"died due to signal|Segmentation fault|core dumped|internal compiler error|"
                    r"Internal error|std::bad_alloc|out of memory", re.IGNORECASE)


def _classify_failure(outcome: _RunOutcome) -> str:
    if outcome.timed_out:
        return "timeout"
    if outcome.returncode is None:
        return "nvcc-missing"
    if outcome.returncode < 0 or _CRASH.search(outcome.log):
        return "crash"
    return "compile-error"


@dataclass(frozen=True)
class _Unit:
    """A translation unit of several kernels, with the line span of each body (1-based, inclusive)."""

    text: str
    spans: tuple[tuple[int, int], ...]


def build_translation_unit(kernels: Sequence[KernelSource]) -> str:
    """The source nvcc sees for a batch: deduplicated preambles, then each kernel's namespaced body."""
    return _make_unit(kernels).text


def _make_unit(kernels: Sequence[KernelSource]) -> _Unit:
    if len(kernels) == 1:
        text = kernels[0].source
        return _Unit(text if text.endswith("\n") else text + "\n", ((1, text.count("\n") + 1),))
    lines = [f"// {len(kernels)} kernels in one translation unit (translate/nvcc.py batching)"]
    seen: list[str] = []
    for k in kernels:
        if k.preamble not in seen:
            seen.append(k.preamble)
            lines += k.preamble.rstrip("\n").split("\n")
    spans = []
    for k in kernels:
        lines += ["", f"// ==== kernel {k.name} ===="]
        start = len(lines) + 1
        lines += k.body.rstrip("\n").split("\n")
        spans.append((start, len(lines)))
    return _Unit("\n".join(lines) + "\n", tuple(spans))


_DIAG_HEAD = re.compile(r"^(\S.*?)\((\d+)\): (catastrophic error|error|warning|remark)", re.MULTILINE)


def _blamed(log: str, unit: _Unit, tu_name: str) -> Optional[set[int]]:
    """Indices of the kernels whose bodies the error messages point at; None when some error points
    elsewhere (preamble, a header with no trace back into a body) so no one can be blamed safely.

    An EDG diagnostic is a head line ``file(line): error: ...`` plus indented context, where template
    errors name the instantiation site (``at line N of file``). Warnings are not blame."""
    heads = list(_DIAG_HEAD.finditer(log))
    blamed: set[int] = set()
    errors = 0
    for i, head in enumerate(heads):
        if "error" not in head.group(3):
            continue
        errors += 1
        block = log[head.start():heads[i + 1].start() if i + 1 < len(heads) else len(log)]
        lines = [int(head.group(2))] if Path(head.group(1)).name == tu_name else []
        lines += [int(n) for n in re.findall(rf"at line (\d+) of \"?[^\s\"]*{re.escape(tu_name)}", block)]
        owners = {j for line in lines for j, (a, b) in enumerate(unit.spans) if a <= line <= b}
        if not owners:
            return None
        blamed |= owners
    return blamed if errors else None


class _Cache:
    """Content-addressed store: entries/<key>.json (log, resources, outcome) + blobs/<sha256>.bin, so
    the kernels of one batch share one blob. Writes are atomic (several workers may share the dir)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def _entry(self, key: str) -> Path:
        return self.root / "entries" / key[:2] / f"{key}.json"

    def get(self, key: str) -> Optional[CompileResult]:
        path = self._entry(key)
        try:
            data = json.loads(path.read_text())
            blob = None
            if data.get("blob"):
                blob = (self.root / "blobs" / f"{data['blob']}.bin").read_bytes()
        except (OSError, ValueError):
            return None
        data.pop("blob", None)
        ptx = data.pop("ptx_blob", None)
        if ptx is not None:
            data["ptx"] = blob.decode() if blob is not None else None
            blob = None
        known = {f.name for f in dataclasses.fields(CompileResult)}
        return CompileResult(**{k: v for k, v in data.items() if k in known}, cubin=blob, cached=True)

    def put(self, result: CompileResult) -> None:
        data = {k: v for k, v in dataclasses.asdict(result).items() if k not in ("cubin", "ptx", "cached")}
        payload = result.cubin if result.cubin is not None else (result.ptx.encode() if result.ptx else None)
        if payload is not None:
            digest = hashlib.sha256(payload).hexdigest()
            self._atomic_write(self.root / "blobs" / f"{digest}.bin", payload)
            data["blob"] = digest
            if result.ptx is not None:
                data["ptx_blob"] = True
        self._atomic_write(self._entry(result.key), json.dumps(data).encode())

    @staticmethod
    def _atomic_write(path: Path, payload: bytes) -> None:
        if path.exists() and path.suffix == ".bin":
            return  # content-addressed: same name, same bytes
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)


def default_cache_dir() -> Path:
    """$TUNER_CACHE_DIR, else ~/.cache/attn-autotuner/kernels."""
    env = os.environ.get("TUNER_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "attn-autotuner" / "kernels"


def _batch_timeout(per_kernel: float, n: int) -> float:
    # A batch shares the front end: 16 configs took 4x one config's time.
    return per_kernel * (1 + (n - 1) / 4)


class _Compiler:
    def __init__(self, toolchain: _Toolchain, arch: str, timeout: float, cache: Optional[_Cache]):
        self.tc, self.arch, self.timeout, self.cache = toolchain, arch, timeout, cache

    def _failure(self, k: KernelSource, key: str, kind: str, log: str, seconds: float, n: int) -> CompileResult:
        return CompileResult(name=k.name, ok=False, arch=self.arch, log=log, compile_seconds=seconds,
                             error_kind=kind, key=key, nvcc_version=self.tc.version, batch_size=n)

    def compile_group(self, group: list[tuple[KernelSource, str]]) -> list[CompileResult]:
        """Compile kernels in one unit; on failure split by blame, or one by one."""
        kernels = [k for k, _ in group]
        unit = _make_unit(kernels)
        n = len(kernels)
        with tempfile.TemporaryDirectory(prefix="tune-nvcc-") as tmp:
            tmpdir = Path(tmp)
            tu_name = "batch.cu" if n > 1 else f"{kernels[0].name}.cu"
            (tmpdir / tu_name).write_text(unit.text)
            out = tmpdir / "out.cubin"
            cmd = [str(self.tc.nvcc), *self.tc.flags, "-o", str(out), tu_name]
            outcome = _run_nvcc(cmd, _batch_timeout(self.timeout, n), tmpdir)
            cubin = out.read_bytes() if outcome.returncode == 0 and out.is_file() else None
        if cubin is not None:
            per_kernel = parse_ptxas_resources(outcome.log)
            results = []
            for k, key in group:
                res = per_kernel.get(k.name, KernelResources())
                results.append(CompileResult(
                    name=k.name, ok=True, arch=self.arch, cubin=cubin, log=outcome.log, compile_seconds=outcome.seconds / n,
                    error_kind=None, key=key, nvcc_version=self.tc.version, batch_size=n, **dataclasses.asdict(res)))
            self._store(results)
            return results
        kind = _classify_failure(outcome)
        if outcome.returncode == 0:  # nvcc said yes but wrote nothing: treat as a compiler fault
            kind, outcome.log = "crash", outcome.log + "\nnvcc exited 0 but wrote no cubin"
        if n == 1:
            result = self._failure(kernels[0], group[0][1], kind, outcome.log, outcome.seconds, 1)
            if kind == "compile-error":  # deterministic: worth remembering; timeouts and crashes may not recur
                self._store([result])
            return [result]
        blamed = _blamed(outcome.log, unit, tu_name) if kind == "compile-error" else None
        if blamed and len(blamed) < n:
            # The blamed ones alone (for their own log), the others together again.
            by_index = {i: self.compile_group([group[i]])[0] for i in sorted(blamed)}
            rest = [i for i in range(n) if i not in blamed]
            by_index.update(zip(rest, self.compile_group([group[i] for i in rest])))
            return [by_index[i] for i in range(n)]
        return [self.compile_group([g])[0] for g in group]

    def _store(self, results: Iterable[CompileResult]) -> None:
        if self.cache is None:
            return
        for r in results:
            try:
                self.cache.put(r)
            except OSError:
                pass  # a full or read-only cache must not fail the compile


def compile_kernels(kernels: Sequence[KernelSource], arch: str, *, cache_dir: Optional[Path] = None,
                    timeout: float = 300, jobs: int = 2, batch_size: int = 8,
                    extra_flags: Sequence[str] = ()) -> list[CompileResult]:
    """Build each kernel for ``arch`` (e.g. ``sm_80``, ``sm_90a``); one result per kernel, in order.

    Kernels go ``batch_size`` to a translation unit (same preamble only), ``jobs`` nvcc processes at a
    time (a 16-config unit peaks at ~8.5 GB). ``timeout`` is per kernel alone; a batch gets a share-scaled
    budget. With ``cache_dir``, results (ok ones, and compile errors) are stored by content hash and a hit
    skips nvcc. Never raises for a bad kernel or a missing toolchain.
    """
    kernels = list(kernels)
    if not kernels:
        return []
    try:
        tc = _toolchain(arch, extra_flags, "cubin")
    except ToolNotFound as exc:
        kind = "nvcc-missing"
        return [CompileResult(name=k.name, ok=False, arch=arch, log=str(exc), error_kind=kind) for k in kernels]
    cache = _Cache(cache_dir) if cache_dir is not None else None
    keys = [cache_key(k.source, tc.key_material) for k in kernels]
    done: dict[str, CompileResult] = {}
    if cache is not None:
        for key in set(keys):
            hit = cache.get(key)
            if hit is not None:
                done[key] = hit
    # Unique pending kernels, grouped by preamble (a unit concatenates preambles; keep them identical)
    # and with distinct symbol names inside one unit.
    pending: dict[str, KernelSource] = {}
    for k, key in zip(kernels, keys):
        if key not in done and key not in pending:
            pending[key] = k
    groups: list[list[tuple[KernelSource, str]]] = []
    by_preamble: dict[str, list[tuple[KernelSource, str]]] = {}
    for key, k in pending.items():
        by_preamble.setdefault(k.preamble, []).append((k, key))
    size = max(1, batch_size)
    for members in by_preamble.values():
        current: list[tuple[KernelSource, str]] = []
        for item in members:
            if len(current) >= size or any(item[0].name == c[0].name for c in current):
                groups.append(current)
                current = []
            current.append(item)
        if current:
            groups.append(current)
    compiler = _Compiler(tc, arch, timeout, cache)
    if groups:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for group, results in zip(groups, pool.map(compiler.compile_group, groups)):
                for (_, key), result in zip(group, results):
                    done[key] = result
    return [done[key] for key in keys]


def compile_kernel(kernel: KernelSource, arch: str, **options) -> CompileResult:
    """One kernel alone; see ``compile_kernels`` for the options."""
    return compile_kernels([kernel], arch, batch_size=1, jobs=1, **options)[0]


def compile_ptx(kernel: KernelSource, arch: str = "compute_75", *, cache_dir: Optional[Path] = None,
                timeout: float = 300, extra_flags: Sequence[str] = ()) -> CompileResult:
    """PTX for a virtual architecture (``result.ptx``), for the sm75 cross-check: the driver JIT-compiles
    compute_75 PTX on a newer GPU, so a T4 kernel's correctness can be checked on an H100."""
    try:
        tc = _toolchain(arch, extra_flags, "ptx")
    except ToolNotFound as exc:
        return CompileResult(name=kernel.name, ok=False, arch=arch, log=str(exc), error_kind="nvcc-missing")
    key = cache_key(kernel.source, tc.key_material)
    cache = _Cache(cache_dir) if cache_dir is not None else None
    if cache is not None and (hit := cache.get(key)) is not None:
        return hit
    with tempfile.TemporaryDirectory(prefix="tune-nvcc-") as tmp:
        tmpdir = Path(tmp)
        (tmpdir / "k.cu").write_text(kernel.source)
        out = tmpdir / "k.ptx"
        outcome = _run_nvcc([str(tc.nvcc), *tc.flags, "-o", str(out), "k.cu"], timeout, tmpdir)
        ptx = out.read_text() if outcome.returncode == 0 and out.is_file() else None
    if ptx is None:
        kind = _classify_failure(outcome) if outcome.returncode != 0 else "crash"
        return CompileResult(name=kernel.name, ok=False, arch=arch, log=outcome.log, compile_seconds=outcome.seconds,
                             error_kind=kind, key=key, nvcc_version=tc.version)
    result = CompileResult(name=kernel.name, ok=True, arch=arch, log=outcome.log, compile_seconds=outcome.seconds,
                           key=key, nvcc_version=tc.version, ptx=ptx)
    if cache is not None:
        try:
            cache.put(result)
        except OSError:
            pass
    return result
