from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

PROFILE_DIR = Path(__file__).resolve().parent

# Every atom the translator knows, with the first compute capability that has it.
ATOM_CATALOGUE: dict[str, dict[str, tuple[int, int]]] = {
    "mma_atoms": {"SM75_16x8x8": (7, 5), "SM80_16x8x16": (8, 0), "SM90_GMMA": (9, 0)},
    "g2s_copy_atoms": {
        "UniversalCopy128": (7, 0),
        "SM80_CP_ASYNC_CACHEGLOBAL": (8, 0),
        "SM80_CP_ASYNC_CACHEALWAYS": (8, 0),
        "SM90_TMA": (9, 0),
    },
    "s2r_copy_atoms": {
        "SM75_U32x4_LDSM_N": (7, 5),
        "SM75_U32x2_LDSM_N": (7, 5),
        "UniversalCopy": (7, 0),
    },
}


class ProfileError(ValueError):
    """A profile that does not exist or whose file is broken."""


@dataclass(frozen=True)
class Profile:
    name: str
    display_name: str
    device_names: tuple[str, ...]
    ray_accelerator_type: str
    compute_capability: tuple[int, int]
    nvcc_arch: str
    sm_count: int
    smem_per_sm_kb: int
    smem_per_block_kb: int
    registers_per_sm: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    l2_cache_mb: int
    memory_gb: int
    memory_bandwidth_gbs: float
    tflops_fp16: float
    tflops_bf16: float
    fp8: bool
    dtypes: tuple[str, ...]
    mma_atoms: tuple[str, ...]
    g2s_copy_atoms: tuple[str, ...]
    s2r_copy_atoms: tuple[str, ...]

    @property
    def sm(self) -> int:
        """Compute capability as one number: 75, 80, 89, 90."""
        return self.compute_capability[0] * 10 + self.compute_capability[1]

    @property
    def default_dtype(self) -> str:
        """bf16 where the tensor cores have it, else fp16 (Turing)."""
        return "bf16" if "bf16" in self.dtypes else "fp16"

    @property
    def arch_family(self) -> str:
        """Cubins are stored per architecture: sm75, sm80, sm89, sm90."""
        return f"sm{self.sm}"

    @property
    def smem_per_block_bytes(self) -> int:
        return self.smem_per_block_kb * 1024

    @property
    def has_cp_async(self) -> bool:
        return self.sm >= 80

    def peak_tflops(self, dtype: str) -> float:
        if dtype == "fp8":   # FP8 tensor cores run at twice the 16-bit rate (H100: 1979 against 989 dense)
            return 2 * self.tflops_bf16
        return self.tflops_bf16 if dtype == "bf16" else self.tflops_fp16


_TYPES: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "display_name": str,
    "device_names": list,
    "ray_accelerator_type": str,
    "compute_capability": list,
    "nvcc_arch": str,
    "sm_count": int,
    "smem_per_sm_kb": int,
    "smem_per_block_kb": int,
    "registers_per_sm": int,
    "max_threads_per_sm": int,
    "max_blocks_per_sm": int,
    "l2_cache_mb": int,
    "memory_gb": int,
    "memory_bandwidth_gbs": (int, float),
    "tflops_fp16": (int, float),
    "tflops_bf16": (int, float),
    "fp8": bool,
    "dtypes": list,
    "mma_atoms": list,
    "g2s_copy_atoms": list,
    "s2r_copy_atoms": list,
}


def check_fields(data: dict[str, Any], types: dict[str, Any], fail: Callable[[str], Exception]) -> None:
    """A data file's table has exactly the fields of ``types`` (name -> type, or a tuple of types for a
    number), each of its type; ``fail(message)`` makes the exception to raise. Shared by the data files'
    loaders (profiles here, tuner/models.py)."""
    missing = [k for k in types if k not in data]
    if missing:
        raise fail(f"missing field(s): {', '.join(missing)}")
    unknown = sorted(set(data) - set(types))
    if unknown:
        raise fail(f"unknown field(s): {', '.join(unknown)}")
    for key, typ in types.items():
        value = data[key]
        # bool is an int in Python: a count given as true is still wrong.
        if isinstance(value, bool) and typ is not bool:
            raise fail(f"field '{key}' must be {getattr(typ, '__name__', 'a number')}, got {value!r}")
        if not isinstance(value, typ):
            want = typ.__name__ if isinstance(typ, type) else "a number"
            raise fail(f"field '{key}' must be {want}, got {type(value).__name__} {value!r}")


