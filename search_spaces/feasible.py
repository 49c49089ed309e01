"""The valid part of a search space, and a sampler walk that proposes only valid parameter sets.

A space file declares domains (choices, ``when`` conditions, ``[derived]`` fields, targets). The rules that
couple parameters numerically (block_m a multiple of 16 x warps, block_n a multiple of the copy tiling,
the register and shared-memory budgets) live in ``translate.params.validate``; left to the sampler they
cost 20-89% of its proposals (measured per profile and variant, 2026-11-23). So a space is enumerated once
per (space, profile, head dim, dtype, sketches, problem shapes): every choice sequence ``suggest`` can
make, kept where ``validate`` accepts the parameter set. ``suggest`` then walks the tree of the valid
sequences and offers, at each parameter, only the values that still have a valid completion:

* where those are the whole domain, the parameter keeps its name;
* where they are a strict subset, the Optuna name carries the subset (``block_n[64|80|96]``): each name
  keeps one fixed distribution, as Optuna requires, and TPE (``group=True``) sees a conditional parameter;
* a parameter left with one value is set, not suggested.

Sketches are the search's schedule dimension: the ``schedule`` parameter chooses among named sketches
(``sketches``: name -> the reference schedule it belongs to, e.g. ``fa2_late_prefetch -> fa2`` or an LLM's
``llm-1 -> ws_overlap``); the space's ``when`` conditions see the reference schedule.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping

from . import DEFAULT_SCHEDULE, SCHEDULE, SearchSpace, SpaceError


_MISSING = object()


@dataclass(frozen=True)
class SpacePoint:
    """One valid candidate: the sketch it is built from, its parameters, and the choices that make it."""

    sketch: str
    params: Any                                   # translate.params.KernelParams (DecodeParams: decode spaces)
    choices: tuple[tuple[str, Any], ...]          # (parameter name, value) in suggest order


@dataclass(frozen=True)
class Step:
    """The next parameter on a path of the tree: its name, the values with a valid completion, its domain."""

    name: str
    allowed: tuple
    domain: tuple
    integer: bool = False

    @property
    def optuna_name(self) -> str:
        if self.allowed == self.domain:
            return self.name
        return f"{self.name}[{'|'.join(str(v) for v in self.allowed)}]"


@dataclass(frozen=True, eq=False)
class FeasibleSpace:
    space: SearchSpace
    sketches: tuple[tuple[str, str], ...]         # (sketch name, its reference schedule), in choice order
    points: tuple[SpacePoint, ...]
    tree: Mapping[tuple, Step]                    # choices so far -> the next parameter
    enumerated: int                               # parameter sets the space's domains allow
    first_rejections: tuple[str, ...]             # a few of validate's reasons, for the error message
    layout: str = "dense"                         # the kernels' layout and page size (layout_reasons)
    page_size: int | None = None
    kv_dtype: str = ""                            # decode: the cache's dtype where not the queries' (fp8)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_choices", {p.choices: p for p in self.points})

    def base_of(self, sketch: str) -> str:
        return dict(self.sketches).get(sketch, sketch)

    @property
    def valid_fraction(self) -> float:
        return len(self.points) / self.enumerated if self.enumerated else 0.0

    def point(self, choices: tuple) -> SpacePoint:
        return self._by_choices[choices]

    def suggest(self, trial) -> SpacePoint:
        """Draw one valid point with Optuna's define-by-run API (enqueued values are taken as given)."""
        prefix: tuple = ()
        while prefix in self.tree:
            step = self.tree[prefix]
            try:
                if len(step.allowed) == 1:
                    value = step.allowed[0]
                elif step.integer:
                    value = trial.suggest_int(step.optuna_name, step.allowed[0], step.allowed[-1])
                else:
                    value = trial.suggest_categorical(step.optuna_name, list(step.allowed))
            except ValueError as exc:   # an enqueued value outside the valid space (an old seed, a hand-made retry)
                raise SpaceError(f"{step.optuna_name}: {exc}") from None
            if value not in step.allowed:
                raise SpaceError(f"{step.optuna_name}={value!r} is not one of {list(step.allowed)}")
            prefix += ((step.name, value),)
        return self.point(prefix)

    def optuna_params(self, point: SpacePoint) -> dict[str, Any]:
        """The Optuna parameters (by their names in this tree) that ``suggest`` turns into ``point``: what
        ``study.enqueue_trial`` takes to propose it."""
        out: dict[str, Any] = {}
        prefix: tuple = ()
        for name, value in point.choices:
            step = self.tree[prefix]
            if len(step.allowed) > 1:
                out[step.optuna_name] = value
            prefix += ((name, value),)
        return out

    def neighbours(self, point: SpacePoint) -> list[SpacePoint]:
        """The valid points that differ from ``point`` in exactly one choice (same parameters chosen)."""
        mine = dict(point.choices)
        return [other for other, choices, _ in self._indexed()
                if choices.keys() == mine.keys() and _choices_apart(mine, choices) == 1]

    def unasked_neighbour(self, point: SpacePoint, asked: set, rng,
                          max_distance: int | None = 1) -> SpacePoint | None:
        """A random point among the nearest to ``point`` (fewest choices apart, at most ``max_distance``;
        None: any) whose ``(sketch, params key)`` is not in ``asked`` (then added to it, so it is proposed
        once), or None: what the campaign enqueues when the sampler repeats itself."""
        if max_distance is None:
            max_distance = float("inf")
        mine = dict(point.choices)
        by_distance: dict[int, list[SpacePoint]] = {}
        for other, choices, key in self._indexed():
            d = _choices_apart(mine, choices)
            if 0 < d <= max_distance and key not in asked:
                by_distance.setdefault(d, []).append(other)
        if not by_distance:
            return None
        near = rng.choice(by_distance[min(by_distance)])
        asked.add((near.sketch, near.params.key()))
        return near

    def _indexed(self) -> list[tuple[SpacePoint, dict, tuple]]:
        """Each point with its choices as a dict and its (sketch, params key), built once (a campaign asks
        for neighbours hundreds of times over a few thousand points)."""
        index = self.__dict__.get("_index")
        if index is None:
            index = [(p, dict(p.choices), (p.sketch, p.params.key())) for p in self.points]
            object.__setattr__(self, "_index", index)
        return index

    def project(self, params: dict, profile, head_dim: int, dtype: str, problems=()) -> tuple[dict, list[str]]:
        """The Optuna parameters (by their names in this tree) that make the full parameter dict ``params``
        (with its ``schedule``: a sketch name), or every reason it is not a valid point of the space."""
        sketch = params.get(SCHEDULE, DEFAULT_SCHEDULE)
        if sketch not in dict(self.sketches):
            return {}, [f"schedule={sketch!r} is outside {[s for s, _ in self.sketches]}"]
        base = dict(params, **{SCHEDULE: self.base_of(sketch)})
        raw, problems_found = self.space.project(base, profile, head_dim, dtype)
        if problems_found:
            return {}, problems_found
        kernel = self.space.params_class().from_dict({k: v for k, v in params.items() if k != SCHEDULE})
        reasons = sorted({e for p in problems
                          for e in candidate_errors(self.space, kernel, profile, p, self.base_of(sketch), self.layout,
                                                    self.kv_dtype)})
        if self.space.phase == "prefill":
            reasons += layout_reasons(kernel, self.base_of(sketch), self.layout, self.page_size)
        if reasons:
            return {}, reasons
        raw = {**raw, SCHEDULE: sketch} if SCHEDULE in raw else raw
        chosen: dict[str, Any] = {}
        prefix: tuple = ()
        while prefix in self.tree:
            step = self.tree[prefix]
            value = raw.get(step.name)
            if value not in step.allowed:
                return {}, [f"{step.name}={value!r} has no valid completion here (valid: {list(step.allowed)})"]
            if len(step.allowed) > 1:
                chosen[step.optuna_name] = value
            prefix += ((step.name, value),)
        return chosen, []


