"""Hopper (sm_90a) kernels from TL programs: wgmma GEMMs, TMA loads into an mbarrier pipeline,
warp-specialised producer and consumer warpgroups (``warpgroup`` blocks in the sketch)."""
from translate.sm90.generate import generate_warp_specialized

__all__ = ["generate_warp_specialized"]