def validate_profile_data(data: dict[str, Any], source: str = "<profile>") -> Profile:
    """Check a profile's raw data field by field and build the Profile; ProfileError on any fault."""

    def fail(msg: str) -> ProfileError:
        return ProfileError(f"{source}: {msg}")

    check_fields(data, _TYPES, fail)
    cc = data["compute_capability"]
    if len(cc) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in cc):
        raise fail(f"field 'compute_capability' must be [major, minor], got {cc!r}")
    for key in ("sm_count", "smem_per_sm_kb", "smem_per_block_kb", "registers_per_sm",
                "max_threads_per_sm", "max_blocks_per_sm", "memory_gb", "memory_bandwidth_gbs"):
        if data[key] <= 0:
            raise fail(f"field '{key}' must be positive, got {data[key]!r}")
    if data["smem_per_block_kb"] > data["smem_per_sm_kb"]:
        raise fail("smem_per_block_kb cannot exceed smem_per_sm_kb")
    if not data["nvcc_arch"].startswith("sm_"):
        raise fail(f"field 'nvcc_arch' must look like sm_80, got {data['nvcc_arch']!r}")
    for dt in data["dtypes"]:
        if dt not in ("fp16", "bf16", "fp8"):
            raise fail(f"unknown dtype {dt!r} in 'dtypes' (known: fp16, bf16, fp8)")
        if dt == "fp8" and not data["fp8"]:
            raise fail("'dtypes' lists fp8 but the profile says fp8 = false")
        if data["tflops_" + ("bf16" if dt == "fp8" else dt)] <= 0:   # (fp8's peak is twice bf16's)
            raise fail(f"dtype {dt} is listed but tflops_{dt} is not positive")
    for key, catalogue in ATOM_CATALOGUE.items():
        if not data[key]:
            raise fail(f"field '{key}' must list at least one atom")
        for atom in data[key]:
            if atom not in catalogue:
                raise fail(f"unknown atom {atom!r} in '{key}' (known: {', '.join(catalogue)})")
            if tuple(cc) < catalogue[atom]:
                need = "%d.%d" % catalogue[atom]
                raise fail(f"atom {atom!r} needs compute capability {need}, profile has {cc[0]}.{cc[1]}")
    values = {}
    for f in fields(Profile):
        v = data[f.name]
        values[f.name] = tuple(v) if isinstance(v, list) else v
    return Profile(**values)


def load_profile_file(path: Path) -> Profile:
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read profile: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from None
    profile = validate_profile_data(data, str(path))
    if profile.name != Path(path).stem:
        raise ProfileError(f"{path}: name {profile.name!r} does not match the file name")
    return profile


def available_profiles(directory: Path = PROFILE_DIR) -> list[str]:
    return sorted(p.stem for p in Path(directory).glob("*.toml"))


def load_profile(name: str, directory: Path = PROFILE_DIR) -> Profile:
    """Load a profile by name (case-insensitive: ``H100`` and ``h100`` both work)."""
    key = name.strip().lower().replace(" ", "").replace("-", "")
    names = available_profiles(directory)
    if key not in names:
        raise ProfileError(f"unknown GPU {name!r}; choose one of: {', '.join(names)}")
    return load_profile_file(Path(directory) / f"{key}.toml")


def load_all_profiles(directory: Path = PROFILE_DIR) -> list[Profile]:
    profiles = [load_profile_file(Path(directory) / f"{n}.toml") for n in available_profiles(directory)]
    return sorted(profiles, key=lambda p: (p.sm, p.tflops_fp16))
