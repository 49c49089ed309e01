"""Decode over an FP8 (e4m3) KV cache, without a GPU: the spec's kv_dtype, the parameter rules, the generated source
(attn_decode_fp8.cuh's kernel, fp16 GEMMs, the scales' argument) and the layout the kernel's reads rely on, mirrored
from attn_decode_fp8.cuh (fp8_off, qk_col, pv_col): permutations, whole tiles, conflict-free shared-memory reads."""
from pathlib import Path

import pytest

from hardware_profiles import load_profile
from kernel_abi.spec import KernelSpec, kv_dtype_errors
from tl.parser import parse
from translate.compiler import generate
from translate.decode import DecodeParams, validate_decode
from translate.decode.params import decode_smem_bytes, default_decode_params
from translate.kernel import TranslationError

H100 = load_profile("h100")
SKETCHES = Path(__file__).resolve().parents[2] / "tl" / "sketches" / "decode"
FP8 = KernelSpec("gqa", 128, 128, True, "bf16", "paged", "decode", kv_dtype="fp8")
BF16 = KernelSpec("gqa", 128, 128, True, "bf16", "paged", "decode")


def kernel(spec=FP8, params=None, sketch="gqa_paged.tl"):
    params = params or default_decode_params(spec, None, H100)
    return generate(parse((SKETCHES / sketch).read_text()).program, params, H100, spec)


def test_the_kv_dtype_names_the_kernel_and_is_absent_from_a_16_bit_specs_record():
    assert FP8.label() == "gqa_d128x128_causal_bf16_kvfp8_paged_decode"
    assert FP8.to_dict()["kv_dtype"] == "fp8" and "kv_dtype" not in BF16.to_dict()
    assert KernelSpec(**FP8.to_dict()) == FP8 and KernelSpec(**BF16.to_dict()) == BF16
    assert "kv_dtype" not in repr(BF16)      # generated sources name the spec: the 16-bit ones keep theirs


@pytest.mark.parametrize("spec,words", [
    (KernelSpec("gqa", 128, 128, True, "bf16", "dense", "prefill", kv_dtype="fp8"), "decode kernels"),
    (KernelSpec("gqa", 128, 128, True, "fp8", "paged", "decode", kv_dtype="fp8"), "fp16 or bf16"),
    (KernelSpec("gqa", 128, 128, True, "bf16", "paged", "decode", kv_dtype="int8"), "unknown kv_dtype"),
])
def test_specs_no_fp8_cache_kernel_reads_are_refused_by_name(spec, words):
    assert any(words in e for e in kv_dtype_errors(spec))
    assert any(words in e for e in validate_decode(DecodeParams(), H100, spec))


def test_the_ring_holds_bytes_and_the_default_takes_128_key_tiles():
    p = DecodeParams(block_n=128, kv_stages=3)
    assert decode_smem_bytes(p, FP8) == 16 * 128 * 2 + 3 * 128 * 256       # Q, then K and V e4m3 stages
    assert decode_smem_bytes(p, BF16) == 16 * 128 * 2 + 3 * 128 * 512
    assert default_decode_params(FP8, None, H100) == p
    assert not validate_decode(p, H100, FP8)


D64 = KernelSpec("mha", 64, 64, True, "bf16", "paged", "decode", kv_dtype="fp8")


@pytest.mark.parametrize("spec,params,words", [
    (FP8, DecodeParams(mma="sm90_seesaw", kv_load="tma", kv_stages=2, block_m=64, warps_m=4, warps_n=2), "mma.sync"),
    # 128 threads, a 16-key tile of 64-byte rows: 64 chunks
    (D64, DecodeParams(block_n=16, warps_n=1, warps_m=4, block_m=64), "16-byte chunks"),
])
def test_parameters_the_fp8_gather_cannot_take_are_refused(spec, params, words):
    assert any(words in e for e in validate_decode(params, H100, spec))
    assert not any(words in e for e in validate_decode(params, H100, dict_spec(spec)))


def dict_spec(spec):   # the same spec over a 16-bit cache
    return KernelSpec(**{**spec.to_dict(), "kv_dtype": ""})


