"""The sketch stage: the LLM writes the TL sketch, then the parameterised program; the checker's
diagnostics go back for a bounded number of repair rounds.

Whatever happens at the endpoint, ``generate_program`` gives the campaign a valid program: the LLM's if
it checks clean, otherwise the built-in reference program of the variant, with a message saying which and
why. ``generate_programs`` asks for several schedule variants through the same loop and keeps only those
that check clean and differ; the built-in sketches are the caller's.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import tl
from hardware_profiles import Profile
from tl.diagnostics import Diagnostic
from kernel_abi.spec import KernelSpec

from .cache import ResponseCache
from .client import BadAnswer, LLMClient, LLMConfig, LLMError
from .prompts import code_request, extract_tl, repair_request, sketch_messages, variant_messages

log = logging.getLogger("tuner.llm")

LLM_PATH = "<llm>"
Checker = Callable[[str, str], "tuple[Any, list]"]


@dataclass(frozen=True)
class SketchOutcome:
    """The program the campaign uses and how it was obtained.

    ``rounds``: repair requests sent. ``diagnostics_history``: per checked answer, the ``str()`` of each
    diagnostic (empty tuple for the answer that checked clean). ``message``: one line for the user.
    """

    program_text: str
    program: Any
    source: str                                  # "llm" | "builtin"
    rounds: int = 0
    diagnostics_history: tuple[tuple[str, ...], ...] = ()
    message: str = ""
    sketch_text: str = ""                        # the LLM's flow-only sketch (step 1), if any

    def to_dict(self) -> dict:
        """What the study records (no program object, no credentials)."""
        return {"source": self.source, "rounds": self.rounds, "message": self.message,
                "diagnostics_history": [list(d) for d in self.diagnostics_history],
                "sketch_text": self.sketch_text, "program_text": self.program_text}


def builtin_outcome(spec: KernelSpec, message: str, *, rounds: int = 0, history: tuple = (),
                    sketch_text: str = "", checker: Optional[Checker] = None, schedule: str = "fa2") -> SketchOutcome:
    text = tl.load_sketch(spec.variant, spec.causal, schedule)
    path = str(tl.sketch_path(spec.variant, spec.causal, schedule))
    program, diagnostics = (checker or tl.check_source)(text, path)
    if program is None or diagnostics:  # the reference program is ours: failing it is a bug, not a fallback
        raise RuntimeError(f"the built-in program {path} does not check: " + "; ".join(map(str, diagnostics)))
    return SketchOutcome(text, program, "builtin", rounds, tuple(history), message, sketch_text)


def generate_program(config: LLMConfig, profile: Profile, spec: KernelSpec,
                     cache: Optional[ResponseCache] = None, *, client: Optional[LLMClient] = None,
                     checker: Optional[Checker] = None) -> SketchOutcome:
    """Sketch, then code, then up to ``config.max_repair_rounds`` repairs; the built-in program otherwise.

    Never raises for endpoint or model trouble: the reason ends up in ``SketchOutcome.message``.
    """
    from translate.defaults import default_schedule

    schedule = default_schedule(profile)
    check = checker or _checker_for(profile, spec)
    reference = (f"the built-in {spec.variant} {'causal' if spec.causal else 'non-causal'} reference program"
                 + (f" ({schedule})" if schedule != "fa2" else ""))
    if not config.configured:
        outcome = builtin_outcome(spec, f"{config.not_configured_reason}; using {reference}", checker=check,
                                  schedule=schedule)
        log.info(outcome.message)
        return outcome

    attempt = _converse(client or LLMClient(config), cache, sketch_messages(profile, spec),
                        code_request(profile, spec), check, config.max_repair_rounds)
    if attempt.program is not None:
        return _llm_outcome(config, attempt, "TL program")
    outcome = builtin_outcome(spec, f"{attempt.failure}; using {reference}", rounds=attempt.rounds,
                              history=tuple(attempt.history), sketch_text=attempt.sketch_text, checker=check,
                              schedule=schedule)
    log.warning(outcome.message)
    return outcome


def generate_programs(config: LLMConfig, profile: Profile, spec: KernelSpec,
                      cache: Optional[ResponseCache] = None, *, count: int = 3, client: Optional[LLMClient] = None,
                      checker: Optional[Checker] = None) -> list[SketchOutcome]:
    """Up to ``count`` checked schedule variants from the LLM, each asked to differ from those before it.

    The sketch is a search dimension: the caller adds these to the built-in sketches, so nothing here
    falls back to a built-in program. A variant that fails its repair rounds, or whose answer is unusable,
    is dropped; so is one whose program repeats an earlier variant. With no endpoint configured, or once
    the endpoint is dead, the list ends (possibly empty). Never raises for endpoint or model trouble.
    """
    if not config.configured:
        log.info("%s; no LLM schedule variants", config.not_configured_reason)
        return []
    check = checker or _checker_for(profile, spec)
    client = client or LLMClient(config)
    outcomes: list[SketchOutcome] = []
    seen: set[str] = set()
    for index in range(1, count + 1):
        label = f"TL schedule variant {index}/{count}"
        # the kept programs go into the request, so every variant's messages (and cache key) differ
        opening = variant_messages(profile, spec, index, count, [o.program_text for o in outcomes])
        attempt = _converse(client, cache, opening, code_request(profile, spec), check, config.max_repair_rounds)
        if attempt.program is None:
            log.warning("%s dropped: %s", label, attempt.failure)
            if _endpoint_dead(attempt.error):
                break
            continue
        key = _normalised(attempt.program, attempt.text)
        if key in seen:
            log.info("%s dropped: the same program as an earlier variant", label)
            continue
        seen.add(key)
        outcomes.append(_llm_outcome(config, attempt, label))
    return outcomes


@dataclass
class _Attempt:
    """Where one sketch -> code -> repair conversation ended: ``program`` is set only if it checked clean."""

    text: str = ""
    program: Any = None
    rounds: int = 0
    history: list[tuple[str, ...]] = field(default_factory=list)
    sketch_text: str = ""
    failure: str = ""                    # why there is no program, without the caller's fallback
    error: Optional[LLMError] = None     # the endpoint or answer error that ended it, if one did


def _converse(client: LLMClient, cache: Optional[ResponseCache], opening: list[dict], code: dict,
              check: Checker, max_rounds: int) -> _Attempt:
    """Ask for the sketch (``opening``), then the program (``code``), then repairs; never raises LLMError.

    The attempt is filled as the conversation goes, so a failure keeps the rounds and diagnostics so far.
    """
    attempt = _Attempt()
    try:
        _sketch_code_repair(client, cache, opening, code, check, max_rounds, attempt)
    except BadAnswer as exc:
        attempt.failure, attempt.error = f"the LLM's answer was unusable ({exc})", exc
    except LLMError as exc:
        attempt.failure, attempt.error = str(exc), exc
    return attempt


def _sketch_code_repair(client: LLMClient, cache: Optional[ResponseCache], messages: list[dict], code: dict,
                        check: Checker, max_rounds: int, attempt: _Attempt) -> None:
    sketch_answer = client.complete(messages, cache)
    attempt.sketch_text = extract_tl(sketch_answer)
    messages = messages + [{"role": "assistant", "content": _fenced(attempt.sketch_text) if attempt.sketch_text
                            else sketch_answer}, code]
    answer = client.complete(messages, cache)
    while True:
        text = extract_tl(answer)
        program, diagnostics = _check(check, text)
        attempt.history.append(tuple(str(d) for d in diagnostics))
        if program is not None and not diagnostics:
            attempt.text, attempt.program = text, program
            return
        log.info("LLM program has %d diagnostic(s) after %d repair round(s): %s", len(diagnostics),
                 attempt.rounds, str(diagnostics[0]).splitlines()[0] if diagnostics else "")
        if attempt.rounds >= max_rounds:
            first = str(diagnostics[0]).splitlines()[0] if diagnostics else "no program"
            attempt.failure = (f"the LLM's program still has {len(diagnostics)} error(s) after {attempt.rounds} "
                               f"repair round(s) (first: {first})")
            return
        messages = messages + [{"role": "assistant", "content": _fenced(text) if text else answer},
                               repair_request(diagnostics)]
        attempt.rounds += 1
        answer = client.complete(messages, cache)


def _llm_outcome(config: LLMConfig, attempt: _Attempt, what: str) -> SketchOutcome:
    rounds = attempt.rounds
    message = (f"{what} written by {config.model}"
               + (f" after {rounds} repair round{'s' if rounds != 1 else ''}" if rounds else "")
               + " (checked clean)")
    log.info(message)
    return SketchOutcome(attempt.text, attempt.program, "llm", rounds, tuple(attempt.history), message,
                         attempt.sketch_text)


def _endpoint_dead(error: Optional[LLMError]) -> bool:
    """A BadAnswer means the server answered (the next variant may do better); any other LLMError means
    it cannot answer, and asking on would only repeat the failure."""
    return error is not None and not isinstance(error, BadAnswer)


def _normalised(program: Any, text: str) -> str:
    """The canonical text of a program, so that layout and comments do not make a duplicate look new."""
    try:
        return tl.format_program(program)
    except Exception:  # a custom checker's program object: compare the text as written
        return text


def _checker_for(profile: Profile, spec: KernelSpec) -> Checker:
    """tl.check_source with the GPU's limits: a pipeline whose stages (at the profile's default tiles)
    overflow shared memory is a diagnostic the LLM can repair, not a kernel that fails to launch."""
    from translate.defaults import default_params, default_schedule

    try:
        params = default_params(profile, spec, default_schedule(profile))
    except ValueError:
        return tl.check_source
    symbols = {"BM": params.block_m, "BN": params.block_n, "HeadDim": spec.d_qk, "HeadDimQK": spec.d_qk,
               "HeadDimV": spec.d_v, "kv_stages": params.kv_stages}
    limits = tl.CheckLimits(profile.smem_per_block_bytes, symbols)
    return lambda text, path: tl.check_source(text, path, limits)


def _check(check: Checker, text: str) -> tuple[Any, list]:
    if not text.strip():
        return None, [Diagnostic(LLM_PATH, 1, 1, "syntax", "the answer contains no TL program",
                                 "answer with the complete program in one ```tl code block")]
    try:
        return check(text, LLM_PATH)
    except Exception as exc:  # a checker bug must not end the campaign; the LLM cannot fix it either
        log.exception("TL checker failed on the LLM's program")
        return None, [Diagnostic(LLM_PATH, 1, 1, "internal", f"the checker failed: {exc}", "")]


def _fenced(text: str) -> str:
    return f"```tl\n{text.rstrip()}\n```"
