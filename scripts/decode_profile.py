"""One absorbed-MLA decode call (128 heads, batch 64 x 8k keys, pages of 64) for a profiler:

    ncu -k "regex:attn_mla.*dec[0-9a-f]+$" --launch-skip 1 --launch-count 1 --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
        python3 scripts/decode_profile.py [w2x4]

The MLA default on the H100 (translate.decode.default_decode_params: the 64 x 64 tile on warpgroup MMAs out of
step, attn_decode_sm90_seesaw.cuh), or with `w2x4` the campaign's favourite of the mma.sync kernel (64 rows, 2 x 4
warps), or with `wgmma` the default tile on the lockstep warpgroups (attn_decode_sm90.cuh), `seesaw` forced onto the
out-of-step ones (the default on Hopper), or with a folder of `tune build --phase decode` output its kernel (no
compiler needed), or with `--flashmla LIB.so` FlashMLA's own kernel on the same inputs (scripts/flashmla/build.sh;
profile it with -k "regex:flash_fwd_splitkv_mla"). Three calls; the profiler skips the first.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import tl  # noqa: E402
from hardware_profiles import load_profile  # noqa: E402
from tl.parser import parse  # noqa: E402
from translate.compiler import generate  # noqa: E402
from translate.decode import DecodeParams, default_decode_params  # noqa: E402
from translate.nvcc import compile_kernel, default_cache_dir  # noqa: E402
from kernel_abi.spec import KernelSpec  # noqa: E402
from tuner.measure.decode import MLAPoint, make_mla_inputs  # noqa: E402
from tuner.serving.launch.decode_kernel import load_decode_kernel  # noqa: E402


def run_flashmla(lib_path: str) -> None:
    import math

    from flashmla_check import flashmla_call, load_flashmla

    x = make_mla_inputs(MLAPoint(64, 8192))
    call, _keep = flashmla_call(load_flashmla(Path(lib_path)), x, 1.0 / math.sqrt(576), True)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    print("ran FlashMLA", lib_path)


def main() -> None:
    if sys.argv[1:2] == ["--flashmla"]:
        run_flashmla(sys.argv[2])
        return
    profile = load_profile("h100")
    spec = KernelSpec("mla", 576, 512, True, "bf16", "paged", "decode")
    params = (DecodeParams(block_m=64, block_n=64, warps_m=2, warps_n=4, kv_stages=2, min_split_blocks=2)
              if sys.argv[1:] == ["w2x4"] else default_decode_params(spec, 128, profile))
    if sys.argv[1:] in (["wgmma"], ["seesaw"]):
        mma = {"wgmma": "sm90_wgmma", "seesaw": "sm90_seesaw"}[sys.argv[1]]
        params = DecodeParams(**{**params.to_dict(), "mma": mma})
    built = Path(sys.argv[1]) if sys.argv[1:] else None
    if built is not None and built.is_dir():
        record = next(built.glob("*.json"))
        meta = json.loads(record.read_text())["meta"]
        kernel = load_decode_kernel(record.with_suffix(".cubin").read_bytes(), meta)
        name = meta["name"]
    else:
        gk = generate(parse(tl.load_sketch("mla", True, "decode", "paged")).program, params, profile, spec)
        compiled = compile_kernel(gk, profile.nvcc_arch, cache_dir=default_cache_dir())
        kernel = load_decode_kernel(compiled.cubin, gk.meta())
        name = gk.name
    x = make_mla_inputs(MLAPoint(64, 8192))
    for _ in range(3):
        kernel(x["q"], x["k"], None, cache_seqlens=x["seqused_k"], page_table=x["page_table"])
    torch.cuda.synchronize()
    print("ran", name)


if __name__ == "__main__":
    main()
