"""The (variant, head dim, dtype, causal) combinations one campaign tunes, expanded from the CLI's values.

Pure and CPU-only: ``--variant mha,gqa --head-dim 64,128 --causal both`` or ``--model llama3-8b`` become
a list of ``Combination``; bad values are a ``ComboError`` naming the value and the choices.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from tuner.models import ModelError, get_model
from kernel_abi.spec import (DTYPES, HEAD_DIMS, MLA_D_QK, MLA_D_V, VARIANTS, KernelSpec, Problem, grid_problems,
                           heads_for, is_local, spec_for)
from kernel_abi.spec import MLA_ABSORBED_D_QK, MLA_ABSORBED_D_V

CAUSAL_WORDS = {"both": (True, False),
                "true": (True,), "causal": (True,), "yes": (True,), "1": (True,),
                "false": (False,), "noncausal": (False,), "no": (False,), "0": (False,)}


class ComboError(ValueError):
    """CLI values that name no valid combination."""


@dataclass(frozen=True)
class Combination:
    variant: str                          # mha gqa mqa mla
    head_dim: int | None                  # d_qk as the user gives it; None for mla (always 192/128)
    dtype: str                            # fp16 / bf16
    causal: bool
    heads: tuple[int, int] | None = None  # (heads_q, heads_kv) of a model preset; None = the paper grid's heads
    model: str | None = None
    layout: str = "dense"                 # dense, or a serving layout: varlen / paged (tuner/measure/mixes.py)
    page_size: int | None = None          # paged only
    phase: str = "prefill"                # decode: split-KV decode over a paged or dense cache
    # The attention options built into the kernels and given to every problem (kernel_abi.spec: a window (left,
    # right) in keys, a cap, sinks), from --window/--softcap/--sinks or a preset's kind of layer (``layer``)
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    sinks: bool = False
    layer: str | None = None              # "local" or "global": the preset's kind of layer these options are
    kv_dtype: str = ""                    # decode: "fp8", an e4m3 cache (KernelSpec.kv_dtype); "": the queries'

    def window_for_mask(self) -> tuple[int, int]:
        """The window as a problem of this causality states it (causal: the right side 0)."""
        if self.window == (-1, -1):
            return self.window
        return (self.window[0], 0) if self.causal else self.window

    def has_options(self) -> bool:
        return self.window != (-1, -1) or self.softcap > 0 or self.sinks

    def options_text(self) -> str:
        """``window 127,0, sinks``: the options as the label and the study name's reader see them; "" for none."""
        w = self.window_for_mask()
        return ", ".join(x for x in (w != (-1, -1) and f"window {w[0]},{w[1]}",
                                     self.softcap and f"softcap {self.softcap:g}", self.sinks and "sinks") if x)

    def options_tag(self) -> str:
        """The options in a study name: ``-w127-sinks``, ``-w4096x4096-cap50``; "" for none (names as before)."""
        w = self.window_for_mask()
        window = "" if w == (-1, -1) else (f"-w{w[0]}" if w[1] in (0, -1) and self.causal else f"-w{w[0]}x{w[1]}")
        return window + (f"-cap{self.softcap:g}" if self.softcap else "") + ("-sinks" if self.sinks else "")

    def label(self) -> str:
        dims = f"d{MLA_D_QK}/{MLA_D_V}" if self.variant == "mla" else f"d{self.head_dim}"
        text = f"{self.variant} {dims} {self.dtype} {'causal' if self.causal else 'noncausal'}"
        serving = self.layout if self.page_size is None else f"{self.layout} page {self.page_size}"
        if self.phase == "decode":
            text = text.replace(f"d{MLA_D_QK}/{MLA_D_V}", f"d{MLA_ABSORBED_D_QK}/{MLA_ABSORBED_D_V} absorbed")
            serving = f"decode, {serving if self.page_size else 'dense'} cache"
        if self.kv_dtype:
            serving = serving.replace(" cache", f" {self.kv_dtype} cache")
        extra = [x for x in (self.model, self.heads and f"{self.heads[0]}q/{self.heads[1]}kv",
                             (self.layout != "dense" or self.phase == "decode") and serving,
                             self.layer and f"{self.layer} layers", self.options_text()) if x]
        return f"{text} ({', '.join(extra)})" if extra else text

    def spec(self) -> KernelSpec:
        spec = replace(spec_for(self.variant, self.head_dim, self.dtype, self.causal), layout=self.layout)
        if self.has_options():
            spec = replace(spec, local=is_local(self.window_for_mask(), self.causal), softcap=self.softcap > 0,
                           sinks=self.sinks)
        if self.phase != "decode":
            return spec
        if self.variant == "mla":   # DeepSeek decodes MLA absorbed: the latent rows are K, their first 512 V
            spec = replace(spec, d_qk=MLA_ABSORBED_D_QK, d_v=MLA_ABSORBED_D_V)
        return replace(spec, phase="decode", kv_dtype=self.kv_dtype)

    def kv_tag(self) -> str:
        """``-kvfp8`` in a study name of an FP8 cache's decode combination; "" otherwise (names as before)."""
        return f"-kv{self.kv_dtype}" if self.kv_dtype else ""

    def decode_heads(self) -> tuple[int, int]:
        """(heads_q, heads_kv) of a decode call: the preset's, else the paper grid's; absorbed MLA has one
        latent KV head for all query heads."""
        hq, hkv, _, _ = heads_for(self.variant, self.spec().d_qk if self.variant != "mla" else MLA_D_QK)
        hq, hkv = self.heads or (hq, hkv)
        return (hq, 1) if self.variant == "mla" else (hq, hkv)

    def problems(self, **grid) -> list:
        """The benchmark problems of this combination: the paper grid (``grid``: total_tokens, seqlens), or
        for a serving layout its mixes (tuner/measure/mixes.toml) with these heads and dims, or for decode one call
        per decode bucket (tuner/measure/decode_problem.py)."""
        if self.phase == "decode":
            from tuner.measure.decode_problem import decode_problems

            spec = self.spec()
            hq, hkv = self.decode_heads()
            return decode_problems(self.variant, hq, hkv, spec.d_qk, spec.d_v, self.causal, self.dtype,
                                   self.page_size, self.window_for_mask(), self.softcap, self.sinks, self.kv_dtype)
        if self.layout == "dense":
            problems = grid_problems(self.variant, self.spec().d_qk, self.dtype, self.causal, heads=self.heads,
                                     **grid)
            if not self.has_options():
                return problems
            return [p.with_(window=self.window_for_mask(), softcap=self.softcap, sinks=self.sinks) for p in problems]
        from tuner.measure.mixes import serving_problems

        spec = self.spec()
        hq, hkv, _, _ = heads_for(self.variant, spec.d_qk)
        hq, hkv = self.heads or (hq, hkv)
        problems = serving_problems(self.layout, self.variant, hq, hkv, spec.d_qk, spec.d_v, self.causal, self.dtype,
                                    self.page_size)
        if not self.has_options():
            return problems
        return [replace(p, window=self.window_for_mask(), softcap=self.softcap, sinks=self.sinks) for p in problems]

    def shapes(self) -> list[Problem]:
        """Dense problems of this combination's heads and dims (what the validators check a parameter set
        against; a serving mix's lengths change no rule of theirs)."""
        if self.phase == "decode":
            spec = self.spec()
            hq, hkv = self.decode_heads()
            return [Problem(self.variant, 1, hq, hkv, 1, 1, spec.d_qk, spec.d_v, self.causal, self.dtype)]
        if self.layout == "dense":
            return self.problems()
        return [Problem(p.variant, 1, p.heads_q, p.heads_kv, 1, 1, p.d_qk, p.d_v, p.causal, p.dtype)
                for p in self.problems()[:1]]


