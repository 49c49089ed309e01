"""The CUDA driver as the runtime uses it (cuda-python, imported lazily): errors, the device's primary context
(torch's), cubin architecture checks, and the per-launch lookups bound once to torch's own C functions.

Every launcher of this package goes through these names; they keep no state but the retained contexts.
"""
from __future__ import annotations

import struct

CUDA_ERROR_INVALID_CONTEXT = 201


class KernelLoadError(RuntimeError):
    """The module or its kernel could not be loaded (wrong architecture, missing symbol, no cuda-python)."""


class KernelLaunchError(RuntimeError):
    """The launch was refused or the kernel faulted."""


def cubin_arch(data: bytes) -> tuple[int, int] | None:
    """The SM (major, minor) a cubin's ELF header names, or None when ``data`` is not a CUDA ELF (PTX).

    CUDA ELF files carry OS ABI 0x41; from ABI version 8 (nvcc 12.8+) the SM sits in bits 8-15 of
    e_flags (sm_90a: 0x5a), before it in bits 0-7 (checked with nvcc 13.0: tests/test_runtime.py)."""
    if len(data) < 52 or data[:4] != b"\x7fELF" or data[7] != 0x41:
        return None
    flags = struct.unpack_from("<I", data, 48)[0]
    sm = (flags >> 8) & 0xFF if data[8] >= 8 else flags & 0xFF
    return (sm // 10, sm % 10) if sm else None


def runs_on(cubin_sm: tuple[int, int], capability: tuple[int, int]) -> bool:
    """SASS runs on its own major family at the same or a later minor (an sm_90a cubin only on 9.0)."""
    return cubin_sm[0] == capability[0] and cubin_sm[1] <= capability[1]


def api():
    """cuda-python's driver module (``cuda.bindings.driver``)."""
    try:
        from cuda.bindings import driver
    except ImportError:   # pragma: no cover - older cuda-python layout
        try:
            from cuda import cuda as driver
        except ImportError as exc:
            raise KernelLoadError("the runtime needs cuda-python on the GPU machine "
                                  "(pip install cuda-python)") from exc
    return driver


def check(result, what: str):
    """cuda-python returns (CUresult, values...): the values, or KernelLoadError naming the driver's error."""
    err = result[0]
    if int(err) != 0:
        driver = api()
        name = driver.cuGetErrorName(err)[1]
        raise KernelLoadError(f"{what}: {name.decode() if isinstance(name, bytes) else err}")
    return result[1] if len(result) == 2 else result[1:]


_contexts: dict = {}


def device(device_index: int):
    """(CUdevice, its primary context: torch's), retained once per process."""
    found = _contexts.get(device_index)
    if found is None:
        driver = api()
        check(driver.cuInit(0), "cuInit")
        dev = check(driver.cuDeviceGet(device_index), f"cuDeviceGet({device_index})")
        found = _contexts[device_index] = (dev, check(driver.cuDevicePrimaryCtxRetain(dev),
                                                       "cuDevicePrimaryCtxRetain"))
    return found


def primary_context(device_index: int):
    return device(device_index)[1]


class CurrentContext:
    """The device's primary context made current for a block (pushed and popped)."""

    def __init__(self, device_index: int):
        self.ctx = primary_context(device_index)

    def __enter__(self):
        check(api().cuCtxPushCurrent(self.ctx), "cuCtxPushCurrent")

    def __exit__(self, *exc):
        api().cuCtxPopCurrent()


LAUNCH = None    # cuda-python's cuLaunchKernel, bound at the first launch


def bind_launch():
    global LAUNCH
    LAUNCH = api().cuLaunchKernel
    return LAUNCH


# The two lookups below run per launch: the first call rebinds each name to torch's own function.
def raw_stream(device_index: int) -> int:
    """torch's current stream on the device as a raw handle (the C call inductor uses; ~0.2 µs)."""
    global raw_stream
    import torch

    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    raw_stream = get if get is not None else (lambda i: torch.cuda.current_stream(i).cuda_stream)
    return raw_stream(device_index)


def current_device() -> int:
    global current_device
    import torch

    current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
    return current_device()
