"""Serving mixes and the serving bucket rule (tuner/measure/mixes.py)."""
import pytest

from tuner.measure.mixes import MixError, ServingProblem, serving_problems
from tuner.serving.buckets.serving import is_serving_bucket, nearest_serving_bucket, parse_serving_bucket, serving_bucket


def test_issue_14s_mixes_fall_into_the_buckets_the_rule_states():
    varlen = {p.name: p.bucket for p in serving_problems("varlen", "gqa", 32, 8, 128, 128, True, "bf16")}
    assert varlen == {"8x2k": "t16k-even", "1x8k+32x256": "t16k-skewed", "64 random 1-512": "t16k-short"}
    paged = {p.name: p.bucket for p in serving_problems("paged", "gqa", 32, 8, 128, 128, True, "bf16", 16)}
    assert paged["2x(2k on 6k)"] == "t4k-even-p16" and paged["8x2k"] == "t16k-even-p16"


def test_the_rule_reads_only_what_the_host_knows():
    assert serving_bucket(16384, 8, 2048, 2048) == "t16k-even"
    assert serving_bucket(16384, 33, 8192, 8192) == "t16k-skewed"      # 8192 >= 4 x 496
    assert serving_bucket(15000, 64, 512, 512) == "t16k-short"
    assert serving_bucket(100, 1, 100, 6000) == "t4k-even"             # one chunk on a long prefix: not short
    assert serving_bucket(10 ** 6, 4, 10 ** 5, 10 ** 5, 128) == "t64k-even-p128"   # past the last edge
    assert serving_bucket(0, 0, 0, 0) == "t4k-short"                    # an empty batch still has a bucket
    with pytest.raises(ValueError, match="max_seqlen_k"):
        serving_bucket(10, 1, 10, -1)


def test_bucket_names_round_trip_and_the_nearest_keeps_mix_and_page_first():
    assert parse_serving_bucket("t16k-short-p16") == (16384, "short", 16)
    assert is_serving_bucket("t4k-even") and not is_serving_bucket("s4096") and not is_serving_bucket("t4k-odd")
    with pytest.raises(ValueError, match="serving bucket"):
        parse_serving_bucket("s4096")
    have = ["t16k-even", "t64k-short", "t4k-skewed"]
    assert nearest_serving_bucket("t4k-even", have) == "t16k-even"        # the same mix before nearer tokens
    assert nearest_serving_bucket("t16k-short", have) == "t64k-short"
    assert nearest_serving_bucket("t16k-even-p16", ["t16k-even-p128", "t16k-even-p16"]) == "t16k-even-p16"
    ties = ["t16k-short", "t16k-even"]            # a skewed call: neither mix matches; the order given does not matter
    assert nearest_serving_bucket("t16k-skewed", ties) == nearest_serving_bucket("t16k-skewed", ties[::-1])


def test_flops_count_the_visible_pairs_causal_bottom_right():
    p = ServingProblem("varlen", "x", (2, 3), (2, 5), "mha", 1, 1, 64, 64, True, "fp16")
    assert p.pairs == 3 + (3 * 2 + 6)      # 2x2 causal: 3 pairs; 3 queries on 5 keys: 2 prefix each + 6
    assert p.flops == 2.0 * p.pairs * 128


def test_bad_input_is_refused_with_the_reason():
    with pytest.raises(MixError, match="page size 24"):
        serving_problems("paged", "gqa", 32, 8, 128, 128, True, "bf16", 24)
    with pytest.raises(MixError, match="paged layout only"):
        serving_problems("varlen", "gqa", 32, 8, 128, 128, True, "bf16", 16)
    with pytest.raises(MixError, match="no serving mixes"):
        serving_problems("dense", "gqa", 32, 8, 128, 128, True, "bf16")
    with pytest.raises(MixError, match="queries <= keys"):
        ServingProblem("varlen", "x", (5,), (4,), "mha", 1, 1, 64, 64, True, "fp16")
