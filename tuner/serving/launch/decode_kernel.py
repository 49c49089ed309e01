"""Launch a decode kernel (translate/decode) on torch tensors: the split kernel, then, with more than one split,
its combine kernel, both on torch's current stream through the CUDA driver API.

The call follows ``flash_attn_with_kvcache``: q (b, seqlen_q, hq, d_qk); k_cache/v_cache either paged
(pages, page_size, hkv, d) with ``page_table`` (b, max_pages) int32, or dense (b, seqlen_cache, hkv, d);
``cache_seqlens`` (b) int32 the keys each sequence has (None: the whole cache). Causal aligns bottom-right: the
new tokens are the last ``seqlen_q`` of each sequence. The split count comes from the kernel's split rule
(kernel_abi/splits.py: waves of the CTAs an SM holds) on the cache's capacity (known without reading the lengths back), or
``num_splits``.

``cache_leftpad`` (b) int32 (FA2's; a dense cache, GQA/MHA kernels of ABI 5 on): sequence b's keys are rows
[cache_leftpad[b], cache_seqlens[b]) of its cache, causal and a window aligned to their count. Its values are not read
back (as the lengths are not): a leftpad above the sequence's length leaves it no key (output 0, lse -inf), and the
split count still comes from the capacity, so splits past a short sequence's keys stay empty.

Absorbed MLA kernels (translate.decode.v_from_k: one latent KV head, d_qk 576, d_v 512) read V as the first d_v
columns of k_cache's rows, as FlashMLA does: pass ``v_cache=None`` or the view ``k_cache[..., :d_v]``. Over an e4m3
latent cache (kv_dtype fp8) V's scale is therefore k_scale: pass ``v_scale=None`` or k_scale itself.

Everything that depends only on the call's shapes, strides and scale is packed once per signature into the
kernel's ``attn_decode::Args`` (a ctypes mirror, ``DecodeArgs``); a call writes its pointers and launches.
"""
from __future__ import annotations

import ctypes
import math
import threading
from dataclasses import dataclass
from typing import Any

from kernel_abi.decode import COMBINE_WARPS, combine_grid, v_from_k
from kernel_abi.spec import FEATURES, KernelSpec, effective_window, softcap_errors
from kernel_abi.splits import plan_splits
from tuner.serving.launch import driver as cuda
from tuner.serving.launch.kernel import AttentionKernel, load_attention_kernel
from tuner.serving.launch.plan import place_map, point_map

_LOG2E = math.log2(math.e)
_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
_MAX_PLANS = 256


