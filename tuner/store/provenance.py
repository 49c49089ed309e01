"""Provenance of a kernel: which tools built it and on which GPU it was measured.

Every lookup degrades to None when its tool is absent (no nvcc on a GPU node, no GPU on a build
machine): provenance describes, it never stops a campaign.
"""
from __future__ import annotations

import functools
import platform
import re
import socket
import subprocess
from datetime import datetime, timezone
from pathlib import Path


@functools.lru_cache(maxsize=1)
def nvcc_version() -> str | None:
    """``"13.0.88"`` from ``nvcc --version``; None when nvcc is not on PATH or fails."""
    try:
        out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release [0-9.]+, V([0-9.]+)", out) or re.search(r"release ([0-9.]+)", out)
    return m.group(1) if m else None


@functools.lru_cache(maxsize=1)
def cutlass_version() -> str | None:
    """CUTLASS version of the headers we compile against (cutlass/version.h in the nvidia-cutlass
    wheel), else the wheel's own version."""
    try:
        import cutlass_library

        header = Path(cutlass_library.__file__).parent / "source" / "include" / "cutlass" / "version.h"
        text = header.read_text()
        parts = [re.search(rf"#define CUTLASS_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
        if all(parts):
            return ".".join(p.group(1) for p in parts)
    except (ImportError, OSError, AttributeError):
        pass
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("nvidia-cutlass")
    except PackageNotFoundError:
        return None


def _nvidia_smi_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out else None


def _torch_facts(device_name: str | None) -> dict:
    facts = {"torch": None, "torch_cuda": None, "cudnn": None, "driver": None, "cuda_driver_api": None,
             "gpu_name": device_name, "gpu_capability": None}
    try:
        import torch
    except ImportError:
        return facts
    facts["torch"] = torch.__version__
    facts["torch_cuda"] = torch.version.cuda
    try:
        if torch.cuda.is_available():
            facts["gpu_name"] = device_name or torch.cuda.get_device_name()
            facts["gpu_capability"] = "%d.%d" % torch.cuda.get_device_capability()
            facts["cudnn"] = torch.backends.cudnn.version()
            get_driver = getattr(torch._C, "_cuda_getDriverVersion", None)
            if get_driver is not None:
                v = int(get_driver())           # e.g. 13000 -> "13.0"
                facts["cuda_driver_api"] = f"{v // 1000}.{(v % 1000) // 10}"
            facts["driver"] = _nvidia_smi_driver()
    except Exception:  # noqa: BLE001 - a half-broken CUDA setup still gets a record
        pass
    return facts


def collect(profile, device_name: str | None = None) -> dict:
    """Tool versions and GPU facts for a stored kernel. ``profile`` is a hardware_profiles.Profile
    (or None); ``device_name`` overrides torch's idea of the GPU name (a trial measured elsewhere)."""
    import tuner

    data = {
        "tool": "attn-autotuner",
        "tool_version": tuner.__version__,
        "nvcc": nvcc_version(),
        "cutlass": cutlass_version(),
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if profile is not None:
        data.update(gpu=profile.name, arch=profile.arch_family, sm=profile.sm, nvcc_arch=profile.nvcc_arch)
    data.update(_torch_facts(device_name))
    return data
