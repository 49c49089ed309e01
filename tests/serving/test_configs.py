"""Reading an export: files stay inside the folder, the bucket rule, the dispatch table, architectures."""
import json
import os

import pytest
import torch
from conftest import H100, StandInKernel, make_export, qkv

from tuner.serving.buckets.seqlen import nearest_bucket
from tuner.serving import DeviceFacts, ExportError, load_exported, read_configs
from tuner.serving.configs import dispatch_table, pick


def _config_file(exported):
    return next(p for p in exported.glob("variant=mha,*.json"))


def _rewrite(path, bucket, **fields):
    doc = json.loads(path.read_text())
    doc[bucket].update(fields)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("name,fragment", [
    ("/etc/shadow", "not a file name inside the exported folder"),
    ("../../x.cubin", "not a file name inside the exported folder"),
    ("..", "not a file name inside the exported folder"),
    ("sub/k.cubin", "not a file name inside the exported folder"),
    ("", "not a file name inside the exported folder"),
    (7, "not a file name inside the exported folder"),
])
def test_a_config_naming_a_file_outside_its_folder_is_refused_before_anything_is_opened(exported, name, fragment,
                                                                                          monkeypatch):
    path = _config_file(exported)
    _rewrite(path, "s512", cubin=name)
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda f, *a, **k: opened.append(str(f)) or real_open(f, *a, **k))
    with pytest.raises(ExportError, match=fragment) as info:
        load_exported(exported)
    assert path.name in str(info.value)
    assert not [f for f in opened if "shadow" in f or f.endswith("x.cubin")]


def test_a_symbolic_link_out_of_the_folder_is_refused(exported, tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"not yours")
    path = _config_file(exported)
    os.symlink(secret, exported / "link.cubin")
    _rewrite(path, "s512", cubin="link.cubin")
    with pytest.raises(ExportError, match="outside the exported folder"):
        read_configs(exported)


def test_source_and_program_names_are_checked_too(exported):
    path = _config_file(exported)
    _rewrite(path, "s4096", source="../../etc/passwd")
    with pytest.raises(ExportError, match="s4096's source"):
        read_configs(exported)


def test_a_cubin_for_another_architecture_is_refused_with_the_gpus_named(exported):
    """A config exported for sm_90 whose cubin's ELF header says sm_80: refused at load, SDPA runs."""
    import hashlib

    elf = bytearray(64)
    elf[:4], elf[7], elf[8] = b"\x7fELF", 0x41, 8
    elf[48:52] = (0x6005004).to_bytes(4, "little")          # what nvcc 13 writes for sm_80
    path = _config_file(exported)
    (exported / "arm.cubin").write_bytes(bytes(elf))
    _rewrite(path, "s512", cubin="arm.cubin", kernel_sha256=hashlib.sha256(bytes(elf)).hexdigest())
    attn = load_exported(exported, devices={("cpu", None): DeviceFacts(H100, (9, 0))},
                         kernel_loader=lambda c, m, d: pytest.fail("loaded a cubin for another GPU"))
    q, k, v = qkv(hq=4, hkv=4, sq=100)
    with pytest.warns(RuntimeWarning, match="a cubin for sm_80 in a config exported for sm_90"):
        attn(q, k, v, causal=True)
    assert attn.last_path == "sdpa" and attn.reasons["kernel-unloadable"] == 1


def test_configs_exported_for_another_sm_do_not_serve_a_gpu_of_that_name(exported):
    attn = load_exported(exported, devices={("cpu", None): DeviceFacts(H100, (8, 0))},
                         kernel_loader=lambda c, m, d: pytest.fail("dispatched to an sm_90 kernel on sm_80"))
    q, k, v = qkv(hq=4, hkv=4)
    attn(q, k, v, causal=True)
    assert attn.last_path == "sdpa" and attn.reasons == {"other-arch": 1}
    assert "exported for another SM" in attn.last_reason


@pytest.mark.parametrize("buckets", [("s512", "s4096"), ("s1024",), ("s512", "s1024", "s2048", "s4096", "s8192",
                                                                      "s16384"), ("s512", "s2048", "s16384")])