def choice_distance(a: SpacePoint, b: SpacePoint) -> int:
    """How many parameters two points choose differently (one that only one of them chooses counts)."""
    return _choices_apart(dict(a.choices), dict(b.choices))


def _choices_apart(mine: dict, theirs: dict) -> int:
    """choice_distance on the points' choices as dicts (the neighbour searches keep them built)."""
    return sum(mine.get(k, _MISSING) != v for k, v in theirs.items()) + len(mine.keys() - theirs.keys())


def default_sketches(space: SearchSpace, profile, head_dim: int, dtype: str) -> tuple[tuple[str, str], ...]:
    """The reference schedules the space offers on this profile, each its own sketch."""
    try:
        names = space.domain(SCHEDULE, profile, head_dim, dtype)
    except KeyError:   # a space without the dimension: the paper's flow
        names = (DEFAULT_SCHEDULE,)
    return tuple((n, n) for n in names)


def candidate_errors(space: SearchSpace, params, profile, shape, base: str, layout: str = "dense",
                     kv_dtype: str = "") -> list[str]:
    """Every reason ``params`` cannot build a kernel of ``shape`` (a kernel_abi.spec.Problem: heads, dims, dtype,
    causal) from a sketch of reference schedule ``base``: translate.params.validate for prefill kernels,
    translate.decode.validate_decode (on the decode spec of the shape, in ``layout``, over a cache of
    ``kv_dtype``) for decode ones."""
    if space.phase == "decode":
        from translate.decode.params import validate_decode
        from kernel_abi.spec import KernelSpec

        spec = KernelSpec(shape.variant, shape.d_qk, shape.d_v, shape.causal, shape.dtype, layout, "decode",
                          kv_dtype=kv_dtype)
        return validate_decode(params, profile, spec)
    from translate.params import validate

    return validate(params, profile, shape, warp_specialized=base.startswith("ws_"))


