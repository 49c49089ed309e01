"""Decode parameters, their validation, and the split rule: pure functions."""
import pytest

from hardware_profiles import load_profile
from translate.decode import DecodeParams, decode_smem_bytes, plan_splits, validate_decode
from kernel_abi.splits import split_cost
from kernel_abi.spec import KernelSpec

H100, T4 = load_profile("h100"), load_profile("t4")
GQA = KernelSpec("gqa", 128, 128, True, "bf16", "paged", "decode")


def test_the_default_is_legal_on_hopper_and_ampere():
    assert validate_decode(DecodeParams(), H100, GQA) == []
    assert validate_decode(DecodeParams(), load_profile("a100"), GQA) == []


@pytest.mark.parametrize("params,words", [
    (DecodeParams(block_n=48), "multiple of 16 x warps_n"),
    (DecodeParams(block_m=16, warps_m=2), "multiple of 16 x warps_m"),
    (DecodeParams(kv_stages=1), "kv_stages"),
    (DecodeParams(block_n=256, kv_stages=8), "per-block limit"),
    (DecodeParams(block_m=128, warps_m=1, warps_n=1), "registers per thread"),
    (DecodeParams(warps_n=3), "warps_n"),
])
def test_illegal_candidates_are_rejected_with_the_reason(params, words):
    reasons = validate_decode(params, H100, GQA)
    assert any(words in r for r in reasons), reasons


def test_sm75_and_mla_are_refused_with_the_reason():
    assert any("sm75" in r for r in validate_decode(DecodeParams(), T4, KernelSpec("gqa", 128, 128, True, "fp16",
                                                                                    "paged", "decode")))
    mla = KernelSpec("mla", 192, 128, True, "bf16", "paged", "decode")
    assert any("MLA" in r for r in validate_decode(DecodeParams(), H100, mla))


def test_shared_memory_counts_the_ring_or_the_merge_buffer_whichever_is_larger():
    p = DecodeParams(block_m=16, block_n=64, warps_n=4, kv_stages=4)
    assert decode_smem_bytes(p, GQA) == 16 * 128 * 2 + 4 * 64 * 256 * 2
    p = DecodeParams(block_m=64, warps_m=4, block_n=16, warps_n=1, kv_stages=2)
    assert decode_smem_bytes(p, GQA) == 64 * 128 * 2 + max(2 * 16 * 256 * 2, 64 * 130 * 4)


def test_params_round_trip_and_reject_unknown_or_mistyped_fields():
    p = DecodeParams(block_n=128, pack_gqa=False)
    assert DecodeParams.from_dict(p.to_dict()) == p
    with pytest.raises(ValueError, match="unknown decode parameter"):
        DecodeParams.from_dict({"block_k": 3})
    with pytest.raises(ValueError, match="integer"):
        DecodeParams.from_dict({"block_n": "64"})
    assert DecodeParams().key() != DecodeParams(min_split_blocks=4).key()


def test_few_sequences_are_split_until_the_slots_are_full():
    # batch 1, 8 KV heads, 8k keys in 64-key tiles (128 tiles), 132 SMs x 2 CTAs: splitting 33 ways and more
    # all fit one wave; 4 tiles per CTA is reached at 32 splits, the fewest with the least time
    plan = plan_splits(8, 8192, 64, 132, 2, 2)
    assert plan.num_splits == 32 and plan.blocks_per_split == 4


def test_a_ragged_last_wave_is_avoided():
    # batch 64 x 8 KV heads = 512 CTAs on 132 x 3 = 396 slots: unsplit that is 2 waves of 128 + 2 tiles (the
    # second a third full); 3 splits make 4 waves of 43 + 2 (180 < 260 tile times)
    assert split_cost(512, 128, 396, 1) == 260
    plan = plan_splits(512, 8192, 64, 132, 3, 2)
    assert plan.num_splits == 3 and split_cost(512, 128, 396, 3) == 180


def test_full_waves_need_no_split_and_short_caches_are_not_cut_below_the_minimum():
    assert plan_splits(264, 8192, 64, 132, 2, 2).num_splits == 1       # exactly one wave
    assert plan_splits(8, 256, 64, 132, 2, 2).num_splits == 2          # 4 tiles, at least 2 per split
    assert plan_splits(8, 256, 64, 132, 2, 8).num_splits == 1


def test_a_forced_split_count_is_clamped_to_the_tiles_there_are():
    assert plan_splits(8, 1000, 64, 132, 2, 2, num_splits=3).num_splits == 3
    assert plan_splits(8, 100, 64, 132, 2, 2, num_splits=64).num_splits == 2
    plan = plan_splits(1, 10 ** 6, 64, 132, 64, 1)
    assert plan.num_splits <= 128 and plan.num_splits * plan.blocks_per_split >= 10 ** 6 / 64
    with pytest.raises(ValueError):
        plan_splits(0, 100, 64, 132, 2, 2)


def test_the_combine_kernel_and_the_host_agree_on_its_limits_and_grid():
    """attn_decode.cuh's combine holds a weight register per 32 splits up to kCombineMaxSplits and merges a
    kCombineSliceCols-column slice of a row a warp; the split rule and the launch (combine_grid) must use the same."""
    import re

    from translate import INCLUDE_DIR
    from kernel_abi.decode import COMBINE_SLICE_COLS, COMBINE_WARPS, COMBINE_WIDE_SPLITS, combine_grid
    from kernel_abi.splits import MAX_SPLITS

    header = (INCLUDE_DIR / "attn_decode.cuh").read_text()
    assert int(re.search(r"kCombineMaxSplits = (\d+);", header).group(1)) == MAX_SPLITS
    assert int(re.search(r"kCombineSliceCols = (\d+);", header).group(1)) == COMBINE_SLICE_COLS
    assert plan_splits(1, 1 << 20, 64, 132, 1, 1).num_splits <= MAX_SPLITS
    assert int(re.search(r"kCombineWideSplits = (\d+);", header).group(1)) == COMBINE_WIDE_SPLITS
    # many splits: a warp per slice (MLA's 512 columns are 4 slices a row, d128 one, d64 one with half the lanes
    # idle); fewer: a warp per row
    assert combine_grid(128, 512, COMBINE_WIDE_SPLITS) == 128 * 4 // COMBINE_WARPS
    assert combine_grid(128, 512, COMBINE_WIDE_SPLITS - 1) == 128 // COMBINE_WARPS
    assert combine_grid(32, 128, 64) == combine_grid(32, 64, 64) == 32 // COMBINE_WARPS
    assert combine_grid(5, 128, 2) == 2
    # a kernel built before ABI 3 merges a row a warp whatever the splits (its combine was one warp a row)
    assert combine_grid(128, 512, 64, abi=2) == 128 // COMBINE_WARPS
