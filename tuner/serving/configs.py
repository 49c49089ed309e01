"""Reading an exported folder (`tune export`) and the pure dispatch rule over it.

The loader reads only files inside the folder: every file a config names must be a bare file name that
resolves (symbolic links followed) to a file in the folder, or the config is refused with ``ExportError``
before anything is opened. ``choose`` is a pure function of shapes, dtype and device facts, so it is
testable without a GPU and traceable by torch.compile.

A config's buckets follow one rule (tuner/serving/buckets/names.py): key-length buckets ``s<N>`` (dense configs, and
varlen configs exported before the serving rule), routed by the nearest key length; or serving buckets
(varlen and paged configs), routed by ``ExportedConfig.serving`` (tuner/serving/rule.py).

Decode configs (``"phase": "decode"`` in the metadata, ``,phase=decode`` in the name) hold decode buckets
(``d-b8-kv8k-p16``, tuner/serving/buckets/decode.py) of split-KV decode kernels, routed by ``ExportedConfig.decode``
(tuner/serving/decode_rule.py: the call's (batch, KV capacity) class, else the nearest bucket of the same page
size); they never serve a prefill call, nor a prefill config a decode call (``dispatch_table``'s ``phase``).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from tuner.serving.buckets.names import LAYOUTS, SEQLEN_RULE, SERVING_RULE, bucket_errors, bucket_rule, mixed_rules
from tuner.serving.buckets.seqlen import bucket_seqlen
from tuner.serving.buckets.decode import DECODE_RULE, decode_bucket_errors, is_decode_bucket, parse_decode_bucket
from tuner.serving.buckets.serving import parse_serving_bucket
from kernel_abi.spec import FEATURES, variant_of_heads
from tuner.serving.decode_rule import DecodeTable
from tuner.serving.rule import ServingTable

# Every generated kernel takes the group (query heads per KV head) as a launch argument and maps KV head =
# query head // group (translate.KERNEL_ARGS), and verification covers GQA/MQA mapping, so a kernel of any
# variant serves any whole group; the config whose variant matches the call's layout is still preferred
# (it was tuned for that head count).
ANY_VARIANT = "*"
METADATA_KEY = "_metadata"      # the block of a config file that is not a bucket
_FILE_FIELDS = ("cubin", "source", "program")


def device_file_token(device_name: str) -> str:
    """A GPU's name as it stands in config file names: every character outside [A-Za-z0-9._-] becomes _."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", device_name.strip())


class ExportError(ValueError):
    """An exported folder or config file that cannot be read, or names files outside its folder; the
    message names the file."""


@dataclass(frozen=True)
class ExportedKernel:
    bucket: str
    seqlen_k: int | None          # a key-length bucket's length; None for a serving bucket
    kernel_name: str
    sha256: str
    cubin_path: Path
    meta: dict
    params: dict
    tflops: float
    tokens: int | None = None     # a serving bucket's token edge, mix class and page size (paged)
    mix: str | None = None
    page_size: int | None = None
    batch: int | None = None          # a decode bucket's batch and KV capacity class edges (page_size when paged)
    kv_capacity: int | None = None

    @property
    def block_n(self) -> int | None:
        value = self.meta.get("block_n", self.params.get("block_n"))
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class ExportedConfig:
    path: Path
    variant: str
    d_qk: int
    d_v: int
    dtype: str
    causal: bool
    device_names: tuple[str, ...]
    kernels: dict  # bucket -> ExportedKernel
    sm: int | None = None
    layout: str = "dense"      # tl/layout.py: dense (b, s, h, d), varlen (packed, cu_seqlens), paged (a page table)
    # Bucket seqlens ascending and the log2 midpoints between neighbours, for the run-time bucket rule.
    bucket_order: tuple = field(default=(), compare=False)
    bucket_bounds: tuple = field(default=(), compare=False)
    serving: ServingTable | None = field(default=None, compare=False)    # set when the buckets are serving ones
    phase: str = "prefill"     # or "decode": split-KV decode kernels (tuner/serving/launch/decode_kernel.py)
    decode: DecodeTable | None = field(default=None, compare=False)      # set for a decode config
    # the options its kernels are built with (kernel_abi.spec.FEATURES: "local", "softcap", "sinks"): such a
    # config serves only calls that need exactly these, and a plain config never serves them
    features: tuple = ()
    # a decode config's KV cache dtype where it is not ``dtype``'s ("fp8": e4m3 with k_scale / v_scale); such a
    # config serves only calls over such a cache, and dispatches under dispatch_dtype(dtype, kv_dtype)
    kv_dtype: str = ""

    @property
    def bucket_rule(self) -> str:
        if self.decode is not None:
            return DECODE_RULE
        return SERVING_RULE if self.serving is not None else SEQLEN_RULE

    @property
    def page_sizes(self) -> tuple:
        """The page sizes a paged config's buckets were tuned on."""
        if self.decode is not None:
            return self.decode.page_sizes
        return self.serving.page_sizes if self.serving is not None else ()

    def decode_bucket_of_call(self, batch: int, kv_capacity: int, page_size: int | None = None) -> str | None:
        """A decode config's bucket for a call (tuner/serving/decode_rule.py); None when none has its page size."""
        return self.decode.bucket(batch, kv_capacity, page_size)

    def serves_device(self, device_name: str) -> bool:
        token = device_file_token(device_name)
        return any(device_file_token(n) == token for n in self.device_names)

    def bucket_for(self, seqlen_k: int) -> str:
        """``tuner.serving.buckets.seqlen.nearest_bucket`` over this config's buckets by precomputed midpoints: the nearest
        edge in log2 distance, a tie to the larger (tests/serving/test_configs.py checks the two agree).
        A plain loop over at most a few midpoints: torch.compile traces it, not bisect."""
        index = 0
        for bound in self.bucket_bounds:
            if seqlen_k >= bound:
                index += 1
        return self.bucket_order[index]

    def bucket_of_call(self, total_q: int, batch: int, max_seqlen_q: int, max_seqlen_k: int,
                       page_size: int | None = None) -> str | None:
        """The bucket of a packed call by this config's rule (serving buckets: all four lengths and the page
        size; key-length buckets: ``max_seqlen_k``); None when no kernel can tile ``page_size``."""
        if self.serving is not None:
            return self.serving.bucket(total_q, batch, max_seqlen_q, max_seqlen_k, page_size)
        return self.bucket_for(max(1, max_seqlen_k))