def _items(option: str, value: str) -> list[str]:
    """A comma list, lowercased, duplicates dropped, order kept."""
    items = list(dict.fromkeys(x.strip().lower() for x in value.split(",") if x.strip()))
    if not items:
        raise ComboError(f"--{option} is empty")
    return items


def _variants(value: str) -> list[str]:
    items = _items("variant", value)
    if "all" in items:  # `all,mha` still means all four
        return list(VARIANTS)
    bad = [x for x in items if x not in VARIANTS]
    if bad:
        raise ComboError(f"unknown variant {', '.join(map(repr, bad))}; choose from: {', '.join(VARIANTS)} "
                         "(a comma list) or all")
    return items


def _head_dims(value: str | int | None, variants: list[str]) -> list[int | None]:
    """Head dims for the non-MLA variants; mla ignores them, being always 192/128."""
    if value is None:
        return [128]
    if isinstance(value, bool):  # bool is an int in Python
        raise ComboError(f"--head-dim must be one of {', '.join(map(str, HEAD_DIMS))}, got {value!r}")
    if isinstance(value, int):
        dims = [value]
    else:
        try:
            dims = list(dict.fromkeys(int(x) for x in _items("head-dim", value)))  # "128,0128" is one
        except ValueError:
            raise ComboError(f"--head-dim must be a comma list of {', '.join(map(str, HEAD_DIMS))}, got {value!r}") from None
    if variants == ["mla"]:
        # As spec_for: an explicit head dim on an mla-only run must be its own (192).
        bad = [d for d in dims if d != MLA_D_QK]
        if bad:
            raise ComboError(f"mla has head dims q/k {MLA_D_QK}, v {MLA_D_V}; --head-dim {bad[0]} does not apply")
        return [None]
    bad = [d for d in dims if d not in HEAD_DIMS]
    if bad:
        raise ComboError(f"head dim {bad[0]} is not supported; choose {', '.join(map(str, HEAD_DIMS))} "
                         f"(mla is always {MLA_D_QK}/{MLA_D_V} and needs no --head-dim)")
    return dims


