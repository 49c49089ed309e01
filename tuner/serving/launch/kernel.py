"""Load a generated kernel's cubin (or PTX) and launch it on torch tensors through the CUDA driver API.

cuda-python's ``cuda.bindings.driver`` loads the module into the device's primary context (the one torch
uses): a cubin for this GPU, or PTX that the driver JIT-compiles (how sm75 kernels are cross-checked on a
Hopper GPU). A launch is ``cuLaunchKernel`` on torch's current stream. Imports of torch and cuda-python are
lazy, so this module imports on machines without a GPU.

Launch cost is the point of this module (a decode-sized call is all launch): everything that depends only on
the call's shapes, strides, dtypes, device and scale is validated and packed once into a ``LaunchPlan``
(grid, the kernel's parameter buffer, its TMA descriptors); a later call with the same key looks the plan
up, writes the four data pointers (and the descriptors' global addresses, see tuner.serving.launch.tma.AddressPatch) into
the buffer and calls the driver.

Layout (FlashAttention's): q (b, sq, hq, d_qk), k (b, sk, hkv, d_qk), v (b, sk, hkv, d_v) -> out
(b, sq, hq, d_v). Any strides work as long as the head dim is contiguous and the other strides keep
16-byte alignment (the kernel moves 8 elements per 128-bit access).
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_abi.abi import ABI1_ARGS, ABI_VERSION
from tuner.serving.launch import driver as cuda
from tuner.serving.launch.plan import (FOUR_POINTERS, NO_OPTIONS, POINTER, CallOptions, LaunchPlan,
                                       build_paged_plan, build_plan, build_varlen_plan, check_descales, point_map,
                                       packed_vt_align, transposed_packed_v, transposed_v, transposes_v,
                                       vt_key_order)

SUPPORTED_ABIS = tuple(range(1, ABI_VERSION + 1))   # kernel_abi.abi: what each version changed
_DEFAULT_SMEM_LIMIT = 48 * 1024
_LOG2E = math.log2(math.e)
_MAX_PLANS = 256               # per kernel; a model has a handful of shapes per layer kind


def check_meta(meta: dict) -> None:
    """The metadata a kernel needs to be launched; KernelLoadError naming what is wrong."""
    if meta.get("abi") not in SUPPORTED_ABIS:
        raise cuda.KernelLoadError(f"kernel ABI {meta.get('abi')!r} is not one this runtime launches "
                              f"({', '.join(map(str, SUPPORTED_ABIS))}); rebuild the kernel")
    for key in ("name", "num_threads", "smem_bytes", "block_m", "spec"):
        if key not in meta:
            raise cuda.KernelLoadError(f"kernel metadata lacks {key!r}")


# Persistent kernels' tile counters (one per stream) come in blocks of COUNTER_BLOCK (512 bytes); a new block is
# allocated, outside captures, whenever fewer than COUNTER_SPARE are left for streams not seen yet (a CUDA-graph
# capture runs on a stream of its own and cannot allocate one).
COUNTER_BLOCK = 64
COUNTER_SPARE = 8


def load_attention_kernel(binary: bytes | str | Path, meta: dict, device: int | None = None) -> "AttentionKernel":
    """The module and entry point of ``meta["name"]``, as an AttentionKernel (load_kernel's work)."""
    check_meta(meta)
    data = Path(binary).read_bytes() if isinstance(binary, (str, Path)) else bytes(binary)
    if not data:
        raise cuda.KernelLoadError("empty kernel binary")
    import torch

    index = torch.cuda.current_device() if device is None else int(device)
    arch = cuda.cubin_arch(data)
    capability = torch.cuda.get_device_capability(index)
    if arch is not None and not cuda.runs_on(arch, capability):
        raise cuda.KernelLoadError(f"{meta['name']} is a cubin for sm_{arch[0]}{arch[1]}; GPU {index} "
                              f"({torch.cuda.get_device_name(index)}) is sm_{capability[0]}{capability[1]}")
    driver = cuda.api()
    image = ctypes.create_string_buffer(data)   # NUL-terminated: PTX needs it, a cubin ignores it
    what = f"{meta['name']} ({'cubin' if arch else 'PTX'})"
    with cuda.CurrentContext(index):
        module = cuda.check(driver.cuModuleLoadData(ctypes.addressof(image)), f"cannot load {what}")
        function = cuda.check(driver.cuModuleGetFunction(module, meta["name"].encode()), f"cannot find {what}")
        smem = int(meta["smem_bytes"])
        if smem > _DEFAULT_SMEM_LIMIT:
            attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            cuda.check(driver.cuFuncSetAttribute(function, attr, smem),
                   f"{meta['name']} needs {smem} bytes of shared memory; the GPU refused")
        sms = cuda.check(driver.cuDeviceGetAttribute(
            driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, cuda.device(index)[0]),
            "cuDeviceGetAttribute")
    kernel = AttentionKernel(meta=dict(meta), device_index=index, _module=module, _function=function, _sm_count=sms)
    if any(name == "tile_counter" for name, _ in kernel.args) and not torch.cuda.is_current_stream_capturing():
        kernel.reserve_counters()     # before any capture: the counters of the streams to come
    return kernel


@dataclass
class AttentionKernel:
    meta: dict
    device_index: int
    _module: Any
    _function: Any
    _sm_count: int
    _plans: Any = None       # call key -> LaunchPlan
    _counters: dict = field(default_factory=dict)          # stream handle -> tile counter address
    _counter_tensors: list = field(default_factory=list)   # what keeps those counters allocated
    _free_counters: list = field(default_factory=list)     # zeroed counters no stream has taken yet
    _streams: dict = field(default_factory=dict)            # stream handle -> CUstream

    @property
    def name(self) -> str:
        return self.meta["name"]

    @property
    def args(self) -> list:
        return [tuple(a) for a in self.meta.get("args", ABI1_ARGS)]

    @property
    def takes_scale(self) -> bool:
        """Whether the softmax scale is a launch argument (ABI 2); else the kernel computes 1/sqrt(d_qk)."""
        return any(name == "softmax_scale_log2" for name, _ in self.args)

    @property
    def tensor_map_args(self) -> list[tuple[str, str]]:
        """(argument, tensor) of the TMA descriptors the kernel takes."""
        return [(name, kind.split(":", 1)[1]) for name, kind in self.args if kind.startswith("tensormap:")]

    def resources(self) -> dict:
        """Registers and local memory per thread as the driver reports them."""
        driver = cuda.api()
        attr = driver.CUfunction_attribute
        out = {}
        for key, a in (("num_regs", attr.CU_FUNC_ATTRIBUTE_NUM_REGS),
                       ("local_size_bytes", attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES),
                       ("shared_size_bytes", attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)):
            err, value = driver.cuFuncGetAttribute(a, self._function)
            out[key] = value if int(err) == 0 else None
        return out

    def module_global(self, name: str) -> tuple:
        """(device address, bytes) of the module's global variable ``name``, e.g. the stamps of a kernel built
        with -DATTN_DECODE_TRACE (scripts/decode_trace.py); KernelLoadError when the module has no such global."""
        return cuda.check(cuda.api().cuModuleGetGlobal(self._module, name.encode()), name)

    @property
    def fp8(self) -> bool:
        """e4m3 inputs with descales, a bf16 output (kernel_abi.spec)."""
        return self.meta["spec"].get("dtype") == "fp8"

    def __call__(self, q, k, v, out=None, softmax_scale: float | None = None, *, window_size=(-1, -1),
                 softcap: float = 0.0, sinks=None, q_descale=None, k_descale=None, v_descale=None, v_t=None):
        """``out`` (b, sq, hq, d_v) = attention(q, k, v) on the tensors' device and torch's current stream.
        ValueError (before any launch) for inputs the kernel cannot take; ``softmax_scale`` None is
        1/sqrt(d_qk). ``window_size``, ``softcap``, ``sinks``: the options of kernel_abi.spec, for a kernel built
        with them (tuner.serving.launch.plan.option_values). An FP8 kernel takes float8_e4m3fn q, k, v and
        FlashAttention-3's ``q_descale``/``k_descale``/``v_descale`` (fp32, (batch, KV heads)), all required, and
        returns bf16; V is copied transposed for it (tuner.serving.launch.plan.transposed_v, in the kernel's key order:
        plan.vt_key_order), or ``v_t`` is that copy made earlier (a caller that keeps V transposed: no copy per call)."""
        plain = sinks is None and not softcap and (window_size is None or tuple(window_size) == (-1, -1))
        options = NO_OPTIONS if plain else CallOptions(tuple(window_size), softcap, sinks)
        plan = self._plan_for(q, k, v, out, softmax_scale, options)
        extra = () if sinks is None else (sinks.data_ptr(),)
        if self.fp8 or any(d is not None for d in (q_descale, k_descale, v_descale)):
            extra += self._descales(int(q.shape[0]), int(k.shape[2]), q.device, q_descale, k_descale, v_descale)
        if out is None:
            import torch

            out = torch.empty(plan.out_shape, dtype=plan.out_dtype or q.dtype, device=q.device)
        if transposes_v(self.meta):
            order = vt_key_order(self.meta)
            v = transposed_v(v, order=order) if v_t is None else \
                _checked_v_t(v_t, v, transposed_v(v, alloc=False, order=order).shape)
        elif v_t is not None:
            raise ValueError(f"{self.name} reads V as given: v_t applies to FP8 kernels that read the runtime's V^T "
                             "(v_transpose 'runtime'), not to those that transpose V in the kernel")
        self._launch(plan, q, k, v, out, extra)
        return out

    def _descales(self, batch: int, heads_kv: int, device, q_descale, k_descale, v_descale) -> tuple:
        """The descale pointers of an FP8 call of ``batch`` sequences, checked (ValueError naming the argument)."""
        if not self.fp8:
            raise ValueError(f"{self.name} is not an FP8 kernel: q_descale, k_descale and v_descale apply to "
                             "float8_e4m3fn inputs")
        import torch

        given = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
        check_descales(given, batch, heads_kv, device, check_finite=not torch.cuda.is_current_stream_capturing())
        return tuple(t.data_ptr() for t in given.values())

    def prepare(self, q, k, v, softmax_scale: float | None = None):   # (a kernel with no sinks)
        """``launcher(q, k, v) -> out`` bound to the plan of these tensors' signature (shapes, strides, dtypes,
        device, scale), for a caller that keys its own cache by that signature (tuner.serving's eager path):
        one lookup there instead of two. Only tensors of the same signature may be passed; the per-call
        checks (alignment) still run."""
        import torch

        if self.fp8:
            raise ValueError(f"{self.name} is an FP8 kernel: call it with its descales")
        plan = self._plan_for(q, k, v, None, softmax_scale)
        shape, dtype, device, launch, empty = plan.out_shape, q.dtype, q.device, self._launch, torch.empty

        def launcher(q, k, v):
            out = empty(shape, dtype=dtype, device=device)
            launch(plan, q, k, v, out)
            return out

        return launcher

    def varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, seqused_k=None,
               out=None, softmax_scale: float | None = None, *, window_size=(-1, -1), softcap: float = 0.0,
               sinks=None, q_descale=None, k_descale=None, v_descale=None, v_t=None):
        """Packed sequences (a kernel of the varlen layout): q (total_q, hq, d_qk), k (total_k, hkv, d_qk),
        v (total_k, hkv, d_v), ``cu_seqlens_q``/``cu_seqlens_k`` int32 (batch + 1) on the same GPU,
        ``seqused_k`` int32 (batch) or None -> out (total_q, hq, d_v). Causal aligns bottom-right within
        each sequence. ``max_seqlen_q`` must be at least every sequence's length (FlashAttention's contract:
        it sizes the grid). An FP8 kernel takes the descales of ``__call__`` per sequence, (batch, KV heads),
        and V transposed as ``transposed_v(v)`` makes it of the packed V (or ``v_t``, that copy made earlier)."""
        import torch

        _check_lengths(q, cu_seqlens_q, cu_seqlens_k, seqused_k)
        batch = cu_seqlens_q.shape[0] - 1
        descales = ()
        if self.fp8 or any(d is not None for d in (q_descale, k_descale, v_descale)):
            descales = self._descales(batch, int(k.shape[1]), q.device, q_descale, k_descale, v_descale)
        key = ("varlen", q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
               q.device, k.device, v.device, batch, int(max_seqlen_q), int(max_seqlen_k), softmax_scale,
               None if out is None else (out.shape, out.stride(), out.dtype, out.device),
               CallOptions(tuple(window_size or (-1, -1)), softcap, sinks).key())
        plan = self._plans.get(key) if self._plans is not None else None
        if plan is None:
            plan = build_varlen_plan(self, q, k, v, out, softmax_scale, batch, int(max_seqlen_q), int(max_seqlen_k),
                                     CallOptions(tuple(window_size or (-1, -1)), softcap, sinks))
            self._remember_plan(key, plan)
        if out is None:
            out = torch.empty(plan.out_shape, dtype=plan.out_dtype or q.dtype, device=q.device)
        if transposes_v(self.meta):
            align, order = packed_vt_align(self.meta), vt_key_order(self.meta)
            v = transposed_packed_v(v, cu_seqlens_k, batch, align, order=order) if v_t is None else \
                _checked_v_t(v_t, v, transposed_packed_v(v, None, batch, align, alloc=False, order=order).shape)
        elif v_t is not None:
            raise ValueError(f"{self.name} reads V as given: v_t applies to FP8 kernels that read the runtime's V^T "
                             "(v_transpose 'runtime'), not to those that transpose V in the kernel")
        self._launch(plan, q, k, v, out, (cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(),
                                          0 if seqused_k is None else seqused_k.data_ptr())
                     + (() if sinks is None else (sinks.data_ptr(),)) + descales)
        return out

    def paged(self, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q: int, out=None,
              softmax_scale: float | None = None, *, window_size=(-1, -1), softcap: float = 0.0, sinks=None,
              q_descale=None, k_descale=None, v_descale=None, max_seqlen_k: int | None = None):
        """Prefill over a paged cache (a kernel of the paged layout): packed q (total_q, hq, d_qk) with
        ``cu_seqlens_q`` int32 (batch + 1); k_cache/v_cache (pages, page_size, hkv, d); ``page_table`` int32
        (batch, pages per sequence); ``seqused_k`` int32 (batch) the keys of each sequence -> out (total_q, hq,
        d_v). Causal aligns bottom-right within each sequence (a chunk of queries after a cached prefix). An FP8
        kernel takes e4m3 tensors and the descales of ``varlen`` per sequence, (batch, KV heads), and returns bf16;
        V is gathered from the pages transposed per call (tuner/serving/launch/paged_vt.py), sized by
        ``max_seqlen_k`` (at least every sequence's keys; None: the table's capacity)."""
        import torch

        _check_lengths(q, cu_seqlens_q, cu_seqlens_q, seqused_k)
        if seqused_k is None:
            raise ValueError("a paged call needs seqused_k: the keys each sequence has in its pages")
        if not isinstance(page_table, torch.Tensor) or page_table.dtype != torch.int32 or page_table.dim() != 2 \
                or page_table.device != q.device or page_table.stride(1) != 1:
            raise ValueError(f"page_table must be a 2-D int32 tensor (batch, pages) with contiguous rows on {q.device}")
        batch = cu_seqlens_q.shape[0] - 1
        if page_table.shape[0] != batch:
            raise ValueError(f"page_table has {page_table.shape[0]} rows for {batch} sequences")
        descales = ()
        if self.fp8 or any(d is not None for d in (q_descale, k_descale, v_descale)):
            descales = self._descales(batch, int(k_cache.shape[2]), q.device, q_descale, k_descale, v_descale)
        vt_keys = None
        if transposes_v(self.meta):
            from tuner.serving.launch.paged_vt import max_keys_of, paged_vt_keys

            max_keys = max_keys_of(page_table.shape[1], k_cache.shape[1], max_seqlen_k, k_cache.shape[0])
            vt_keys = paged_vt_keys(batch, max_keys, packed_vt_align(self.meta))
        key = ("paged", q.shape, q.stride(), k_cache.shape, k_cache.stride(), v_cache.shape, v_cache.stride(), q.dtype,
               k_cache.dtype, v_cache.dtype, q.device, k_cache.device, v_cache.device, batch, int(max_seqlen_q),
               page_table.stride(0), softmax_scale, None if out is None else (out.shape, out.stride(), out.dtype),
               CallOptions(tuple(window_size or (-1, -1)), softcap, sinks).key(), vt_keys)
        plan = self._plans.get(key) if self._plans is not None else None
        if plan is None:
            plan = build_paged_plan(self, q, k_cache, v_cache, out, softmax_scale, batch, int(max_seqlen_q),
                                    page_table.stride(0), CallOptions(tuple(window_size or (-1, -1)), softcap, sinks),
                                    vt_keys=vt_keys)
            self._remember_plan(key, plan)
        if out is None:
            out = torch.empty(plan.out_shape, dtype=plan.out_dtype or q.dtype, device=q.device)
        starts = 0
        if vt_keys is not None:   # the sequences' keys numbered as if packed: the kernel's cu_seqlens_k
            from tuner.serving.launch.paged_vt import key_starts, transposed_paged_v

            cu_k = key_starts(seqused_k)
            v_cache = transposed_paged_v(v_cache, page_table, cu_k, batch, vt_keys, packed_vt_align(self.meta),
                                         order=vt_key_order(self.meta))
            starts = cu_k.data_ptr()
        self._launch(plan, q, k_cache, v_cache, out,
                     (cu_seqlens_q.data_ptr(), starts, seqused_k.data_ptr(), page_table.data_ptr())
                     + (() if sinks is None else (sinks.data_ptr(),)) + descales)
        return out

    def _remember_plan(self, key, plan) -> None:
        if self._plans is None:
            self._plans = {}
        if len(self._plans) >= _MAX_PLANS:
            self._plans.pop(next(iter(self._plans)))
        self._plans[key] = plan

    def _plan_for(self, q, k, v, out, softmax_scale, options: CallOptions = NO_OPTIONS) -> "LaunchPlan":
        key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
               q.device, k.device, v.device, softmax_scale,
               None if out is None else (out.shape, out.stride(), out.dtype, out.device))
        if options is not NO_OPTIONS:
            key += options.key()
        plans = self._plans
        plan = plans.get(key) if plans is not None else None
        if plan is None:
            plan = build_plan(self, q, k, v, out, softmax_scale, options)
            self._remember_plan(key, plan)
        return plan

    # --- the per-call path -------------------------------------------------------------------------------
    def _launch(self, plan: LaunchPlan, q, k, v, out, extra: tuple = ()) -> None:
        qp, kp, vp, op = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()
        if (qp | kp | vp | op) & 15:
            raise ValueError("q, k, v and out data pointers must be 16-byte aligned (128-bit loads)")
        index = self.device_index
        handle = cuda.raw_stream(index)
        stream = self._streams.get(handle) or self._stream(handle)
        with plan.lock:
            self._pack(plan, (qp, kp, vp, op), handle, extra)
            if cuda.current_device() != index:
                with cuda.CurrentContext(index):
                    err = int((cuda.LAUNCH or cuda.bind_launch())(*plan.prefix, stream, plan.pointers_address, 0)[0])
            else:
                err = int((cuda.LAUNCH or cuda.bind_launch())(*plan.prefix, stream, plan.pointers_address, 0)[0])
                if err == cuda.CUDA_ERROR_INVALID_CONTEXT:   # a thread where torch never made the context current
                    cuda.check(cuda.api().cuCtxSetCurrent(cuda.primary_context(index)), "cuCtxSetCurrent")
                    err = int((cuda.LAUNCH or cuda.bind_launch())(*plan.prefix, stream, plan.pointers_address, 0)[0])
        if err:
            driver = cuda.api()
            raise cuda.KernelLaunchError(f"launch of {self.name} failed: {driver.cuGetErrorName(err)[1]!r} ({err})")

    def _pack(self, plan: LaunchPlan, pointers: tuple, stream_handle: int, extra: tuple = ()) -> None:
        """This call's pointers (q, k, v, out, then the layout's: plan.dynamic_offsets) into the plan's
        parameter buffer (under the plan's lock)."""
        params = plan.params
        for offset, value in zip(plan.dynamic_offsets, extra):
            POINTER.pack_into(params, offset, value)
        FOUR_POINTERS.pack_into(params, 0, *pointers)
        if plan.persistent_counter:
            POINTER.pack_into(params, 32, self._counters.get(stream_handle) or self._tile_counter(stream_handle))
        for slot in plan.maps:
            address = pointers[slot.index]
            if address != slot.address:
                point_map(params, slot, address)

    def _stream(self, handle: int):
        stream = self._streams[handle] = cuda.api().CUstream(init_value=int(handle))
        return stream

    def _tile_counter(self, stream_handle: int) -> int:
        """A zeroed pair of ints per stream for a persistent kernel's tile counter; the kernel leaves it
        zeroed for the next launch (its last CTA resets it). Two streams never share one.

        Counters come from blocks allocated outside any CUDA-graph capture (``reserve_counters``, called at
        load and whenever few are left): a counter allocated while a stream is captured would live in the
        graph's private pool beyond the capture, which torch.compile's CUDA graphs (mode="reduce-overhead")
        refuse ("tensor(s) in the cudagraph pool not tracked as outputs")."""
        import torch

        capturing = torch.cuda.is_current_stream_capturing()
        if not self._free_counters:
            if capturing:
                raise cuda.KernelLaunchError(f"{self.name}: every one of its {len(self._counters)} tile counters is taken "
                                        "by another stream and none can be allocated while a CUDA graph is "
                                        "captured; run the kernel once on the capturing stream before the capture")
            self.reserve_counters()
        pointer = self._counters[stream_handle] = self._free_counters.pop()
        if not capturing and len(self._free_counters) < COUNTER_SPARE:
            self.reserve_counters()
        return pointer

    def reserve_counters(self) -> None:
        """Allocate a block of COUNTER_BLOCK zeroed tile counters (2 ints each) and wait for the zeros, so that a
        launch on any stream finds them written."""
        import torch

        with torch.cuda.device(self.device_index):
            tensor = torch.zeros(2 * COUNTER_BLOCK, dtype=torch.int32, device=f"cuda:{self.device_index}")
            torch.cuda.current_stream().synchronize()
        self._counter_tensors.append(tensor)
        base = tensor.data_ptr()
        self._free_counters.extend(base + 8 * i for i in reversed(range(COUNTER_BLOCK)))