def test_the_precomputed_bucket_rule_is_nearest_bucket(tmp_path, buckets):
    from store_fakes import make_record

    folder = make_export(tmp_path / "e", [make_record(bucket=b, cubin=b.encode()) for b in buckets])
    (config,) = read_configs(folder)
    for seqlen in list(range(1, 3000)) + [4095, 4096, 4097, 5792, 5793, 8191, 11585, 11586, 16384, 10 ** 6]:
        assert config.bucket_for(seqlen) == nearest_bucket(seqlen, buckets), seqlen


def test_the_dispatch_table_prefers_the_matching_variant_and_serves_any_group(exported):
    table = dispatch_table(read_configs(exported))
    args = dict(d_qk=128, d_v=128, dtype="bf16", causal=True)
    assert pick(table, heads_q=8, heads_kv=8, **args)[0].variant == "mha"
    assert pick(table, heads_q=8, heads_kv=2, **args)[0].variant == "gqa"
    assert pick(table, heads_q=8, heads_kv=1, **args)[0].variant == "gqa"      # no mqa config: the first one
    assert pick(table, heads_q=8, heads_kv=3, **args) == (None, "no-variant")
    assert pick(table, heads_q=8, heads_kv=8, d_qk=64, d_v=64, dtype="bf16", causal=True) == (None, "no-shape-config")
    assert pick(table, heads_q=8, heads_kv=8, d_qk=128, d_v=128, dtype=None, causal=True) == (None, "dtype")
    assert pick(table, heads_q=16, heads_kv=1, d_qk=192, d_v=128, dtype="bf16", causal=True)[0].variant == "mla"


def test_a_single_query_row_uses_a_kernel_of_the_other_causality(served):
    """Bottom-right causal with one query row sees every key: a decode step (non-causal) on an export of
    causal MLA kernels runs the kernel."""
    q, k, v = qkv(hq=4, hkv=1, sq=1, sk=300, d=192, dv=128)
    out = served(q, k, v, causal=False)
    assert served.last_path == "kernel"
    torch.testing.assert_close(out.double(), _ref(q, k, v, False), atol=2e-2, rtol=2e-2)
    q2, k2, v2 = qkv(hq=4, hkv=1, sq=2, sk=300, d=192, dv=128)
    served(q2, k2, v2, causal=False)
    assert served.last_path == "sdpa" and "no exported config" in served.last_reason


def _ref(q, k, v, causal):
    from conftest import reference

    return reference(q, k, v, causal)


def test_the_stand_in_refuses_what_the_kernel_refuses():
    k = StandInKernel({"spec": {"causal": True}})
    q = torch.randn(1, 8, 2, 64)[..., ::2]
    with pytest.raises(ValueError, match="contiguous"):
        k(q, q, q)


def test_a_config_file_that_links_out_of_the_folder_is_not_read(exported, tmp_path):
    outside = tmp_path / "elsewhere.json"
    outside.write_text(_config_file(exported).read_text())
    os.symlink(outside, exported / "variant=zzz,head_dim=128,dtype=bf16,causal=1,device_name=X.json")
    with pytest.raises(ExportError, match="outside the exported folder"):
        read_configs(exported)


def test_a_cubin_swapped_for_a_link_after_loading_is_refused_when_opened(exported, tmp_path):
    attn = load_exported(exported, devices={("cpu", None): DeviceFacts(H100, (9, 0))},
                         kernel_loader=lambda c, m, d: pytest.fail("opened a file outside the folder"))
    (config,) = [c for c in attn.configs if c.variant == "mha"]
    target = config.kernels["s512"].cubin_path
    secret = tmp_path / "secret"
    secret.write_bytes(target.read_bytes())
    target.unlink()
    os.symlink(secret, target)
    q, k, v = qkv(hq=4, hkv=4, sq=100)
    with pytest.warns(RuntimeWarning, match="outside the exported folder"):
        attn(q, k, v, causal=True)
    assert attn.last_path == "sdpa" and attn.reasons["kernel-unloadable"] == 1