def _dtypes(value: str | None, profile) -> list[str]:
    if value is None:
        return [profile.default_dtype]
    items = _items("dtype", value)
    for d in items:
        if d not in DTYPES:
            raise ComboError(f"unknown dtype {d!r}; choose from: {', '.join(DTYPES)}")
        if d not in profile.dtypes:
            raise ComboError(f"{profile.name} does not support {d}; choose one of: {', '.join(profile.dtypes)}")
    return items


def _causal(value: str | bool | None) -> tuple[bool, ...]:
    if value is None:
        return (True,)
    if isinstance(value, bool):
        return (value,)
    flags = CAUSAL_WORDS.get(str(value).strip().lower())
    if flags is None:
        raise ComboError(f"--causal {value!r} is not one of: {', '.join(CAUSAL_WORDS)}")
    return flags


def _from_model(profile, name: str, dtype: str | None, causal: str | bool | None,
                layer: str | None = None) -> list[Combination]:
    try:
        preset = get_model(name)
    except ModelError as exc:
        raise ComboError(str(exc)) from None
    if preset.kernel_support():
        raise ComboError(preset.kernel_support())
    if dtype is not None:
        dtypes = _dtypes(dtype, profile)
    else:
        dtypes = [d for d in preset.dtypes if d in profile.dtypes]
        if not dtypes:
            raise ComboError(f"model {preset.name} runs in {', '.join(preset.dtypes)}, which {profile.name} does not "
                             f"support (its dtypes: {', '.join(profile.dtypes)}); give --dtype to tune it anyway")
    flags = sorted(preset.causal, reverse=True) if causal is None else _causal(causal)  # causal first
    head_dim = None if preset.variant == "mla" else preset.d_qk
    heads = (preset.heads_q, preset.heads_kv)
    kinds = preset.layer_kinds() if layer is None else (layer,)
    if layer is not None and layer not in preset.layer_kinds():
        raise ComboError(f"model {preset.name} has {' and '.join(preset.layer_kinds())} layers; --layer {layer} is "
                         "not one of them")
    out = []
    for kind in kinds:      # a model with local and global layers needs kernels of both: one combination each
        o = preset.options(kind)
        named = kind if len(preset.layer_kinds()) > 1 or o["window"] != (-1, -1) else None
        out += [Combination(preset.variant, head_dim, d, c, heads, preset.name, window=o["window"],
                            softcap=o["softcap"], sinks=o["sinks"], layer=named) for d in dtypes for c in flags]
    return out


ALL = "all"
PREFILL_LAYOUTS = ("dense", "varlen", "paged")
DECODE_LAYOUTS = ("paged", "dense")
DEFAULT_PAGE_SIZE = 16       # vLLM's; what `--layout all` tunes when no --page-size is given


def several(value) -> bool:
    """Whether a --layout / --phase / --page-size value names more than one: ``all``, a comma list, a tuple."""
    if isinstance(value, (tuple, list)):
        return True
    return isinstance(value, str) and (value.strip().lower() == ALL or "," in value)