def test_the_source_runs_the_fp8_kernel_with_fp16_gemms_and_takes_the_scales():
    k = kernel()
    src = k.source
    assert '#include "attn_decode_fp8.cuh"' in src and '#include "attn_decode.cuh"' not in src
    assert "const attn_decode::Args args, const attn_decode::KvScales scales)" in src
    assert "attn_decode::split_kv_fp8<" in src and "(args, scales, smem)" in src
    assert "using Element = cutlass::bfloat16_t;" in src                  # queries and output
    assert "SM80_16x8x16_F32F16F16F32_TN" in src                            # the GEMMs: fp16 (the header says why)
    assert k.meta()["args"] == [["args", "struct:attn_decode::Args"], ["scales", "struct:attn_decode::KvScales"]]
    assert k.meta()["spec"]["kv_dtype"] == "fp8"
    assert f"{k.name}_combine" in src and "combine<" in src and "kvfp8" in k.name
    plain = kernel(BF16)
    assert "split_kv<" in plain.source and "KvScales" not in plain.source and plain.name != k.name


def test_dense_and_option_kernels_build_over_an_fp8_cache():
    dense = KernelSpec("mha", 64, 64, False, "fp16", "dense", "decode", kv_dtype="fp8")
    assert "split_kv_fp8<" in kernel(dense, sketch="gqa_dense.tl").source
    from tl.options import with_options
    spec = KernelSpec("gqa", 128, 128, True, "bf16", "paged", "decode", softcap=True, sinks=True, kv_dtype="fp8")
    program = with_options(parse((SKETCHES / "gqa_paged.tl").read_text()).program, softcap=True, sinks=True)
    src = generate(program, default_decode_params(spec, None, H100), H100, spec).source
    assert "kSoftcap = true" in src and "split_kv_fp8<" in src


# ---- the layout attn_decode_fp8.cuh reads (its functions, in Python) ----

def fp8_off(row_bytes, row, col):
    sw = (row >> 1) & 3 if row_bytes == 64 else row & 7
    return row * row_bytes + (col ^ (sw << 4))


def qk_col(k):
    return (k & ~15) | (((k & 7) >> 1) << 2) | (((k >> 3) & 1) << 1) | (k & 1)


def pv_col(n):
    return (n & ~31) | ((n & 7) << 2) | ((n >> 3) & 3)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_the_permutations_and_the_swizzle_are_bijections(d):
    assert sorted(qk_col(k) for k in range(d)) == list(range(d))
    assert sorted(pv_col(n) for n in range(d)) == list(range(d))
    rows = 128
    offsets = {fp8_off(d, r, c) for r in range(rows) for c in range(0, d, 16)}
    assert offsets == set(range(0, rows * d, 16))      # whole 16-byte chunks, every one once
    for r in range(8, rows):   # period 8 rows: a thread's rows 8 apart differ by a constant
        assert all(fp8_off(d, r, c) - fp8_off(d, r - 8, c) == 8 * d for c in range(0, d, 4))


def mma_b_values(lane):
    """mma.m16n8k16's B fragment of a lane: (k, n) of its four values."""
    n, k = lane // 4, 2 * (lane % 4)
    return [(k, n), (k + 1, n), (k + 8, n), (k + 9, n)]


