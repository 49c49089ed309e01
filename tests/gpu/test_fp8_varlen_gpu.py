"""FP8 (e4m3) kernels of packed sequences on a Hopper GPU (marker gpu; skipped elsewhere): the varlen defaults of
MHA/GQA/MQA at head dims 64 and 128 pass the packed FP8 gate (every length mix of tuner/measure/verify_varlen.py, a
descale per (sequence, KV head) 1000x apart, values near 448); a kernel fed the wrong sequence's descales fails it; an
export serves flash_attn_varlen_func with e4m3 tensors on the kernel."""
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs a Hopper (sm_90) GPU")]

from test_fp8_gpu import _gpu, build_defaults  # noqa: E402

from kernel_abi.spec import KernelSpec  # noqa: E402

SPECS = [KernelSpec(v, d, d, c, "fp8", layout="varlen")
         for v, d, c in (("gqa", 128, True), ("mha", 128, False), ("mha", 64, True), ("mqa", 64, False),
                         ("gqa", 96, True), ("mha", 256, False), ("gqa", 192, True))] + \
    [KernelSpec("mla", 192, 128, True, "fp8", layout="varlen")]


@pytest.fixture(scope="module")
def built():
    return build_defaults(SPECS)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.label())
def test_fp8_varlen_defaults_pass_the_packed_fp8_gate(built, spec):
    from tuner.measure.verify_varlen import verify_varlen
    from tuner.serving.launch import load_kernel

    gen, result = built[spec.label()]
    assert result.ok, result.log[-3000:]
    report = verify_varlen(load_kernel(result.cubin, gen.meta()), gen.spec)
    assert report.passed, report.reason
    assert len(report.checks) >= 5


def test_a_kernel_given_one_sequences_descales_for_all_fails_the_gate(built):
    """The dense kernel's indexing (batch 0 for a packed tile) planted by the caller: every sequence gets the first
    sequence's descales."""
    from tuner.measure.verify_varlen import verify_varlen
    from tuner.serving.launch import load_kernel

    gen, result = built[SPECS[0].label()]
    kernel = load_kernel(result.cubin, gen.meta())

    class FirstSequenceOnly:
        meta = kernel.meta

        def varlen(self, *args, **kw):
            for name in ("q_descale", "k_descale", "v_descale"):
                kw[name] = kw[name][:1].expand_as(kw[name]).contiguous()
            return kernel.varlen(*args, **kw)

    assert not verify_varlen(FirstSequenceOnly(), gen.spec).passed


def test_the_packed_v_transpose_matches_torch():
    """The Triton copy (CUDA) writes what torch's copy (CPU) writes: each sequence from its aligned key, zeros
    between."""
    from tuner.serving.launch.plan import transposed_packed_v

    for lens in ([0], [1], [0, 1, 127, 128, 129, 2000, 5, 64], [4097, 3]):
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
        v = torch.randn(sum(lens), 3, 128).to(torch.float8_e4m3fn)
        on_gpu = transposed_packed_v(v.cuda(), cu.cuda(), len(lens), 16)
        assert torch.equal(on_gpu.cpu().view(torch.uint8), transposed_packed_v(v, cu, len(lens), 16).view(torch.uint8))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from tuner.defaults.export import export_defaults
    from tuner.serving import load_exported

    out = tmp_path_factory.mktemp("fp8-varlen-export")
    cache = os.environ.get("KERNEL_CACHE_DIR")
    export_defaults(_gpu(), [SPECS[0]], out / "export", cache_dir=Path(cache) if cache else None,
                    study_dir=out / "studies")
    return load_exported(out / "export")


def test_an_fp8_varlen_export_serves_flash_attn_varlen_func_on_the_kernel(exported):
    from tuner.measure import verify_fp8

    gen = torch.Generator(device="cuda").manual_seed(3)
    lens_q, lens_k = [1, 300, 0, 129], [700, 300, 5, 1000]
    hq, hkv, d = 32, 8, 128

    def draw(n, h):
        return torch.randn(n, h, d, generator=gen, device="cuda").clamp(-448, 448).to(torch.float8_e4m3fn)

    q, k, v = draw(sum(lens_q), hq), draw(sum(lens_k), hkv), draw(sum(lens_k), hkv)
    scales = dict(zip(("q_descale", "k_descale", "v_descale"), verify_fp8.descales(4, hkv, gen, "cuda")))
    cu = [torch.tensor([0, *torch.tensor(x).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
          for x in (lens_q, lens_k)]
    out = exported.flash_attn_varlen_func(q, k, v, cu[0], cu[1], max(lens_q), max(lens_k), causal=True, **scales)
    assert exported.last_path == "kernel" and exported.stats["sdpa"] == 0 and out.dtype == torch.bfloat16
    for b in range(4):
        q0, q1, k0, k1 = (int(cu[0][b]), int(cu[0][b + 1]), int(cu[1][b]), int(cu[1][b + 1]))
        if q1 == q0:
            continue
        own = {n: s[b:b + 1] for n, s in scales.items()}
        qs, ks, vs = q[None, q0:q1], k[None, k0:k1], v[None, k0:k1]
        check = verify_fp8.judge(f"sequence {b}", out[None, q0:q1], verify_fp8.reference(qs, ks, vs, own, True),
                                 verify_fp8.emulate(qs, ks, vs, own, True))
        assert check.passed, check.reason
