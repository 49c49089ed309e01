"""The runtime side of `tune export`: load an exported folder, get an ``attention(q, k, v, causal=...)``.

    from tuner.loader import load_exported
    attention = load_exported("exported/")
    o = attention(q, k, v, causal=True)     # q (b, sq, hq, d_qk), k (b, sk, hkv, d_qk), v (b, sk, hkv, d_v)

A call picks the exported config of the current device whose head dims, dtype and causality match and
whose variant can serve the head layout, then the kernel of the bucket nearest to seqlen_k (log2
distance), loaded lazily through ``tuner.runtime.load_kernel`` and cached. Anything else (no matching
config, CPU tensors, a cubin that will not load, a layout the kernel refuses) runs torch's ``scaled_dot_product_attention``, with
the same (b, s, h, d) layout and FlashAttention's bottom-right causal alignment. ``last_path`` says
which ran (``"kernel"`` or ``"sdpa"``), ``last_reason`` why, and ``stats`` counts both.

The choice (``choose``) is a pure function of shapes, dtype and device name, so it is testable without
a GPU.
"""
from __future__ import annotations

import collections
import hashlib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tuner.buckets import bucket_seqlen, is_bucket_name, nearest_bucket
from tuner.export import METADATA_KEY, device_file_token
from tuner.problem import variant_of_heads

# Which head layouts a kernel of each variant serves. Every generated kernel takes the group (query
# heads per KV head) as a launch argument and maps KV head = query head // group (translate.KERNEL_ARGS),
# and verification covers GQA/MQA mapping, so any kernel serves any whole group; the config whose
# variant matches the call's layout is still preferred (it was tuned for that head count).
_SERVES = {
    "mha": lambda hq, hkv: hq % hkv == 0,
    "gqa": lambda hq, hkv: hq % hkv == 0,
    "mqa": lambda hq, hkv: hq % hkv == 0,
    "mla": lambda hq, hkv: hq % hkv == 0,
}


class ExportError(ValueError):
    """An exported folder or config file that cannot be read; the message names the file."""


@dataclass(frozen=True)
class ExportedKernel:
    bucket: str
    seqlen_k: int
    kernel_name: str
    sha256: str
    cubin_path: Path
    meta: dict
    params: dict
    tflops: float


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

    def serves_device(self, device_name: str) -> bool:
        token = device_file_token(device_name)
        return any(device_file_token(n) == token for n in self.device_names)


@dataclass(frozen=True)
class Choice:
    """The outcome of dispatch: a kernel, or None and the reason SDPA runs instead."""

    config: ExportedConfig | None
    kernel: ExportedKernel | None
    reason: str


def infer_variant(heads_q: int, heads_kv: int, d_qk: int, d_v: int) -> str:
    return "mla" if d_qk != d_v else variant_of_heads(heads_q, heads_kv)


