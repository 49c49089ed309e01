import pytest

from tuner.serving.buckets.seqlen import BUCKETS, bucket_for, bucket_seqlen, nearest_bucket


@pytest.mark.parametrize("seqlen,bucket", [(1, "s512"), (512, "s512"), (513, "s1024"), (4096, "s4096"),
                                           (5000, "s8192"), (16384, "s16384"), (100000, "s16384")])
def test_bucket_for_takes_the_smallest_edge_that_holds_the_seqlen(seqlen, bucket):
    assert bucket_for(seqlen) == bucket


def test_every_edge_is_its_own_bucket():
    assert [bucket_seqlen(bucket_for(e)) for e in BUCKETS] == list(BUCKETS)


@pytest.mark.parametrize("bad", [0, -3, 1.5, "4096", True])
def test_bad_seqlen_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="positive integer"):
        bucket_for(bad)


@pytest.mark.parametrize("seqlen,available,expected", [
    (3000, ["s512", "s16384"], "s16384"),    # log2: 2.45 octaves up against 2.55 down
    (4096, ["s1024", "s8192", "s16384"], "s8192"),
    (100, ["s2048", "s512"], "s512"),
    (2896, ["s2048", "s4096"], "s2048"),     # just below the log-midpoint 2896.3
    (6000, ["s4096", "s8192"], "s8192"),
])
def test_nearest_bucket_is_nearest_in_log2(seqlen, available, expected):
    assert nearest_bucket(seqlen, available) == expected


def test_nearest_bucket_tie_goes_to_the_larger_bucket():
    # 2048 is exactly one octave from 1024 and from 4096.
    assert nearest_bucket(2048, ["s1024", "s4096"]) == "s4096"


def test_nearest_bucket_refuses_nothing_to_choose_and_bad_names():
    with pytest.raises(ValueError, match="no buckets"):
        nearest_bucket(100, [])
    with pytest.raises(ValueError, match="not a shape bucket"):
        nearest_bucket(100, ["4096"])
