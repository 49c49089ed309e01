"""An exported folder as attention functions: ``load_exported(folder)`` -> ``ExportedAttention``.

    attn = load_exported("exported/")
    o = attn(q, k, v, causal=True)                                  # (b, s, h, d), FlashAttention's layout
    o = attn(q, k, v, causal=True, layout="bhsd", scale=0.1)        # SDPA's layout
    o = attn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)   # drop-in for SDPA
    o = attn.flash_attn_func(q, k, v, causal=True, softmax_scale=None)                # drop-in for FA2
    o = attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, block_table=table)   # decode

Every call dispatches to a route (tuner/serving/op.py): the exported kernel of the config whose head dims,
dtype and causality match and whose variant serves the head layout, in the bucket nearest to seqlen_k; or
torch SDPA and why. Which devices an export serves is settled when it is loaded (device names and compute
capabilities read once), so the dispatch is a pure function of shapes, dtypes and device index that
torch.compile traces without a graph break. ``stats`` counts the paths ("kernel", "sdpa"), ``reasons`` the
SDPA calls by reason code, ``last_path``/``last_reason``/``last_bucket`` describe the last call.
"""
from __future__ import annotations

import collections
import hashlib
import math
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from tuner.serving import op
from tuner.serving.decode import DecodeCalls
from tuner.serving.dropin import DropIns
from tuner.serving.fp8_calls import FP8, Fp8Calls
from tuner.serving.option_calls import OptionCalls
from tuner.serving.options import PLAIN, ModelOptions
from tuner.serving.paged import PagedCalls
from tuner.serving.varlen import VarlenCalls
from tuner.serving.configs import (Choice, ExportedConfig, ExportedKernel, ExportError, choose, dispatch_table,
                                   inside_folder, pick, read_configs)
from tuner.serving.reasons import REASONS
from tuner.serving.sdpa import check_shapes, sdpa_attention

_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8"}
_MAX_FAST = 512      # remembered eager call signatures (a model has a handful per layer kind)


@dataclass(frozen=True)
class DeviceFacts:
    name: str
    capability: tuple[int, int] | None


def cuda_devices(device_name: str | None = None) -> dict:
    """(type, index) -> DeviceFacts of every visible CUDA device, read once (none without CUDA)."""
    if not torch.cuda.is_available():
        return {}
    return {("cuda", i): DeviceFacts(device_name or torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i))
            for i in range(torch.cuda.device_count())}


def _default_kernel_loader(cubin: bytes, meta: dict, device_index: int = 0):
    if meta.get("grid") == "decode":      # a split-KV decode kernel and its combine kernel
        from tuner.serving.launch.decode_kernel import load_decode_kernel

        return load_decode_kernel(cubin, meta, device_index)
    from tuner.serving.launch import load_kernel

    return load_kernel(cubin, meta, device_index)


