"""Serving buckets (tuner/measure/mixes.py) in the store and the export: which layouts may carry them, what an entry
writes for them, the round trip through the reader."""
import json

import pytest
from store_fakes import make_record

from tuner.serving.buckets.names import bucket_errors, bucket_sort_key
from tuner.store.export import build_configs, export_records
from tuner.store.records import InvalidRecordError, KernelStore

PAGED = "variant=gqa,head_dim=128,dtype=bf16,causal=1,layout=paged,device_name=NVIDIA_H100_80GB_HBM3.json"
VARLEN = "variant=gqa,head_dim=128,dtype=bf16,causal=1,layout=varlen,device_name=NVIDIA_H100_80GB_HBM3.json"


def _profile():
    from hardware_profiles import load_profile

    return load_profile("h100")


@pytest.mark.parametrize("layout,bucket,fragment", [
    ("dense", "t16k-even", "serving buckets such as t16k-even are for varlen and paged records"),
    ("dense", "t4k-even-p16", "is not a bucket name such as s4096"),
    ("paged", "s4096", "a paged record needs a serving bucket naming its page size"),
    ("paged", "t16k-even", "names no page size"),
    ("paged", "t16k-even-p24", "page size 24 is not one of 16, 32, 64, 128, 256"),
    ("varlen", "t16k-even-p16", r"a varlen record.s serving bucket has none \(e.g. t16k-even\)"),
    ("varlen", "16k-even", "neither a serving bucket"),
    ("ragged", "s4096", "layout must be one of dense, varlen, paged"),
])
def test_the_store_refuses_a_bucket_its_layout_cannot_carry(tmp_path, layout, bucket, fragment):
    store = KernelStore(tmp_path)
    with pytest.raises(InvalidRecordError, match=fragment):
        store.offer(make_record(bucket=bucket, layout=layout))
    assert store.records() == []


@pytest.mark.parametrize("layout,bucket", [("dense", "s4096"), ("varlen", "s4096"), ("varlen", "t16k-skewed"),
                                           ("varlen", "t4k-short"), ("paged", "t4k-even-p16"),
                                           ("paged", "t64k-even-p256")])
def test_the_buckets_each_layout_carries(layout, bucket):
    assert bucket_errors(bucket, layout) == []


def test_serving_records_are_stored_and_read_back_in_rule_order(tmp_path):
    store = KernelStore(tmp_path)
    for bucket in ("t64k-even-p16", "t16k-skewed-p16", "t16k-even-p128", "t4k-even-p16", "t16k-short-p16"):
        assert store.offer(make_record(variant="gqa", bucket=bucket, layout="paged", cubin=bucket.encode()))
    assert store.offer(make_record(variant="gqa", bucket="s1024", cubin=b"dense"))
    best = store.best("sm90", "gqa", "bf16", 128, 128, True, "paged")
    assert list(best) == ["t4k-even-p16", "t16k-short-p16", "t16k-even-p128", "t16k-skewed-p16", "t64k-even-p16"]
    assert best["t16k-even-p128"].cubin == b"t16k-even-p128"
    assert [r.bucket for r in store.records()][0] == "s1024"      # dense first (its layout sorts first)
    assert sorted(["t4k-even", "s512", "t4k-short"], key=bucket_sort_key) == ["s512", "t4k-short", "t4k-even"]


def test_a_paged_export_writes_the_rule_fields_and_page_sizes(tmp_path):
    recs = [make_record(variant="gqa", bucket="t16k-even-p16", layout="paged", cubin=b"p16"),
            make_record(variant="gqa", bucket="t4k-even-p128", layout="paged", cubin=b"p128"),
            make_record(variant="gqa", bucket="t16k-skewed", layout="varlen", cubin=b"v")]
    docs = build_configs(recs, _profile(), exported_at="now")
    assert sorted(docs) == [PAGED, VARLEN]
    paged = docs[PAGED]
    meta = paged["_metadata"]
    assert (meta["layout"], meta["bucket_rule"], meta["page_sizes"]) == ("paged", "serving", [16, 128])
    assert [k for k in paged if k != "_metadata"] == ["t4k-even-p128", "t16k-even-p16"]
    entry = paged["t16k-even-p16"]
    assert (entry["tokens"], entry["mix"], entry["page_size"]) == (16384, "even", 16) and "seqlen_k" not in entry
    varlen = docs[VARLEN]
    assert varlen["_metadata"]["bucket_rule"] == "serving" and "page_sizes" not in varlen["_metadata"]
    assert varlen["t16k-skewed"]["mix"] == "skewed" and "page_size" not in varlen["t16k-skewed"]


def test_key_length_configs_say_nothing_new():
    docs = build_configs([make_record(bucket="s4096"), make_record(bucket="s1024", layout="varlen", cubin=b"v")],
                         _profile(), exported_at="now")
    for doc in docs.values():
        assert "bucket_rule" not in doc["_metadata"] and "page_sizes" not in doc["_metadata"]
        assert [e["seqlen_k"] for k, e in doc.items() if k != "_metadata"] in ([4096], [1024])


def test_one_config_never_mixes_the_two_rules(tmp_path):
    recs = [make_record(bucket="s4096", layout="varlen", cubin=b"old"),
            make_record(bucket="t16k-even", layout="varlen", cubin=b"new")]
    with pytest.raises(ValueError, match=r"key-length buckets \(s4096\) and serving buckets \(t16k-even\)"):
        build_configs(recs, _profile())


def test_a_paged_config_round_trips_through_the_reader(tmp_path):
    from tuner.serving import read_configs

    recs = [make_record(variant="gqa", bucket=b, layout="paged", cubin=b.encode())
            for b in ("t16k-even-p16", "t4k-even-p16", "t16k-short-p64")]
    export_records(recs, _profile(), tmp_path / "e")
    assert json.loads((tmp_path / "e" / PAGED).read_text())["_metadata"]["page_sizes"] == [16, 64]
    (config,) = read_configs(tmp_path / "e")
    assert config.layout == "paged" and config.bucket_rule == "serving" and config.page_sizes == (16, 64)
    assert sorted(config.kernels) == ["t16k-even-p16", "t16k-short-p64", "t4k-even-p16"]
    kernel = config.kernels["t16k-short-p64"]
    assert (kernel.tokens, kernel.mix, kernel.page_size, kernel.seqlen_k) == (16384, "short", 64, None)
