"""Search spaces as data: one TOML file per variant (``mha.toml`` …), loaded into frozen dataclasses.

A file declares each kernel parameter's domain (categorical ``choices`` or an ``int`` range), optional
narrowing by head dim (``by_head_dim``), per layout where a serving layout's kernel measured differently
(``by_layout = { paged = { "128" = [...] } }``: those head dims' choices in a space loaded for that layout),
conditions (``when``: the parameter is only searched when
earlier parameters take given values; otherwise ``default`` is used), per-architecture and per-dtype
restrictions (``[arch.sm75]``, ``[dtype.bf16]``) and seeds from FA2/FA3's shipped choices. A restriction is a list
(the parameter keeps those of its values) or, in a ``[dtype.*]`` table, a table by head dim (``hopper_block_n = {
"128" = [...] }``): the dtype's own values at those head dims, in place of the parameter's (FP8 kernels take other
tiles than the 16-bit ones at the same head dim); other head dims keep the parameter's.

Two additions carry the structure of the Hopper kernels: a parameter may set another KernelParams field
than its own name (``target``: ``hopper_block_m`` sets ``block_m`` from 64 x warpgroups, with its own
Optuna distribution), and ``[derived.FIELD]`` computes a field from the others (``num_warps = block_m // 16``
when the MMA is wgmma) instead of searching it. The pseudo-field ``schedule`` chooses the reference
sketch set (tl.SCHEDULES): the sketch is a dimension of the search; the warp-specialised schedules are
offered only on profiles with wgmma.

``suggest(trial, space, profile, spec)`` draws a ``KernelParams`` with Optuna's define-by-run API. The
domain of each name depends only on (space, profile, head dim, dtype), which a study fixes, so the
distributions stay identical across the trials of one study as Optuna requires.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SPACE_DIR = Path(__file__).resolve().parent

# Which profile list bounds each atom parameter.
_PROFILE_ATOMS = {"mma_atom": "mma_atoms", "g2s_atom": "g2s_copy_atoms", "s2r_atom": "s2r_copy_atoms"}


class SpaceError(ValueError):
    """A search-space file that does not exist or is broken, or a space empty for a profile."""


SCHEDULE = "schedule"          # the pseudo-field: which reference sketch set a candidate is built from
DEFAULT_SCHEDULE = "fa2"


PHASES = ("prefill", "decode")
LAYOUTS = ("dense", "varlen", "paged")    # kernel_abi.spec's layouts: the keys of a parameter's by_layout


def params_class(phase: str = "prefill"):
    """The parameter class a space of ``phase`` draws: translate.params.KernelParams for prefill kernels,
    translate.decode.DecodeParams for split-KV decode kernels."""
    if phase == "decode":
        from translate.decode.params import DecodeParams

        return DecodeParams
    from translate.params import KernelParams

    return KernelParams


def params_from(data: dict, schedule: str | None = None):
    """A parameter dict as the class it belongs to: DecodeParams when its sketch is a decode one (a
    tl.DECODE_SCHEDULES name), or without a sketch when it names the decode split rule's knob; else
    KernelParams. (Replay files and trial payloads carry the dict and the sketch name.)"""
    from tl import DECODE_SCHEDULES

    decode = schedule in DECODE_SCHEDULES if schedule else "min_split_blocks" in data
    return params_class("decode" if decode else "prefill").from_dict(data)


def _kernel_param_types(phase: str = "prefill") -> dict[str, type]:
    cls = params_class(phase)
    types = {f.name: type(getattr(cls(), f.name)) for f in fields(cls)}
    types[SCHEDULE] = str
    return types


def _schedule_legal(profile, schedule: str) -> bool:
    """Warp-specialised sketches need wgmma and TMA: Hopper profiles only."""
    return not schedule.startswith("ws_") or "SM90_GMMA" in profile.mma_atoms


@dataclass(frozen=True)
class ParamSpec:
    name: str
    kind: str                                           # "categorical" or "int"
    choices: tuple = ()
    low: int = 0
    high: int = 0
    step: int = 1
    by_head_dim: tuple[tuple[int, tuple], ...] = ()
    when: tuple[tuple[str, tuple], ...] = ()
    default: Any = None
    target: str = ""                                    # the KernelParams field it sets ("" = its name)
    by_layout: tuple[tuple[str, tuple[tuple[int, tuple], ...]], ...] = ()   # layout -> by_head_dim entries

    def for_layout(self, layout: str) -> "ParamSpec":
        """This parameter in a space for ``layout``: its by_layout entries replace by_head_dim's at their head
        dims."""
        extra = dict(dict(self.by_layout).get(layout, ()))
        if not extra:
            return self
        merged = tuple((hd, v) for hd, v in self.by_head_dim if hd not in extra) + tuple(sorted(extra.items()))
        return replace(self, by_head_dim=merged)

    @property
    def field(self) -> str:
        return self.target or self.name

    def base_choices(self, head_dim: int) -> tuple:
        for hd, values in self.by_head_dim:
            if hd == head_dim:
                return values
        if self.kind == "int":
            return tuple(range(self.low, self.high + 1, self.step))
        return self.choices


@dataclass(frozen=True)
class SpaceSeed:
    head_dim: int | None
    params: tuple[tuple[str, Any], ...]
    source: str
    kv_dtype: str | None = None   # a decode seed for caches of this dtype only ("fp8"); None: for every cache
    dtype: str | None = None      # a prefill seed for kernels of this dtype only ("fp8": FA3's e4m3 tiles); None: any


@dataclass(frozen=True)
class DerivedSpec:
    """``[derived.FIELD] expr = "block_m // 16", when = {...}``: the field is computed, not searched."""

    field: str
    expr: str
    when: tuple[tuple[str, tuple], ...] = ()


@dataclass(frozen=True)
class SearchSpace:
    variant: str
    params: tuple[ParamSpec, ...]
    arch: tuple[tuple[str, tuple[tuple[str, tuple], ...]], ...] = ()
    dtype: tuple[tuple[str, tuple[tuple[str, tuple], ...]], ...] = ()
    seeds: tuple[SpaceSeed, ...] = ()
    source: str = ""
    derived: tuple[DerivedSpec, ...] = ()
    phase: str = "prefill"                # decode: the parameters are DecodeParams (search_spaces/decode/)

    def params_class(self):
        return params_class(self.phase)

    def param(self, name: str) -> ParamSpec:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def domain(self, name: str, profile, head_dim: int, dtype: str) -> tuple:
        """The values ``name`` may take for this profile, head dim and dtype (ordered as declared)."""
        spec = self.param(name)
        values = spec.base_choices(head_dim)
        if spec.field in _PROFILE_ATOMS:
            legal = set(getattr(profile, _PROFILE_ATOMS[spec.field]))
            values = tuple(v for v in values if v in legal)
        if spec.field == SCHEDULE:
            values = tuple(v for v in values if _schedule_legal(profile, v))
        for table_key, tables in ((profile.arch_family, self.arch), (dtype, self.dtype)):
            for key, restrictions in tables:
                if key != table_key:
                    continue
                for pname, allowed in restrictions:
                    if pname != name:
                        continue
                    if isinstance(allowed, HeadDimValues):
                        values = allowed.values_for(head_dim, values)
                    else:
                        values = tuple(v for v in values if v in allowed)
        if not values:
            raise SpaceError(f"{self.source}: parameter {name!r} has no legal value on {profile.name} "
                             f"(head dim {head_dim}, {dtype})")
        return values

    def domains(self, profile, head_dim: int, dtype: str) -> dict[str, tuple]:
        """The domain of every parameter the profile can search (one whose ``schedule`` condition names no
        schedule the profile builds, e.g. a Hopper producer's copy on a T4, is left out)."""
        schedules = None
        if any(p.name == SCHEDULE for p in self.params):
            schedules = set(self.domain(SCHEDULE, profile, head_dim, dtype))
        out = {}
        for p in self.params:
            needs = dict(p.when).get(SCHEDULE)
            if schedules is not None and needs is not None and not schedules & set(needs):
                continue
            out[p.name] = self.domain(p.name, profile, head_dim, dtype)
        return out

    @staticmethod
    def active(spec, values: dict[str, Any]) -> bool:
        """Whether ``spec`` (a ParamSpec or DerivedSpec) applies, given the fields chosen so far."""
        return all(values.get(cond) in allowed for cond, allowed in spec.when)

    def derive(self, values: dict[str, Any]) -> dict[str, Any]:
        """The derived fields whose condition holds, computed from ``values`` (in place, and returned)."""
        from tl.expr import evaluate

        for d in self.derived:
            if self.active(d, values):
                values[d.field] = int(evaluate(d.expr, {k: v for k, v in values.items() if isinstance(v, int)}))
        return values

    def project(self, params: dict[str, Any], profile, head_dim: int, dtype: str) -> tuple[dict, list[str]]:
        """The Optuna parameters of a full KernelParams dict (with an optional ``schedule``; active
        parameters only), or why it is outside the space."""
        schedule = params.get(SCHEDULE, DEFAULT_SCHEDULE)
        full = self.params_class().from_dict({k: v for k, v in params.items() if k != SCHEDULE}).to_dict()
        full[SCHEDULE] = schedule
        chosen: dict[str, Any] = {}
        problems: list[str] = []
        active_fields = {p.field for p in self.params if self.active(p, full)}
        active_fields |= {d.field for d in self.derived if self.active(d, full)}
        defaulted: set[str] = set()   # as in suggest: the first inactive parameter of a field sets it
        for p in self.params:
            if not self.active(p, full):
                if p.field not in active_fields and p.field not in defaulted and full[p.field] != p.default:
                    problems.append(f"{p.field}={full[p.field]!r} is fixed to {p.default!r} when "
                                    + ", ".join(f"{c} not in {list(a)}" for c, a in p.when))
                defaulted.add(p.field)
                continue
            domain = self.domain(p.name, profile, head_dim, dtype)
            if full[p.field] not in domain:
                problems.append(f"{p.field}={full[p.field]!r} is outside {list(domain)}")
            chosen[p.name] = full[p.field]
        expected = self.derive(dict(full))
        for d in self.derived:
            if self.active(d, full) and full[d.field] != expected[d.field]:
                problems.append(f"{d.field}={full[d.field]!r} is derived: {d.expr} = {expected[d.field]!r}")
        return chosen, problems

    def seeds_for(self, head_dim: int, kv_dtype: str = "", dtype: str = "") -> list[SpaceSeed]:
        """The seeds of this head dim (and, ``kv_dtype``, of a decode cache of that dtype: a seed naming a kv_dtype
        is for such caches only; ``dtype``, of kernels of that dtype: a seed naming one is for those only)."""
        return [s for s in self.seeds if s.head_dim in (None, head_dim) and s.kv_dtype in (None, kv_dtype or None)
                and s.dtype in (None, dtype or None)]

    def for_layout(self, layout: str) -> "SearchSpace":
        """The space a ``layout`` kernel is searched in (the parameters' by_layout entries applied)."""
        if layout not in LAYOUTS:
            raise SpaceError(f"unknown layout {layout!r}; choose one of: {', '.join(LAYOUTS)}")
        return replace(self, params=tuple(p.for_layout(layout) for p in self.params))


def _fail(source: str, msg: str) -> SpaceError:
    return SpaceError(f"{source}: {msg}")


def _parse_param(name: str, raw: dict, types: dict[str, type], source: str, earlier: list[str]) -> ParamSpec:
    if not isinstance(raw, dict):
        raise _fail(source, f"[params.{name}] must be a table")
    target = raw.get("target", "")
    field_name = target or name
    if field_name not in types:
        raise _fail(source, f"unknown parameter {field_name!r}; KernelParams has: {', '.join(types)}")
    allowed_keys = {"type", "choices", "low", "high", "step", "by_head_dim", "by_layout", "when", "default",
                    "target"}
    unknown = sorted(set(raw) - allowed_keys)
    if unknown:
        raise _fail(source, f"[params.{name}]: unknown key(s) {', '.join(unknown)}")
    want = types[field_name]
    kind = raw.get("type", "categorical")

    def check_values(values, where: str) -> tuple:
        if not isinstance(values, list) or not values:
            raise _fail(source, f"[params.{name}] {where} must be a non-empty list")
        for v in values:
            if type(v) is not want:  # bool is not an int here, and 64 is not "64"
                raise _fail(source, f"[params.{name}] {where}: {v!r} is not a {want.__name__}")
        if len(set(values)) != len(values):
            raise _fail(source, f"[params.{name}] {where} has duplicates")
        return tuple(values)

    choices: tuple = ()
    low = high = 0
    step = 1
    if kind == "categorical":
        choices = check_values(raw.get("choices"), "choices")
    elif kind == "int":
        if want is not int:
            raise _fail(source, f"[params.{name}] is a {want.__name__}; type = 'int' does not apply")
        try:
            low, high, step = int(raw["low"]), int(raw["high"]), int(raw.get("step", 1))
        except (KeyError, TypeError, ValueError):
            raise _fail(source, f"[params.{name}] type = 'int' needs integer low and high") from None
        if low > high or step < 1:
            raise _fail(source, f"[params.{name}] needs low <= high and step >= 1")
    else:
        raise _fail(source, f"[params.{name}] type must be 'categorical' or 'int', got {kind!r}")
    def head_dim_table(table, where: str) -> tuple:
        if not isinstance(table, dict):
            raise _fail(source, f"[params.{name}] {where} must be a table of head dims")
        out = []
        for hd, values in table.items():
            if not str(hd).isdigit():
                raise _fail(source, f"[params.{name}] {where} key {hd!r} is not a head dim")
            out.append((int(hd), check_values(values, f"{where}.{hd}")))
        return tuple(out)

    by_hd = head_dim_table(raw.get("by_head_dim") or {}, "by_head_dim")
    by_layout = []
    for layout, table in (raw.get("by_layout") or {}).items():
        if layout not in LAYOUTS:
            raise _fail(source, f"[params.{name}] by_layout key {layout!r} is not a layout ({', '.join(LAYOUTS)})")
        by_layout.append((layout, head_dim_table(table, f"by_layout.{layout}")))
    when = []
    for cond, values in (raw.get("when") or {}).items():
        if cond not in earlier:
            raise _fail(source, f"[params.{name}] condition on {cond!r}, which is not declared before it")
        when.append((cond, tuple(values) if isinstance(values, list) else (values,)))
    default = raw.get("default")
    if when:
        if default is None:
            raise _fail(source, f"[params.{name}] has a 'when' condition and so needs a 'default'")
        if type(default) is not want:
            raise _fail(source, f"[params.{name}] default {default!r} is not a {want.__name__}")
    return ParamSpec(name, kind, choices, low, high, step, by_hd, tuple(when), default, target, tuple(by_layout))


@dataclass(frozen=True)
class HeadDimValues:
    """A dtype's own values of a parameter at some head dims (``{ "128" = [...] }`` in a ``[dtype.*]`` table)."""

    by_head_dim: tuple[tuple[int, tuple], ...]

    def values_for(self, head_dim: int, values: tuple) -> tuple:
        return next((v for hd, v in self.by_head_dim if hd == head_dim), values)


def _head_dim_values(allowed: dict, where: str, source: str) -> HeadDimValues:
    pairs = []
    for hd, values in allowed.items():
        if not (str(hd).isdigit() and isinstance(values, list) and values):
            raise _fail(source, f"{where}: a table by head dim maps \"64\", \"128\" ... to non-empty lists, got "
                                f"{hd!r} = {values!r}")
        pairs.append((int(hd), tuple(values)))
    return HeadDimValues(tuple(pairs))


def _parse_restrictions(raw: Any, section: str, names: list[str], source: str):
    if not isinstance(raw, dict):
        raise _fail(source, f"[{section}] must hold tables")
    out = []
    for key, table in raw.items():
        if not isinstance(table, dict):
            raise _fail(source, f"[{section}.{key}] must be a table")
        rules = []
        for pname, allowed in table.items():
            if pname not in names:
                raise _fail(source, f"[{section}.{key}] restricts unknown parameter {pname!r}")
            if isinstance(allowed, dict):
                if section != "dtype":
                    raise _fail(source, f"[{section}.{key}] {pname}: values by head dim are a dtype's only")
                rules.append((pname, _head_dim_values(allowed, f"[{section}.{key}] {pname}", source)))
                continue
            rules.append((pname, tuple(allowed) if isinstance(allowed, list) else (allowed,)))
        out.append((key, tuple(rules)))
    return tuple(out)


def parse_space(data: dict, source: str = "<space>") -> SearchSpace:
    """Validate raw TOML data and build the SearchSpace; SpaceError names the file and the fault."""
    unknown = sorted(set(data) - {"variant", "phase", "params", "arch", "dtype", "seeds", "derived"})
    if unknown:
        raise _fail(source, f"unknown top-level key(s): {', '.join(unknown)}")
    phase = data.get("phase", "prefill")
    if phase not in PHASES:
        raise _fail(source, f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
    types = _kernel_param_types(phase)
    variant = data.get("variant")
    if not isinstance(variant, str):
        raise _fail(source, "missing 'variant'")
    raw_params = data.get("params")
    if not isinstance(raw_params, dict) or not raw_params:
        raise _fail(source, "no [params.*] tables")
    params: list[ParamSpec] = []
    for name, raw in raw_params.items():
        params.append(_parse_param(name, raw, types, source, [p.field for p in params]))
    names = [p.name for p in params]
    derived = []
    for field_name, raw in (data.get("derived") or {}).items():
        if field_name not in types or not isinstance(raw, dict) or not isinstance(raw.get("expr"), str):
            raise _fail(source, f"[derived.{field_name}] needs a KernelParams field and an 'expr' string")
        when = tuple((c, tuple(v) if isinstance(v, list) else (v,)) for c, v in (raw.get("when") or {}).items())
        for cond, _ in when:
            if cond not in {p.field for p in params}:
                raise _fail(source, f"[derived.{field_name}] condition on {cond!r}, which no parameter sets")
        derived.append(DerivedSpec(field_name, raw["expr"], when))
    seeds = []
    for i, raw in enumerate(data.get("seeds", [])):
        if not isinstance(raw, dict) or not isinstance(raw.get("params"), dict):
            raise _fail(source, f"seeds[{i}] needs a 'params' table")
        bad = sorted(set(raw["params"]) - set(types))
        if bad:
            raise _fail(source, f"seeds[{i}]: unknown parameter(s) {', '.join(bad)}")
        if raw.get("kv_dtype") not in (None, "fp8"):
            raise _fail(source, f"seeds[{i}]: kv_dtype must be fp8 (a decode cache's seed) or absent, got "
                                f"{raw.get('kv_dtype')!r}")
        if raw.get("dtype") not in (None, "fp8"):
            raise _fail(source, f"seeds[{i}]: dtype must be fp8 (a seed of the e4m3 kernels only) or absent, got "
                                f"{raw.get('dtype')!r}")
        seeds.append(SpaceSeed(raw.get("head_dim"), tuple(sorted(raw["params"].items())),
                               str(raw.get("source", f"{Path(source).name} seed {i}")), raw.get("kv_dtype"),
                               raw.get("dtype")))
    return SearchSpace(variant, tuple(params), _parse_restrictions(data.get("arch", {}), "arch", names, source),
                       _parse_restrictions(data.get("dtype", {}), "dtype", names, source), tuple(seeds), source,
                       tuple(derived), phase)


DECODE_DIR = "decode"   # search_spaces/decode/<variant>.toml: the decode kernels' spaces


# A folder of spaces to use instead of this package's (<variant>.toml, decode/<variant>.toml): a user's own spaces,
# or the spaces a recorded grid was measured in.
SPACES_ENV = "TUNER_SEARCH_SPACES"


def spaces_dir() -> Path:
    """$TUNER_SEARCH_SPACES where set, else this package's folder."""
    return Path(os.environ.get(SPACES_ENV) or SPACE_DIR)


def available_spaces(directory: Path | None = None) -> list[str]:
    return sorted(p.stem for p in Path(directory or spaces_dir()).glob("*.toml"))


def load_space(variant: str, directory: Path | None = None, phase: str = "prefill",
               layout: str = "dense") -> SearchSpace:
    """Load ``<variant>.toml`` (of ``decode/`` for the decode phase) for a ``layout`` kernel (its parameters'
    by_layout entries applied) from ``directory`` (default: spaces_dir()); an unknown variant lists the choices."""
    directory = directory or spaces_dir()
    if phase not in PHASES:
        raise SpaceError(f"unknown phase {phase!r}; choose one of: {', '.join(PHASES)}")
    if phase == "decode":
        directory = Path(directory) / DECODE_DIR
    names = available_spaces(directory)
    key = variant.strip().lower()
    if key not in names:
        raise SpaceError(f"unknown variant {variant!r}; choose one of: {', '.join(names)}")
    path = Path(directory) / f"{key}.toml"
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise SpaceError(f"{path}: not valid TOML: {exc}") from None
    space = parse_space(data, str(path))
    if space.variant != key:
        raise SpaceError(f"{path}: variant {space.variant!r} does not match the file name")
    if space.phase != phase:
        raise SpaceError(f"{path}: a {space.phase} space where a {phase} one was asked for")
    return space.for_layout(layout)


def suggest_candidate(trial, space: SearchSpace, profile, spec=None, *, head_dim: int | None = None,
                      dtype: str | None = None):
    """Draw (schedule, KernelParams) from ``trial`` (define-by-run), restricted to what ``profile`` allows.

    ``spec`` (a KernelSpec) gives the head dim and dtype; they may also be given directly.
    """
    hd = head_dim if head_dim is not None else (spec.d_qk if spec is not None else 128)
    dt = dtype if dtype is not None else (spec.dtype if spec is not None else profile.dtypes[-1])
    values: dict[str, Any] = {}
    for p in space.params:
        if not space.active(p, values):
            values.setdefault(p.field, p.default)   # a parameter with the same field may have set it
            continue
        domain = space.domain(p.name, profile, hd, dt)
        if p.kind == "int" and p.by_head_dim == () and domain == tuple(range(p.low, p.high + 1, p.step)):
            values[p.field] = trial.suggest_int(p.name, p.low, p.high, step=p.step)
        else:
            values[p.field] = trial.suggest_categorical(p.name, list(domain))
    space.derive(values)
    schedule = values.pop(SCHEDULE, DEFAULT_SCHEDULE) or DEFAULT_SCHEDULE
    return schedule, space.params_class()(**{k: v for k, v in values.items() if v is not None})


def suggest(trial, space: SearchSpace, profile, spec=None, *, head_dim: int | None = None,
            dtype: str | None = None):
    """Draw one KernelParams from ``trial`` (the schedule, when the space has one, is in trial.params)."""
    return suggest_candidate(trial, space, profile, spec, head_dim=head_dim, dtype=dtype)[1]


__all__ = ["ParamSpec", "DerivedSpec", "SearchSpace", "SpaceError", "SpaceSeed", "available_spaces", "load_space",
           "parse_space", "suggest", "suggest_candidate", "SPACE_DIR", "SCHEDULE", "DEFAULT_SCHEDULE", "PHASES",
           "params_class", "params_from"]
