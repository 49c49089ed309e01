"""Host cost of a decode call: microseconds of Python and driver work per call, against the kernel's GPU time.

    python3 scripts/decode_host_cost.py [--calls 300]

For the GQA default (llama3-8b heads, pages of 16) and the absorbed-MLA 16-head default (pages of 64), at batch 1 x
2k keys (the shortest decode bucket, where a call is all launch): the kernel called directly
(tuner.serving.launch.decode_kernel.DecodeKernel), and through an export (`flash_attn_with_kvcache`, the custom op and its route),
each ``--calls`` times without a synchronisation (host µs per call), beside the GPU time of one call
(tuner.measure.timer.time_ms). A call whose host cost exceeds its GPU time is launch-bound unless captured in a CUDA graph.
"append": the served call with FA2's ``k=``/``v=`` (one new row a sequence written into the cache first,
tuner/serving/kvcache_append.py), with its eager check of the lengths (a host read, so a synchronisation every
call) and with ``check_append=False``, the rows written by one Triton launch (eager CUDA calls) or, in the last
column, by the torch ops (``ATTN_TUNER_APPEND_TRITON=0``, what compiled calls use); each call rewrites the same row
(the lengths are not advanced).
The export holds unverified records: this measures launches, not kernels (tuner/measure/verify_decode.py gates those).
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def host_us(call, calls: int) -> float:
    import torch

    call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    a = ap.parse_args()

    import torch

    import tl
    from hardware_profiles import load_profile
    from tl.parser import parse
    from translate.compiler import generate
    from translate.decode import DecodeParams, default_decode_params
    from translate.nvcc import compile_kernel, default_cache_dir
    from kernel_abi.spec import KernelSpec
    from tuner.measure import timer
    from tuner.measure.decode import DecodePoint, MLAPoint, make_decode_inputs, make_mla_inputs
    from tuner.serving.launch.decode_kernel import load_decode_kernel
    from tuner.store.export import export_records
    from tuner.store.provenance import collect
    from tuner.serving import load_exported
    from tuner.store.records import KernelRecord, KernelStore

    profile, device = load_profile("h100"), torch.cuda.get_device_name()
    cases = [("gqa p16", KernelSpec("gqa", 128, 128, True, "bf16", "paged", "decode"), DecodeParams(),
              make_decode_inputs(DecodePoint(1, 2048)), "d-b1-kv2k-p16"),
             ("mla h16 p64", KernelSpec("mla", 576, 512, True, "bf16", "paged", "decode"), None,
              make_mla_inputs(MLAPoint(1, 2048, heads_q=16)), "d-b1-kv2k-p64")]
    print(f"{device}: host µs per call ({a.calls} calls, no sync) against the GPU time of one call")
    print("| case | GPU µs | direct host µs | served host µs | append, checked | append, check_append=False | "
          "the same, torch ops |")
    for label, spec, params, x, bucket in cases:
        params = params or default_decode_params(spec, 16, profile)
        text = tl.load_sketch(spec.variant, True, "decode", "paged")
        gk = generate(parse(text).program, params, profile, spec)
        compiled = compile_kernel(gk, profile.nvcc_arch, cache_dir=default_cache_dir())
        kernel = load_decode_kernel(compiled.cubin, gk.meta())
        v = x.get("v") if x.get("v") is not None else x["k"][..., : spec.d_v]
        scale = spec.d_qk ** -0.5
        direct = lambda: kernel(x["q"], x["k"], v, cache_seqlens=x["seqused_k"], page_table=x["page_table"],  # noqa: E731
                                softmax_scale=scale)
        root = Path(tempfile.mkdtemp())
        store = KernelStore(root / "study")
        store.offer(KernelRecord(arch="sm90", gpu="h100", device_name=device, variant=spec.variant, dtype="bf16",
                                 d_qk=spec.d_qk, d_v=spec.d_v, causal=True, bucket=bucket, params=params.to_dict(),
                                 kernel_name=gk.name, kernel_meta=gk.meta(), source=gk.source, cubin=compiled.cubin,
                                 tl_program=text, verification={"passed": True}, tflops=1.0, baselines={},
                                 problem={}, provenance=collect(profile, device), layout="paged", phase="decode"))
        export_records(store.records(), profile, root / "out")
        attn = load_exported(root / "out")
        served = lambda: attn.flash_attn_with_kvcache(x["q"], x["k"], v, cache_seqlens=x["seqused_k"],  # noqa: E731
                                                      block_table=x["page_table"], causal=True, softmax_scale=scale)
        served()
        assert attn.last_path == "kernel", attn.last_reason
        b, hkv = x["q"].shape[0], x["k"].shape[2]
        k_new = torch.randn(b, 1, hkv, spec.d_qk, device="cuda", dtype=x["k"].dtype)
        v_new = None if x.get("v") is None else torch.randn(b, 1, hkv, spec.d_v, device="cuda", dtype=x["k"].dtype)
        room = x["seqused_k"] - 1          # the new row overwrites each sequence's last one
        v_cache = x.get("v")               # None: absorbed MLA appends k alone

        def appending(check):
            return lambda: attn.flash_attn_with_kvcache(x["q"], x["k"], v_cache, k_new, v_new, cache_seqlens=room,
                                                        block_table=x["page_table"], causal=True,
                                                        softmax_scale=scale, check_append=check)
        appending(True)()
        assert attn.last_path == "kernel", attn.last_reason
        gpu = timer.time_ms(direct) * 1e3
        row = [gpu, host_us(direct, a.calls), host_us(served, a.calls), host_us(appending(True), a.calls),
               host_us(appending(False), a.calls)]
        os.environ["ATTN_TUNER_APPEND_TRITON"] = "0"
        row.append(host_us(appending(False), a.calls))
        del os.environ["ATTN_TUNER_APPEND_TRITON"]
        print(f"| {label} | " + " | ".join(f"{x:.1f}" for x in row) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
