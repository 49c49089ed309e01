"""A factory of structurally real kernel records (arbitrary cubin bytes: CPU tests never load them)."""
from __future__ import annotations

from tuner.store.records import KernelRecord

PROVENANCE = {"tool": "attn-autotuner", "tool_version": "0.1.0", "nvcc": "13.0.88", "cutlass": "4.2.0",
              "torch": "2.11.0+cu130", "driver": "580.159", "cuda_driver_api": "13.0", "cudnn": 91900,
              "gpu_name": "NVIDIA H100 80GB HBM3", "gpu": "h100", "arch": "sm90", "sm": 90,
              "hostname": "node1", "date": "2026-11-21T10:00:00+00:00"}


def make_record(**changes) -> KernelRecord:
    params = {"block_m": 128, "block_n": 64, "num_warps": 4, "kv_stages": 2, "mma_atom": "SM80_16x8x16",
              "g2s_atom": "SM80_CP_ASYNC_CACHEGLOBAL", "s2r_atom": "SM75_U32x4_LDSM_N", "swizzle": 3,
              "q_in_regs": False}
    fields = dict(
        arch="sm90", gpu="h100", device_name="NVIDIA H100 80GB HBM3", variant="mha", dtype="bf16",
        d_qk=128, d_v=128, causal=True, bucket="s4096", params=params,
        kernel_name="fa_fwd_m128n64w4s2", kernel_meta={"kernel_name": "fa_fwd_m128n64w4s2", "num_threads": 128,
                                                       "smem_bytes": 65536, "block_m": 128, "params": params},
        source="extern \"C\" __global__ void fa_fwd_m128n64w4s2() {}\n", cubin=b"\x7fELF fake cubin 1",
        tl_program="kernel attention { }\n",
        verification={"passed": True, "max_rel_error": 0.004, "checks": [{"shape": "b1 s4096"}, {"shape": "s17"}]},
        tflops=350.0, baselines={"flash": 330.0, "cudnn": 590.0, "efficient": 170.0},
        problem={"variant": "mha", "batch": 4, "heads_q": 16, "heads_kv": 16, "seqlen_q": 4096,
                 "seqlen_k": 4096, "d_qk": 128, "d_v": 128, "causal": True, "dtype": "bf16"},
        provenance=dict(PROVENANCE), study="h100-mha", trial=7,
    )
    fields.update(changes)
    return KernelRecord(**fields)


DECODE_PARAMS = {"block_m": 16, "block_n": 64, "warps_m": 1, "warps_n": 4, "kv_stages": 3, "pack_gqa": True,
                 "min_split_blocks": 2, "swizzle": 3}


def make_decode_record(**changes) -> KernelRecord:
    """A decode record (phase decode, a decode bucket, DecodeParams, a meta with grid "decode"): paged, page 16."""
    layout = changes.get("layout", "paged")
    fields = dict(
        variant="gqa", layout=layout, phase="decode", bucket="d-b8-kv8k-p16" if layout == "paged" else "d-b8-kv8k",
        params=dict(DECODE_PARAMS), kernel_name="attn_decode_dm16n64w1x4s3p_b2_sw3",
        kernel_meta={"abi": 1, "name": "attn_decode_dm16n64w1x4s3p_b2_sw3", "num_threads": 128, "smem_bytes": 102400,
                     "block_m": 16, "block_n": 64, "grid": "decode", "params": dict(DECODE_PARAMS),
                     "spec": {"variant": "gqa", "d_qk": 128, "d_v": 128, "causal": True, "dtype": "bf16",
                              "layout": layout, "phase": "decode"}},
        tflops=12.5, baselines={"fa4": 11.0, "copy_gbs": 3000.0},
        problem={"variant": "gqa", "batch": 8, "heads_q": 32, "heads_kv": 8, "seqlen_q": 1, "kv_len": 8192,
                 "d_qk": 128, "d_v": 128, "causal": True, "dtype": "bf16", "layout": layout, "kv_gbs": 2400.0},
        verification={"passed": True, "max_error": 0.002, "cases": [{"kv": 1}, {"kv": 4097}]},
        cubin=b"decode cubin", study="h100-decode")
    fields.update(changes)
    return make_record(**fields)
