import math

import pytest
import torch
from store_fakes import make_record

from tuner.store.export import export_records
from tuner.serving import (ExportedAttention, ExportError, choose, load_exported, read_configs, sdpa_attention)
from tuner.serving import DeviceFacts
from tuner.store.records import KernelStore

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def exported(tmp_path):
    from hardware_profiles import load_profile

    recs = [make_record(bucket="s512", cubin=b"k512"), make_record(bucket="s4096", cubin=b"k4096"),
            make_record(bucket="s16384", cubin=b"k16k"),
            make_record(variant="gqa", bucket="s2048", cubin=b"gqa2k"),
            make_record(variant="mla", d_qk=192, d_v=128, bucket="s8192", cubin=b"mla8k"),
            make_record(dtype="fp16", causal=False, bucket="s1024", cubin=b"fp16")]
    out = tmp_path / "export"
    export_records(recs, load_profile("h100"), out)
    return out


def pick(configs, **changes):
    args = dict(heads_q=16, heads_kv=16, d_qk=128, d_v=128, dtype="bf16", causal=True, seqlen_k=4096,
                device_name=H100)
    args.update(changes)
    return choose(configs, **args)


@pytest.mark.parametrize("seqlen_k,bucket", [(1, "s512"), (700, "s512"), (1500, "s4096"), (4096, "s4096"),
                                             (9000, "s16384"), (8000, "s4096"), (100000, "s16384")])
def test_dispatch_takes_the_nearest_bucket(exported, seqlen_k, bucket):
    c = pick(read_configs(exported), seqlen_k=seqlen_k)
    assert c.kernel is not None and c.kernel.bucket == bucket
    assert c.kernel.cubin_path.read_bytes() == {"s512": b"k512", "s4096": b"k4096", "s16384": b"k16k"}[bucket]


@pytest.mark.parametrize("changes,reason", [
    (dict(d_qk=64, d_v=64), "no exported config for head dims 64/64"),
    (dict(dtype="fp16"), "no exported config for head dims 128/128, fp16, causal"),
    (dict(dtype=None), "fp16, bf16 and fp8 only"),
    (dict(causal=False), "non-causal"),
    (dict(device_name="NVIDIA A100-SXM4-80GB"), "no exported config for device"),
    (dict(device_name=None), "not on a CUDA device"),
])
def test_no_match_means_sdpa_with_the_reason(exported, changes, reason):
    c = pick(read_configs(exported), **changes)
    assert c.kernel is None and reason in c.reason


def test_device_aliases_of_the_profile_match(exported):
    assert pick(read_configs(exported), device_name="NVIDIA H100").kernel is not None


def test_variant_follows_the_head_layout(exported):
    configs = read_configs(exported)
    assert pick(configs).config.variant == "mha"
    gqa = pick(configs, heads_q=32, heads_kv=4, seqlen_k=100)
    assert (gqa.config.variant, gqa.kernel.bucket) == ("gqa", "s2048")
    mqa = pick(configs, heads_q=32, heads_kv=1)
    assert mqa.config.variant == "gqa"        # a gqa kernel serves any group
    mla = pick(configs, d_qk=192, d_v=128)
    assert (mla.config.variant, mla.kernel.bucket) == ("mla", "s8192")


def test_grouped_heads_prefer_a_grouped_config_but_any_kernel_serves_them(exported):
    configs = [c for c in read_configs(exported) if c.variant != "gqa"]
    c = pick(configs, heads_q=32, heads_kv=8)
    assert c.config.variant == "mha"          # the group is a launch argument of every kernel
    c = pick(configs, heads_q=32, heads_kv=5)
    assert c.kernel is None and "no exported variant serves 32 query heads over 5 KV heads" in c.reason


