"""The lowered form of a warp-specialised TL program: one ``Op`` per statement (or a synthetic op that
names the statement it serves), in ``Loop``/``Cond`` blocks, split by role.

The consumer's ops declare which register tensors and shared buffers they read and write; the async
dependency pass (``schedule.py``) turns that into ``warpgroup_wait<N>`` counts, the releases of the
pipeline stages the GEMMs read, and the deferred rescale of the output accumulator.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union


@dataclass(eq=False)
class Op:
    kind: str                          # emitter key: gemm, mask, softmax, reshape, tma_copy, ...
    stmt: Any                          # the TL statement it came from (line + text for the comment)
    tl_text: str
    reads: tuple[str, ...] = ()        # register tensors (and the SS P buffer) read
    writes: tuple[str, ...] = ()       # register tensors written
    data: dict = field(default_factory=dict)
    # Filled by the dependency pass:
    wait: Optional[int] = None         # warpgroup_wait<wait>() before the op
    releases: tuple = ()               # GEMM ops whose pending stage releases are checked after the wait
    rescale: tuple[str, ...] = ()      # accumulators rescaled (deferred softmax factor) before the op
    reasons: list = field(default_factory=list)

    @property
    def line(self) -> int:
        return getattr(self.stmt, "line", 0)


@dataclass(eq=False)
class Loop:
    var: str
    start: str
    stop: str
    body: list
    stmt: Any
    tl_text: str


@dataclass(eq=False)
class Cond:
    condition: str
    body: list
    stmt: Any
    tl_text: str


Node = Union[Op, Loop, Cond]


def iter_ops(nodes):
    for n in nodes:
        if isinstance(n, Op):
            yield n
        else:
            yield from iter_ops(n.body)