@dataclass(frozen=True)
class Choice:
    """The outcome of dispatch: a kernel, or None and the reason SDPA runs instead (``code`` is the
    countable category, ``reason`` the sentence)."""

    config: ExportedConfig | None
    kernel: ExportedKernel | None
    reason: str
    code: str = "kernel"


def infer_variant(heads_q: int, heads_kv: int, d_qk: int, d_v: int) -> str:
    return "mla" if d_qk != d_v else variant_of_heads(heads_q, heads_kv)


def inside_folder(folder: Path, name, what: str, config: Path) -> Path:
    """``folder / name`` when ``name`` is a bare file name that resolves to a file in ``folder``; else
    ExportError naming the config and the offending name. Nothing is opened."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name \
            or "\x00" in name:
        raise ExportError(f"{config}: {what} {name!r} is not a file name inside the exported folder "
                          "(absolute paths, directories and '..' are refused)")
    path = folder / name
    try:
        resolved, root = path.resolve(), folder.resolve()
    except (OSError, RuntimeError) as exc:
        raise ExportError(f"{config}: {what} {name!r} cannot be resolved: {exc}") from None
    if resolved.parent != root:
        raise ExportError(f"{config}: {what} {name!r} resolves to {resolved}, outside the exported folder {root}")
    return path


def _bucket_rule(kernels: dict) -> tuple[tuple, tuple]:
    if any(bucket_rule(b) != SEQLEN_RULE for b in kernels):
        return (), ()
    order = sorted(kernels, key=bucket_seqlen)
    edges = [bucket_seqlen(b) for b in order]
    return tuple(order), tuple(math.sqrt(a * b) for a, b in zip(edges, edges[1:]))


def read_config(path: Path) -> ExportedConfig:
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
        meta = doc[METADATA_KEY]
        names = meta.get("device_names") or [meta["device_name"]]
        layout = str(meta.get("layout", "dense"))
        phase = meta.get("phase", "prefill")
        if phase not in ("prefill", "decode"):
            raise ValueError(f"phase must be prefill or decode, got {phase!r}")
        features = meta.get("features", [])
        if not isinstance(features, list) or any(f not in FEATURES for f in features) \
                or list(features) != [f for f in FEATURES if f in features]:
            raise ValueError(f"features must be a list of {', '.join(FEATURES)} in that order, got {features!r}")
        features = tuple(features)
        kv_dtype = meta.get("kv_dtype", "")
        if kv_dtype not in ("", "fp8") or (kv_dtype and phase != "decode"):
            raise ValueError(f"kv_dtype must be fp8 (a decode config's e4m3 cache) or absent, got {kv_dtype!r} "
                             f"({phase})")
        kernels = {}
        for bucket, entry in doc.items():
            if bucket == METADATA_KEY:
                continue
            if phase == "decode":
                wrong = decode_bucket_errors(bucket, layout)
            elif is_decode_bucket(bucket):
                wrong = [f"key {bucket!r} is a decode bucket in a prefill config (decode configs say "
                         "\"phase\": \"decode\" in their metadata)"]
            elif bucket_rule(bucket) is None:
                wrong = [f"key {bucket!r} is not a shape bucket"]
            else:
                wrong = bucket_errors(bucket, layout) if layout in LAYOUTS else []
            if wrong:
                raise ValueError(wrong[0])
            spec = entry["meta"].get("spec") if isinstance(entry.get("meta"), dict) else None
            built = tuple(f for f in FEATURES if isinstance(spec, dict) and spec.get(f))
            if built != features:
                raise ValueError(f"bucket {bucket}'s kernel is built with ({', '.join(built) or 'no options'}) "
                                 f"but the config states ({', '.join(features) or 'no options'})")
            if isinstance(spec, dict) and spec.get("kv_dtype", "") != kv_dtype:
                raise ValueError(f"bucket {bucket}'s kernel reads a {spec.get('kv_dtype') or meta['dtype']} cache but "
                                 f"the config states {kv_dtype or meta['dtype']}")
            for key in _FILE_FIELDS:
                if key in entry or key == "cubin":
                    inside_folder(path.parent, entry[key], f"bucket {bucket}'s {key}", path)
            kernels[bucket] = ExportedKernel(
                bucket=bucket, kernel_name=entry["kernel_name"], sha256=entry["kernel_sha256"],
                cubin_path=path.parent / entry["cubin"], meta=entry["meta"], params=entry["params"],
                tflops=float(entry["tflops"]), **_rule_fields(bucket, phase))
        mixed = mixed_rules(kernels) if phase == "prefill" else None
        if mixed:
            raise ValueError(mixed)
        order, bounds = _bucket_rule(kernels) if phase == "prefill" else ((), ())
        serving = decode = None
        if phase == "decode":
            decode = DecodeTable.build(kernels)
        elif kernels and bucket_rule(next(iter(kernels))) == SERVING_RULE:
            serving = ServingTable.build({b: e.block_n for b, e in kernels.items()})
        sm = meta.get("sm")
        return ExportedConfig(path=path, variant=meta["variant"], d_qk=int(meta["d_qk"]), d_v=int(meta["d_v"]),
                              dtype=meta["dtype"], causal=bool(meta["causal"]), device_names=tuple(names),
                              kernels=kernels, sm=None if sm is None else int(sm), bucket_order=order,
                              bucket_bounds=bounds, layout=layout, serving=serving, phase=phase, decode=decode,
                              features=features, kv_dtype=kv_dtype)
    except ExportError:
        raise
    except OSError as exc:
        raise ExportError(f"{path}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ExportError(f"{path}: not valid JSON: {exc}") from None
    except KeyError as exc:
        raise ExportError(f"{path}: missing field {exc}") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise ExportError(f"{path}: malformed export config: {exc}") from None


def _rule_fields(bucket: str, phase: str = "prefill") -> dict:
    """An ExportedKernel's fields that a bucket name stands for (the names are the truth; an entry's
    ``seqlen_k`` / ``tokens`` / ``mix`` / ``batch`` / ``kv_capacity`` / ``page_size`` repeat them for people and
    other readers)."""
    if phase == "decode":
        batch, kv, page = parse_decode_bucket(bucket)
        return {"seqlen_k": None, "batch": batch, "kv_capacity": kv, "page_size": page}
    if bucket_rule(bucket) == SEQLEN_RULE:
        return {"seqlen_k": bucket_seqlen(bucket)}
    tokens, mix, page = parse_serving_bucket(bucket)
    return {"seqlen_k": None, "tokens": tokens, "mix": mix, "page_size": page}


def read_configs(folder: Path) -> list[ExportedConfig]:
    folder = Path(folder)
    if not folder.is_dir():
        raise ExportError(f"{folder}: not a directory (expected the output of `tune export`)")
    return [read_config(inside_folder(folder, p.name, "config", p)) for p in sorted(folder.glob("variant=*.json"))]


def dispatch_table(configs: list[ExportedConfig], layout: str = "dense", phase: str = "prefill") -> dict:
    """(d_qk, d_v, dtype, causal, features) -> {variant: config, "*": the fallback variant's} over one device's
    configs of one layout and phase: what ``pick`` reads, settled once so that a traced call does nothing but look
    it up."""
    table: dict = {}
    for c in sorted(configs, key=lambda c: c.variant):
        if not c.kernels or c.layout != layout or c.phase != phase:
            continue
        by_variant = table.setdefault((c.d_qk, c.d_v, dispatch_dtype(c.dtype, c.kv_dtype), c.causal, c.features), {})
        by_variant.setdefault(c.variant, c)
        by_variant.setdefault(ANY_VARIANT, c)
    return table


def dispatch_dtype(dtype: str | None, kv_dtype: str = "") -> str | None:
    """The dtype a dispatch table keys a config by: the queries', with an FP8 cache's appended ("bf16/kvfp8"), so
    that a 16-bit cache's call never meets an FP8 cache's kernel nor the reverse."""
    return f"{dtype}/kv{kv_dtype}" if kv_dtype and dtype is not None else dtype


def pick(table: dict, *, heads_q: int, heads_kv: int, d_qk: int, d_v: int, dtype: str | None, causal: bool,
         features: tuple = ()):
    """(config, "kernel") or (None, reason code): the dispatch rule, pure and traceable by torch.compile
    (dict lookups and integer tests only). ``features``: the options the call needs (tuner/serving/options.py)."""
    if dtype is None:
        return None, "dtype"
    by_variant = table.get((d_qk, d_v, dtype, causal, features))
    if by_variant is None:
        return None, "no-option-config" if features and table.get((d_qk, d_v, dtype, causal, ())) else \
            "no-shape-config"
    if heads_kv < 1 or heads_q % heads_kv:
        return None, "no-variant"
    want = "mla" if d_qk != d_v else "mha" if heads_q == heads_kv else "mqa" if heads_kv == 1 else "gqa"
    config = by_variant.get(want)
    return (config if config is not None else by_variant[ANY_VARIANT]), "kernel"


def choose(configs: list[ExportedConfig], *, heads_q: int, heads_kv: int, d_qk: int, d_v: int, dtype: str | None,
           causal: bool, seqlen_k: int | None, device_name: str | None,
           capability: tuple[int, int] | None = None, features: tuple = ()) -> Choice:
    """The exported kernel for one call, or why there is none, with the sentence. Pure: no GPU, no files read.

    ``seqlen_k`` None picks the config and leaves the bucket to the run time (``kernel`` None, ``config``
    set). ``capability`` refuses configs exported for another SM."""
    if device_name is None:
        return Choice(None, None, "tensors are not on a CUDA device", "not-cuda")
    on_device = [c for c in configs if c.serves_device(device_name)]
    if not on_device:
        return Choice(None, None, f"no exported config for device {device_name!r}", "no-device-config")
    if capability is not None:
        sm = capability[0] * 10 + capability[1]
        same_sm = [c for c in on_device if c.sm is None or c.sm == sm]
        if not same_sm:
            return Choice(None, None, f"the configs for {device_name!r} were exported for sm_{on_device[0].sm}; "
                                      f"this GPU is sm_{sm}", "other-arch")
        on_device = same_sm
    config, code = pick(dispatch_table(on_device), heads_q=heads_q, heads_kv=heads_kv, d_qk=d_qk, d_v=d_v,
                        dtype=dtype, causal=causal, features=features)
    if code == "dtype":
        return Choice(None, None, "dtype has no exported kernels (fp16, bf16 and fp8 only)", code)
    shape = f"head dims {d_qk}/{d_v}, {dtype}, {'causal' if causal else 'non-causal'}"
    if code == "no-shape-config":
        built = f" built with {'+'.join(features)}" if features else ""
        return Choice(None, None, f"no exported config{built} for {shape} on {device_name!r}", code)
    if code == "no-option-config":
        return Choice(None, None, f"no exported kernel built with {'+'.join(features)} for {shape} on "
                                  f"{device_name!r} (export a campaign or `tune build` of these options)", code)
    if code == "no-variant":
        have = sorted({c.variant for c in on_device
                       if (c.d_qk, c.d_v, c.dtype, c.causal, c.features) == (d_qk, d_v, dtype, causal, features)})
        return Choice(None, None, f"no exported variant serves {heads_q} query heads over {heads_kv} KV heads "
                                  f"(have {', '.join(have)})", code)
    if seqlen_k is None:
        return Choice(config, None, f"{config.variant} kernel, bucket chosen per call")
    bucket = config.bucket_for(seqlen_k)
    return Choice(config, config.kernels[bucket], f"{config.variant} kernel of bucket {bucket}")