def test_broken_config_names_the_file(exported):
    bad = exported / "variant=mha,head_dim=64,dtype=bf16,causal=1,device_name=X.json"
    bad.write_text('{"_metadata": {}}')
    with pytest.raises(ExportError, match="device_name=X.json: missing field 'device_name'"):
        load_exported(exported)
    with pytest.raises(ExportError, match="not a directory"):
        load_exported(exported / "nope")


# ---- the call path -----------------------------------------------------------------------------------

def reference(q, k, v, causal):
    """softmax(Q K^T / sqrt(d)) V in float64, loops over heads, bottom-right causal; empty rows are 0."""
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    out = torch.zeros(b, sq, hq, v.shape[3], dtype=torch.float64)
    for h in range(hq):
        kh = h // (hq // hkv)
        s = q[:, :, h].double() @ k[:, :, kh].double().transpose(1, 2) / math.sqrt(d)
        if causal:
            keep = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + (sk - sq)
            s = s.masked_fill(~keep, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        out[:, :, h] = p @ v[:, :, kh].double()
    return out


@pytest.mark.parametrize("b,sq,sk,hq,hkv,dqk,dv,causal", [
    (2, 33, 33, 4, 4, 64, 64, False),
    (2, 33, 33, 4, 4, 64, 64, True),
    (1, 17, 40, 8, 2, 32, 32, True),      # GQA, fewer queries than keys: bottom-right
    (1, 40, 17, 4, 1, 32, 32, True),      # MQA, more queries than keys: the first rows see nothing
    (2, 20, 31, 4, 4, 192, 128, True),    # MLA head dims
    (1, 5, 9, 6, 3, 16, 16, False),
])
def test_sdpa_fallback_on_cpu_matches_a_plain_reference(exported, b, sq, sk, hq, hkv, dqk, dv, causal):
    g = torch.Generator().manual_seed(sq * 131 + sk)
    q = torch.randn(b, sq, hq, dqk, generator=g)
    k = torch.randn(b, sk, hkv, dqk, generator=g)
    v = torch.randn(b, sk, hkv, dv, generator=g)
    before = [t.clone() for t in (q, k, v)]
    attention = load_exported(exported)
    out = attention(q, k, v, causal=causal)
    assert attention.last_path == "sdpa" and "not on a CUDA device" in attention.last_reason
    assert out.shape == (b, sq, hq, dv) and out.is_contiguous()
    torch.testing.assert_close(out.double(), reference(q, k, v, causal), atol=1e-5, rtol=1e-5)
    assert all(torch.equal(a, c) for a, c in zip(before, (q, k, v)))
    if causal and sq > sk:
        assert torch.all(out[:, : sq - sk] == 0)


def test_sdpa_fallback_in_bf16_is_close_to_the_reference():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 64, 8, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    k, v = k[:, :, :2], v[:, :, :2]
    out = sdpa_attention(q, k, v, causal=True)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), reference(q, k, v, True), atol=2e-2, rtol=2e-2)


def test_bad_shapes_are_a_clear_error(exported):
    attention = load_exported(exported)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        attention(torch.zeros(1, 4, 6, 16), torch.zeros(1, 4, 4, 16), torch.zeros(1, 4, 4, 16))
    with pytest.raises(ValueError, match="4-D"):
        attention(torch.zeros(4, 6, 16), torch.zeros(4, 6, 16), torch.zeros(4, 6, 16))


def _OnDevice(configs, kernel_loader):
    """CPU tensors posing as the H100's, so the kernel branch runs without a GPU."""
    return ExportedAttention(configs, kernel_loader=kernel_loader, devices={("cpu", None): DeviceFacts(H100, (9, 0))})


