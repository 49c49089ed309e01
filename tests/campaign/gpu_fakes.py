"""Stand-ins for the GPU, and only for it, so that the real GPU backend (tuner.campaign.backends
._gpu_measure and baselines: tuner.serving.launch.load_kernel -> tuner.measure.verify.verify -> tuner.bench) runs on a
CPU-only machine:

* ``torch.cuda.is_available`` / ``synchronize`` / ``get_device_name``: True / no-op / an H100's name;
* ``tuner.serving.launch.load_kernel``: the runtime's own checks of the cubin and its metadata, then a kernel
  that computes attention on the CPU (the loader's SDPA) and writes into ``out`` as the real one does;
* ``tuner.measure.timer.time_ms``: calls the timed function once and returns a deterministic time per kernel;
* ``translate.nvcc.compile_kernels`` (campaign runs only): a "cubin" naming the kernels, no nvcc
  (the dry-run test compiles for real);
* tensors on ``cpu`` (backends.TRIAL_DEVICE).

``install()`` is the Ray ``worker_process_setup_hook`` of tests/campaign/fake_gpu_campaign.py, so each
Ray worker of that campaign runs with them. Environment knobs (read in the worker):
``FAKE_GPU_WRONG_AT``: a kernel name fragment whose kernel is wrong beyond seqlen 1100 (passes the
small verification shapes, must be caught at the benchmark shape); ``FAKE_GPU_REAL_NVCC=1``: keep the real
nvcc (a rehearsal of a campaign with real kernels and a fake GPU).
"""
from __future__ import annotations

import hashlib
import os

DEVICE_NAME = "NVIDIA H100 80GB HBM3"
BASELINE_MS = 2.0


class CpuKernel:
    """What tuner.serving.launch.load_kernel returns, computing on the CPU: ``kernel(q, k, v, out=None) -> out``."""

    def __init__(self, meta: dict, error: float = 0.0, wrong_beyond: int | None = None):
        self.meta = meta
        self.error = error
        self.wrong_beyond = wrong_beyond
        self.calls = 0

    @property
    def name(self) -> str:
        return self.meta["name"]

    def __call__(self, q, k, v, out=None, softmax_scale=None):
        import torch

        from tuner.serving.sdpa import sdpa_attention

        spec = self.meta["spec"]
        want = {"bf16": torch.bfloat16, "fp16": torch.float16}[spec["dtype"]]
        if q.dtype != want or q.shape[-1] != spec["d_qk"] or v.shape[-1] != spec["d_v"]:
            raise ValueError(f"{self.name} was built for {spec}; got {q.dtype} {tuple(q.shape)} {tuple(v.shape)}")
        self.calls += 1
        res = sdpa_attention(q, k, v, causal=spec["causal"], softmax_scale=softmax_scale)
        if self.error or (self.wrong_beyond is not None and k.shape[1] > self.wrong_beyond):
            res = res + (self.error or 0.25)
        if out is None:
            return res
        out.copy_(res)
        return out


def fake_load_kernel(binary, meta: dict, device: int | None = None, *, error: float = 0.0,
                     wrong_beyond: int | None = None) -> CpuKernel:
    """tuner.serving.launch.load_kernel's own checks (ABI, metadata, non-empty binary holding the symbol)."""
    from pathlib import Path

    from tuner.serving.launch import driver, kernel

    kernel.check_meta(meta)
    data = Path(binary).read_bytes() if isinstance(binary, (str, Path)) else bytes(binary)
    if meta["name"].encode() not in data:
        raise driver.KernelLoadError(f"cannot load {meta['name']}: no such function in the module")
    return CpuKernel(meta, error, wrong_beyond)


def fake_time_ms(fn, warmup: int = 10, reps: int = 50, *, timing=None) -> float:
    """One call of ``fn``; a deterministic time: per kernel (a hash of its name) or the baselines'."""
    from tuner.measure import timer

    LAST_TIMINGS.append(timing or timer.DEFAULT_TIMING)
    before = {id(k): k.calls for k in LOADED}
    fn()
    for k in LOADED:
        if k.calls != before[id(k)]:
            h = int.from_bytes(hashlib.sha256(k.name.encode()).digest()[:4], "big")
            return 1.0 + (h % 1000) / 1000      # 1.0-2.0 ms: faster or slower than the baselines' 2.0
    return BASELINE_MS


LOADED: list[CpuKernel] = []
LAST_TIMINGS: list = []


def _recording_load_kernel(binary, meta):
    wrong_at = os.environ.get("FAKE_GPU_WRONG_AT")
    kernel = fake_load_kernel(binary, meta, wrong_beyond=1100 if wrong_at and wrong_at in meta["name"] else None)
    LOADED.append(kernel)
    return kernel


def fake_compile_kernels(kernels, arch, *, cache_dir=None, timeout=300, jobs=2, batch_size=8, extra_flags=()):
    """translate.nvcc.compile_kernels without nvcc: one shared "cubin" naming every kernel of the batch."""
    from translate.nvcc import CompileResult

    kernels = list(kernels)
    blob = b"\x7fELF fake cubin\x00" + b"\x00".join(k.name.encode() for k in kernels)
    return [CompileResult(name=k.name, ok=True, arch=arch, cubin=blob, registers=128, spill_stores=0,
                          nvcc_version="fake", batch_size=len(kernels)) for k in kernels]


def patch_torch_cuda(setattr_=setattr) -> None:
    import torch

    setattr_(torch.cuda, "is_available", lambda: True)
    setattr_(torch.cuda, "synchronize", lambda device=None: None)
    setattr_(torch.cuda, "get_device_name", lambda device=None: DEVICE_NAME)


def install() -> None:
    """Ray worker_process_setup_hook: every stand-in above, in this worker process."""
    import translate.nvcc
    from tuner.measure import timer, verify
    from tuner.serving import launch
    from tuner.campaign import backends

    patch_torch_cuda()
    # The gate's check shapes cut to the small ones, as the in-process trial tests cut them: on the CPU a bf16
    # reference of the large ones takes ~30 s a trial, and a campaign here checks the flow around the gate
    # (tests/test_verify*.py check the gate itself)
    verify.CHECK_SHAPES = tuple(s for s in verify.CHECK_SHAPES if s[1] * s[2] <= 300 * 300)
    launch.load_kernel = _recording_load_kernel
    timer.time_ms = fake_time_ms
    backends.TRIAL_DEVICE = "cpu"
    if os.environ.get("FAKE_GPU_REAL_NVCC") != "1":
        translate.nvcc.compile_kernels = fake_compile_kernels