def layout_reasons(params, base: str, layout: str = "dense", page_size: int | None = None) -> list[str]:
    """Why a parameter set cannot build a layout (tl/layout.py): a serving layout's needs, and the K/V copy
    (cp.async producers read paged caches only). Pure."""
    from translate.params_sm90 import kv_cp_async

    tma = not kv_cp_async(params)
    if layout != "paged" and base.startswith("ws_") and not tma:
        return [f"g2s_atom {params.g2s_atom}: the producer copies K/V with cp.async only from a paged cache; "
                f"the {layout} layout loads them with TMA"]
    if layout == "dense":
        return []
    if params.pack_gqa:
        return [f"pack_gqa packs a KV head's query heads into a dense tile's rows; the {layout} layout finds its "
                "rows by sequence, one query head a tile"]
    from translate.defaults import CP_ASYNC_PRODUCER_REGS, SERVING_PRODUCER_REGS

    reasons = []
    if not base.startswith("ws_"):
        reasons.append(f"the {layout} layout is built by the warp-specialised Hopper schedules, not {base}")
    need = SERVING_PRODUCER_REGS.get(layout, 24)
    if params.producer_regs < need:
        reasons.append(f"producer_regs {params.producer_regs} < {need}: the {layout} producer (sequence walk"
                       f"{', page lookups' if layout == 'paged' else ''}) spills below it (translate/defaults.py)")
    elif not tma and params.producer_regs < CP_ASYNC_PRODUCER_REGS:
        reasons.append(f"producer_regs {params.producer_regs} < {CP_ASYNC_PRODUCER_REGS}: the cp.async producer "
                       "(every thread's row offsets) spills below it (translate/defaults.py)")
    if layout == "paged" and tma and page_size and page_size % params.block_n and params.block_n % page_size:
        reasons.append(f"page size {page_size} neither divides block_n {params.block_n} nor is a multiple of it: "
                       "a K/V tile is read by TMA in boxes of min(block_n, page size) rows within one page "
                       "(the cp.async producer reads any multiple of 8)")
    return reasons


def feasible_space(space: SearchSpace, profile, head_dim: int, dtype: str, problems,
                   sketches: tuple[tuple[str, str], ...] | None = None, layout: str = "dense",
                   page_size: int | None = None, kv_dtype: str = "") -> FeasibleSpace:
    """Enumerate ``space`` for this profile and spec, keeping the parameter sets that ``validate`` accepts
    on every problem shape (and ``layout_reasons`` for a serving layout); SpaceError when none is left (with
    the first reasons)."""
    shapes = tuple(dict.fromkeys(p.with_(batch=1, seqlen_q=1, seqlen_k=1) for p in problems))
    sketches = tuple(sketches) if sketches is not None else default_sketches(space, profile, head_dim, dtype)
    return _feasible(space, profile, head_dim, dtype, shapes, sketches, layout, page_size, kv_dtype)


