"""Decode records through `tune export`: their own configs (``,phase=decode`` after the layout token), the decode
metadata and entries, prefill configs untouched, phases never mixed, unverified ones refused."""
import hashlib
import json

import pytest
from store_fakes import make_decode_record, make_record

from tuner.store.export import build_configs, config_file_name, export_records, run_export
from tuner.store.records import KernelStore

DEV = "device_name=NVIDIA_H100_80GB_HBM3.json"
PAGED = f"variant=gqa,head_dim=128,dtype=bf16,causal=1,layout=paged,phase=decode,{DEV}"
DENSE = f"variant=gqa,head_dim=128,dtype=bf16,causal=1,phase=decode,{DEV}"
PREFILL = f"variant=gqa,head_dim=128,dtype=bf16,causal=1,{DEV}"


def _profile():
    from hardware_profiles import load_profile

    return load_profile("h100")


def test_decode_config_names():
    assert config_file_name("gqa", 128, 128, "bf16", True, "NVIDIA H100 80GB HBM3", "paged", "decode") == PAGED
    assert config_file_name("gqa", 128, 128, "bf16", True, "NVIDIA H100 80GB HBM3", "dense", "decode") == DENSE
    assert config_file_name("gqa", 128, 128, "bf16", True, "NVIDIA H100 80GB HBM3") == PREFILL


@pytest.fixture
def study(tmp_path):
    store = KernelStore(tmp_path / "studies")
    for bucket, cubin in (("d-b8-kv8k-p16", b"p16-8-8k"), ("d-b1-kv2k-p16", b"p16-1-2k"), ("d-b32-kv32k-p64", b"p64")):
        assert store.offer(make_decode_record(bucket=bucket, cubin=cubin))
    assert store.offer(make_decode_record(layout="dense", bucket="d-b128-kv32k", cubin=b"dense"))
    assert store.offer(make_record(variant="gqa", bucket="s4096", cubin=b"prefill"))   # same spec, prefill
    return tmp_path / "studies"


