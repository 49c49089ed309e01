"""The seeds stage: candidate parameter sets that the search tries first.

With an LLM: one request for structured output (``chat.completions.parse`` with a pydantic model), or,
where the server rejects that, JSON mode with validation and a retry, or plain text as a last resort.
Every candidate goes through ``translate.params.validate``; invalid ones are dropped with the reason
logged, duplicates removed, and the list topped up with profile-derived seeds (FlashAttention-2/3's
own choices) so the search always starts from known-good points.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from hardware_profiles import Profile
from translate.params import KernelParams, validate
from kernel_abi.spec import KernelSpec, Problem, heads_for

from .cache import ResponseCache
from .client import BadAnswer, LLMClient, LLMConfig, LLMError, ResponseFormatUnsupported
from .prompts import extract_json, seed_messages, seed_retry_request

log = logging.getLogger("tuner.llm")

REPRESENTATIVE_SEQLEN = 4096
TOTAL_TOKENS = 16384          # the paper grid: batch = 16384 / seqlen
JSON_ATTEMPTS = 2             # JSON mode: the first answer and one retry with the error shown


@dataclass(frozen=True)
class Seed:
    params: KernelParams
    source: str               # "llm" | "profile"
    rationale: str = ""


def representative_problem(spec: KernelSpec, seqlen: int = REPRESENTATIVE_SEQLEN) -> Problem:
    """The paper-grid shape at ``seqlen`` for this kernel: what seeds are validated and argued against."""
    head_dim = None if spec.variant == "mla" else spec.d_qk
    hq, hkv, d_qk, d_v = heads_for(spec.variant, head_dim if head_dim is not None else spec.d_qk)
    return Problem(spec.variant, max(1, TOTAL_TOKENS // seqlen), hq, hkv, seqlen, seqlen, spec.d_qk, spec.d_v,
                   spec.causal, spec.dtype)


# -- the structured-output model ---------------------------------------------------------------------

class _Candidate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    block_m: int
    block_n: int
    num_warps: int
    kv_stages: int
    mma_atom: str
    g2s_atom: str
    s2r_atom: str
    swizzle: int
    q_in_regs: bool
    rationale: str = Field(description="one sentence: why this set should be fast on this GPU")


@lru_cache(maxsize=None)
def proposal_model(mma: tuple[str, ...], g2s: tuple[str, ...], s2r: tuple[str, ...]) -> type[BaseModel]:
    """``KernelParamProposal``: {candidates: [...]}, the atoms listed as the profile's (an ``enum`` in the
    JSON schema, so servers with guided decoding cannot emit an atom the GPU lacks). The enum is schema
    only, never a pydantic check: ``validate`` rejects a foreign atom with a message naming the legal ones.
    Always a list, never ``const``, which some guided-decoding backends do not support."""
    def atom(legal: tuple[str, ...]):
        return (str, Field(json_schema_extra={"enum": list(legal)}))

    candidate = create_model("KernelParamCandidate", __base__=_Candidate,
                             mma_atom=atom(mma), g2s_atom=atom(g2s), s2r_atom=atom(s2r))
    return create_model("KernelParamProposal", __config__=ConfigDict(extra="forbid"),
                        candidates=(list[candidate], ...))


def _model_for(profile: Profile) -> type[BaseModel]:
    return proposal_model(tuple(profile.mma_atoms), tuple(profile.g2s_copy_atoms), tuple(profile.s2r_copy_atoms))


# -- profile-derived seeds -------------------------------------------------------------------------

def _fa_choices(profile: Profile, spec: KernelSpec) -> list[dict]:
    t = lambda m, n, w, s=1, q=False: {"block_m": m, "block_n": n, "num_warps": w, "kv_stages": s, "q_in_regs": q}
    # Small tiles last: they fit the 64 KB of sm75 where FA's own choices do not.
    return _fa_table(profile, spec, t) + [t(64, 32, 4), t(64, 48, 4), t(64, 96, 4), t(64, 64, 2), t(64, 32, 4, 2)]


def _fa_table(profile: Profile, spec: KernelSpec, t) -> list[dict]:
    """FA2's shipped tiles and FA3's sm8x table for this head dim and arch, best guess first."""
    d = max(spec.d_qk, spec.d_v)
    ampere_or_hopper = profile.sm in (80, 90)
    if d <= 64:
        return [t(128, 128, 4), t(128, 112, 4), t(128, 64, 4), t(128, 96, 4), t(64, 128, 4), t(128, 128, 8),
                t(128, 64, 4, 2), t(64, 64, 4)]
    if d <= 128:
        if ampere_or_hopper:
            first = [t(128, 64, 4), t(128, 128, 8, 1, True), t(128, 64, 4, 1, True), t(128, 64, 4, 2)]
        else:  # sm75/86/89: FA2 picks 128x32 (non-causal) / 64x64 (causal), FA3 128x128x8 with Q in regs
            first = [t(64, 64, 4) if spec.causal else t(128, 32, 4), t(128, 128, 8, 1, True), t(128, 64, 4),
                     t(128, 32, 4) if spec.causal else t(64, 64, 4)]
        return first + [t(64, 128, 4), t(128, 128, 8), t(128, 64, 8), t(64, 64, 4, 2), t(128, 32, 4, 2)]
    # d 192 (MLA's Q/K): FA2 128x64x8; FA3 128x96x8 with 2 stages (1 on sm86/89) and Q in regs
    return [t(128, 64, 8), t(128, 96, 8, 2 if ampere_or_hopper else 1, True), t(64, 64, 4), t(128, 64, 8, 2),
            t(128, 32, 4), t(64, 32, 4), t(64, 64, 4, 2), t(128, 96, 8)]


def _atoms(profile: Profile, spec: KernelSpec) -> list[dict]:
    """Atom sets in order of preference, each from the profile's legal list."""
    def pick(legal, order):
        return [a for a in order if a in legal] + [a for a in legal if a not in order]

    mma = pick(profile.mma_atoms, ["SM80_16x8x16", "SM75_16x8x8"])
    g2s = pick(profile.g2s_copy_atoms, ["SM80_CP_ASYNC_CACHEGLOBAL", "SM80_CP_ASYNC_CACHEALWAYS", "UniversalCopy128"])
    s2r = pick(profile.s2r_copy_atoms, ["SM75_U32x4_LDSM_N", "SM75_U32x2_LDSM_N", "UniversalCopy"])
    swizzle = 3 if spec.d_qk % 64 == 0 and spec.d_v % 64 == 0 else 2
    best = {"mma_atom": mma[0], "g2s_atom": g2s[0], "s2r_atom": s2r[0], "swizzle": swizzle}
    alternatives = [dict(best, g2s_atom=g) for g in g2s[1:]] + [dict(best, s2r_atom=s) for s in s2r[1:2]]
    return [best] + alternatives