@functools.lru_cache(maxsize=64)
def _feasible(space, profile, head_dim, dtype, shapes, sketches, layout="dense", page_size=None,
              kv_dtype="") -> FeasibleSpace:
    params_class = space.params_class()
    bases = dict(sketches)
    has_schedule = any(p.name == SCHEDULE for p in space.params)
    legal_bases = set(space.domain(SCHEDULE, profile, head_dim, dtype)) if has_schedule else {DEFAULT_SCHEDULE}
    sketch_domain = tuple(s for s, b in sketches if b in legal_bases)
    if has_schedule and not sketch_domain:
        raise SpaceError(f"{space.source}: none of the sketches {list(bases)} has a schedule this space offers on "
                         f"{profile.name} ({sorted(legal_bases)})")
    points: list[SpacePoint] = []
    steps: dict[tuple, Step] = {}
    rejections: list[str] = []
    enumerated = 0

    def walk(i: int, values: dict, choices: tuple, sketch: str):
        nonlocal enumerated
        if i == len(space.params):
            full = space.derive(dict(values))
            full.pop(SCHEDULE, None)
            try:
                params = params_class(**{k: v for k, v in full.items() if v is not None})
            except TypeError as exc:
                raise SpaceError(f"{space.source}: {exc}") from None
            enumerated += 1
            base = bases.get(sketch, sketch)
            errors = [e for shape in shapes
                      for e in candidate_errors(space, params, profile, shape, base, layout, kv_dtype)]
            if space.phase == "prefill":
                errors += layout_reasons(params, base, layout, page_size)
            if errors:
                if len(rejections) < 3:
                    rejections.append(f"{sketch} {params.key()}: {errors[0]}")
                return
            points.append(SpacePoint(sketch, params, choices))
            return
        p = space.params[i]
        if not space.active(p, values):
            walk(i + 1, {**values, p.field: values.get(p.field, p.default)}, choices, sketch)
            return
        if p.name == SCHEDULE:
            domain = sketch_domain
        else:
            domain = space.domain(p.name, profile, head_dim, dtype)
        integer = p.kind == "int" and domain == tuple(range(domain[0], domain[-1] + 1))
        for value in domain:
            if p.name == SCHEDULE:
                walk(i + 1, {**values, SCHEDULE: bases[value]}, choices + ((p.name, value),), value)
            else:
                walk(i + 1, {**values, p.field: value}, choices + ((p.name, value),), sketch)
        steps[choices] = Step(p.name, domain, domain, integer)

    # a space without the schedule dimension: every point is the paper's flow; else the walk names the sketch
    walk(0, {}, (), "" if has_schedule else DEFAULT_SCHEDULE)
    if not points:
        raise SpaceError(f"{space.source}: no parameter set is valid on {profile.name} for head dim {head_dim}, "
                         f"{dtype} ({enumerated} enumerated); e.g. " + "; ".join(rejections))
    return FeasibleSpace(space, sketches if has_schedule else ((DEFAULT_SCHEDULE, DEFAULT_SCHEDULE),), tuple(points),
                         _prune(steps, points), enumerated, tuple(rejections), layout, page_size, kv_dtype)


def _prune(steps: dict[tuple, Step], points: list[SpacePoint]) -> dict[tuple, Step]:
    """Keep the tree's nodes on valid paths, each offering only the values that lead to a valid point."""
    allowed: dict[tuple, set] = {}
    for point in points:
        for k, (_, value) in enumerate(point.choices):
            allowed.setdefault(point.choices[:k], set()).add(value)
    tree = {}
    for prefix, values in allowed.items():
        step = steps[prefix]
        kept = tuple(v for v in step.domain if v in values)
        contiguous = step.integer and kept == tuple(range(kept[0], kept[-1] + 1))   # else categorical
        tree[prefix] = Step(step.name, kept, step.domain, contiguous)
    return tree