def test_decode_records_export_to_their_own_configs(study, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_export(gpu="h100", variant="gqa", study_dir=study, out_dir=out) == 0
    assert sorted(p.name for p in out.glob("*.json")) == sorted([PAGED, DENSE, PREFILL])
    assert "exported 5 kernel(s) in 3 config file(s)" in capsys.readouterr().out
    prefill = json.loads((out / PREFILL).read_text())
    assert "phase" not in prefill["_metadata"] and list(prefill) == ["_metadata", "s4096"]


def test_decode_metadata_and_entries(study, tmp_path):
    out = tmp_path / "out"
    run_export(gpu="h100", variant=None, study_dir=study, out_dir=out)
    doc = json.loads((out / PAGED).read_text())
    meta = doc["_metadata"]
    assert (meta["phase"], meta["bucket_rule"], meta["layout"], meta["page_sizes"]) == ("decode", "decode", "paged",
                                                                                        [16, 64])
    assert list(doc)[1:] == ["d-b1-kv2k-p16", "d-b8-kv8k-p16", "d-b32-kv32k-p64"]     # by batch, KV, page
    entry = doc["d-b8-kv8k-p16"]
    assert (entry["batch"], entry["kv_capacity"], entry["page_size"]) == (8, 8192, 16)
    assert "seqlen_k" not in entry and "tokens" not in entry
    sha = hashlib.sha256(b"p16-8-8k").hexdigest()
    assert entry["kernel_sha256"] == sha and (out / f"{sha}.cubin").read_bytes() == b"p16-8-8k"
    assert entry["meta"]["grid"] == "decode" and entry["params"]["min_split_blocks"] == 2
    assert entry["baselines"] == {"fa4": 11.0, "copy_gbs": 3000.0}
    # TFLOPS against FA4's; the achieved GB/s against the copy bandwidth (not TFLOPS against GB/s)
    assert entry["ratios"] == {"fa4": round(12.5 / 11.0, 4), "copy_gbs": round(2400 / 3000, 4)}
    assert entry["problem"]["kv_gbs"] == 2400.0 and entry["verification"]["passed"] is True
    dense = json.loads((out / DENSE).read_text())
    assert (dense["_metadata"]["phase"], dense["_metadata"]["layout"]) == ("decode", "dense")
    assert "page_sizes" not in dense["_metadata"]
    assert {k: v for k, v in dense["d-b128-kv32k"].items() if k in ("batch", "kv_capacity", "page_size")} == \
        {"batch": 128, "kv_capacity": 32768}


def test_a_prefill_export_is_byte_identical_beside_decode_records(tmp_path):
    prefill = [make_record(bucket="s512", cubin=b"a"), make_record(variant="gqa", bucket="t4k-even-p16",
                                                                   layout="paged", cubin=b"b")]
    alone = build_configs(prefill, _profile(), exported_at="2026-11-24T00:00:00+00:00")
    both = build_configs(prefill + [make_decode_record()], _profile(), exported_at="2026-11-24T00:00:00+00:00")
    assert set(both) - set(alone) == {PAGED}
    for name, doc in alone.items():
        assert json.dumps(both[name]) == json.dumps(doc)


def test_phases_are_never_mixed_in_one_config():
    # a prefill record carrying a decode bucket would land in a prefill config: refused
    bad = make_record(variant="gqa", bucket="d-b8-kv8k-p16", layout="paged")
    with pytest.raises(ValueError, match="a prefill record in bucket 'd-b8-kv8k-p16'"):
        build_configs([make_record(variant="gqa", bucket="t4k-even-p16", layout="paged"), bad], _profile())
    wrong = make_decode_record(bucket="t4k-even-p16")
    with pytest.raises(ValueError, match="a decode record in bucket 't4k-even-p16'"):
        build_configs([make_decode_record(), wrong], _profile())


def test_an_unverified_decode_record_refuses_the_export(tmp_path):
    bad = make_decode_record(verification={"passed": False, "reason": "NaN in the combine"})
    with pytest.raises(ValueError, match="did not pass verification"):
        export_records([make_decode_record(bucket="d-b1-kv2k-p16", cubin=b"x"), bad], _profile(), tmp_path / "o")
    assert not (tmp_path / "o").exists() or list((tmp_path / "o").iterdir()) == []


def test_decode_configs_are_read_back(study, tmp_path):
    from tuner.serving import read_configs

    out = tmp_path / "out"
    run_export(gpu="h100", variant=None, study_dir=study, out_dir=out)
    configs = {c.path.name: c for c in read_configs(out)}
    paged, dense, prefill = configs[PAGED], configs[DENSE], configs[PREFILL]
    assert (paged.phase, paged.layout, paged.bucket_rule, paged.page_sizes) == ("decode", "paged", "decode", (16, 64))
    assert (dense.phase, dense.layout, dense.page_sizes) == ("decode", "dense", ())
    assert (prefill.phase, prefill.bucket_rule) == ("prefill", "seqlen")
    k = paged.kernels["d-b8-kv8k-p16"]
    assert (k.batch, k.kv_capacity, k.page_size, k.seqlen_k) == (8, 8192, 16, None)


def test_an_fp8_cache_record_is_stored_beside_the_16_bit_one_of_its_bucket(tmp_path):
    """An e4m3 cache's kernel has its own key (KernelRecord.key ends in its kv_dtype): offering it neither fails nor
    replaces the 16-bit cache's kernel of the same bucket, and best() finds each by its kv dtype."""
    store = KernelStore(tmp_path / "studies")
    plain = make_decode_record(cubin=b"bf16 cache", tflops=20.0)
    meta = plain.kernel_meta
    fp8 = make_decode_record(cubin=b"fp8 cache", tflops=5.0,
                             kernel_meta={**meta, "spec": {**meta["spec"], "kv_dtype": "fp8"}})
    assert store.offer(plain) and store.offer(fp8)
    args = ("sm90", "gqa", "bf16", 128, 128, True, "paged", "decode")
    assert store.best(*args)["d-b8-kv8k-p16"].cubin == b"bf16 cache"
    assert store.best(*args, (), "fp8")["d-b8-kv8k-p16"].cubin == b"fp8 cache"
    assert store.record_dir(*fp8.key).parent.name.endswith("-paged-decode-kvfp8")
    assert sorted(r.cubin for r in store.records()) == [b"bf16 cache", b"fp8 cache"]
