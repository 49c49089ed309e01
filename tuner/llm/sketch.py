"""The sketch stage: the LLM writes the TL sketch, then the parameterised program; the checker's
diagnostics go back for a bounded number of repair rounds.

Whatever happens at the endpoint, the campaign gets a valid program: the LLM's if it checks clean,
otherwise the built-in reference program of the variant, with a message saying which and why.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional

import tl
from hardware_profiles import Profile
from tl.diagnostics import Diagnostic
from tuner.problem import KernelSpec

from .cache import ResponseCache
from .client import BadAnswer, LLMClient, LLMConfig, LLMError
from .prompts import code_request, extract_tl, repair_request, sketch_messages

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

    history: list[tuple[str, ...]] = []
    rounds = 0
    sketch_text = ""
    try:
        client = client or LLMClient(config)
        messages = sketch_messages(profile, spec)
        sketch_answer = client.complete(messages, cache)
        sketch_text = extract_tl(sketch_answer)
        messages = messages + [{"role": "assistant", "content": _fenced(sketch_text) if sketch_text else sketch_answer},
                               code_request(profile, spec)]
        answer = client.complete(messages, cache)
        while True:
            text = extract_tl(answer)
            program, diagnostics = _check(check, text)
            history.append(tuple(str(d) for d in diagnostics))
            if program is not None and not diagnostics:
                message = (f"TL program written by {config.model}"
                           + (f" after {rounds} repair round{'s' if rounds != 1 else ''}" if rounds else "")
                           + " (checked clean)")
                log.info(message)
                return SketchOutcome(text, program, "llm", rounds, tuple(history), message, sketch_text)
            log.info("LLM program has %d diagnostic(s) after %d repair round(s): %s", len(diagnostics), rounds,
                     str(diagnostics[0]).splitlines()[0] if diagnostics else "")
            if rounds >= config.max_repair_rounds:
                first = str(diagnostics[0]).splitlines()[0] if diagnostics else "no program"
                message = (f"the LLM's program still has {len(diagnostics)} error(s) after {rounds} repair "
                           f"round(s) (first: {first}); using {reference}")
                break
            messages = messages + [{"role": "assistant", "content": _fenced(text) if text else answer},
                                   repair_request(diagnostics)]
            rounds += 1
            answer = client.complete(messages, cache)
    except BadAnswer as exc:
        message = f"the LLM's answer was unusable ({exc}); using {reference}"
    except LLMError as exc:
        message = f"{exc}; using {reference}"
    outcome = builtin_outcome(spec, message, rounds=rounds, history=tuple(history), sketch_text=sketch_text,
                              checker=check, schedule=schedule)
    log.warning(outcome.message)
    return outcome


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