def _checked_v_t(v_t, v, shape):
    """``v_t`` of the ``shape`` transposed_v(v) / transposed_packed_v(v) make for the kernel (its key order's extent):
    (batch, d, heads, keys) with keys contiguous and 16-byte row strides."""
    b, d, h, sk = (int(x) for x in shape)
    if tuple(v_t.shape) != (b, d, h, sk) or v_t.dtype != v.dtype or v_t.device != v.device or v_t.stride(-1) != 1 \
            or any(s % 16 for s in v_t.stride()[:-1]):
        raise ValueError(f"v_t must be transposed_v(v) in the kernel's key order: {(b, d, h, sk)} {v.dtype} on "
                         f"{v.device} with contiguous keys and 16-byte row strides, got {tuple(v_t.shape)} "
                         f"{v_t.dtype} strides {tuple(v_t.stride())}")
    return v_t


def _check_lengths(q, cu_seqlens_q, cu_seqlens_k, seqused_k) -> None:
    """The per-sequence arguments of a varlen call: int32 vectors on the tensors' GPU, contiguous."""
    import torch

    for name, t, size in (("cu_seqlens_q", cu_seqlens_q, None), ("cu_seqlens_k", cu_seqlens_k, None),
                          ("seqused_k", seqused_k, None)):
        if t is None and name == "seqused_k":
            continue
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1 or t.device != q.device \
                or t.stride(0) != 1:
            raise ValueError(f"{name} must be a contiguous 1-D int32 tensor on {q.device}, got "
                             f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    batch = cu_seqlens_q.shape[0] - 1
    if batch < 1 or cu_seqlens_k.shape[0] != batch + 1:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must both hold batch + 1 >= 2 offsets, got "
                         f"{cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}")
    if seqused_k is not None and seqused_k.shape[0] != batch:
        raise ValueError(f"seqused_k must hold one length per sequence ({batch}), got {seqused_k.shape[0]}")
