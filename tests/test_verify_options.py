"""The verification gate for the options of kernel_abi.spec (tuner/measure/verify.py): the reference against
torch's own masked attention and an explicit sink key, the check shapes of an option kernel, and a kernel that
drops an option (the window, the cap, the sinks) failing the gate."""
import math

import pytest
import torch
import torch.nn.functional as F

from kernel_abi.spec import KernelSpec, Problem
from tuner.measure import verify


def _qkv(b=2, sq=37, sk=53, hq=4, hkv=2, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, sq, hq, d, generator=g), torch.randn(b, sk, hkv, d, generator=g),
            torch.randn(b, sk, hkv, d, generator=g))


@pytest.mark.parametrize("causal,window", [(False, (5, 3)), (True, (5, 0)), (False, (-1, 0)), (False, (0, -1)),
                                           (True, (0, 0)), (False, (100, 100))])
def test_the_reference_window_is_torchs_masked_attention(causal, window):
    q, k, v = _qkv()
    sq, sk = q.shape[1], k.shape[1]
    i = torch.arange(sq)[:, None] + sk - sq
    j = torch.arange(sk)[None, :]
    left, right = window[0], 0 if causal else window[1]
    mask = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        mask &= j >= i - left
    if right >= 0:
        mask &= j <= i + right
    expect = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(2, 1),
                                            v.transpose(1, 2).repeat_interleave(2, 1), attn_mask=mask)
    expect = torch.nan_to_num(expect.transpose(1, 2), nan=0.0)    # a row with no key: 0
    assert torch.allclose(verify.reference(q, k, v, causal, window=window), expect, atol=1e-5)


def test_the_reference_softcap_and_sinks_are_the_definitions():
    q, k, v = _qkv()
    sinks = torch.tensor([30.0, -30.0, 0.5, 2.0])
    kr, vr = k.repeat_interleave(2, 2), v.repeat_interleave(2, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kr) / 4.0
    s = 7.0 * torch.tanh(s / 7.0)
    logits = torch.cat([s, sinks.view(1, 4, 1, 1).expand(2, 4, 37, 1)], dim=-1)
    p = torch.softmax(logits, -1)[..., :-1]
    expect = torch.einsum("bhqk,bkhd->bqhd", p, vr)
    out = verify.reference(q, k, v, False, softcap=7.0, sinks=sinks)
    assert torch.allclose(out, expect, atol=1e-5)
    assert torch.allclose(verify.reference_lse(q, k, False, softcap=7.0, sinks=sinks), torch.logsumexp(logits, -1),
                          atol=1e-5)
    assert float(out[:, :, 0].abs().max()) < 1e-9      # a sink of +30 takes the whole row: output 0


def test_an_option_kernel_is_checked_at_its_turning_sizes():
    spec = KernelSpec("gqa", 128, 128, True, "bf16", local=True, softcap=True, sinks=True)
    problems = verify.default_check_problems(spec)
    windows = {p.window for p in problems}
    assert set(verify.CAUSAL_WINDOWS) <= windows and {p.softcap for p in problems} == {1.0, 50.0}
    assert all(p.sinks for p in problems) and all(verify.spec_serves(spec, p) for p in problems)
    assert max(w[0] for w in windows) > max(p.seqlen_k for p in problems)      # a window longer than the sequence
    plain = KernelSpec("gqa", 128, 128, True, "bf16")
    assert all(p.window == (-1, -1) and not p.softcap and not p.sinks for p in verify.default_check_problems(plain))
    assert not verify.spec_serves(plain, problems[0]) and not verify.spec_serves(spec.__class__(
        "gqa", 128, 128, True, "bf16", local=True), problems[0])               # a cap needs a capping kernel
    assert verify.spec_serves(spec.__class__("gqa", 128, 128, True, "bf16", local=True, softcap=True, sinks=True),
                              Problem("gqa", 1, 8, 2, 8, 8, 128, 128, True, "bf16", softcap=1.0, sinks=True))