def serving_targets(profile, layout, phase, page_size) -> tuple[list[tuple[str, str, int | None]], list[str]]:
    """The (layout, phase, page size) a run over several tunes, and a note per one the GPU cannot take.

    ``phase`` all: prefill and decode. ``layout`` all: for prefill dense, varlen and paged (the serving layouts on
    Hopper GPUs only), for decode a paged cache; a comma list names them (decode takes paged and dense). Paged
    kernels, prefill and decode, are tuned for each page size of ``page_size`` (an int or a tuple; default 16)."""
    from tuner.serving.buckets.serving import PAGE_SIZES

    phases = ("prefill", "decode") if str(phase).strip().lower() == ALL else tuple(_items("phase", str(phase)))
    bad = [p for p in phases if p not in ("prefill", "decode")]
    if bad:
        raise ComboError(f"--phase must be prefill, decode, a comma list of them or all, got {bad[0]!r}")
    named = None if str(layout).strip().lower() == ALL else tuple(_items("layout", str(layout)))
    bad = [x for x in named or () if x not in PREFILL_LAYOUTS]
    if bad:
        raise ComboError(f"--layout must be {', '.join(PREFILL_LAYOUTS)}, a comma list of them or all, got {bad[0]!r}")
    sizes = tuple(page_size) if isinstance(page_size, (tuple, list)) else (() if page_size is None else (page_size,))
    bad = [x for x in sizes if isinstance(x, bool) or x not in PAGE_SIZES]
    if bad:
        raise ComboError(f"--page-size must be among {', '.join(map(str, PAGE_SIZES))}, got {bad[0]!r}")
    hopper = "SM90_GMMA" in getattr(profile, "mma_atoms", ())
    out, notes = [], []
    for ph in phases:
        if ph == "decode" and profile.sm < 80:
            notes.append(f"decode left out: its kernels need an sm80+ GPU, {profile.name} is sm{profile.sm}")
            continue
        layouts = named or (PREFILL_LAYOUTS if ph == "prefill" else ("paged",))
        for lay in layouts:
            if ph == "decode" and lay not in DECODE_LAYOUTS:
                notes.append(f"decode over a {lay} cache left out: decode reads a paged or a dense cache")
                continue
            if ph == "prefill" and lay != "dense" and not hopper:
                notes.append(f"{lay} prefill left out: its kernels are the warp-specialised Hopper ones, "
                             f"{profile.name} is not a Hopper GPU")
                continue
            if lay == "paged":
                out += [(lay, ph, size) for size in sizes or (DEFAULT_PAGE_SIZE,)]
            else:
                out.append((lay, ph, None))
    if sizes and not any(lay == "paged" for lay, _, _ in out):
        raise ComboError("--page-size applies to a paged layout; the layouts asked for have none")
    if not out:
        raise ComboError(f"nothing to tune on {profile.name}: " + "; ".join(notes))
    return out, notes


