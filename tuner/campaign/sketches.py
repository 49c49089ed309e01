"""The sketches a campaign searches over: the schedule dimension of its study.

A campaign holds several checked TL programs: the built-in reference sketches the space offers on the
profile (the paper's flow and its late-prefetch variant; on Hopper also the warp-specialised flows with
and without intra-warpgroup overlap) and the variants an LLM wrote. Each has a name (the value of the
study's ``schedule`` parameter) and the reference schedule it belongs to (what the space's conditions and
the translator see: a program with warpgroup roles is warp-specialised). The list is fixed when the study
starts and kept in the study, so that ``--resume`` searches the same dimension (Optuna needs identical
distributions) with the same programs.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

ATTR = "sketches"
LLM_PREFIX = "llm-"


@dataclass(frozen=True)
class Sketch:
    name: str           # the study's schedule value: "fa2", "fa2_late_prefetch", "ws_overlap", "llm-1"
    base: str           # its reference schedule (tl.SCHEDULES key without variants)
    text: str           # the TL program
    source: str         # "builtin" or "llm"

    def to_dict(self) -> dict:
        return asdict(self)


def builtin_sketches(variant: str, causal: bool, bases, layout: str = "dense", features=()) -> list[Sketch]:
    import tl

    return [Sketch(name, base, with_features(tl.load_sketch(variant, causal, name, layout), features), "builtin")
            for base in bases for name in tl.schedule_variants(base)]


def with_features(text: str, features) -> str:
    """A sketch with the statements of the kernel options ``features`` (kernel_abi.spec.FEATURES: a window's masks
    and bounds, the cap, the sinks; tl/options.py) where it lacks them; ``text`` as it is without options.
    ValueError where tl/options.py cannot place them in this program."""
    if not features:
        return text
    import tl
    from tl.options import options_of, with_options

    program = tl.parse_program(text)
    if set(options_of(program)) >= set(features):
        return text
    return tl.format_program(with_options(program, "local" in features, "softcap" in features, "sinks" in features))


def campaign_sketches(variant: str, causal: bool, bases, llm_programs=(), layout: str = "dense",
                      phase: str = "prefill", features=()) -> list[Sketch]:
    """The built-in sketches of the reference schedules ``bases`` (in order), each followed by the LLM's
    programs of its kind; an LLM program of a kind the profile does not offer is left out. A serving layout
    keeps the warp-specialised schedules (the only ones that build it), in that layout, and so do kernel options
    (``features``: the warp-specialised kernels build them), whose statements every sketch gets (an LLM program
    they cannot be placed in is left out). Decode searches its own sketches (tl.DECODE_SCHEDULES) in its cache
    layout, with the statements of its options; the LLM's programs are prefill flows."""
    from tl.pipelines import has_roles

    if phase == "decode":
        return builtin_sketches(variant, causal, bases, layout, features)
    if layout != "dense" or features:
        bases = [b for b in bases if b.startswith("ws_")]
    out = builtin_sketches(variant, causal, bases, layout, features)
    seen = {_canonical(s.text) for s in out}
    for i, outcome in enumerate(llm_programs, 1):
        base = "ws_overlap" if has_roles(outcome.program.statements) else "fa2"
        try:
            text = with_features(outcome.program_text, features)
        except Exception:  # noqa: BLE001 - an LLM program the options cannot be placed in is not searched
            continue
        if base not in bases or _canonical(text) in seen:   # (an LLM re-writing a reference)
            continue
        seen.add(_canonical(text))
        at = max(k for k, s in enumerate(out) if s.base == base) + 1
        out.insert(at, Sketch(f"{LLM_PREFIX}{i}", base, text, "llm"))
    return out


def _canonical(text: str) -> str:
    import tl

    try:
        return tl.format_program(tl.parse_program(text))
    except Exception:  # noqa: BLE001 - compare what cannot be formatted as it is
        return text


def from_attr(rows) -> list[Sketch]:
    return [Sketch(**r) for r in rows or ()]


def to_attr(sketches: list[Sketch]) -> list[dict]:
    return [s.to_dict() for s in sketches]


def parsed(sketches: list[Sketch]) -> dict:
    """name -> parsed TL program; a stored program that no longer parses is a broken study."""
    import tl

    programs = {}
    for s in sketches:
        try:
            programs[s.name] = tl.parse_program(s.text)
        except Exception as exc:  # noqa: BLE001 - name the sketch, whatever the parser raised
            raise ValueError(f"sketch {s.name} of the study does not parse: {exc}") from None
    return programs