class ReferenceKernel:
    """The reference as a kernel, on the CPU (fp32 inside, the inputs' dtype out), optionally dropping an option."""

    def __init__(self, drop=None):
        self.drop = drop

    def __call__(self, q, k, v, out=None, window_size=(-1, -1), softcap=0.0, sinks=None):
        opts = {"window": window_size, "softcap": softcap, "sinks": sinks}
        if self.drop:
            opts[self.drop] = {"window": (-1, -1), "softcap": 0.0, "sinks": None}[self.drop]
        causal = self.causal
        res = verify.reference(q, k, v, causal, **opts).to(q.dtype)
        out.copy_(res)
        return out


@pytest.mark.parametrize("drop", [None, "window", "softcap", "sinks"])
def test_a_kernel_that_drops_an_option_fails_the_gate(monkeypatch, drop):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    spec = KernelSpec("mha", 64, 64, True, "bf16", local=True, softcap=True, sinks=True)
    kernel = ReferenceKernel(drop)
    kernel.causal = True
    small = [p for p in verify.default_check_problems(spec) if p.seqlen_q * p.seqlen_k <= 130 * 130]
    assert len(small) >= 4 and len({p.window for p in small}) >= 4
    report = verify.verify(kernel, spec, problems=small, seed=3, device="cpu")
    if drop is None:
        assert report.passed, report.reason
    else:
        assert not report.passed and "max error" in report.reason


class ReferenceVarlenKernel:
    """The reference as a packed-sequence kernel on the CPU (sequence by sequence), optionally dropping an option."""

    def __init__(self, causal: bool, drop=None):
        self.causal, self.drop = causal, drop

    def varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=None, out=None,
               window_size=(-1, -1), softcap=0.0, sinks=None):
        opts = {"window": window_size, "softcap": softcap, "sinks": sinks}
        if self.drop:
            opts[self.drop] = {"window": (-1, -1), "softcap": 0.0, "sinks": None}[self.drop]
        cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        used = seqused_k.tolist() if seqused_k is not None else [b - a for a, b in zip(cu_k, cu_k[1:])]
        out.zero_()
        for b in range(len(cu_q) - 1):
            if cu_q[b + 1] > cu_q[b] and used[b] > 0:
                ks = slice(cu_k[b], cu_k[b] + used[b])
                out[cu_q[b]:cu_q[b + 1]] = verify.reference(q[None, cu_q[b]:cu_q[b + 1]], k[None, ks], v[None, ks],
                                                            self.causal, **opts)[0].to(out.dtype)
        return out


# (each ~9 s on a CPU: the fast tier keeps the kernel that keeps every option and one that drops one)
@pytest.mark.parametrize("drop", [None, pytest.param("window", marks=pytest.mark.slow),
                                  pytest.param("softcap", marks=pytest.mark.slow), "sinks"])
def test_the_packed_sequence_gate_checks_every_option_too(monkeypatch, drop):
    """verify_varlen gives an option kernel the dense gate's windows (every one, the mixes cycled), caps and sinks,
    and the reference alike: a kernel that drops one fails it."""
    from tuner.measure import verify_varlen

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    spec = KernelSpec("gqa", 64, 64, True, "bf16", "varlen", local=True, softcap=True, sinks=True)
    small = tuple(m for m in verify_varlen.CHECK_MIXES if max(m.keys) <= 300)
    assert small
    report = verify_varlen.verify_varlen(ReferenceVarlenKernel(True, drop), spec, mixes=small, seed=5, device="cpu")
    labels = [c.problem for c in report.checks]
    assert len(report.checks) == len(verify.CAUSAL_WINDOWS)
    assert all(f" window{w[0]},{w[1]}" in " ".join(labels) for w in verify.CAUSAL_WINDOWS)
    assert all("sinks" in label and "softcap" in label for label in labels)
    if drop is None:
        assert report.passed, report.reason
    else:
        assert not report.passed