class KvScales(ctypes.Structure):
    """attn_decode::KvScales (translate/include/attn_decode_fp8.cuh): an FP8 cache kernel's second argument."""

    _fields_ = [("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("k_stride", ctypes.c_int), ("v_stride", ctypes.c_int)]


class DecodeArgs(ctypes.Structure):
    """attn_decode::Args (translate/include/attn_decode.cuh), field for field."""

    _fields_ = ([(n, ctypes.c_void_p) for n in ("q", "k", "v", "o", "o_partial", "lse_partial", "lse",
                                                 "page_table", "seqused_k")]
                + [(f"{t}_{w}_stride", ctypes.c_longlong) for t in "qkvo" for w in ("batch", "row", "head")]
                + [("page_table_stride", ctypes.c_longlong)]
                + [(n, ctypes.c_int) for n in ("batch", "seqlen_q", "heads_q", "group", "seqlen_k", "page_shift",
                                               "num_splits", "blocks_per_split", "m_blocks")]
                + [("scale_log2", ctypes.c_float), ("sinks", ctypes.c_void_p), ("window_left", ctypes.c_int),
                   ("window_right", ctypes.c_int), ("softcap_prescale", ctypes.c_float), ("leftpad_k", ctypes.c_void_p)])


def option_errors(features, window, softcap, sinks, heads_q: int, device) -> list[str]:
    """Why a call's options do not fit a kernel built with ``features`` (kernel_abi.spec.FEATURES): a window, cap
    or sinks the kernel does not compute, a sinks tensor that is not (heads_q,) fp32 contiguous on the device."""
    import torch

    errors = []
    window = tuple(window or (-1, -1))
    if len(window) != 2 or any(isinstance(w, bool) or not isinstance(w, int) or w < -1 for w in window):
        errors.append(f"window_size must be two ints >= -1 (left, right; -1 open), got {window!r}")
    elif window != (-1, -1) and "local" not in features:
        errors.append(f"window_size {window}: this kernel has no sliding window")
    cap_errors = softcap_errors(softcap)
    if cap_errors:
        errors += cap_errors
    elif bool(softcap) != ("softcap" in features):
        errors.append("this kernel soft-caps its scores: pass softcap > 0" if softcap == 0 else
                      f"softcap {softcap:g}: this kernel has no soft-capping")
    if sinks is None:
        if "sinks" in features:
            errors.append("this kernel adds sink logits: pass learnable_sink, (heads_q,) fp32")
    elif "sinks" not in features:
        errors.append("learnable_sink: this kernel has no sinks")
    elif not isinstance(sinks, torch.Tensor) or sinks.dtype != torch.float32 or tuple(sinks.shape) != (heads_q,) \
            or sinks.device != device or (heads_q > 1 and sinks.stride(0) != 1):
        errors.append(f"learnable_sink must be a contiguous fp32 tensor of {heads_q} logits (one per query head) "
                      f"on {device}")
    return errors


def k_map_spec(address: int, shape, strides, element_bytes: int, paged: bool, block_n: int):
    """The TMA map a kv_load tma kernel reads whole key tiles through (attn_decode_sm90_seesaw.cuh): the cache
    (pages or sequences, rows, heads, d) as tuner.serving.launch.tma's 4-D map with boxes of ``block_n`` rows. None where no tile
    can come by TMA, so the kernel never reads the descriptor: pages smaller than a tile (it gathers them) or a
    dense cache shorter than one. TensorMapError for a cache the TMA unit cannot address."""
    from tuner.serving.launch import tma

    rows = int(shape[1])
    if rows < block_n or (paged and rows % block_n):
        return None
    return tma.tensor_map_spec(address, shape, strides, element_bytes, block_n)


@dataclass
class KMap:
    """A kv_load tma kernel's second parameter: the K cache's descriptor in its own buffer, and the slot that keeps
    it pointing at the call's k_cache (tuner.serving.launch.plan.point_map, as the prefill plans' descriptors)."""
    buffer: Any             # (c_uint64 * 16): the 128 bytes cuLaunchKernel copies; zeros while slot is None
    slot: Any               # tuner.serving.launch.plan.MapSlot, or None (k_map_spec: the kernel never reads it)

    def point(self, address: int) -> None:
        if self.slot is not None and address != self.slot.address:
            point_map(self.buffer, self.slot, address)


def build_k_map(k_cache, paged: bool, block_n: int, dtype: str) -> KMap:
    spec = k_map_spec(k_cache.data_ptr(), k_cache.shape, k_cache.stride(), k_cache.element_size(), paged, block_n)
    buffer = (ctypes.c_uint64 * 16)()
    return KMap(buffer, place_map(buffer, 0, 1, spec, dtype) if spec is not None else None)


@dataclass
class DecodePlan:
    args: DecodeArgs
    pointer: Any            # (c_void_p * n) -> args [, k_map]: cuLaunchKernel's parameter array (the combine
                            # kernel reads the first)
    pointers_address: int   # its address, as cuLaunchKernel takes it
    split_launch: tuple     # (function, grid x/y/z, block x/y/z, shared memory): cuLaunchKernel's first arguments
    combine_launch: tuple
    num_splits: int
    rows: int               # b * seqlen_q * hq
    out_shape: tuple
    workspace_o: int        # fp32 elements of the partial outputs (splits, rows, d_v)
    workspace_lse: int      # and of their log2-sum-exps (splits, rows)
    lock: Any
    k_map: Any = None       # KMap of a kv_load tma kernel
    scales: Any = None      # KvScales of an FP8 cache kernel (its pointers and strides written per call)


def load_decode_kernel(binary, meta: dict, device: int | None = None) -> "DecodeKernel":
    """Load a decode kernel's cubin (both entry points) on GPU ``device``; meta is ``GeneratedKernel.meta()``."""
    if meta.get("grid") != "decode":
        raise cuda.KernelLoadError(f"{meta.get('name')} is not a decode kernel (grid {meta.get('grid')!r})")
    base = load_attention_kernel(binary, meta, device)
    driver = cuda.api()
    with cuda.CurrentContext(base.device_index):
        combine = cuda.check(driver.cuModuleGetFunction(base._module, (meta["name"] + "_combine").encode()),
                            f"cannot find {meta['name']}_combine")
    return DecodeKernel(base, combine)


class DecodeKernel:
    def __init__(self, base: AttentionKernel, combine_function):
        self.base = base
        self.meta = base.meta
        self.spec = base.meta["spec"]
        self.params = base.meta["params"]
        self._combine = combine_function
        self._plans: dict = {}
        self._streams: dict = {}
        self._ctas_per_sm: int | None = None

    @property
    def name(self) -> str:
        return self.meta["name"]

    @property
    def ctas_per_sm(self) -> int:
        """CTAs of the split kernel one SM holds at once (the driver's occupancy), which the split rule fills."""
        if self._ctas_per_sm is None:
            driver = cuda.api()
            with cuda.CurrentContext(self.base.device_index):
                n = cuda.check(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    self.base._function, self.meta["num_threads"], self.meta["smem_bytes"]), "cuOccupancy")
            self._ctas_per_sm = max(1, int(n))
        return self._ctas_per_sm

    @property
    def paged(self) -> bool:
        return self.spec.get("layout") == "paged"

    def split_plan(self, batch: int, heads_q: int, heads_kv: int, seqlen_q: int, max_seqlen_k: int,
                   num_splits: int | None = None):
        """(splits, blocks per split, row blocks) the rule gives this call shape."""
        p = self.params
        pack = heads_q // heads_kv if p["pack_gqa"] else 1
        m_blocks = math.ceil(seqlen_q * pack / p["block_m"])
        units = heads_kv if p["pack_gqa"] else heads_q
        plan = plan_splits(batch * units * m_blocks, max_seqlen_k, p["block_n"], self.base._sm_count,
                           self.ctas_per_sm, p["min_split_blocks"], num_splits)
        return plan, m_blocks, units

    def visible_keys(self, capacity: int, seqlen_q: int, window=(-1, -1)) -> int:
        """The most keys a sequence's queries see, which the splits divide: a window's (the kernel starts them at the
        window's first tile, one tile of slack) or the cache's capacity (a leftpad, whose values are not read back,
        only shortens a sequence). ``window``: effective (kernel_abi.spec.effective_window)."""
        left, right = window
        if left < 0 or (right < 0 and not self.spec.get("causal")):
            return capacity
        return min(capacity, left + seqlen_q + max(right, 0) + int(self.params["block_n"]))

    @property
    def v_from_k(self) -> bool:
        """V is the first d_v columns of k_cache (absorbed MLA): v_cache is None or that view."""
        return v_from_k(KernelSpec(**{f: self.spec[f] for f in ("variant", "d_qk", "d_v", "causal", "dtype")}))

    @property
    def kv_fp8(self) -> bool:
        """The kernel reads an e4m3 cache (spec kv_dtype fp8) with k_scale / v_scale."""
        return self.spec.get("kv_dtype") == "fp8"

    @property
    def features(self) -> tuple:
        """The options the kernel is built with (kernel_abi.spec.FEATURES), from its spec."""
        return tuple(f for f in FEATURES if self.spec.get(f))

    def __call__(self, q, k_cache, v_cache=None, cache_seqlens=None, page_table=None,
                 softmax_scale: float | None = None, num_splits: int | None = None, return_lse: bool = False,
                 out=None, workspace=None, window_size=(-1, -1), softcap: float = 0.0, learnable_sink=None,
                 cache_leftpad=None, k_scale=None, v_scale=None):
        """out (b, seqlen_q, hq, d_v) [, lse (b, hq, seqlen_q) fp32]. ``workspace``: (o_partial, lse_partial) to
        use instead of fresh buffers (the verifier poisons them). ``window_size``, ``softcap``, ``learnable_sink``
        (FlashAttention's conventions, kernel_abi/spec.py) for a kernel built with those options; the lse then
        includes the sinks. ``cache_leftpad``: see the module doc. ``k_scale``/``v_scale``: an FP8 cache kernel's
        (kv_fp8) fp32 scales, one element or one per KV head (the real K is k_cache * k_scale); their values are not
        read (the serving layer checks they are finite)."""
        import torch

        if self.kv_fp8 and self.v_from_k:
            v_scale = latent_v_scale(k_scale, v_scale, self.name)
        if self.kv_fp8 or k_scale is not None or v_scale is not None:
            self._check_scales(k_scale, v_scale, k_cache)

        if cache_leftpad is not None:
            errors = self.leftpad_errors(cache_leftpad, q)
            if errors:
                raise ValueError(f"{self.name}: " + "; ".join(errors))
        v_cache = self._values(k_cache, v_cache)
        features = self.features
        if features or learnable_sink is not None or softcap or tuple(window_size or (-1, -1)) != (-1, -1):
            errors = option_errors(features, window_size, softcap, learnable_sink,
                                   int(q.shape[2]) if isinstance(q, torch.Tensor) and q.dim() == 4 else 0,
                                   q.device if isinstance(q, torch.Tensor) else None)
            if errors:
                raise ValueError(f"{self.name}: " + "; ".join(errors))
        window = effective_window(tuple(int(w) for w in (window_size or (-1, -1))), bool(self.spec.get("causal")))
        plan = self._plan(q, k_cache, v_cache, cache_seqlens, page_table, softmax_scale, num_splits, out,
                          window, float(softcap))
        if out is None:
            out = torch.empty(plan.out_shape, dtype=q.dtype, device=q.device)
        lse = torch.empty((plan.out_shape[0], plan.out_shape[2], plan.out_shape[1]), dtype=torch.float32,
                          device=q.device) if return_lse else None
        o_partial_ptr = lse_partial_ptr = None
        if plan.num_splits > 1:
            if workspace is not None:
                o_partial, lse_partial = workspace
                if o_partial.numel() < plan.workspace_o or lse_partial.numel() < plan.workspace_lse:
                    raise ValueError("workspace too small for this call's splits")
                o_partial_ptr, lse_partial_ptr = o_partial.data_ptr(), lse_partial.data_ptr()
            else:   # one allocation: the partial outputs, then the log2-sum-exps (the kernels take pointers only)
                buffer = torch.empty(plan.workspace_o + plan.workspace_lse, dtype=torch.float32, device=q.device)
                o_partial_ptr = buffer.data_ptr()
                lse_partial_ptr = o_partial_ptr + 4 * plan.workspace_o
        pointers = (q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr())
        if (pointers[0] | pointers[1] | pointers[2] | pointers[3]) & 15:
            raise ValueError("q, k_cache, v_cache and out must be 16-byte aligned (128-bit loads)")
        stream = self._stream()
        with plan.lock:
            a = plan.args
            a.q, a.k, a.v, a.o = pointers
            a.o_partial, a.lse_partial = o_partial_ptr, lse_partial_ptr
            a.lse = lse.data_ptr() if lse is not None else None
            a.page_table = page_table.data_ptr() if page_table is not None else None
            a.seqused_k = cache_seqlens.data_ptr() if cache_seqlens is not None else None
            a.sinks = learnable_sink.data_ptr() if learnable_sink is not None else None
            a.leftpad_k = cache_leftpad.data_ptr() if cache_leftpad is not None else None
            if plan.k_map is not None:
                plan.k_map.point(pointers[1])
            if plan.scales is not None:   # a 1-element scale serves every KV head (stride 0)
                plan.scales.k, plan.scales.v = k_scale.data_ptr(), v_scale.data_ptr()
                plan.scales.k_stride, plan.scales.v_stride = int(k_scale.numel() > 1), int(v_scale.numel() > 1)
            self._launch(plan.split_launch, stream, plan.pointers_address)
            if plan.num_splits > 1:
                self._launch(plan.combine_launch, stream, plan.pointers_address)
        return (out, lse) if return_lse else out

    def _check_scales(self, k_scale, v_scale, k_cache) -> None:
        """ValueError naming a scale this kernel cannot take: an FP8 cache kernel needs both (check_kv_scales, the
        values unread); a 16-bit cache kernel takes none."""
        import torch

        from tuner.serving.launch.plan import check_kv_scales

        if not self.kv_fp8:
            raise ValueError(f"{self.name}: k_scale/v_scale are an FP8 (e4m3) cache's; this kernel reads a "
                             f"{self.spec['dtype']} cache")
        heads_kv = int(k_cache.shape[2]) if isinstance(k_cache, torch.Tensor) and k_cache.dim() == 4 else 1
        device = k_cache.device if isinstance(k_cache, torch.Tensor) else None
        try:
            check_kv_scales({"k_scale": k_scale, "v_scale": v_scale}, heads_kv, device, check_finite=False)
        except ValueError as exc:
            raise ValueError(f"{self.name}: {exc}") from None

    def leftpad_errors(self, cache_leftpad, q) -> list[str]:
        """Why this kernel cannot take ``cache_leftpad`` for q (empty: it can): only a dense GQA/MHA kernel of ABI 5
        on reads one, as a contiguous int32 tensor of one row per sequence on q's device. Its values are not
        checked: that would read them back (a synchronisation)."""
        import torch

        if self.paged:
            return ["cache_leftpad: a paged cache takes no leftpad (as in FlashAttention 2): a sequence's pages start "
                    "at its first key"]
        if self.v_from_k:
            return ["cache_leftpad: the absorbed-MLA decode kernels read no leftpad"]
        if int(self.meta.get("abi", 0)) < 5:
            return [f"cache_leftpad: this kernel (ABI {self.meta.get('abi')}) reads no leftpad; rebuild it (ABI 5)"]
        b = int(q.shape[0]) if isinstance(q, torch.Tensor) and q.dim() == 4 else -1
        device = q.device if isinstance(q, torch.Tensor) else None
        if not isinstance(cache_leftpad, torch.Tensor) or cache_leftpad.dtype != torch.int32 \
                or tuple(cache_leftpad.shape) != (b,) or cache_leftpad.device != device \
                or (b > 1 and cache_leftpad.stride(0) != 1):
            return [f"cache_leftpad must be a contiguous int32 tensor of {b} rows (one per sequence) on {device}, got "
                    f"{getattr(cache_leftpad, 'dtype', type(cache_leftpad).__name__)} "
                    f"{tuple(getattr(cache_leftpad, 'shape', ()))} on {getattr(cache_leftpad, 'device', None)}"]
        return []

    def _values(self, k_cache, v_cache):
        """The V tensor the kernel is given: for an MLA kernel the view k_cache[..., :d_v] (None, or a v_cache that
        is exactly that view: same storage, same strides); a separate V tensor would be silently ignored, so it is
        refused. Other kernels need their v_cache."""
        import torch

        if not self.v_from_k:
            if v_cache is None:
                raise ValueError("this decode kernel reads a separate V cache: pass v_cache")
            return v_cache
        d_v = self.spec["d_v"]
        if not isinstance(k_cache, torch.Tensor) or k_cache.dim() != 4 or k_cache.shape[-1] != self.spec["d_qk"]:
            return v_cache if v_cache is not None else k_cache   # check_decode_inputs names the problem
        view = k_cache[..., :d_v]
        if v_cache is None:
            return view
        if not (isinstance(v_cache, torch.Tensor) and v_cache.data_ptr() == k_cache.data_ptr()
                and tuple(v_cache.shape) == tuple(view.shape) and v_cache.stride() == view.stride()):
            raise ValueError(f"this MLA decode kernel reads V as the first {d_v} columns of k_cache's rows "
                             f"(FlashMLA's latent cache): pass v_cache=None or k_cache[..., :{d_v}], not a separate "
                             "tensor")
        return v_cache

    def _stream(self):
        """torch's current stream on the kernel's device, as the driver's handle (one lookup per call)."""
        handle = cuda.raw_stream(self.base.device_index)
        stream = self._streams.get(handle)
        if stream is None:
            stream = self._streams[handle] = cuda.api().CUstream(init_value=int(handle))
        return stream

    def _launch(self, prefix: tuple, stream, pointers_address: int) -> None:
        """cuLaunchKernel(*prefix, stream, params, 0): ``prefix`` (function, grid, block, shared memory) is the
        plan's, built once; a thread without the context current gets the primary one and tries again."""
        launch = cuda.LAUNCH or cuda.bind_launch()
        err = int(launch(*prefix, stream, pointers_address, 0)[0])
        if err == cuda.CUDA_ERROR_INVALID_CONTEXT:
            cuda.check(cuda.api().cuCtxSetCurrent(cuda.primary_context(self.base.device_index)), "cuCtxSetCurrent")
            err = int(launch(*prefix, stream, pointers_address, 0)[0])
        if err:
            raise cuda.KernelLaunchError(f"launch of {self.name} failed: {cuda.api().cuGetErrorName(err)[1]!r} "
                                       f"({err})")

    def _plan(self, q, k_cache, v_cache, cache_seqlens, page_table, softmax_scale, num_splits, out,
              window=(-1, -1), softcap: float = 0.0) -> DecodePlan:
        key = (q.shape, q.stride(), k_cache.shape, k_cache.stride(), v_cache.shape, v_cache.stride(), q.dtype,
               k_cache.dtype, v_cache.dtype, q.device, None if page_table is None else (page_table.shape, page_table.stride()),
               cache_seqlens is None, softmax_scale, num_splits,
               None if out is None else (out.shape, out.stride(), out.dtype), window, softcap)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._build(q, k_cache, v_cache, cache_seqlens, page_table, softmax_scale, num_splits, out,
                               window, softcap)
            if len(self._plans) >= _MAX_PLANS:
                self._plans.pop(next(iter(self._plans)))
            self._plans[key] = plan
        return plan

    def _build(self, q, k_cache, v_cache, cache_seqlens, page_table, softmax_scale, num_splits, out,
               window=(-1, -1), softcap: float = 0.0) -> DecodePlan:
        import torch

        from tuner.serving.launch.plan import _check_layout

        spec = self.spec
        dtype = getattr(torch, _DTYPES[spec["dtype"]])
        check_decode_inputs(q, k_cache, v_cache, cache_seqlens, page_table, dtype, spec, self.paged,
                            self.base.device_index, torch.float8_e4m3fn if self.kv_fp8 else None)
        b, sq, hq, _ = q.shape
        hkv = k_cache.shape[2]
        if self.paged:
            page_size = k_cache.shape[1]
            capacity = page_table.shape[1] * page_size
        else:
            page_size, capacity = 0, k_cache.shape[1]
        split, m_blocks, units = self.split_plan(b, hq, hkv, sq, self.visible_keys(capacity, sq, window), num_splits)
        out_shape = (b, sq, hq, spec["d_v"])
        if out is not None:
            if tuple(out.shape) != out_shape or out.dtype != dtype or out.device != q.device:
                raise ValueError(f"out must be {out_shape} {dtype} on {q.device}")
            _check_layout("out", out)
            o_strides = out.stride()[:3]
        else:
            o_strides = (sq * hq * spec["d_v"], hq * spec["d_v"], spec["d_v"])
        scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(spec["d_qk"])
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            raise ValueError(f"softmax_scale must be a positive finite number, got {softmax_scale!r}")
        if units * m_blocks > 65535 or b > 65535:
            raise ValueError(f"{units * m_blocks} head units x row blocks and batch {b} must each be <= 65535")
        a = DecodeArgs()
        for t, strides in (("q", q.stride()[:3]), ("k", k_cache.stride()[:3]), ("v", v_cache.stride()[:3]),
                           ("o", o_strides)):
            for w, s in zip(("batch", "row", "head"), strides):
                setattr(a, f"{t}_{w}_stride", int(s))
        a.page_table_stride = int(page_table.stride(0)) if page_table is not None else 0
        a.batch, a.seqlen_q, a.heads_q, a.group, a.seqlen_k = b, sq, hq, hq // hkv, capacity
        a.page_shift = int(page_size).bit_length() - 1 if page_size else 0
        a.num_splits, a.blocks_per_split, a.m_blocks = split.num_splits, split.blocks_per_split, m_blocks
        a.scale_log2 = float(scale) * _LOG2E
        a.window_left, a.window_right = window
        if softcap:   # the scores become cap * tanh(scores * scale / cap): tanh(S * prescale), then cap * log2(e)
            a.softcap_prescale, a.scale_log2 = float(scale) / softcap, softcap * _LOG2E
        rows = b * sq * hq
        meta = self.base.meta
        k_map = None
        if self.params.get("kv_load", "gather") == "tma":
            from tuner.serving.launch import tma

            try:
                k_map = build_k_map(k_cache, self.paged, int(self.params["block_n"]), spec["dtype"])
            except tma.TensorMapError as exc:
                raise ValueError(f"{self.name} reads whole key tiles by TMA and k_cache cannot be mapped: {exc}") \
                    from None
        scales = KvScales() if self.kv_fp8 else None
        params = [ctypes.addressof(a)] + ([ctypes.addressof(k_map.buffer)] if k_map is not None else []) + (
            [ctypes.addressof(scales)] if scales is not None else [])
        pointer = (ctypes.c_void_p * len(params))(*params)
        split_launch = (self.base._function, split.num_splits, units * m_blocks, b, meta["num_threads"], 1, 1,
                        meta["smem_bytes"])
        combine_launch = (self._combine, combine_grid(rows, spec["d_v"], split.num_splits, meta.get("abi", 0)), 1, 1,
                          32 * COMBINE_WARPS, 1, 1, 0)
        return DecodePlan(a, pointer, ctypes.addressof(pointer), split_launch, combine_launch, split.num_splits, rows,
                          out_shape, split.num_splits * rows * spec["d_v"], split.num_splits * rows, threading.Lock(),
                          k_map, scales)


def latent_v_scale(k_scale, v_scale, name: str):
    """V's scale for an absorbed-MLA kernel over an e4m3 latent cache: V is the first d_v columns of the latent rows,
    so its scale is k_scale (attn_decode_fp8_mla.cuh reads k_scale alone). None or k_scale itself (the same tensor)
    are taken; another tensor, which the kernel would silently not read, is refused naming v_scale."""
    if v_scale is None or v_scale is k_scale:
        return k_scale
    raise ValueError(f"{name}: v_scale: absorbed MLA reads V from k_cache's latent rows, whose scale is k_scale; pass "
                     "v_scale=None or k_scale itself")


def check_decode_inputs(q, k_cache, v_cache, cache_seqlens, page_table, dtype, spec: dict, paged: bool,
                        device_index: int, kv_dtype=None) -> None:
    """ValueError naming what a decode call's tensors get wrong, before any launch. ``kv_dtype``: the caches' torch
    dtype where it is not q's (an FP8 cache kernel's float8_e4m3fn)."""
    import torch

    from tuner.serving.launch.plan import _check_layout

    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or not t.is_cuda:
            raise ValueError(f"{name} must be a CUDA torch tensor")
        want = dtype if name == "q" or kv_dtype is None else kv_dtype
        if t.dtype != want:
            raise ValueError(f"{name} is {t.dtype}; this kernel was built for {want}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D, got shape {tuple(t.shape)}")
        _check_layout(name, t)
    if q.device.index != device_index or k_cache.device != q.device or v_cache.device != q.device:
        raise ValueError(f"q, k_cache and v_cache must be on cuda:{device_index}")
    b, sq, hq, dq = q.shape
    n, rows, hkv, dk = k_cache.shape
    if sq < 1 or sq > 16:
        raise ValueError(f"a decode kernel takes 1..16 query tokens per sequence, got {sq}: longer chunks are "
                         "prefill")
    if spec.get("variant") == "mla" and hkv != 1:
        raise ValueError(f"MLA decode reads one latent KV head; k_cache has {hkv}")
    if (dq, dk) != (spec["d_qk"], spec["d_qk"]) or tuple(v_cache.shape) != (n, rows, hkv, spec["d_v"]):
        raise ValueError(f"head dims must be q/k {spec['d_qk']}, v {spec['d_v']}; got q {tuple(q.shape)}, k_cache "
                         f"{tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    if cache_seqlens is not None:
        if cache_seqlens.dtype != torch.int32 or cache_seqlens.shape != (b,) or cache_seqlens.device != q.device \
                or cache_seqlens.stride(0) != 1:
            raise ValueError(f"cache_seqlens must be a contiguous int32 tensor of {b} lengths on {q.device}")
    if paged:
        if page_table is None:
            raise ValueError("this decode kernel reads a paged cache: pass page_table (batch, pages) int32")
        if page_table.dtype != torch.int32 or page_table.dim() != 2 or page_table.shape[0] != b \
                or page_table.device != q.device or page_table.stride(1) != 1:
            raise ValueError(f"page_table must be a 2-D int32 tensor ({b}, pages) with contiguous rows on {q.device}")
        if rows & (rows - 1):
            raise ValueError(f"page size {rows} must be a power of two")
        if cache_seqlens is None:
            raise ValueError("a paged decode call needs cache_seqlens: the keys each sequence has in its pages")
    else:
        if page_table is not None:
            raise ValueError("this decode kernel reads a dense cache (batch, seqlen, heads, dim): build a paged one "
                             "for page_table")
        if n != b:
            raise ValueError(f"a dense cache holds one sequence per batch entry: {n} caches for {b} queries")