class ExportedAttention(DropIns, OptionCalls, VarlenCalls, PagedCalls, DecodeCalls, Fp8Calls):
    """The attention functions of one exported folder; see the module docstring."""

    def __init__(self, configs: list[ExportedConfig], device_name: str | None = None,
                 kernel_loader: Callable | None = None, devices: dict | None = None):
        """``device_name`` stands in for every CUDA device's name; ``devices`` maps (device type, index) to
        DeviceFacts (tests route CPU tensors to a stand-in ``kernel_loader(cubin, meta, device_index)``)."""
        self.configs = list(configs)
        self.devices = dict(devices) if devices is not None else cuda_devices(device_name)
        self._kernel_loader = kernel_loader or _default_kernel_loader
        self._kernels: dict = {}                  # (sha256, device index) -> kernel or the load error
        self._sm_of = {e.sha256: c.sm for c in self.configs for e in c.kernels.values()}
        # Per device, the configs it can run and their dispatch table: settled here, so that a traced call
        # never reads a device name or a list of configs, only dicts keyed by its shapes.
        named = {key: [c for c in self.configs if c.serves_device(f.name)] for key, f in self.devices.items()}
        self._on_device = {key: [c for c in named[key] if c.sm is None or f.capability is None
                                 or c.sm == f.capability[0] * 10 + f.capability[1]]
                           for key, f in self.devices.items()}
        self._tables = {key: dispatch_table(configs) for key, configs in self._on_device.items() if configs}
        self._varlen_tables = {key: dispatch_table(configs, "varlen") for key, configs in self._on_device.items()
                               if configs}
        self._paged_tables = {key: dispatch_table(configs, "paged") for key, configs in self._on_device.items()
                              if configs}
        self._decode_tables = {layout: {key: dispatch_table(configs, layout, "decode")
                                        for key, configs in self._on_device.items() if configs}
                               for layout in ("paged", "dense")}
        self._decode_memo: dict = {}
        # a device with no table: why (nothing for its name, or only configs exported for another SM)
        self._no_table = {key: "other-arch" if named[key] else "no-device-config" for key in self.devices}
        self._fallback = {code: op.register_route(op.Route(self, code=code)) for code in REASONS}
        self._routes = {}
        for c in self.configs:
            for bucket in (None, *c.kernels):
                self._routes[(id(c), bucket)] = op.register_route(op.Route(self, config=c, bucket=bucket))
        self._memo: dict = {}
        self._messages: dict = {}
        self._fast: dict = {}                     # eager call signature -> launcher (see __call__)
        self._local = threading.local()
        self.last_path: str | None = None
        self.last_reason: str = ""
        self.last_bucket: str | None = None
        self.stats: collections.Counter = collections.Counter()
        self.reasons: collections.Counter = collections.Counter()

    # --- dispatch (traced by torch.compile: pure reads of what __init__ settled) --------------------------
    def route(self, q, k, v, causal: bool, scale: float, options: ModelOptions = PLAIN) -> int:
        """The route of a call in (b, s, h, d) layout: traced as dict lookups under torch.compile, memoised
        per call signature in eager (with the sentence that ``last_reason`` shows). ``options``: a window, a cap,
        sinks (tuner/serving/options.py): only a config built with exactly those serves the call."""
        if torch.compiler.is_compiling():
            return self._decide(q, k, v, causal, scale, options)
        key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, causal, scale,
               options.window, options.softcap > 0, options.sinks is not None)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._decide(q, k, v, causal, scale, options)
            self._messages[found] = self._sentence(q, k, v, causal, scale, found, options)
        return found

    def _table_or_fallback(self, tables: dict, q, k, v, scale, kv_dtype=None):
        """(the device's dispatch table, None), or (None, the fallback route) when no table can serve the call:
        the checks of both layouts' dispatch before the head layout is looked up. ``kv_dtype``: the torch dtype k
        and v are allowed instead of q's (a decode call over an FP8 cache)."""
        device = q.device
        if k.device != device or v.device != device:
            return None, self._fallback["mixed-devices"]
        table = tables.get((device.type, device.index))
        if table is None:
            code = self._no_table.get((device.type, device.index))
            return None, self._fallback[code or ("not-cuda" if device.type != "cuda" else "no-device-config")]
        if k.dtype != (kv_dtype or q.dtype) or v.dtype != (kv_dtype or q.dtype):
            return None, self._fallback["mixed-dtypes"]
        if not (0.0 < scale < math.inf):
            return None, self._fallback["scale"]
        return table, None

    def _decide(self, q, k, v, causal, scale, options: ModelOptions = PLAIN) -> int:
        table, fallback = self._table_or_fallback(self._tables, q, k, v, scale)
        if table is None:
            return fallback
        # int(): heads and head dims are specialised when torch.compile made them symbolic (dynamic=True);
        # a model's never change, and dispatch is by them
        config, code = pick(table, heads_q=int(q.shape[2]), heads_kv=int(k.shape[2]), d_qk=int(q.shape[3]),
                            d_v=int(v.shape[3]), dtype=_DTYPE_NAMES.get(q.dtype), causal=bool(causal),
                            features=options.features(bool(causal)))
        if config is None and code in ("no-shape-config", "no-option-config") and q.shape[1] == 1:
            # one query row: bottom-right causal sees every key, so causal and non-causal kernels agree (a
            # window's right side then bounds nothing either)
            config, code = pick(table, heads_q=int(q.shape[2]), heads_kv=int(k.shape[2]), d_qk=int(q.shape[3]),
                                d_v=int(v.shape[3]), dtype=_DTYPE_NAMES.get(q.dtype), causal=not causal,
                                features=options.features(not causal))
        if config is None:
            return self._fallback[code]
        seqlen_k = k.shape[1]
        bucket = config.bucket_for(seqlen_k) if type(seqlen_k) is int else None   # a SymInt: chosen per call
        return self._routes[(id(config), bucket)]

    def _sentence(self, q, k, v, causal, scale, route_id: int, options: ModelOptions = PLAIN) -> str:
        """Why a route was taken, for people (eager only: ``choose`` builds strings)."""
        route = op._ROUTES[route_id]
        if route.config is not None:
            return f"{route.config.variant} kernel"
        facts = self.devices.get((q.device.type, q.device.index))
        if route.code in ("no-shape-config", "no-option-config", "no-variant", "dtype") and facts is not None:
            return choose(self._on_device[(q.device.type, q.device.index)], heads_q=q.shape[2], heads_kv=k.shape[2],
                          d_qk=q.shape[3], d_v=v.shape[3], dtype=_DTYPE_NAMES.get(q.dtype), causal=bool(causal),
                          seqlen_k=k.shape[1], device_name=facts.name, features=options.features(bool(causal))).reason
        if route.code == "scale":
            return f"{REASONS['scale']}: {scale}"
        return f"{REASONS[route.code]} ({q.device})" if route.code == "not-cuda" else REASONS[route.code]

    def choose_for(self, q, k, v, causal: bool) -> Choice:
        """The choice for a call in (b, s, h, d) layout, with its sentence (for people; calls use route)."""
        check_shapes(q, k, v)
        route = op._ROUTES[self.route(q, k, v, causal, 1.0 / math.sqrt(q.shape[3]))]
        if route.config is None:
            return Choice(None, None, self._messages.get(self._fallback[route.code], REASONS[route.code]), route.code)
        bucket = route.bucket or route.config.bucket_for(k.shape[1])
        return Choice(route.config, route.config.kernels[bucket], f"{route.config.variant} kernel of bucket {bucket}")

    # --- what a route runs (at run time, inside the op or on the eager fast path) ------------------------
    def run(self, route: op.Route, q, k, v, attn_mask, causal: bool, scale: float):
        if route.config is not None and attn_mask is None:
            bucket = route.bucket or route.config.bucket_for(k.shape[1])
            def launch(kern):
                out = kern(q, k, v, softmax_scale=scale)
                if route.bucket is not None:    # a bucket settled by the shapes: the eager path may remember it
                    self._local.ran = (kern, scale, route.config.variant, bucket)
                return out

            return self._launch(route.config.kernels[bucket], bucket, route.config.variant, q.device.index or 0,
                                launch, lambda code, message: self._sdpa(code, message, q, k, v, None, causal, scale))
        code = route.code if route.config is None else "mask"
        message = self._messages.get(self._fallback.get(code), REASONS[code])
        return self._sdpa(code, message, q, k, v, attn_mask, causal, scale)

    def _launch(self, entry: ExportedKernel, bucket: str, label: str, device_index: int, launch, fallback):
        """``launch(kernel)`` on ``entry``'s loaded kernel, counted as a kernel call (``last_reason`` ``label``); a
        load failure, or a launch the kernel refused before it ran (ValueError: strides, alignment, the page size,
        arguments), goes to ``fallback(code, message)`` instead."""
        try:
            kern = self.kernel(entry, device_index)
        except Exception as exc:  # noqa: BLE001 - any load failure means the fallback, warned once
            return fallback("kernel-unloadable", f"kernel {entry.kernel_name} cannot be loaded: {exc}")
        try:
            out = launch(kern)
        except ValueError as exc:
            return fallback("inputs-refused", f"kernel {entry.kernel_name} refused the inputs: {exc}")
        self.last_path, self.last_reason, self.last_bucket = "kernel", label, bucket
        self.stats["kernel"] += 1
        return out

    def _count_fallback(self, code: str, message: str) -> None:
        """A call that runs a fallback (torch SDPA, the fp32 reference): counted by reason, and ``last_*`` says why."""
        self.last_path, self.last_reason, self.last_bucket = "sdpa", message, None
        self.stats["sdpa"] += 1
        self.reasons[code] += 1

    def _sdpa(self, code: str, message: str, q, k, v, attn_mask, causal, scale):
        self._count_fallback(code, message)
        return sdpa_attention(q, k, v, causal=causal, softmax_scale=scale, attn_mask=attn_mask)

    def kernel(self, entry: ExportedKernel, device_index: int = 0):
        """The loaded kernel of an entry (loaded once per device); raises the load error, also on later calls."""
        # the name too: one compile unit's cubin holds several kernels, so two buckets may share a file
        key = (entry.sha256, entry.kernel_name, device_index)
        if key not in self._kernels:
            try:
                self._kernels[key] = self._load(entry, device_index)
            except Exception as exc:  # noqa: BLE001 - remembered: a broken kernel is not retried per call
                warnings.warn(f"exported kernel {entry.kernel_name} ({entry.cubin_path.name}) cannot be loaded, "
                              f"using torch SDPA: {exc}", RuntimeWarning, stacklevel=4)
                self._kernels[key] = exc
        value = self._kernels[key]
        if isinstance(value, Exception):
            raise value
        return value

    def _load(self, entry: ExportedKernel, device_index: int):
        from tuner.serving.launch.driver import cubin_arch

        # checked again as it is opened: a link swapped in after the export was read is refused too
        path = inside_folder(entry.cubin_path.parent, entry.cubin_path.name, "cubin", entry.cubin_path)
        cubin = path.read_bytes()
        if hashlib.sha256(cubin).hexdigest() != entry.sha256:
            raise ExportError(f"{entry.cubin_path}: content does not match its sha256 {entry.sha256}")
        arch, sm = cubin_arch(cubin), self._sm_of.get(entry.sha256)
        if arch is not None and sm is not None and arch[0] * 10 + arch[1] != sm:
            raise ExportError(f"{entry.cubin_path}: a cubin for sm_{arch[0]}{arch[1]} in a config exported for "
                              f"sm_{sm}")
        return self._kernel_loader(cubin, entry.meta, device_index)

    # --- entry points ---------------------------------------------------------------------------------
    def __call__(self, q, k, v, causal: bool = False, softmax_scale: float | None = None, *,
                 scale: float | None = None, layout: str = "bshd", window_size=(-1, -1), softcap: float = 0.0,
                 learnable_sink=None, q_descale=None, k_descale=None, v_descale=None):
        """Attention in FlashAttention's layout (``layout="bshd"``: (batch, seqlen, heads, dim)) or SDPA's
        (``"bhsd"``); the output in the same layout. ``scale`` and ``softmax_scale`` are the same thing
        (default 1/sqrt(d_qk)); causal is aligned bottom-right when seqlen_q != seqlen_k. ``window_size``,
        ``softcap`` and ``learnable_sink`` (one logit per query head) as FlashAttention takes them
        (tuner/serving/options.py): served by a kernel built with them, else by the fp32 reference (counted).

        FP8: float8_e4m3fn q, k, v with FlashAttention-3's ``q_descale``, ``k_descale``, ``v_descale`` (fp32, (batch,
        KV heads), all three required) -> bf16 (tuner/serving/fp8_calls.py); descales with 16-bit inputs are refused.

        Eager calls with nothing observing them (op.nothing_observes) take a launcher remembered per call
        signature the first time the signature ran a kernel: one dictionary lookup, then the launch."""
        if q.dtype == FP8 or q_descale is not None or k_descale is not None or v_descale is not None:
            if q.dtype != FP8:
                raise ValueError(f"q_descale, k_descale and v_descale apply to {FP8} inputs, not {q.dtype}")
            if learnable_sink is not None or softcap or (window_size is not None and tuple(window_size) != (-1, -1)):
                raise NotImplementedError("FP8 calls take no window_size, softcap or learnable_sink")
            return self._call(q, k, v, causal, softmax_scale, scale, layout,
                              fp8=(q_descale, k_descale, v_descale))
        if learnable_sink is not None or softcap or (window_size is not None and tuple(window_size) != (-1, -1)):
            return self._call(q, k, v, causal, softmax_scale, scale, layout, (window_size, softcap, learnable_sink))
        key = None
        if not torch.compiler.is_compiling():
            key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
                   q.device, k.device, v.device, causal, softmax_scale, scale, layout)
            fast = self._fast.get(key)
            if fast is not None and op.no_observers(q, k, v):
                out = fast(q, k, v)
                if out is not None:
                    return out
            self._local.ran = None
        out = self._call(q, k, v, causal, softmax_scale, scale, layout)
        ran = key is not None and getattr(self._local, "ran", None)
        if ran:
            self._remember(key, ran, q, k, v, layout)
        return out

    def _remember(self, key, ran, q, k, v, layout: str) -> None:
        """The eager launcher of a signature that just ran ``ran`` = (kernel, scale, variant, bucket)."""
        import functools

        kern, scale, variant, bucket = ran
        if layout == "bhsd":
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        prepare = getattr(kern, "prepare", None)
        try:
            launcher = prepare(q, k, v, scale) if prepare is not None else functools.partial(kern, softmax_scale=scale)
        except ValueError:
            return
        stats = self.stats

        def fast(q, k, v):
            if layout == "bhsd":
                q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            try:
                out = launcher(q, k, v)
            except ValueError:        # refused per call (alignment): the slow path falls back and says why
                return None
            self.last_path, self.last_reason, self.last_bucket = "kernel", variant, bucket
            stats["kernel"] += 1
            return out.transpose(1, 2) if layout == "bhsd" else out

        if len(self._fast) >= _MAX_FAST:
            self._fast.pop(next(iter(self._fast)))
        self._fast[key] = fast

    def _call(self, q, k, v, causal, softmax_scale, scale, layout, options=None, fp8=None):
        """``__call__`` past its fast path; ``options`` (window_size, softcap, learnable_sink) for an options call;
        ``fp8`` (q_descale, k_descale, v_descale) for an FP8 call."""
        if layout not in ("bshd", "bhsd"):
            raise ValueError(f"layout must be 'bshd' (batch, seqlen, heads, dim) or 'bhsd', got {layout!r}")
        if scale is not None and softmax_scale is not None and scale != softmax_scale:
            raise ValueError(f"scale ({scale}) and softmax_scale ({softmax_scale}) differ; give one")
        if layout == "bhsd":
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        scale = softmax_scale if softmax_scale is not None else scale
        if fp8 is not None:
            out = self.attend_fp8(q, k, v, causal, scale, *fp8)
        else:
            out = self.attend(q, k, v, causal, scale) if options is None else \
                self.attend_options(q, k, v, causal, scale, *options)
        return out.transpose(1, 2) if layout == "bhsd" else out

    attention = __call__

    def attend(self, q, k, v, causal: bool, scale: float | None):
        """(b, s, h, d) tensors through the op (or its eager fast path)."""
        check_shapes(q, k, v)
        scale = float(scale) if scale is not None else 1.0 / math.sqrt(int(q.shape[3]))
        return op.launch(q, k, v, bool(causal), scale, self.route(q, k, v, causal, scale))

    def fallback(self, code: str, q, k, v, causal: bool, scale: float | None, attn_mask=None):
        """SDPA, through the op, for a reason the entry points find before dispatch (a mask, a window):
        counted per call, also in a compiled graph. (b, s, h, d) tensors; ``attn_mask`` as SDPA takes it."""
        check_shapes(q, k, v)
        scale = float(scale) if scale is not None else 1.0 / math.sqrt(int(q.shape[3]))
        return op.launch(q, k, v, bool(causal), scale, self._fallback[code], attn_mask)


def load_exported(folder, device_name: str | None = None, kernel_loader: Callable | None = None,
                  devices: dict | None = None) -> ExportedAttention:
    """The attention functions of the configs in ``folder`` (``tune export``'s output). ``device_name``
    stands in for torch.cuda.get_device_name(); ``kernel_loader(cubin, meta, device_index)`` for
    tuner.serving.launch.load_kernel; ``devices`` for the CUDA devices (see ExportedAttention)."""
    return ExportedAttention(read_configs(Path(folder)), device_name=device_name, kernel_loader=kernel_loader,
                             devices=devices)