def profile_seeds(profile: Profile, spec: KernelSpec, n: int) -> list[KernelParams]:
    """Up to ``n`` legal, distinct candidates from FA2/FA3's choices for this GPU and kernel.

    The default candidate (``translate.defaults.default_params``), where it exists, comes first.
    """
    problem = representative_problem(spec)
    ordered: list[KernelParams] = []
    try:
        from translate.defaults import default_params

        ordered.append(default_params(profile, spec))
    except ImportError:
        pass
    atoms = _atoms(profile, spec)
    ordered += [KernelParams(**tile, **atoms[0]) for tile in _fa_choices(profile, spec)]
    # Then the best tiles with the other atoms: the search should see each atom at least once.
    ordered += [KernelParams(**tile, **a) for a in atoms[1:] for tile in _fa_choices(profile, spec)[:2]]
    out: list[KernelParams] = []
    for params in ordered:
        if params not in out and not validate(params, profile, problem):
            out.append(params)
        if len(out) >= n:
            break
    return out


# -- LLM proposals ----------------------------------------------------------------------------------

def propose_params(config: LLMConfig, profile: Profile, spec: KernelSpec, program_text: str, n: int = 8,
                   cache: Optional[ResponseCache] = None, *, client: Optional[LLMClient] = None) -> list[Seed]:
    """Up to ``n`` seeds: the LLM's valid proposals first (source "llm"), topped up with profile seeds.

    Never raises for endpoint or model trouble; the reason is logged on the ``tuner.llm`` logger.
    """
    if n <= 0:
        return []
    problem = representative_problem(spec)
    seeds: list[Seed] = []
    if not config.configured:
        log.info("%s; using profile-derived seeds", config.not_configured_reason)
    else:
        try:
            client = client or LLMClient(config)
            raw = _ask(client, seed_messages(profile, spec, problem, program_text, n), _model_for(profile), cache)
            seeds = _accept(raw, profile, problem, n)
            log.info("LLM proposed %d candidate(s), %d valid and distinct", len(raw), len(seeds))
        except LLMError as exc:
            log.warning("parameter proposals: %s; using profile-derived seeds", exc)
    if not seeds and config.configured:
        log.warning("no valid LLM proposal survived; using profile-derived seeds")
    for params in profile_seeds(profile, spec, n):
        if len(seeds) >= n:
            break
        if all(s.params != params for s in seeds):
            seeds.append(Seed(params, "profile", "FlashAttention-2/3 choice for this head dim and GPU"))
    return seeds