def test_kernel_path_loads_lazily_once_and_dispatches(exported):
    loads = []

    def fake_loader(cubin, meta, device_index):
        loads.append(cubin)
        return lambda q, k, v, softmax_scale: ("kernel-out", cubin)

    attention = _OnDevice(read_configs(exported), kernel_loader=fake_loader)
    assert loads == []                                   # nothing loaded before a call
    q = torch.zeros(1, 4000, 16, 128, dtype=torch.bfloat16)
    for _ in range(3):
        assert attention(q, q, q, causal=True) == ("kernel-out", b"k4096")
    assert loads == [b"k4096"]
    assert (attention.last_path, attention.last_bucket) == ("kernel", "s4096")
    short = torch.zeros(1, 300, 16, 128, dtype=torch.bfloat16)
    assert attention(short, short, short, causal=True) == ("kernel-out", b"k512")
    assert attention.stats == {"kernel": 4}
    # The same device with a shape nobody exported: SDPA.
    attention(q[..., :64], q[..., :64], q[..., :64], causal=True)
    assert attention.last_path == "sdpa" and attention.stats == {"kernel": 4, "sdpa": 1}


def test_a_kernel_that_cannot_load_falls_back_to_sdpa_once_warned(exported):
    calls = []

    def broken_loader(cubin, meta, device_index):
        calls.append(1)
        raise RuntimeError("CUDA_ERROR_NO_BINARY_FOR_GPU")

    attention = _OnDevice(read_configs(exported), kernel_loader=broken_loader)
    q = torch.randn(1, 64, 16, 128).to(torch.bfloat16)
    with pytest.warns(RuntimeWarning, match="CUDA_ERROR_NO_BINARY_FOR_GPU"):
        out = attention(q, q, q, causal=True)
    assert attention.last_path == "sdpa" and "cannot be loaded" in attention.last_reason
    torch.testing.assert_close(out.double(), reference(q, q, q, True), atol=2e-2, rtol=2e-2)
    attention(q, q, q, causal=True)
    assert calls == [1]                                  # the failure is remembered, not retried


def test_inputs_the_kernel_refuses_go_to_sdpa(exported):
    def picky(q, k, v, softmax_scale):
        raise ValueError("q: the head dim must be contiguous")

    attention = _OnDevice(read_configs(exported), kernel_loader=lambda c, m, d: picky)
    q = torch.randn(1, 64, 16, 128).to(torch.bfloat16)
    out = attention(q, q, q, causal=True)
    assert attention.last_path == "sdpa" and "refused the inputs" in attention.last_reason
    torch.testing.assert_close(out.double(), reference(q, q, q, True), atol=2e-2, rtol=2e-2)


def test_a_tampered_cubin_is_not_loaded(exported):
    (cfg,) = [c for c in read_configs(exported) if c.variant == "mha" and c.dtype == "bf16"]
    cfg.kernels["s4096"].cubin_path.write_bytes(b"evil")
    attention = _OnDevice(read_configs(exported), kernel_loader=lambda c, m, d: pytest.fail("loaded a bad cubin"))
    q = torch.randn(1, 4096, 16, 128).to(torch.bfloat16)[:, :8]
    k = torch.randn(1, 4096, 16, 128).to(torch.bfloat16)
    with pytest.warns(RuntimeWarning, match="does not match its sha256"):
        attention(q, k, k, causal=True)
    assert attention.last_path == "sdpa"


def test_default_device_name_comes_from_torch_only_for_cuda_tensors(exported):
    attention = load_exported(exported, device_name=H100)
    q = torch.randn(1, 8, 16, 128).to(torch.bfloat16)
    attention(q, q, q, causal=True)                      # CPU tensors: SDPA even with a device name given
    assert attention.last_path == "sdpa"


def test_store_export_loader_round_trip_keeps_verified_records_only(tmp_path):
    from hardware_profiles import load_profile

    store = KernelStore(tmp_path / "s")
    store.offer(make_record(bucket="s1024", cubin=b"x"))
    export_records(store.records(), load_profile("h100"), tmp_path / "e")
    (cfg,) = read_configs(tmp_path / "e")
    assert list(cfg.kernels) == ["s1024"] and cfg.kernels["s1024"].meta["kernel_name"] == "fa_fwd_m128n64w4s2"
