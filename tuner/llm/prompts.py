"""The prompts (jinja2 templates beside this module) and the extraction of TL and JSON from answers.

The wording follows the QiMeng-Attention paper: list TL's statement forms, explain the memory hierarchy
and the tensor cores, describe FlashAttention's tiling and online softmax, and name the two mistakes
LLMs make (the missing Reshape between the GEMMs, the missing ``.T`` on K).
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import jinja2

from hardware_profiles import Profile
from kernel_abi.spec import KernelSpec, Problem

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"

_VARIANT_TEXT = {
    "mha": "multi-head attention (MHA: every query head has its own K/V head)",
    "gqa": "grouped-query attention (GQA: groups of query heads share one K/V head)",
    "mqa": "multi-query attention (MQA: all query heads share one K/V head)",
    "mla": "multi-head latent attention (MLA, DeepSeek-V3 prefill: Q/K head dim differs from V's)",
}


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False,
                              autoescape=False)


def render(name: str, **context: Any) -> str:
    return _env().get_template(name).render(**context).strip() + "\n"


def kernel_description(spec: KernelSpec) -> str:
    mask = "causal (bottom-right aligned mask)" if spec.causal else "non-causal"
    return f"{_VARIANT_TEXT.get(spec.variant, spec.variant)}, {mask}, forward pass"


def _dims(spec: KernelSpec) -> dict:
    """The head-dimension symbols of the built-in sketches: HeadDim, or HeadDimQK/HeadDimV when they differ."""
    if spec.d_qk != spec.d_v:
        return {"split": True, "q": "HeadDimQK", "k": "HeadDimQK", "v": "HeadDimV"}
    return {"split": False, "q": "HeadDim", "k": "HeadDim", "v": "HeadDim"}


def _tl_context(profile: Profile, spec: KernelSpec) -> dict:
    # Hopper profiles are asked for their own schedule: warp-specialised, wgmma, TMA (the default sketch set)
    hopper = "SM90_GMMA" in profile.mma_atoms
    return {"profile": profile, "spec": spec, "dims": _dims(spec), "kernel_description": kernel_description(spec),
            "hopper": hopper}


def sketch_messages(profile: Profile, spec: KernelSpec) -> list[dict]:
    """The conversation's opening: system (TL, hardware, algorithm, pitfalls) + the sketch request."""
    ctx = _tl_context(profile, spec)
    return [{"role": "system", "content": render("tl_system.j2", **ctx)},
            {"role": "user", "content": render("tl_sketch.j2", **ctx)}]


def variant_messages(profile: Profile, spec: KernelSpec, index: int, count: int,
                     written: Sequence[str] = ()) -> list[dict]:
    """The opening of schedule variant ``index`` (1-based) of ``count``: the same system prompt, then the
    sketch request preceded by the schedules already ``written`` (their TL) and the choices to vary."""
    ctx = _tl_context(profile, spec)
    variant = render("tl_variant.j2", index=index, count=count, written=[w.strip("\n") for w in written], **ctx)
    return [{"role": "system", "content": render("tl_system.j2", **ctx)}, {"role": "user", "content": variant}]


def code_request(profile: Profile, spec: KernelSpec) -> dict:
    return {"role": "user", "content": render("tl_code.j2", **_tl_context(profile, spec))}


def repair_request(diagnostics: Iterable[Any]) -> dict:
    """The checker's diagnostics (their ``str()``: location, code, message and hint) sent back."""
    return {"role": "user", "content": render("tl_repair.j2", diagnostics=[str(d) for d in diagnostics])}


def seed_messages(profile: Profile, spec: KernelSpec, problem: Problem, program_text: str, n: int) -> list[dict]:
    row_threads = (64 if spec.d_qk % 64 == 0 else 32) // 8   # as translate.params.validate counts them
    ctx = {"profile": profile, "spec": spec, "problem": problem, "program_text": program_text, "n": n,
           "kernel_description": kernel_description(spec), "row_threads": row_threads,
           "peak_tflops": f"{profile.peak_tflops(spec.dtype):g}"}
    return [{"role": "system", "content": render("seeds_system.j2")},
            {"role": "user", "content": render("seeds_user.j2", **ctx)}]


def seed_retry_request(error: str) -> dict:
    return {"role": "user", "content": render("seeds_retry.j2", error=error)}


# -- extraction ------------------------------------------------------------------------------------

_THINK = re.compile(r"<think>.*?(</think>|$)", re.S | re.I)   # reasoning models (DeepSeek-R1, Qwen3) on vLLM/Ollama
_FENCE = re.compile(r"(?:```|~~~)[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|~~~)", re.S)
_TL_LINE = re.compile(r"^\s*(allocate|copy|compute|reshape|for|if|end\b|//)", re.I)
_TL_LANGS = {"tl", "text", "plaintext", "", "txt", "sketch"}


def strip_reasoning(answer: str) -> str:
    return _THINK.sub("", answer)


def extract_tl(answer: str) -> str:
    """The TL program in an answer: the fenced block that looks most like TL, else the TL-looking lines.

    Returns "" when nothing in the answer looks like TL.
    """
    answer = strip_reasoning(answer)
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(answer)]
    scored = [(_tl_score(body) + (0.5 if lang in _TL_LANGS else 0), i, body) for i, (lang, body) in enumerate(blocks)]
    scored = [s for s in scored if s[0] >= 1]
    if scored:
        # the best-scoring block; among equals the last one (models put the final version last)
        body = max(scored, key=lambda s: (s[0], s[1]))[2]
        return _dedent(body).strip("\n") + "\n"
    lines = answer.splitlines()
    marks = [i for i, line in enumerate(lines) if _TL_LINE.match(line)]
    if not marks:
        return ""
    span = lines[marks[0]: marks[-1] + 1]
    return "\n".join(span).strip("\n") + "\n"


def _tl_score(body: str) -> float:
    lines = [line for line in body.splitlines() if line.strip()]
    return float(sum(1 for line in lines if _TL_LINE.match(line))) if lines else 0.0


def _dedent(text: str) -> str:
    import textwrap

    return textwrap.dedent(text)


def extract_json(answer: str) -> Any:
    """The JSON value in an answer (bare, fenced, or the outermost ``{...}``); ValueError if none parses."""
    answer = strip_reasoning(answer).strip()
    candidates = [answer] + [body for _, body in _FENCE.findall(answer)]
    first, last = answer.find("{"), answer.rfind("}")
    if 0 <= first < last:
        candidates.append(answer[first: last + 1])
    error: Optional[Exception] = None
    for text in candidates:
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            error = error or exc
    raise ValueError(f"no JSON object in the answer ({error})")
