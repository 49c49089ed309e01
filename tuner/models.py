"""Model presets (`--model NAME`): the attention shapes of published models, as data in models.toml.

A broken models file is a ``ModelError`` naming the file and the preset, never a KeyError in a campaign.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from hardware_profiles import check_fields
from kernel_abi.spec import DTYPES, HEAD_DIMS, MLA_D_QK, MLA_D_V, VARIANTS, variant_of_heads

MODELS_FILE = Path(__file__).resolve().parent / "models.toml"


class ModelError(ValueError):
    """An unknown model or a broken models file."""


@dataclass(frozen=True)
class ModelPreset:
    name: str
    description: str
    variant: str
    heads_q: int
    heads_kv: int
    d_qk: int
    d_v: int
    causal: tuple[bool, ...]
    dtypes: tuple[str, ...]


_TYPES: dict[str, type] = {"description": str, "variant": str, "heads_q": int, "heads_kv": int,
                           "d_qk": int, "d_v": int, "causal": list, "dtypes": list}


def _preset(name: str, data: Any, source: str) -> ModelPreset:
    def fail(msg: str) -> ModelError:
        return ModelError(f"{source}: model '{name}': {msg}")

    if not isinstance(data, dict):
        raise ModelError(f"{source}: '{name}' must be a table of preset fields, got {type(data).__name__}")
    if name != name.lower():
        raise fail("preset names must be lowercase (lookup ignores case)")
    check_fields(data, _TYPES, fail)
    hq, hkv, dqk, dv, variant = data["heads_q"], data["heads_kv"], data["d_qk"], data["d_v"], data["variant"]
    for key in ("heads_q", "heads_kv", "d_qk", "d_v"):
        if data[key] < 1:
            raise fail(f"field '{key}' must be >= 1, got {data[key]}")
    if hq % hkv:
        raise fail(f"heads_q ({hq}) must be a multiple of heads_kv ({hkv})")
    if variant not in VARIANTS:
        raise fail(f"unknown variant {variant!r}; choose one of: {', '.join(VARIANTS)}")
    if variant == "mla":
        if (dqk, dv) != (MLA_D_QK, MLA_D_V):
            raise fail(f"mla kernels have head dims {MLA_D_QK}/{MLA_D_V}, got d_qk {dqk}, d_v {dv}")
    else:
        if variant != variant_of_heads(hq, hkv):
            raise fail(f"variant {variant!r} does not match heads {hq}q/{hkv}kv "
                       f"(that is {variant_of_heads(hq, hkv)!r}: mha when equal, mqa when heads_kv is 1, else gqa)")
        if dqk != dv or dqk not in HEAD_DIMS:
            raise fail(f"{variant} kernels take d_qk == d_v in {HEAD_DIMS}, got d_qk {dqk}, d_v {dv}")
    causal, dtypes = data["causal"], data["dtypes"]
    if not causal or not all(isinstance(c, bool) for c in causal) or len(set(causal)) != len(causal):
        raise fail(f"field 'causal' must list true and/or false once each, got {causal!r}")
    if not dtypes or any(d not in DTYPES for d in dtypes) or len(set(dtypes)) != len(dtypes):
        raise fail(f"field 'dtypes' must list some of {', '.join(DTYPES)} once each, got {dtypes!r}")
    if not data["description"].strip():
        raise fail("field 'description' is empty")
    return ModelPreset(name, data["description"], variant, hq, hkv, dqk, dv, tuple(causal), tuple(dtypes))


def load_models(path: Path | str | None = None) -> dict[str, ModelPreset]:
    """All presets of the models file (default: tuner/models.toml), by name, in file order."""
    source = Path(path) if path is not None else MODELS_FILE
    try:
        data = tomllib.loads(source.read_text())
    except OSError as exc:
        raise ModelError(f"{source}: cannot read models file: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ModelError(f"{source}: not valid TOML: {exc}") from None
    if not data:
        raise ModelError(f"{source}: no model presets")
    return {name: _preset(name, table, str(source)) for name, table in data.items()}


def get_model(name: str, path: Path | str | None = None) -> ModelPreset:
    """One preset by name, case-insensitive (``Llama3-8B`` finds ``llama3-8b``)."""
    models = load_models(path)
    preset = models.get(name.strip().lower())
    if preset is None:
        raise ModelError(f"unknown model {name!r}; choose one of: {', '.join(models)}")
    return preset
