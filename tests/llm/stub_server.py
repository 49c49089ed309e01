"""A scripted OpenAI-compatible HTTP server on 127.0.0.1 for tests of the LLM stage.

It speaks the real wire format (``POST /v1/chat/completions``, ``GET /v1/models``) over a real socket,
so the ``openai`` client runs its own transport, retries and timeouts against it: openai >= 3 uses
httpx2, which RESPX cannot intercept.

A test scripts the answers in order. A ``Reply`` may name substrings that the request must contain
(``expect``): that is how a test checks that the repair loop really sent the checker's diagnostics
back. Unmet expectations are recorded in ``failures`` rather than answered with an error, so the
code under test runs on and the test asserts ``stub.failures == []`` at the end.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional, Union


@dataclass
class Reply:
    """One scripted answer. ``content`` may be a function of the request body."""

    content: Union[str, Callable[[dict], str]] = ""
    expect: tuple[str, ...] = ()          # substrings the request's messages must contain
    status: int = 200
    raw_body: Optional[bytes] = None      # sent as is (e.g. not JSON), bypassing the envelope
    delay_s: float = 0.0
    finish_reason: str = "stop"


@dataclass
class Recorded:
    path: str
    headers: dict
    body: dict

    def header(self, name: str) -> Optional[str]:
        return {k.lower(): v for k, v in self.headers.items()}.get(name.lower())

    @property
    def text(self) -> str:
        """Every message's content, joined: what the expectations are checked against."""
        parts = []
        for m in self.body.get("messages", []):
            c = m.get("content")
            if isinstance(c, list):
                c = " ".join(p.get("text", "") for p in c if isinstance(p, dict))
            parts.append(c or "")
        return "\n".join(parts)

    @property
    def response_format_type(self) -> Optional[str]:
        rf = self.body.get("response_format")
        return rf.get("type") if isinstance(rf, dict) else None


@dataclass
class StubOpenAI:
    script: list[Reply] = field(default_factory=list)
    reject_json_schema: bool = False       # answer json_schema requests with 400, as older servers do
    reject_json_object: bool = False       # answer json_object requests with 400 too
    require_api_key: Optional[str] = None  # 401 unless "Authorization: Bearer <key>"
    model_name: str = "stub-model"
    requests: list[Recorded] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server: Optional[ThreadingHTTPServer] = None
        self._counter = 0

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> "StubOpenAI":
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output quiet
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [
                        {"id": stub.model_name, "object": "model", "created": 0, "owned_by": "stub"}]})
                else:
                    self._send(404, _error(f"no route {self.path}", "not_found"))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    self._send(400, _error("request body is not JSON", "invalid_request_error"))
                    return
                status, payload, delay = stub._answer(self.path, dict(self.headers), body)
                if delay:
                    time.sleep(delay)
                self._send(status, payload)

            def _send(self, status: int, payload) -> None:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json" if not isinstance(payload, bytes)
                                     else "text/html")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # shutdown() waits for the loop's next poll: 0.5 s by default, which every test of the stub paid on stop
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "StubOpenAI":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        assert self._server is not None, "stub not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    @property
    def chat_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    # -- the answers --------------------------------------------------------------------------
    def _answer(self, path: str, headers: dict, body: dict):
        with self._lock:
            rec = Recorded(path, headers, body)
            self.requests.append(rec)
            if not path.rstrip("/").endswith("/chat/completions"):
                return 404, _error(f"no route {path}", "not_found"), 0
            if self.require_api_key is not None:
                auth = {k.lower(): v for k, v in headers.items()}.get("authorization", "")
                if auth != f"Bearer {self.require_api_key}":
                    # like hosted APIs, echo the key that was sent: clients must scrub it
                    received = auth.removeprefix("Bearer ")
                    return 401, _error(f"Incorrect API key provided: {received}.", "invalid_api_key"), 0
            if not body.get("messages") or not body.get("model"):
                return 400, _error("'messages' and 'model' are required", "invalid_request_error"), 0
            rf = rec.response_format_type
            if rf == "json_schema" and self.reject_json_schema:
                return 400, _error("response_format of type 'json_schema' is not supported by this model",
                                   "invalid_request_error", param="response_format"), 0
            if rf == "json_object" and self.reject_json_object:
                return 400, _error("response_format of type 'json_object' is not supported by this model",
                                   "invalid_request_error", param="response_format"), 0
            if not self.script:
                self.failures.append(f"request #{len(self.requests)} arrived after the script ended")
                return 500, _error("stub script exhausted", "server_error"), 0
            reply = self.script.pop(0)
            text = rec.text
            for needle in reply.expect:
                if needle not in text:
                    self.failures.append(f"request #{len(self.requests)} lacks expected text {needle!r}")
            if reply.raw_body is not None:
                return reply.status, reply.raw_body, reply.delay_s
            if reply.status != 200:
                return reply.status, _error(f"stub error {reply.status}", "server_error"), reply.delay_s
            content = reply.content(body) if callable(reply.content) else reply.content
            self._counter += 1
            prompt_tokens = max(1, len(text) // 4)
            completion_tokens = max(1, len(content) // 4)
            envelope = {
                "id": f"chatcmpl-stub{self._counter:06d}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "system_fingerprint": "fp_stub",
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": content, "refusal": None},
                    "logprobs": None,
                    "finish_reason": reply.finish_reason,
                }],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens},
            }
            return 200, envelope, reply.delay_s


def _error(message: str, type_: str, param: Optional[str] = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": None}}


def closed_port_url() -> str:
    """A base URL on 127.0.0.1 where nothing listens: connections are refused at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"