def _ask(client: LLMClient, messages: list[dict], model: type[BaseModel], cache) -> list[Any]:
    """The raw candidate list: structured output, else JSON mode (+ retry), else plain text (+ retry)."""
    try:
        content = client.complete(messages, cache, response_format=model)
        return json.loads(content)["candidates"]
    except ResponseFormatUnsupported as exc:
        log.info("structured output not supported (%s); asking in JSON mode", exc)
    except BadAnswer as exc:
        log.info("structured answer unusable (%s); asking in JSON mode", exc)
    try:
        return _ask_json(client, messages, cache, "json_object")
    except ResponseFormatUnsupported as exc:
        log.info("JSON mode not supported (%s); asking for plain text", exc)
    return _ask_json(client, messages, cache, None)


def _ask_json(client: LLMClient, messages: list[dict], cache, response_format: Optional[str]) -> list[Any]:
    error = ""
    for _ in range(JSON_ATTEMPTS):
        try:
            answer = client.complete(messages, cache, response_format=response_format)
        except BadAnswer as exc:
            error = str(exc)
            continue
        try:
            data = extract_json(answer)
            candidates = data.get("candidates") if isinstance(data, dict) else data
            if not isinstance(candidates, list):
                raise ValueError('the JSON has no "candidates" list')
            return candidates
        except ValueError as exc:
            error = str(exc)
            messages = messages + [{"role": "assistant", "content": answer}, seed_retry_request(error)]
    raise BadAnswer(f"no usable proposal after {JSON_ATTEMPTS} attempts: {error}")


def _accept(raw: list[Any], profile: Profile, problem: Problem, n: int) -> list[Seed]:
    """Validated, distinct seeds from the raw candidates; each rejection is logged with its reason."""
    candidate_model = _model_for(profile).model_fields["candidates"].annotation.__args__[0]
    seeds: list[Seed] = []
    for index, item in enumerate(raw, 1):
        if isinstance(item, dict):  # JSON-mode answers often add keys of their own (smem_kb, ...): ignore them
            item = {k: v for k, v in item.items() if k in candidate_model.model_fields}
        try:
            candidate = candidate_model.model_validate(item)
        except ValidationError as exc:
            reasons = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            log.info("LLM candidate %d dropped: %s", index, reasons)
            continue
        fields = candidate.model_dump()
        rationale = fields.pop("rationale", "")
        params = KernelParams.from_dict(fields)
        errors = validate(params, profile, problem)
        if errors:
            log.info("LLM candidate %d (%s) dropped: %s", index, params.key(), "; ".join(errors))
            continue
        if any(s.params == params for s in seeds):
            log.info("LLM candidate %d (%s) dropped: duplicate", index, params.key())
            continue
        seeds.append(Seed(params, "llm", rationale))
        if len(seeds) >= n:
            break
    return seeds


def describe_seeds(seeds: list[Seed]) -> str:
    """One line for the campaign's output, e.g. ``8 seeds: 3 from the LLM, 5 profile-derived``."""
    llm = sum(1 for s in seeds if s.source == "llm")
    parts = ([f"{llm} from the LLM"] if llm else []) + ([f"{len(seeds) - llm} profile-derived"] if len(seeds) > llm else [])
    return f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''}: " + (", ".join(parts) or "none")
