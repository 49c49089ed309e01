"""The LLM endpoint: configuration and one small client over the ``openai`` package.

Any OpenAI-compatible server works (vLLM, Ollama, llama.cpp server, hosted APIs). Every failure of the
endpoint (refused connection, timeout, 5xx after the retries, an answer that is not a chat completion)
becomes ``LLMUnavailable`` with a one-line reason, so callers fall back instead of crashing. The API
key lives only in ``LLMConfig`` and the HTTP header: it is hidden from ``repr`` and scrubbed from
every message this module produces.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

log = logging.getLogger("tuner.llm")

DEFAULT_TIMEOUT_S = 180.0      # a local model writing a whole program can take minutes
DEFAULT_MAX_RETRIES = 2
DEFAULT_TEMPERATURE = 0.2      # low: we want the language's forms, not creativity in spelling
PLACEHOLDER_KEY = "not-needed"  # local servers (vLLM, Ollama) ignore the key but the client wants one


class LLMError(Exception):
    """Base of the errors of this package; ``str()`` never contains the API key."""


class LLMUnavailable(LLMError):
    """The endpoint cannot answer: callers fall back to the built-in program / profile seeds."""


class ResponseFormatUnsupported(LLMError):
    """The server rejected the requested ``response_format`` (400/422): try a weaker format."""


class BadAnswer(LLMError):
    """The server answered, but not with what was asked (invalid JSON, schema mismatch, refusal)."""


@dataclass(frozen=True)
class LLMConfig:
    """Where and how to ask. ``configured`` is false without a model or without an endpoint/key."""

    base_url: Optional[str] = None
    model: Optional[str] = None
    api_key: Optional[str] = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT_S
    max_retries: int = DEFAULT_MAX_RETRIES
    temperature: Optional[float] = DEFAULT_TEMPERATURE   # None: omit (some reasoning models reject it)
    max_repair_rounds: int = 3

    def __post_init__(self) -> None:
        if self.timeout <= 0:
            raise ValueError(f"LLM timeout must be positive, got {self.timeout}")
        if self.max_retries < 0:
            raise ValueError(f"LLM max_retries must be >= 0, got {self.max_retries}")
        if self.max_repair_rounds < 0:
            raise ValueError(f"max_repair_rounds must be >= 0, got {self.max_repair_rounds}")

    def __repr__(self) -> str:
        return (f"LLMConfig(base_url={self.base_url!r}, model={self.model!r}, "
                f"api_key={'***' if self.api_key else None}, timeout={self.timeout}, "
                f"max_retries={self.max_retries}, temperature={self.temperature}, "
                f"max_repair_rounds={self.max_repair_rounds})")

    __str__ = __repr__

    @classmethod
    def from_options(cls, base_url: Optional[str] = None, model: Optional[str] = None,
                     api_key: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                     **settings: Any) -> "LLMConfig":
        """Options win over ``OPENAI_BASE_URL`` / ``OPENAI_MODEL`` / ``OPENAI_API_KEY``; blanks count as unset."""
        env = os.environ if env is None else env

        def pick(value: Optional[str], var: str) -> Optional[str]:
            value = value if value not in (None, "") else env.get(var)
            return value.strip() or None if value else None

        return cls(base_url=pick(base_url, "OPENAI_BASE_URL"), model=pick(model, "OPENAI_MODEL"),
                   api_key=pick(api_key, "OPENAI_API_KEY"), **settings)

    @property
    def configured(self) -> bool:
        return self.model is not None and (self.base_url is not None or self.api_key is not None)

    @property
    def not_configured_reason(self) -> str:
        """Why ``configured`` is false, in the words of the CLI options; empty when configured."""
        missing = []
        if self.base_url is None and self.api_key is None:
            missing.append("an endpoint (--llm-base-url / OPENAI_BASE_URL, or --llm-api-key / OPENAI_API_KEY "
                           "for the OpenAI API)")
        if self.model is None:
            missing.append("a model (--llm-model / OPENAI_MODEL)")
        return "no LLM configured: missing " + " and ".join(missing) if missing else ""

    @property
    def endpoint(self) -> str:
        return self.base_url or "https://api.openai.com/v1"

    def redact(self, text: str) -> str:
        """``text`` with the API key replaced by ``***`` (error bodies sometimes echo it)."""
        if self.api_key and len(self.api_key) >= 4:
            text = text.replace(self.api_key, "***")
        return text


class LLMClient:
    """Chat completions with explicit timeout and retries, an optional cache, and a dead-endpoint latch.

    After the endpoint has failed once, further calls fail at once (cache hits are still served), so a
    campaign with a dead endpoint loses one timeout, not one per request.
    """

    def __init__(self, config: LLMConfig):
        if not config.configured:
            raise ValueError(config.not_configured_reason)
        import openai  # imported here: a campaign without an LLM never needs it

        self.config = config
        self._openai = openai
        self._client = openai.OpenAI(base_url=config.endpoint, api_key=config.api_key or PLACEHOLDER_KEY,
                                     timeout=config.timeout, max_retries=config.max_retries)
        self.dead_reason: Optional[str] = None
        self.requests_sent = 0

    def complete(self, messages: list[dict], cache=None, response_format: Any = None) -> str:
        """The assistant's text for ``messages``.

        ``response_format``: None (plain text), ``"json_object"`` (JSON mode), or a pydantic model class
        (structured output through ``chat.completions.parse``; the returned text is the JSON that
        validated against it).
        """
        kind = _format_kind(response_format)
        if cache is not None:
            hit = cache.get(self.config.model, messages, kind)
            if hit is not None:
                log.debug("LLM cache hit (%s)", kind)
                return hit
        if self.dead_reason is not None:
            raise LLMUnavailable(self.dead_reason)
        content = self._request(messages, response_format)
        if cache is not None:
            cache.put(self.config.model, messages, kind, content)
        return content

    def _request(self, messages: list[dict], response_format: Any) -> str:
        openai = self._openai
        kwargs: dict[str, Any] = {"model": self.config.model, "messages": messages}
        if self.config.temperature is not None:
            kwargs["temperature"] = self.config.temperature
        self.requests_sent += 1
        try:
            if isinstance(response_format, type):
                completion = self._client.chat.completions.parse(response_format=response_format, **kwargs)
            else:
                if response_format == "json_object":
                    kwargs["response_format"] = {"type": "json_object"}
                completion = self._client.chat.completions.create(**kwargs)
        except (openai.BadRequestError, openai.UnprocessableEntityError) as exc:
            if response_format is not None and _mentions_response_format(exc):
                raise ResponseFormatUnsupported(self._describe(exc)) from None
            raise self._die(f"the endpoint rejected the request: {self._describe(exc)}") from None
        except openai.APITimeoutError:
            raise self._die(f"no answer within {self.config.timeout:g} s "
                            f"(after {self.config.max_retries} retries)") from None
        except openai.APIConnectionError as exc:
            raise self._die(f"cannot connect: {self._describe(exc)}") from None
        except openai.APIStatusError as exc:
            raise self._die(self._describe(exc)) from None
        except (openai.LengthFinishReasonError, openai.ContentFilterFinishReasonError) as exc:
            raise BadAnswer(self.config.redact(str(exc))) from None
        except openai.OpenAIError as exc:
            raise self._die(self._describe(exc)) from None
        except ValueError as exc:  # pydantic ValidationError / JSON errors from parse(): answer off-schema
            raise BadAnswer(f"the answer does not match the requested schema: {self.config.redact(str(exc))[:300]}") from None
        return self._content(completion, response_format)

    def _content(self, completion: Any, response_format: Any) -> str:
        choices = getattr(completion, "choices", None)
        if not choices:
            text = completion if isinstance(completion, str) else repr(completion)
            raise self._die(f"the endpoint's answer is not a chat completion: {self.config.redact(text)[:120]!r}")
        message = choices[0].message
        if getattr(message, "refusal", None):
            raise BadAnswer(f"the model refused: {message.refusal}")
        if isinstance(response_format, type):
            parsed = getattr(message, "parsed", None)
            if parsed is None:
                raise BadAnswer("the structured answer is empty")
            return parsed.model_dump_json()
        content = message.content
        if not content or not content.strip():
            raise BadAnswer("the answer is empty")
        return content

    def _describe(self, exc: Exception) -> str:
        status = getattr(exc, "status_code", None)
        text = f"HTTP {status}: {exc}" if status else str(exc) or type(exc).__name__
        return self.config.redact(text)[:400]

    def _die(self, reason: str) -> LLMUnavailable:
        self.dead_reason = f"LLM endpoint {self.config.endpoint} ({self.config.model}): {reason}"
        return LLMUnavailable(self.dead_reason)


def _format_kind(response_format: Any) -> str:
    if response_format is None:
        return "text"
    if isinstance(response_format, type):
        return f"json_schema:{response_format.__name__}"
    return str(response_format)


def _mentions_response_format(exc: Exception) -> bool:
    """A 400/422 about the response format (not about, say, the model name)."""
    body = getattr(exc, "body", None)
    text = (str(body) if body is not None else "") + " " + str(exc)
    text = text.lower()
    return any(word in text for word in ("response_format", "json_schema", "json_object", "structured",
                                         "guided", "grammar", "not supported"))
