"""Loading any generated kernel: a decode kernel's metadata (grid "decode") loads as a DecodeKernel, any other as an
AttentionKernel."""
from __future__ import annotations

from pathlib import Path

from tuner.serving.launch.decode_kernel import load_decode_kernel
from tuner.serving.launch.kernel import load_attention_kernel


def load_kernel(binary: bytes | str | Path, meta: dict, device: int | None = None):
    """Load ``binary`` (cubin or PTX bytes, or a path to one) into GPU ``device`` (default: torch's current
    device) and return a launchable kernel. ``meta`` is ``GeneratedKernel.meta()``."""
    if isinstance(meta, dict) and meta.get("grid") == "decode":
        return load_decode_kernel(binary, meta, device)
    return load_attention_kernel(binary, meta, device)
