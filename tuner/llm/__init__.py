"""The LLM stage of a campaign: the TL program or schedule variants (sketch + repair loop) and seed proposals,
from any OpenAI-compatible endpoint, with a response cache in the study; without an endpoint, the
built-in reference program and profile-derived seeds.
"""
from .cache import ResponseCache, cache_key
from .client import (BadAnswer, LLMClient, LLMConfig, LLMError, LLMUnavailable, ResponseFormatUnsupported)
from .seeds import Seed, describe_seeds, profile_seeds, propose_params, representative_problem
from .sketch import SketchOutcome, generate_program, generate_programs

__all__ = ["BadAnswer", "LLMClient", "LLMConfig", "LLMError", "LLMUnavailable", "ResponseCache",
           "ResponseFormatUnsupported", "Seed", "SketchOutcome", "cache_key", "describe_seeds", "generate_program",
           "generate_programs", "profile_seeds", "propose_params", "representative_problem"]