def read_config(path: Path) -> ExportedConfig:
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
        meta = doc[METADATA_KEY]
        names = meta.get("device_names") or [meta["device_name"]]
        kernels = {}
        for bucket, entry in doc.items():
            if bucket == METADATA_KEY:
                continue
            if not is_bucket_name(bucket):
                raise ValueError(f"key {bucket!r} is not a shape bucket")
            kernels[bucket] = ExportedKernel(
                bucket=bucket, seqlen_k=bucket_seqlen(bucket), kernel_name=entry["kernel_name"],
                sha256=entry["kernel_sha256"], cubin_path=path.parent / entry["cubin"], meta=entry["meta"],
                params=entry["params"], tflops=float(entry["tflops"]))
        return ExportedConfig(path=path, variant=meta["variant"], d_qk=int(meta["d_qk"]), d_v=int(meta["d_v"]),
                              dtype=meta["dtype"], causal=bool(meta["causal"]),
                              device_names=tuple(names), kernels=kernels)
    except OSError as exc:
        raise ExportError(f"{path}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ExportError(f"{path}: not valid JSON: {exc}") from None
    except KeyError as exc:
        raise ExportError(f"{path}: missing field {exc}") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise ExportError(f"{path}: malformed export config: {exc}") from None


def read_configs(folder: Path) -> list[ExportedConfig]:
    folder = Path(folder)
    if not folder.is_dir():
        raise ExportError(f"{folder}: not a directory (expected the output of `tune export`)")
    return [read_config(p) for p in sorted(folder.glob("variant=*.json"))]


def choose(configs: list[ExportedConfig], *, heads_q: int, heads_kv: int, d_qk: int, d_v: int, dtype: str | None,
           causal: bool, seqlen_k: int, device_name: str | None) -> Choice:
    """The exported kernel for one call, or why there is none. Pure: no GPU, no files read."""
    if device_name is None:
        return Choice(None, None, "tensors are not on a CUDA device")
    if dtype is None:
        return Choice(None, None, "dtype has no exported kernels (fp16 and bf16 only)")
    on_device = [c for c in configs if c.serves_device(device_name)]
    if not on_device:
        return Choice(None, None, f"no exported config for device {device_name!r}")
    fit = [c for c in on_device if (c.d_qk, c.d_v, c.dtype, c.causal) == (d_qk, d_v, dtype, causal) and c.kernels]
    if not fit:
        return Choice(None, None, f"no exported config for head dims {d_qk}/{d_v}, {dtype}, "
                                  f"{'causal' if causal else 'non-causal'} on {device_name!r}")
    serving = [c for c in fit if c.variant in _SERVES and heads_kv >= 1 and _SERVES[c.variant](heads_q, heads_kv)]
    if not serving:
        return Choice(None, None, f"no exported variant serves {heads_q} query heads over {heads_kv} KV heads "
                                  f"(have {', '.join(sorted({c.variant for c in fit}))})")
    want = infer_variant(heads_q, heads_kv, d_qk, d_v)
    config = min(serving, key=lambda c: (c.variant != want, c.variant))
    bucket = nearest_bucket(seqlen_k, list(config.kernels))
    return Choice(config, config.kernels[bucket], f"{config.variant} kernel of bucket {bucket}")


def _dtype_name(dtype) -> str | None:
    import torch

    return {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype)


def _check_shapes(q, k, v) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D (batch, seqlen, heads, head_dim); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    b, _, hq, dqk = q.shape
    if k.shape[0] != b or v.shape[0] != b:
        raise ValueError(f"batch differs: q {b}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} differ in seqlen or heads")
    if k.shape[3] != dqk:
        raise ValueError(f"q and k head dims differ: {dqk} vs {k.shape[3]}")
    if k.shape[2] < 1 or hq % k.shape[2]:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({k.shape[2]})")


def sdpa_attention(q, k, v, causal: bool = False):
    """torch SDPA in our layout: (b, s, h, d) in and out, GQA by head groups, causal aligned bottom-right
    (query i sees keys j <= i + sk - sq, as FlashAttention does); a query row that sees no key is 0."""
    import torch
    import torch.nn.functional as F

    _check_shapes(q, k, v)
    sq, hq = q.shape[1], q.shape[2]
    sk, hkv = k.shape[1], k.shape[2]
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if hq != hkv:
        try:
            return _sdpa(F, torch, qt, kt, vt, causal, sq, sk, enable_gqa=True)
        except TypeError:  # torch < 2.5 has no enable_gqa
            group = hq // hkv
            kt, vt = kt.repeat_interleave(group, dim=1), vt.repeat_interleave(group, dim=1)
    return _sdpa(F, torch, qt, kt, vt, causal, sq, sk)


def _sdpa(F, torch, qt, kt, vt, causal, sq, sk, **kwargs):
    if causal and sq == sk:
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, **kwargs)
    elif causal:
        rows = torch.arange(sq, device=qt.device)[:, None]
        cols = torch.arange(sk, device=qt.device)[None, :]
        mask = cols <= rows + (sk - sq)
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, **kwargs)
        if sq > sk:  # the first sq - sk rows see no key: 0, not NaN
            out = torch.where(mask.any(dim=1)[:, None], out, torch.zeros((), dtype=out.dtype, device=out.device))
    else:
        out = F.scaled_dot_product_attention(qt, kt, vt, **kwargs)
    return out.transpose(1, 2).contiguous()


