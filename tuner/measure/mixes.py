"""Serving-shaped benchmark workloads: a ``ServingProblem`` is one packed prefill call, per sequence a query
length and a key length (more keys than queries: a cached prefix, chunked prefill), the heads and dims of a kernel
spec, and for the paged layout the page size of the KV cache. The mixes are data (mixes.toml); the bucket a mix
falls into follows the serving rule (tuner/serving/buckets/serving.py).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from kernel_abi.spec import (DTYPES, NO_WINDOW, VARIANTS, effective_window, options_text, softcap_errors,
                              visible_pairs, window_errors)
from tuner.serving.buckets.serving import SERVING_LAYOUTS, page_size_problem, serving_bucket

MIXES_FILE = Path(__file__).resolve().parent / "mixes.toml"


class MixError(ValueError):
    """A broken mixes file, an unknown mix, a bad page size."""


def check_page_size(page_size) -> int:
    problem = page_size_problem(page_size)
    if problem:
        raise MixError(problem)
    return page_size


@dataclass(frozen=True)
class ServingProblem:
    """One packed prefill call (see the module doc). Keys ``seqlens_k[i] >= seqlens_q[i]`` (causal aligned
    bottom-right: the query rows are the last of their sequence)."""

    layout: str
    name: str
    seqlens_q: tuple[int, ...]
    seqlens_k: tuple[int, ...]
    variant: str
    heads_q: int
    heads_kv: int
    d_qk: int
    d_v: int
    causal: bool
    dtype: str
    page_size: int | None = None
    # the options a kernel built with them is called with (kernel_abi.spec's conventions): ours and the libraries alike
    window: tuple = NO_WINDOW
    softcap: float = 0.0
    sinks: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.window, list):   # read back from JSON, where a tuple is a list
            object.__setattr__(self, "window", tuple(self.window))
        errors = window_errors(self.window, self.causal) + softcap_errors(self.softcap)
        if self.layout not in SERVING_LAYOUTS:
            errors.append(f"layout must be one of {', '.join(SERVING_LAYOUTS)}, got {self.layout!r}")
        if (self.layout == "paged") != (self.page_size is not None):
            errors.append("a paged problem needs a page size, a varlen one none")
        if len(self.seqlens_q) != len(self.seqlens_k) or not self.seqlens_q:
            errors.append("seqlens_q and seqlens_k must be non-empty and of one length")
        if any(q < 0 or k < q for q, k in zip(self.seqlens_q, self.seqlens_k)):
            errors.append("every sequence needs 0 <= queries <= keys")
        if self.variant not in VARIANTS or self.dtype not in DTYPES:
            errors.append(f"unknown variant/dtype {self.variant!r}/{self.dtype!r}")
        if self.heads_kv < 1 or self.heads_q % self.heads_kv:
            errors.append(f"heads_q ({self.heads_q}) must be a multiple of heads_kv ({self.heads_kv})")
        if errors:
            raise MixError(f"mix {self.name!r}: " + "; ".join(errors))

    # the campaign's per-problem identity (a dense Problem's is its seqlen)
    @property
    def key(self) -> str:
        return self.name

    @property
    def batch(self) -> int:
        return len(self.seqlens_q)

    @property
    def total_q(self) -> int:
        return sum(self.seqlens_q)

    @property
    def total_k(self) -> int:
        return sum(self.seqlens_k)

    @property
    def max_seqlen_q(self) -> int:
        return max(self.seqlens_q)

    @property
    def max_seqlen_k(self) -> int:
        return max(self.seqlens_k)

    @property
    def pairs(self) -> int:
        """(query, key) pairs computed: causal aligns bottom-right, so a query sees the keys up to its own; a window
        counts the pairs it leaves visible."""
        if self.window != NO_WINDOW:
            left, right = effective_window(self.window, self.causal)
            return sum(visible_pairs(q, k, left, right) for q, k in zip(self.seqlens_q, self.seqlens_k))
        if not self.causal:
            return sum(q * k for q, k in zip(self.seqlens_q, self.seqlens_k))
        return sum(q * (k - q) + q * (q + 1) // 2 for q, k in zip(self.seqlens_q, self.seqlens_k))

    @property
    def flops(self) -> float:
        return 2.0 * self.heads_q * self.pairs * (self.d_qk + self.d_v)

    @property
    def bucket(self) -> str:
        return serving_bucket(self.total_q, self.batch, self.max_seqlen_q, self.max_seqlen_k, self.page_size)

    @property
    def softmax_scale(self) -> float:
        return self.d_qk ** -0.5

    def label(self) -> str:
        page = f" page{self.page_size}" if self.page_size else ""
        return (f"{self.variant} {self.layout}{page} '{self.name}' ({self.batch} seqs, {self.total_q} q / "
                f"{self.total_k} k tokens) hq{self.heads_q} hkv{self.heads_kv} d{self.d_qk}/{self.d_v} "
                f"{'causal' if self.causal else 'noncausal'} {self.dtype}"
                + options_text(self.window, self.softcap, self.sinks))


def _lengths(name: str, data: dict, which: str) -> tuple[int, ...] | None:
    pairs = data.get(f"repeat_{which}")
    if pairs is None:
        return None
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) and x >= 0
                                                                                          for x in p) for p in pairs):
        raise MixError(f"{MIXES_FILE.name}: mix {name!r}: repeat_{which} must be a list of [count, length] pairs")
    return tuple(length for count, length in pairs for _ in range(count))


def _random_lengths(name: str, spec) -> tuple[int, ...]:
    import torch

    if not (isinstance(spec, list) and len(spec) == 4 and all(isinstance(x, int) for x in spec)
            and spec[0] >= 1 and 0 <= spec[1] <= spec[2]):
        raise MixError(f"{MIXES_FILE.name}: mix {name!r}: random must be [count, low, high, seed]")
    count, low, high, seed = spec
    g = torch.Generator().manual_seed(seed)
    return tuple(int(x) for x in torch.randint(low, high + 1, (count,), generator=g).tolist())


def load_mixes(path: Path = MIXES_FILE) -> dict[str, dict]:
    """name -> {"layouts": (...), "seqlens_q": (...), "seqlens_k": (...)} from the mixes file."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise MixError(f"cannot read the mixes file {path}: {exc}") from None
    out = {}
    for name, entry in data.items():
        if not isinstance(entry, dict):
            raise MixError(f"{path.name}: {name!r} must be a table")
        layouts = entry.get("layouts")
        if not isinstance(layouts, list) or not layouts or any(x not in SERVING_LAYOUTS for x in layouts):
            raise MixError(f"{path.name}: mix {name!r}: layouts must list some of {', '.join(SERVING_LAYOUTS)}")
        if "random" in entry:
            q = _random_lengths(name, entry["random"])
            k = q
        else:
            q = _lengths(name, entry, "q")
            if q is None:
                raise MixError(f"{path.name}: mix {name!r} needs repeat_q or random")
            k = _lengths(name, entry, "k") or q
        if len(q) != len(k):
            raise MixError(f"{path.name}: mix {name!r}: {len(q)} query lengths against {len(k)} key lengths")
        out[name] = {"layouts": tuple(layouts), "seqlens_q": q, "seqlens_k": k}
    return out


def serving_problems(layout: str, variant: str, heads_q: int, heads_kv: int, d_qk: int, d_v: int, causal: bool,
                     dtype: str, page_size: int | None = None, names=None) -> list[ServingProblem]:
    """The mixes of ``layout`` (or those ``names``), as problems of these heads and dims."""
    if layout not in SERVING_LAYOUTS:
        raise MixError(f"layout {layout!r} has no serving mixes; choose one of: {', '.join(SERVING_LAYOUTS)}")
    if layout == "paged":
        check_page_size(page_size)
    elif page_size is not None:
        raise MixError("--page-size applies to the paged layout only")
    mixes = load_mixes()
    if names is not None:
        unknown = [n for n in names if n not in mixes]
        if unknown:
            raise MixError(f"unknown mix {unknown[0]!r}; the mixes: {', '.join(mixes)}")
    chosen = [n for n in (names or mixes) if layout in mixes[n]["layouts"]]
    return [ServingProblem(layout, n, mixes[n]["seqlens_q"], mixes[n]["seqlens_k"], variant, heads_q, heads_kv,
                           d_qk, d_v, causal, dtype, page_size) for n in chosen]
