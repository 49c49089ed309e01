"""Load a generated kernel's cubin (or PTX) in the GPU process and launch it on torch tensors.

CuPy loads the module (cuModuleLoad: a cubin for this GPU, or PTX that the driver JIT-compiles — how
sm75 kernels are cross-checked on a Hopper GPU) and launches on torch's current stream. CuPy and torch
are imported lazily, so this module imports on machines without a GPU.

Layout (FlashAttention's): q (b, sq, hq, d_qk), k (b, sk, hkv, d_qk), v (b, sk, hkv, d_v) -> out
(b, sq, hq, d_v). Any strides work as long as the head dim is contiguous and the other strides keep
16-byte alignment (the kernel moves 8 elements per 128-bit access).
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ABI_VERSION = 1
_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
# The argument list of kernels whose metadata predates "args" (translate/kernel.py KERNEL_ARGS).
DEFAULT_ARGS = [("q", "ptr"), ("k", "ptr"), ("v", "ptr"), ("o", "ptr"), ("seqlen_q", "i32"), ("seqlen_k", "i32"),
                ("group", "i32")] + [(f"{t}_{w}_stride", "i64") for t in "qkvo" for w in ("batch", "row", "head")]
_DEFAULT_SMEM_LIMIT = 48 * 1024


class KernelLoadError(RuntimeError):
    """The module or its kernel could not be loaded (wrong architecture, missing symbol, no CuPy)."""


class KernelLaunchError(RuntimeError):
    """The launch was refused or the kernel faulted."""


def _cupy():
    try:
        import cupy
    except ImportError as exc:   # pragma: no cover - depends on the machine
        raise KernelLoadError("tuner.runtime needs CuPy on the GPU machine (pip install cupy-cuda13x)") from exc
    return cupy


def load_kernel(binary: bytes | str | Path, meta: dict) -> "AttentionKernel":
    """Load ``binary`` (cubin or PTX bytes, or a path to one) and return a launchable kernel.

    ``meta`` is ``GeneratedKernel.meta()`` (name, threads, shared memory, tile sizes, spec).
    """
    if meta.get("abi") != ABI_VERSION:
        raise KernelLoadError(f"kernel ABI {meta.get('abi')!r} does not match this runtime's {ABI_VERSION}; "
                              "rebuild the kernel")
    for key in ("name", "num_threads", "smem_bytes", "block_m", "spec"):
        if key not in meta:
            raise KernelLoadError(f"kernel metadata lacks {key!r}")
    cupy = _cupy()
    data = Path(binary).read_bytes() if isinstance(binary, (str, Path)) else bytes(binary)
    if not data:
        raise KernelLoadError("empty kernel binary")
    is_ptx = data.lstrip().startswith(b"//") or b".version" in data[:4096]
    fd, path = tempfile.mkstemp(suffix=".ptx" if is_ptx else ".cubin")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:
            module = cupy.RawModule(path=path)
            function = module.get_function(meta["name"])
            function.attributes   # forces the load now, so errors surface here
        except Exception as exc:
            raise KernelLoadError(f"cannot load {meta['name']} ({'PTX' if is_ptx else 'cubin'}): {exc}") from exc
    finally:
        os.unlink(path)
    smem = int(meta["smem_bytes"])
    if smem > _DEFAULT_SMEM_LIMIT:
        try:
            function.max_dynamic_shared_size_bytes = smem
        except Exception as exc:
            raise KernelLoadError(f"{meta['name']} needs {smem} bytes of shared memory; the GPU refused: {exc}") \
                from exc
    return AttentionKernel(meta=dict(meta), _module=module, _function=function)


def _sm_count(device) -> int:
    import torch

    return torch.cuda.get_device_properties(device).multi_processor_count


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError:   # pragma: no cover - older cuda-python layout
        try:
            from cuda import cuda as driver
        except ImportError as exc:
            raise KernelLoadError("Hopper kernels with TMA descriptors need cuda-python on the GPU machine "
                                  "(pip install cuda-python)") from exc
    return driver


@dataclass
class AttentionKernel:
    meta: dict
    _module: Any
    _function: Any
    _maps: Any = None      # TensorMapCache, for kernels that take TMA descriptors
    _launches: Any = None  # (stream, grid, scalar args) -> prepared cuLaunchKernel call
    _counters: Any = None  # (device, stream) -> the tile counter of persistent kernels

    def _tile_counter(self, device, stream_handle: int) -> int:
        """A zeroed pair of ints per (device, stream) for a persistent kernel's tile counter; the kernel
        leaves it zeroed for the next launch (its last CTA resets it)."""
        import torch

        if self._counters is None:
            self._counters = {}
        key = (device.index, stream_handle)
        if key not in self._counters:
            self._counters[key] = torch.zeros(2, dtype=torch.int32, device=device)
        return self._counters[key].data_ptr()

    @property
    def tensor_map_args(self) -> list[tuple[str, str]]:
        """(argument, tensor) of the TMA descriptors the kernel takes after the pointer/stride arguments."""
        return [(name, kind.split(":", 1)[1]) for name, kind in self.meta.get("args", [])
                if kind.startswith("tensormap:")]

    @property
    def name(self) -> str:
        return self.meta["name"]

    def resources(self) -> dict:
        """Registers and local memory per thread as the driver reports them."""
        a = self._function.attributes
        return {"num_regs": a.get("num_regs"), "local_size_bytes": a.get("local_size_bytes"),
                "shared_size_bytes": a.get("shared_size_bytes")}

    def __call__(self, q, k, v, out=None):
        import numpy as np
        import torch

        spec = self.meta["spec"]
        dtype = getattr(torch, _DTYPES[spec["dtype"]])
        _check_inputs(q, k, v, dtype, spec)
        b, sq, hq, _ = q.shape
        _, sk, hkv, _ = k.shape
        d_v = spec["d_v"]
        if out is None:
            out = torch.empty((b, sq, hq, d_v), dtype=dtype, device=q.device)
        else:
            if tuple(out.shape) != (b, sq, hq, d_v) or out.dtype != dtype or out.device != q.device:
                raise ValueError(f"out must be {(b, sq, hq, d_v)} {dtype} on {q.device}; got "
                                 f"{tuple(out.shape)} {out.dtype} on {out.device}")
            _check_layout("out", out)
        block_m = int(self.meta["block_m"])
        m_blocks = (sq + block_m - 1) // block_m
        if self.meta.get("grid") in ("tiles", "persistent"):
            # one tile (query block, head, batch) per CTA, in the kernel's own order; persistent: one CTA
            # per SM walks the tiles
            tiles = m_blocks * hq * b
            grid = (min(tiles, _sm_count(q.device)) if self.meta["grid"] == "persistent" else tiles, 1, 1)
        else:
            grid = (m_blocks, hq, b)
            if grid[1] > 65535 or grid[2] > 65535:
                raise ValueError(f"heads ({hq}) and batch ({b}) must each be <= 65535")
        stream = torch.cuda.current_stream(q.device)
        values = {"q": np.uint64(q.data_ptr()), "k": np.uint64(k.data_ptr()), "v": np.uint64(v.data_ptr()),
                  "o": np.uint64(out.data_ptr()), "seqlen_q": np.int32(sq), "seqlen_k": np.int32(sk),
                  "group": np.int32(hq // hkv), "heads_q": np.int32(hq), "batch": np.int32(b),
                  "tile_counter": np.uint64(self._tile_counter(q.device, stream.cuda_stream))}
        for name, t in (("q", q), ("k", k), ("v", v), ("o", out)):
            for axis, what in enumerate(("batch", "row", "head")):
                values[f"{name}_{what}_stride"] = np.int64(t.stride(axis))
        args = [values[name] for name, kind in self.meta.get("args", DEFAULT_ARGS) if not kind.startswith("tensormap:")]
        cupy = _cupy()
        threads = (int(self.meta["num_threads"]), 1, 1)
        try:
            if self.tensor_map_args and torch.cuda.current_device() == q.device.index:
                # the stream goes to the driver directly; the device's context is current already
                self._launch_with_maps(grid, threads, args, {"q": q, "k": k, "v": v, "o": out}, stream.cuda_stream)
                return out
            with cupy.cuda.Device(q.device.index), cupy.cuda.ExternalStream(stream.cuda_stream):
                if self.tensor_map_args:
                    self._launch_with_maps(grid, threads, args, {"q": q, "k": k, "v": v, "o": out},
                                           stream.cuda_stream)
                else:
                    self._function(grid, threads, tuple(args), shared_mem=int(self.meta["smem_bytes"]))
        except (KernelLaunchError, ValueError):
            raise
        except Exception as exc:
            raise KernelLaunchError(f"launch of {self.name} failed: {exc}") from exc
        return out

    def _launch_with_maps(self, grid, threads, args, tensors: dict, stream_handle: int) -> None:
        """cuLaunchKernel with a parameter array: the scalars, then each TMA descriptor (128 bytes) by value.

        Everything a launch needs is kept per (pointers, shapes, strides, stream): a repeated call on the
        same tensors (a benchmark loop, a model's layers on reused buffers) is one dictionary lookup and the
        driver call, so that short kernels are not timed as Python's argument packing."""
        key = (stream_handle, grid, tuple(int(a) for a in args))
        entry = self._launches.get(key) if self._launches is not None else None
        if entry is None:
            entry = self._prepare_launch(grid, threads, args, tensors, stream_handle)
            if self._launches is None:
                self._launches = {}
            if len(self._launches) >= 64:
                self._launches.pop(next(iter(self._launches)))
            self._launches[key] = entry
        err, = entry[0](*entry[1])
        if int(err) != 0:
            raise KernelLaunchError(f"launch of {self.name} failed: {err}")

    def _prepare_launch(self, grid, threads, args, tensors: dict, stream_handle: int) -> tuple:
        import ctypes

        from tuner.tma import TensorMapCache, TensorMapError, tensor_map_spec

        driver = _driver()
        if self._maps is None:
            self._maps = TensorMapCache()
        boxes = self.meta.get("tensor_maps", {})
        holders = []
        for value in args:
            ctype = {"uint64": ctypes.c_uint64, "int32": ctypes.c_int32, "int64": ctypes.c_int64}[value.dtype.name]
            holders.append(ctype(int(value)))
        pointers = [ctypes.addressof(h) for h in holders]
        maps = []
        for _, tensor in self.tensor_map_args:
            t = tensors[tensor]
            try:
                spec = tensor_map_spec(t.data_ptr(), t.shape, t.stride(), t.element_size(), int(boxes[tensor]["rows"]))
            except TensorMapError as exc:
                raise ValueError(f"{tensor}: {exc}") from None
            tmap = self._maps.get(spec, self.meta["spec"]["dtype"])
            maps.append(tmap)
            pointers.append(int(tmap.getPtr()))
        params = (ctypes.c_void_p * len(pointers))(*pointers)
        raw = self._function
        handle = getattr(raw, "ptr", None) or raw.kernel.ptr   # CuPy RawKernel -> its Function's CUfunction
        function = driver.CUfunction(init_value=int(handle))
        call = (function, grid[0], grid[1], grid[2], threads[0], threads[1], threads[2], int(self.meta["smem_bytes"]),
                driver.CUstream(init_value=int(stream_handle)), ctypes.addressof(params), 0)
        # holders, maps and params must outlive every launch that reads them: kept in the entry
        return driver.cuLaunchKernel, call, (holders, maps, params)


def _check_layout(name: str, t) -> None:
    if t.stride(-1) != 1:
        raise ValueError(f"{name}: the head dim must be contiguous (stride 1), got strides {tuple(t.stride())}")
    if any(s % 8 for s in t.stride()[:3]):
        raise ValueError(f"{name}: batch/sequence/head strides must be multiples of 8 elements (128-bit loads), "
                         f"got {tuple(t.stride())}")
    if t.data_ptr() % 16:
        raise ValueError(f"{name}: data pointer must be 16-byte aligned")


def _check_inputs(q, k, v, dtype, spec: dict) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not hasattr(t, "is_cuda") or not t.is_cuda:
            raise ValueError(f"{name} must be a CUDA torch tensor")
        if t.dtype != dtype:
            raise ValueError(f"{name} is {t.dtype}; this kernel was built for {dtype}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, seqlen, heads, head_dim), got shape {tuple(t.shape)}")
        _check_layout(name, t)
    if q.device != k.device or q.device != v.device:
        raise ValueError("q, k and v must be on the same device")
    b, sq, hq, dq = q.shape
    bk, sk, hkv, dk = k.shape
    if (dq, dk) != (spec["d_qk"], spec["d_qk"]):
        raise ValueError(f"q/k head dim must be {spec['d_qk']}, got {dq}/{dk}")
    if tuple(v.shape) != (b, sk, hkv, spec["d_v"]):
        raise ValueError(f"v must be {(b, sk, hkv, spec['d_v'])}, got {tuple(v.shape)}")
    if bk != b:
        raise ValueError(f"q and k batch differ: {b} vs {bk}")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    if sq < 1 or sk < 1:
        raise ValueError("sequence lengths must be >= 1")