@pytest.mark.parametrize("d", [64, 128, 256])
def test_a_k_read_is_one_word_per_lane_and_free_of_bank_conflicts(d):
    for kb in range(d // 16):
        banks = set()
        for lane in range(32):
            ds = [16 * kb + qk_col(k) for k, _ in mma_b_values(lane)]
            n = lane // 4
            assert ds == list(range(ds[0], ds[0] + 4)) and ds[0] % 4 == 0     # 4 adjacent bytes: one LDS.32
            banks.add(fp8_off(d, n, ds[0]) // 4 % 32)
        assert len(banks) == 32


@pytest.mark.parametrize("d", [64, 128, 256])
def test_a_v_read_gives_four_n_blocks_per_word_and_at_most_64_byte_rows_share_banks(d):
    """Rows of 128 bytes or more: 32 banks. 64-byte rows: the lane's four keys (2 (lane % 4) + e) are rows of one
    parity, so they sit in one half of their 128-byte lines and the XOR cannot move them out of it: two-way."""
    for m in range(d // 32):
        for e in (0, 1, 8, 9):   # the lane's four keys, one read each
            banks = set()
            for lane in range(32):
                n_blocks = [4 * m + i for i in range(4)]
                cols = [pv_col(8 * nb + lane // 4) for nb in n_blocks]
                assert cols == list(range(cols[0], cols[0] + 4)) and cols[0] % 4 == 0
                key = 2 * (lane % 4) + e
                banks.add(fp8_off(d, key, cols[0]) // 4 % 32)
            assert len(banks) == (16 if d == 64 else 32)


# ---- the launcher's arguments (tuner/serving/launch/decode_kernel.py), checked before anything reaches a GPU ----

def _launcher(spec=FP8):
    from types import SimpleNamespace

    from tuner.serving.launch.decode_kernel import DecodeKernel

    k = kernel(spec)
    return DecodeKernel(SimpleNamespace(meta=k.meta()), None)


def _call_args():
    import torch

    q = torch.zeros(2, 1, 32, 128, dtype=torch.bfloat16)
    cache = torch.zeros(9, 16, 8, 128, dtype=torch.float8_e4m3fn)
    return q, cache, cache.clone()


@pytest.mark.parametrize("k_scale,v_scale,words", [
    (None, "ok", "k_scale is missing"),
    ("ok", None, "v_scale is missing"),
    ("f16", "ok", "k_scale must be fp32"),
    ("ok", (2, 8), "v_scale must have shape () or (1,) (per tensor) or (8,) (per KV head), got (2, 8)"),
    ("ok", (4,), "v_scale must have shape"),
    ("strided", "ok", "k_scale must be contiguous"),
    (2.0, "ok", "k_scale must be a torch tensor"),
])
def test_an_fp8_cache_kernel_refuses_a_missing_or_malformed_scale_naming_it(k_scale, v_scale, words):
    import torch

    def make(x):
        if x == "ok":
            return torch.ones(8)
        if x == "f16":
            return torch.ones(8, dtype=torch.float16)
        if x == "strided":
            return torch.ones(16)[::2]
        return torch.ones(x) if isinstance(x, tuple) else x

    q, k, v = _call_args()
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        _launcher()(q, k, v, k_scale=make(k_scale), v_scale=make(v_scale))


def test_scales_are_refused_by_a_16_bit_cache_kernel_and_taken_per_tensor_or_per_head():
    import torch

    from tuner.serving.launch.plan import check_kv_scales

    q, k, v = _call_args()
    with pytest.raises(ValueError, match="k_scale/v_scale are an FP8"):
        _launcher(BF16)(q, k, v, k_scale=torch.ones(1), v_scale=torch.ones(1))
    for shape in ((), (1,), (8,)):
        check_kv_scales({"k_scale": torch.ones(shape), "v_scale": torch.ones(shape)}, 8, torch.device("cpu"))
    with pytest.raises(ValueError, match="v_scale holds values that are not finite"):
        check_kv_scales({"k_scale": torch.ones(8), "v_scale": torch.tensor([1.0] * 7 + [float("inf")])}, 8,
                        torch.device("cpu"))
    with pytest.raises(ValueError, match="k_scale is on"):
        check_kv_scales({"k_scale": torch.ones(8, device="meta"), "v_scale": torch.ones(8)}, 8, torch.device("cpu"))


def test_the_scales_struct_is_packed_as_the_header_declares_it():
    import ctypes
    import re

    from tuner.serving.launch.decode_kernel import KvScales

    header = (Path(__file__).resolve().parents[2] / "translate" / "include" / "attn_decode_fp8.cuh").read_text()
    body = re.search(r"struct KvScales \{(.*?)\};", header, re.S).group(1)
    fields = re.findall(r"(const float\*|int) ([\w, ]+);", body)
    names = [n.strip() for _, group in fields for n in group.split(",")]
    assert names == [n for n, _ in KvScales._fields_]
    kinds = {n.strip(): t for t, group in fields for n in group.split(",")}
    assert all((kinds[n] == "int") == (t is ctypes.c_int) for n, t in KvScales._fields_)


@pytest.mark.slow
def test_the_mma_fragments_are_laid_out_as_the_fp8_reads_assume(tmp_path):
    """Compiled for the host with nvcc and CuTe (no GPU): every lane's B fragment coordinates and register order."""
    from mma_fragments import check_b_fragments

    check_b_fragments(tmp_path, ["Shape<_32, _128>",    # K: a group's keys x d
                                 "Shape<_128, _32>",    # V^T: d_v x a group's keys
                                 "Shape<_16, _64>"], warps=(1, 2, 4))


def test_d256_needs_rows_a_swizzle_period_apart():
    d256 = KernelSpec("mha", 256, 256, True, "bf16", "paged", "decode", kv_dtype="fp8")
    big = load_profile("h200")
    assert any("multiple of 8 x 16" in e for e in validate_decode(DecodeParams(warps_n=2, block_n=64, kv_stages=2),
                                                                   big, d256))
    assert not [e for e in validate_decode(DecodeParams(block_n=64, kv_stages=2), big, d256) if "chunks" in e]
