"""LLM answers cached in the study directory, so a resumed campaign asks nothing twice.

An append-only JSON-lines file: one record per answer, keyed by the sha256 of (model, messages,
response-format kind). Only the model name, the key and the answer text are stored: never the endpoint
credentials. A torn last line (the driver killed mid-write) is skipped on load.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Optional

log = logging.getLogger("tuner.llm")

CACHE_FILE_NAME = "llm_cache.jsonl"


def cache_key(model: str, messages: list[dict], kind: str) -> str:
    payload = json.dumps({"model": model, "messages": messages, "response_format": kind},
                         sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


class ResponseCache:
    """``ResponseCache(path)``: ``path`` is the JSON-lines file, or a directory to put ``llm_cache.jsonl`` in."""

    def __init__(self, path: os.PathLike | str):
        path = Path(path)
        if path.is_dir() or path.suffix == "":
            path = path / CACHE_FILE_NAME
        self.path = path
        self._entries: dict[str, str] = {}
        self.hits = 0
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        for number, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                self._entries[record["key"]] = record["content"]
            except (json.JSONDecodeError, KeyError, TypeError):
                log.warning("%s:%d: skipping an unreadable cache record", self.path, number)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, model: str, messages: list[dict], kind: str) -> Optional[str]:
        content = self._entries.get(cache_key(model, messages, kind))
        if content is not None:
            self.hits += 1
        return content

    def put(self, model: str, messages: list[dict], kind: str, content: str) -> None:
        key = cache_key(model, messages, kind)
        self._entries[key] = content
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = {"key": key, "model": model, "kind": kind, "time": round(time.time(), 3), "content": content}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