def expand_combinations(profile, variant: str | None, head_dim: str | int | None, dtype: str | None,
                        causal: str | bool | None, model: str | None, layout: str = "dense",
                        page_size: int | tuple | None = None, phase: str = "prefill", window=None,
                        softcap: float | None = None, sinks: bool = False, layer: str | None = None,
                        notes: list | None = None) -> list[Combination]:
    """Every combination the options name, variant-major, then head dim, dtype, causal (causal first); each of
    ``layout`` (a serving layout needs the warp-specialised Hopper kernels: an sm90 profile) and ``phase``
    (decode kernels need cp.async and mma.sync: sm80+).

    Attention options: ``window`` (left, right), ``softcap``, ``sinks`` (--window/--softcap/--sinks) apply to every
    combination; without them a model preset's own (tuner/models.toml) give one combination per kind of its layers
    (local, global), or the ``layer`` kind alone. Options are tuned for the prefill of Hopper GPUs in every layout
    (the warp-specialised kernels build them) and for decode (sm80+, not absorbed MLA): elsewhere a ComboError says
    so.

    Several layouts or phases (``all`` or comma lists, several page sizes: serving_targets) give the combinations
    of each, in order (dense prefill, varlen, paged, decode); absorbed MLA's decode with options left out, named in
    ``notes``.

    ``profile`` is a hardware_profiles.Profile (its name and dtypes are used)."""
    if several(layout) or several(phase) or several(page_size):
        targets, left_out = serving_targets(profile, layout, phase, page_size)
        dense = expand_combinations(profile, variant, head_dim, dtype, causal, model, "dense", None, "prefill",
                                    window, softcap, sinks, layer)
        plain = [c for c in dense if not c.has_options()]
        out = []
        for lay, ph, size in targets:
            if (lay, ph) == ("dense", "prefill"):
                out += dense
                continue
            # every prefill layout builds the options; decode too, absorbed MLA's excepted (no model needs them there)
            takes = [c for c in dense if c.variant != "mla"] if ph == "decode" else dense
            kept = plain + [c for c in takes if c.has_options()]
            if len(kept) < len(dense):
                left_out.append(f"{lay} {ph}{f' (pages of {size})' if size else ''}: the {len(dense) - len(kept)} "
                                "absorbed-MLA combination(s) with a window, softcap or sinks are left out (its decode "
                                "kernels are built without them)")
            out += [replace(c, layout=lay, page_size=size, phase=ph) for c in dense if c in kept]   # (serving_targets)
        if notes is not None:
            notes.extend(left_out)
        return out
    layer = layer.strip().lower() if isinstance(layer, str) else layer
    if layer is not None and model is None:
        raise ComboError("--layer picks a --model preset's kind of layer (local or global); give --model")
    given = window is not None or bool(softcap) or sinks
    combos = _combinations(profile, variant, head_dim, dtype, causal, model, None if given else layer)
    if given:
        combos = list(dict.fromkeys(replace(c, window=tuple(window) if window is not None else (-1, -1),
                                            softcap=float(softcap or 0.0), sinks=bool(sinks), layer=None)
                                    for c in combos))
    if any(c.has_options() for c in combos):
        if phase == "decode" and any(c.variant == "mla" for c in combos):
            raise ComboError("absorbed MLA decode kernels are built without windows, soft-capping or sinks (no MLA "
                             "model uses them); drop the options")
        if phase != "decode" and "SM90_GMMA" not in getattr(profile, "mma_atoms", ()):
            raise ComboError(f"sliding windows, soft-capping and sinks are built into the warp-specialised Hopper "
                             f"kernels; {profile.name} is not a Hopper GPU")
    if phase == "decode":
        if profile.sm < 80:
            raise ComboError(f"--phase decode needs an sm80+ GPU (its kernels gather with cp.async); {profile.name} "
                             f"is sm{profile.sm}")
        return [replace(c, layout=layout, page_size=page_size, phase="decode") for c in combos]
    if layout == "dense":
        return combos
    from tl.layout import LAYOUTS

    if layout not in LAYOUTS:   # (a layout that does not exist needs no Hopper GPU either)
        raise ComboError(f"--layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if "SM90_GMMA" not in getattr(profile, "mma_atoms", ()):
        raise ComboError(f"--layout {layout} needs a Hopper GPU (its kernels are the warp-specialised TMA ones); "
                         f"{profile.name} is not one: tune the dense layout there")
    return [replace(c, layout=layout, page_size=page_size) for c in combos]


def kv_dtype_combinations(combos: list[Combination], kv_dtype: str) -> list[Combination]:
    """--kv-dtype: the decode combinations over a cache of ``kv_dtype`` (fp8: e4m3 with scales); ComboError where a
    combination is not one an FP8 cache kernel serves (prefill, absorbed MLA, fp8 queries)."""
    from kernel_abi.spec import kv_dtype_errors

    out = []
    for c in combos:
        if c.phase != "decode":
            raise ComboError(f"--kv-dtype {kv_dtype} is a decode cache's dtype; {c.label()} is {c.phase}")
        c = replace(c, kv_dtype=kv_dtype)
        errors = kv_dtype_errors(c.spec())
        if errors:
            raise ComboError(f"{c.label()}: {errors[0]}")
        out.append(c)
    return out


def _combinations(profile, variant, head_dim, dtype, causal, model, layer=None) -> list[Combination]:
    if model is not None:
        if variant is not None or head_dim is not None:
            raise ComboError("--model sets the variant and head dim; drop --variant/--head-dim")
        return _from_model(profile, model, dtype, causal, layer)
    if variant is None:
        raise ComboError(f"give --variant ({', '.join(VARIANTS)}, a comma list or all) or --model")
    variants = _variants(variant)
    dims = _head_dims(head_dim, variants)
    dtypes, flags = _dtypes(dtype, profile), _causal(causal)
    out = []
    for v in variants:
        for hd in ([None] if v == "mla" else dims):
            out.extend(Combination(v, hd, d, c) for d in dtypes for c in flags)
    return out
