"""The serving bucket rule (tuner/serving/buckets/serving.py) at call time: which bucket of a varlen or paged config serves a
packed call, from what the host knows of it (no GPU read).

``call_class`` is ``tuner.serving.buckets.serving.serving_bucket`` written with integer comparisons only, so that
torch.compile traces it into a constant when the call's lengths are plain ints (mixes.py formats and
parses names with f-strings and regular expressions; tests/serving/test_serving_rule.py checks the two agree
on a grid). ``ServingTable`` settles, when a config is read, the order of preference of its buckets for every
(token edge, mix class, page size) a call can fall into, by ``nearest_serving_bucket`` itself; a call
then takes the first bucket of its order whose kernel can tile its page size (a paged kernel reads a K/V
tile as boxes of one page: the page size must divide block N or be a multiple of it), or None when none can.
"""
from __future__ import annotations

from dataclasses import dataclass

from tuner.serving.buckets.serving import MIX_CLASSES, SHORT_MAX_KEYS, SKEW_RATIO, TOKEN_EDGES, nearest_serving_bucket, parse_serving_bucket

# the key of every page size no bucket names: all of them are equally far from every bucket's page size
OTHER_PAGE = -1


def call_class(total_q: int, batch: int, max_seqlen_q: int, max_seqlen_k: int) -> tuple[int, str]:
    """(token edge, mix class) of a packed call: ``tuner.serving.buckets.serving.serving_bucket``'s rule (see the module doc)."""
    tokens = TOKEN_EDGES[-1]
    for edge in reversed(TOKEN_EDGES):      # the smallest edge holding the packed queries, else the last
        if total_q <= edge:
            tokens = edge
    if max_seqlen_k <= SHORT_MAX_KEYS:
        return tokens, "short"
    if batch > 0 and max_seqlen_q * batch >= SKEW_RATIO * max(1, total_q):
        return tokens, "skewed"
    return tokens, "even"


def plain_ints(*values) -> bool:
    """Whether every value is a plain int, so that a bucket can be settled while tracing (a SymInt, or a
    length not given, leaves it to each call)."""
    return all(type(v) is int for v in values)


def host_reads_allowed() -> bool:
    """Whether a call may read a device tensor's values on the host: not while torch.compile traces it, not while a
    CUDA graph captures it (eager calls only)."""
    import torch

    if torch.compiler.is_compiling():
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def tiles(block_n: int | None, page_size: int | None) -> bool:
    """Whether a kernel of block N ``block_n`` reads pages of ``page_size`` rows (None: not paged, or a
    kernel whose block N the export does not say: its launch decides)."""
    if page_size is None or block_n is None:
        return True
    return page_size > 0 and (page_size % block_n == 0 or block_n % page_size == 0)


def _ranking(name: str, names: list[str]) -> tuple[str, ...]:
    """``names`` by ``nearest_serving_bucket``'s preference for ``name``: the nearest, then the nearest of the
    rest, and so on."""
    left, order = list(names), []
    while left:
        best = nearest_serving_bucket(name, left)
        order.append(best)
        left.remove(best)
    return tuple(order)


@dataclass(frozen=True)
class ServingTable:
    """A config's serving buckets, settled for dispatch (see the module doc)."""

    rankings: dict         # (token edge, mix class, page size or None or OTHER_PAGE) -> bucket names, preferred first
    block_n: dict          # bucket -> its kernel's block N (None: not known)
    page_sizes: tuple      # the page sizes the buckets name, ascending (empty for varlen)

    @classmethod
    def build(cls, buckets: dict) -> "ServingTable":
        """From {bucket name: block N or None} of one config's serving buckets."""
        names = sorted(buckets)
        pages = sorted({p for p in (parse_serving_bucket(n)[2] for n in names) if p is not None})
        # every page size a call can have: those the buckets name, and one standing for all others
        keys = [*pages, OTHER_PAGE] if pages else [None]
        other = max(pages, default=0) + 1          # a page size no bucket names, for nearest_serving_bucket
        rankings = {}
        for edge in TOKEN_EDGES:
            for mix in MIX_CLASSES:
                for page in keys:
                    p = other if page == OTHER_PAGE else page
                    name = f"t{edge // 1024}k-{mix}" + ("" if p is None else f"-p{p}")
                    rankings[(edge, mix, page)] = _ranking(name, names)
        return cls(rankings=rankings, block_n=dict(buckets), page_sizes=tuple(pages))

    def bucket(self, total_q: int, batch: int, max_seqlen_q: int, max_seqlen_k: int,
               page_size: int | None = None) -> str | None:
        """The bucket serving this call, or None when no bucket's kernel can tile ``page_size``. Dict lookups
        and integer tests only: torch.compile traces it when the arguments are plain ints."""
        edge, mix = call_class(total_q, batch, max_seqlen_q, max_seqlen_k)
        ranking = self.rankings.get((edge, mix, page_size))
        if ranking is None:
            ranking = self.rankings[(edge, mix, OTHER_PAGE if page_size is not None else None)]
        for name in ranking:
            if tiles(self.block_n[name], page_size):
                return name
        return None
