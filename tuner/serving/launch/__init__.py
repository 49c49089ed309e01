"""Loading cubins and launching them on torch tensors through the CUDA driver: ``load_kernel`` gives an
``AttentionKernel`` (prefill: dense, varlen, paged) or a ``DecodeKernel`` (split-KV decode and its combine)."""
from tuner.serving.launch.decode_kernel import DecodeKernel
from tuner.serving.launch.driver import KernelLaunchError, KernelLoadError
from tuner.serving.launch.kernel import AttentionKernel
from tuner.serving.launch.load import load_kernel

__all__ = ["AttentionKernel", "DecodeKernel", "KernelLaunchError", "KernelLoadError", "load_kernel"]