def _default_kernel_loader(cubin: bytes, meta: dict):
    from tuner.runtime import load_kernel

    return load_kernel(cubin, meta)


class ExportedAttention:
    """``attention(q, k, v, causal=False)`` over an exported folder; see the module docstring."""

    def __init__(self, configs: list[ExportedConfig], device_name: str | None = None,
                 kernel_loader: Callable[[bytes, dict], Callable] | None = None):
        self.configs = list(configs)
        self.device_name = device_name            # overrides torch.cuda.get_device_name()
        self._kernel_loader = kernel_loader or _default_kernel_loader
        self._kernels: dict = {}                  # (sha256, device index) -> kernel or the load error
        self.last_path: str | None = None
        self.last_reason: str = ""
        self.last_bucket: str | None = None
        self.stats: collections.Counter = collections.Counter()

    def _device_name_of(self, tensor) -> str | None:
        if not tensor.is_cuda:
            return None
        if self.device_name is not None:
            return self.device_name
        import torch

        return torch.cuda.get_device_name(tensor.device)

    def choose_for(self, q, k, v, causal: bool) -> Choice:
        _check_shapes(q, k, v)
        if not (q.device == k.device == v.device):
            return Choice(None, None, "q, k, v are on different devices")
        if not (q.dtype == k.dtype == v.dtype):
            return Choice(None, None, "q, k, v have different dtypes")
        return choose(self.configs, heads_q=q.shape[2], heads_kv=k.shape[2], d_qk=q.shape[3], d_v=v.shape[3],
                      dtype=_dtype_name(q.dtype), causal=bool(causal), seqlen_k=k.shape[1],
                      device_name=self._device_name_of(q))

    def kernel(self, entry: ExportedKernel, device_index: int = 0):
        """The loaded kernel of an entry (loaded once); raises the load error, also on later calls."""
        key = (entry.sha256, device_index)
        if key not in self._kernels:
            try:
                cubin = entry.cubin_path.read_bytes()
                if hashlib.sha256(cubin).hexdigest() != entry.sha256:
                    raise ExportError(f"{entry.cubin_path}: content does not match its sha256 {entry.sha256}")
                self._kernels[key] = self._kernel_loader(cubin, entry.meta)
            except Exception as exc:  # noqa: BLE001 - any load failure means SDPA, said once
                warnings.warn(f"exported kernel {entry.kernel_name} ({entry.cubin_path.name}) cannot be loaded, "
                              f"using torch SDPA: {exc}", RuntimeWarning, stacklevel=3)
                self._kernels[key] = exc
        value = self._kernels[key]
        if isinstance(value, Exception):
            raise value
        return value

    def __call__(self, q, k, v, causal: bool = False):
        choice = self.choose_for(q, k, v, causal)
        if choice.kernel is not None:
            try:
                kern = self.kernel(choice.kernel, q.device.index or 0)
            except Exception as exc:  # noqa: BLE001
                choice = Choice(None, None, f"kernel {choice.kernel.kernel_name} cannot be loaded: {exc}")
            else:
                try:
                    out = kern(q, k, v)
                except ValueError as exc:  # the runtime refused the layout (strides, alignment) before launch
                    choice = Choice(None, None, f"kernel {choice.kernel.kernel_name} refused the inputs: {exc}")
                else:
                    self._note("kernel", choice.reason, choice.kernel.bucket)
                    return out
        self._note("sdpa", choice.reason, None)
        return sdpa_attention(q, k, v, causal=causal)

    attention = __call__

    def _note(self, path: str, reason: str, bucket: str | None) -> None:
        self.last_path, self.last_reason, self.last_bucket = path, reason, bucket
        self.stats[path] += 1


def load_exported(folder, device_name: str | None = None,
                  kernel_loader: Callable[[bytes, dict], Callable] | None = None) -> ExportedAttention:
    """An ``attention(q, k, v, causal=False)`` callable over the configs in ``folder``. ``device_name``
    stands in for torch.cuda.get_device_name(); ``kernel_loader(cubin, meta)`` for
    tuner.runtime.load_kernel."""
    return ExportedAttention(read_configs(Path(folder)), device_name=device_name, kernel_loader=kernel_loader)
