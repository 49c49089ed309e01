"""Model presets (`--model NAME`): the attention shapes of published models, as data in models.toml.

A broken models file is a ``ModelError`` naming the file and the preset, never a KeyError in a campaign.
"""
from __future__ import annotations

import math
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


LAYER_KINDS = {"L": "local", "G": "global"}


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
    # The attention options of the model's config.json: ``sliding_window`` as transformers reads it (a query sees
    # the W keys up to and including its own: FlashAttention's window (W - 1, 0)), on the layers that ``layers``
    # marks L (local) in its repeating pattern (G: global, the whole causal prefix); ``softcap`` on the scores of
    # every layer (0: none); ``sinks``: a learned logit per query head on every layer.
    sliding_window: int | None = None
    softcap: float = 0.0
    sinks: bool = False
    layers: str = "G"

    def layer_kinds(self) -> tuple[str, ...]:
        """The kinds of attention layer the model has, in the order its pattern first names them."""
        return tuple(LAYER_KINDS[c] for c in dict.fromkeys(self.layers))

    def options(self, kind: str) -> dict:
        """The kernel options of one kind of layer: {"window": (W - 1, 0) or (-1, -1), "softcap", "sinks"}."""
        if kind not in self.layer_kinds():
            raise ModelError(f"model {self.name} has no {kind} layers (its kinds: {', '.join(self.layer_kinds())})")
        window = (self.sliding_window - 1, 0) if kind == "local" else (-1, -1)
        return {"window": window, "softcap": self.softcap, "sinks": self.sinks}

    def kernel_support(self) -> str | None:
        """Why the kernels cannot serve this model yet (its head dims), or None."""
        if self.variant != "mla" and self.d_qk not in HEAD_DIMS:
            return (f"model {self.name} has head dim {self.d_qk}, which the kernels do not take yet "
                    f"({', '.join(map(str, HEAD_DIMS))}; MLA {MLA_D_QK}/{MLA_D_V})")
        return None


_TYPES: dict[str, type] = {"description": str, "variant": str, "heads_q": int, "heads_kv": int,
                           "d_qk": int, "d_v": int, "causal": list, "dtypes": list}
_OPTIONAL: dict[str, type] = {"sliding_window": int, "softcap": float, "sinks": bool, "layers": str}


def _preset(name: str, data: Any, source: str) -> ModelPreset:
    def fail(msg: str) -> ModelError:
        return ModelError(f"{source}: model '{name}': {msg}")

    if not isinstance(data, dict):
        raise ModelError(f"{source}: '{name}' must be a table of preset fields, got {type(data).__name__}")
    if name != name.lower():
        raise fail("preset names must be lowercase (lookup ignores case)")
    optional = {k: data[k] for k in _OPTIONAL if k in data}
    if isinstance(optional.get("softcap"), int) and not isinstance(optional.get("softcap"), bool):
        optional["softcap"] = float(optional["softcap"])
    for key, value in optional.items():
        if not isinstance(value, _OPTIONAL[key]) or (key != "sinks" and isinstance(value, bool)):
            raise fail(f"field '{key}' must be {_OPTIONAL[key].__name__}, got {value!r}")
    check_fields({k: v for k, v in data.items() if k not in _OPTIONAL}, _TYPES, fail)
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
        if dqk != dv:   # a head dim the kernels do not take yet is data here, refused where it is used
            raise fail(f"{variant} models have d_qk == d_v, got d_qk {dqk}, d_v {dv}")
    causal, dtypes = data["causal"], data["dtypes"]
    if not causal or not all(isinstance(c, bool) for c in causal) or len(set(causal)) != len(causal):
        raise fail(f"field 'causal' must list true and/or false once each, got {causal!r}")
    if not dtypes or any(d not in DTYPES for d in dtypes) or len(set(dtypes)) != len(dtypes):
        raise fail(f"field 'dtypes' must list some of {', '.join(DTYPES)} once each, got {dtypes!r}")
    if not data["description"].strip():
        raise fail("field 'description' is empty")
    layers = optional.get("layers", "L" if "sliding_window" in optional else "G")
    if not layers or set(layers) - set(LAYER_KINDS):
        raise fail(f"field 'layers' is a repeating pattern of L (local) and G (global) layers, got {layers!r}")
    window = optional.get("sliding_window")
    if ("L" in layers) != (window is not None):
        raise fail("a pattern with local layers (L) needs 'sliding_window', and 'sliding_window' needs L layers")
    if window is not None and window < 1:
        raise fail(f"field 'sliding_window' must be >= 1, got {window}")
    cap = optional.get("softcap", 0.0)
    if not math.isfinite(cap) or cap < 0:
        raise fail(f"field 'softcap' must be a finite number >= 0, got {cap}")
    return ModelPreset(name, data["description"], variant, hq, hkv, dqk, dv, tuple(causal), tuple(dtypes),
                       window, cap, bool(optional.get("sinks", False)), layers)


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
