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
        grid = ((sq + block_m - 1) // block_m, hq, b)
        if grid[1] > 65535 or grid[2] > 65535:
            raise ValueError(f"heads ({hq}) and batch ({b}) must each be <= 65535")
        args = [np.uint64(q.data_ptr()), np.uint64(k.data_ptr()), np.uint64(v.data_ptr()), np.uint64(out.data_ptr()),
                np.int32(sq), np.int32(sk), np.int32(hq // hkv)]
        for t in (q, k, v, out):
            args += [np.int64(t.stride(0)), np.int64(t.stride(1)), np.int64(t.stride(2))]
        cupy = _cupy()
        stream = torch.cuda.current_stream(q.device)
        threads = (int(self.meta["num_threads"]), 1, 1)
        try:
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
        """cuLaunchKernel with a parameter array: the scalars, then each TMA descriptor (128 bytes) by value."""
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
        err, = driver.cuLaunchKernel(function, grid[0], grid[1], grid[2], threads[0], threads[1], threads[2],
                                     int(self.meta["smem_bytes"]), driver.CUstream(init_value=int(stream_handle)),
                                     ctypes.addressof(params), 0)
        if int(err) != 0:
            raise KernelLaunchError(f"launch of {self.name} failed: {err}")


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
