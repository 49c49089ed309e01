"""FP8 (e4m3) kernels over a paged cache on a Hopper GPU (marker gpu; skipped elsewhere): the paged defaults of MHA/GQA
at head dims 64 and 128, causal and not, pass the packed FP8 gate on every paged mix they read (pages of 16, 64, 128
and 256; a descale per (sequence, KV head) 1000x apart, values near 448, shuffled pages beside spare pages of e4m3
NaN); a kernel fed the first sequence's descales, or with one descale ignored, fails it; the Triton gather of V^T
writes what torch's does; an export serves flash_attn_varlen_func(block_table=...) with e4m3 tensors on the kernel,
eager and compiled. Their K comes by the cp.async producer; built for pages of 128 (whole tiles), by TMA boxes.
"""
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs a Hopper (sm_90) GPU")]

from fp8_pages import spread_over_pages  # noqa: E402
from test_fp8_gpu import _gpu, build_defaults  # noqa: E402

from kernel_abi.spec import KernelSpec  # noqa: E402

E4M3 = torch.float8_e4m3fn
SPECS = [KernelSpec(v, d, d, c, "fp8", layout="paged")
         for v, d, c in (("gqa", 128, True), ("mha", 128, False), ("mha", 64, True), ("gqa", 64, False))]


@pytest.fixture(scope="module")
def built():
    return build_defaults(SPECS)


def _kernel(built, spec):
    from tuner.serving.launch import load_kernel

    gen, result = built[spec.label()]
    assert result.ok, result.log[-3000:]
    assert result.spill_stores == 0, result.spill_stores
    return gen, load_kernel(result.cubin, gen.meta())


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.label())
def test_fp8_paged_defaults_pass_the_packed_fp8_gate(built, spec):
    from tuner.measure.verify_varlen import verify_varlen

    gen, kernel = _kernel(built, spec)
    assert gen.params.g2s_atom == "SM80_CP_ASYNC_CACHEGLOBAL"   # (no page size given: the cp.async producer's K)
    report = verify_varlen(kernel, gen.spec)
    assert report.passed, report.reason
    pages = {c.problem.split(" page")[1].split()[0] for c in report.checks}
    assert {"16", "64"} <= pages, pages


@pytest.fixture(scope="module")
def built_tma():
    """The FP8 paged kernels for pages of whole tiles (page size 128): K by TMA boxes."""
    return build_defaults(SPECS[:2], page_size=128)


@pytest.mark.parametrize("spec", SPECS[:2], ids=lambda s: s.label())
def test_fp8_paged_tma_k_kernels_pass_the_packed_fp8_gate(built_tma, spec):
    from tuner.measure.verify_varlen import verify_varlen

    gen, kernel = _kernel(built_tma, spec)
    assert gen.params.g2s_atom == "SM90_TMA"
    report = verify_varlen(kernel, gen.spec)
    assert report.passed, report.reason


# d96 reads K by TMA whatever the page size (the cp.async producer copies 64-byte blocks of a row), d256 by the
# cp.async producer (128 x 64 tiles: a paged producer's registers leave d256's consumers too few for 128 keys)
NEW_HEAD_DIM_SPECS = [KernelSpec("gqa", 96, 96, True, "fp8", layout="paged"),
                      KernelSpec("mha", 256, 256, False, "fp8", layout="paged"),
                      KernelSpec("mha", 192, 192, True, "fp8", layout="paged"),
                      KernelSpec("mla", 192, 128, True, "fp8", layout="paged")]


@pytest.fixture(scope="module")
def built_new_head_dims():
    return build_defaults(NEW_HEAD_DIM_SPECS)


@pytest.mark.parametrize("spec", NEW_HEAD_DIM_SPECS, ids=lambda s: s.label())
def test_fp8_paged_d96_d192_and_d256_defaults_pass_the_packed_fp8_gate(built_new_head_dims, spec):
    from tuner.measure.verify_varlen import verify_varlen

    gen, kernel = _kernel(built_new_head_dims, spec)
    # (d96 and d192 read K by TMA boxes within the pages: translate/params_sm90.py refuses them the cp.async producer)
    assert gen.params.g2s_atom == ("SM80_CP_ASYNC_CACHEGLOBAL" if spec.d_qk == 256 else "SM90_TMA")
    report = verify_varlen(kernel, gen.spec)
    assert report.passed, report.reason


@pytest.mark.parametrize("planted", ["first sequence's descales", "v_descale ignored", "k_descale ignored"])
def test_a_kernel_given_wrong_descales_fails_the_gate(built, planted):
    """The caller plants the bug: every sequence gets the first sequence's descales (the dense kernel's batch index
    where a packed tile's sequence belongs), or one descale is all ones."""
    from tuner.measure.verify_varlen import verify_varlen

    gen, kernel = _kernel(built, SPECS[0])

    class Planted:
        meta = kernel.meta

        def paged(self, *args, **kw):
            for name in ("q_descale", "k_descale", "v_descale"):
                if planted.startswith("first"):
                    kw[name] = kw[name][:1].expand_as(kw[name]).contiguous()
                elif planted.startswith(name):
                    kw[name] = torch.ones_like(kw[name])
            return kernel.paged(*args, **kw)

    assert not verify_varlen(Planted(), gen.spec).passed


def test_the_kernel_refuses_bad_descales_and_page_sizes_before_launching(built):
    gen, kernel = _kernel(built, SPECS[0])
    q = torch.zeros(64, 32, 128, device="cuda", dtype=E4M3)
    cache = torch.zeros(8, 16, 8, 128, device="cuda", dtype=E4M3)
    cu = torch.tensor([0, 64], dtype=torch.int32, device="cuda")
    used = torch.tensor([100], dtype=torch.int32, device="cuda")
    table = torch.arange(8, dtype=torch.int32, device="cuda")[None]
    ones = torch.ones(1, 8, device="cuda")
    with pytest.raises(ValueError, match="v_descale is missing"):
        kernel.paged(q, cache, cache, cu, used, table, 64, q_descale=ones, k_descale=ones)
    with pytest.raises(ValueError, match="k_descale is on cpu"):
        kernel.paged(q, cache, cache, cu, used, table, 64, q_descale=ones, k_descale=ones.cpu(), v_descale=ones)
    odd = torch.zeros(32, 4, 8, 128, device="cuda", dtype=E4M3)
    with pytest.raises(ValueError, match="page size 4 is not a multiple of 8"):
        kernel.paged(q, odd, odd, cu, used, torch.arange(32, dtype=torch.int32, device="cuda")[None], 64,
                     q_descale=ones, k_descale=ones, v_descale=ones)


@pytest.mark.parametrize("d", [128, 96, 192, 256])   # (96: the copy's last 64-column tile masked at the head dim)
@pytest.mark.parametrize("page", [16, 64, 256])   # (a page-256 build once failed in Triton's layout pass)
def test_the_triton_gather_of_v_t_matches_torchs(page, d):
    """The Triton copy (CUDA) writes what torch's gather (CPU) writes: each sequence's keys from its pages in table
    order, from its aligned column, zeros elsewhere (the spare pages hold e4m3 NaN bytes: none may reach V^T)."""
    from tuner.serving.launch.paged_vt import key_starts, paged_vt_keys, transposed_paged_v
    from tuner.serving.launch.transpose_triton import READ_PAST_END

    gen = torch.Generator().manual_seed(page)
    for lens in ([0], [1], [0, 1, 127, 128, 129, 2000, 5, 64], [4097, 3]):
        packed = torch.randint(0, 0x7E, (sum(lens), 3, d), generator=gen, dtype=torch.uint8)
        cache, table = spread_over_pages(packed, lens, page, gen)
        used = torch.tensor(lens, dtype=torch.int32)
        keys = paged_vt_keys(len(lens), max(max(lens), 1), 16)
        on_cpu = transposed_paged_v(cache.view(E4M3), table, key_starts(used), len(lens), keys, 16)
        on_gpu = transposed_paged_v(cache.view(E4M3).cuda(), table.cuda(), key_starts(used.cuda()), len(lens), keys, 16)
        written = min(keys, sum(lens) + 16 * (len(lens) + 1) + READ_PAST_END)   # (the kernel reads no further)
        assert torch.equal(on_gpu.cpu().view(torch.uint8)[..., :written], on_cpu.view(torch.uint8)[..., :written]), lens


def test_the_gathered_v_t_is_the_packed_kernels_v_t_of_the_same_keys():
    """Both Triton kernels on the GPU (transpose_paged_v through the table, transpose_packed_v of the keys packed) write
    the same V^T for the same sequences: the FP8 paged and varlen kernels read it alike."""
    from tuner.serving.launch.paged_vt import key_starts, paged_vt_keys, transposed_paged_v
    from tuner.serving.launch.plan import transposed_packed_v
    from tuner.serving.launch.transpose_triton import READ_PAST_END

    page, lens = 16, [37, 0, 16, 5, 2000, 1]
    gen = torch.Generator().manual_seed(5)
    packed = torch.randint(0, 0x7E, (sum(lens), 4, 128), generator=gen, dtype=torch.uint8)
    cache, table = spread_over_pages(packed, lens, page, gen, spare=3)
    starts = key_starts(torch.tensor(lens, dtype=torch.int32, device="cuda"))
    varlen = transposed_packed_v(packed.cuda().view(E4M3), starts, len(lens), 16).view(torch.uint8)
    paged = transposed_paged_v(cache.cuda().view(E4M3), table.cuda(), starts, len(lens),
                               paged_vt_keys(len(lens), max(lens), 16), 16).view(torch.uint8)
    width = varlen.shape[-1]
    assert torch.equal(paged[..., :width], varlen) and not paged[..., width:width + READ_PAST_END].any()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from tuner.defaults.export import export_defaults
    from tuner.serving import load_exported

    out = tmp_path_factory.mktemp("fp8-paged-export")
    cache = os.environ.get("KERNEL_CACHE_DIR")
    export_defaults(_gpu(), [SPECS[0]], out / "export", cache_dir=Path(cache) if cache else None,
                    page_sizes=(16, 64), study_dir=out / "studies")
    return load_exported(out / "export")


def _paged_call_inputs(page, seed=3):
    """e4m3 packed q, the keys and values packed (for the reference) and spread over the pages of a shuffled cache
    beside spare pages of e4m3 NaN (the last pages' tails NaN too: masked keys, and values the gather leaves out),
    cu_seqlens, the table, descales 1000x apart."""
    from tuner.measure import verify_fp8

    gen = torch.Generator(device="cuda").manual_seed(seed)
    lens_q, lens_k = [1, 300, 0, 129], [700, 300, 5, 1000]
    hq, hkv, d = 32, 8, 128

    def draw(n, h):
        return torch.randn(n, h, d, generator=gen, device="cuda").clamp(-448, 448).to(E4M3)

    q, k, v = draw(sum(lens_q), hq), draw(sum(lens_k), hkv), draw(sum(lens_k), hkv)
    scales = dict(zip(("q_descale", "k_descale", "v_descale"), verify_fp8.descales(4, hkv, gen, "cuda")))
    shuffle = torch.Generator().manual_seed(seed)
    kc, table = spread_over_pages(k.view(torch.uint8).cpu(), lens_k, page, shuffle, spare=6)
    vc, _ = spread_over_pages(v.view(torch.uint8).cpu(), lens_k, page, torch.Generator().manual_seed(seed), spare=6)   # same order
    kc, vc = kc.cuda().view(E4M3), vc.cuda().view(E4M3)
    cu = [torch.tensor([0, *torch.tensor(x).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
          for x in (lens_q, lens_k)]
    return q, k, v, kc, vc, cu, table.cuda(), scales, lens_q, lens_k


def _check_sequences(out, q, k, v, cu, scales):
    from tuner.measure import verify_fp8

    for b in range(len(cu[0]) - 1):
        q0, q1, k0, k1 = (int(cu[0][b]), int(cu[0][b + 1]), int(cu[1][b]), int(cu[1][b + 1]))
        if q1 == q0:
            continue
        own = {n: s[b:b + 1] for n, s in scales.items()}
        qs, ks, vs = q[None, q0:q1], k[None, k0:k1], v[None, k0:k1]
        check = verify_fp8.judge(f"sequence {b}", out[None, q0:q1], verify_fp8.reference(qs, ks, vs, own, True),
                                 verify_fp8.emulate(qs, ks, vs, own, True))
        assert check.passed, check.reason


@pytest.mark.parametrize("page", [16, 64])
def test_an_fp8_paged_export_serves_flash_attn_varlen_func_on_the_kernel(exported, page):
    q, k, v, kc, vc, cu, table, scales, lens_q, lens_k = _paged_call_inputs(page)
    before = exported.stats["kernel"]
    out = exported.flash_attn_varlen_func(q, kc, vc, cu[0], cu[1], max(lens_q), max(lens_k), causal=True,
                                          block_table=table, **scales)
    assert exported.last_path == "kernel" and "paged" in exported.last_reason, exported.last_reason
    assert exported.stats["kernel"] == before + 1 and exported.stats["sdpa"] == 0 and out.dtype == torch.bfloat16
    _check_sequences(out, q, k, v, cu, scales)


def test_a_compiled_fp8_paged_call_runs_the_kernel(exported):
    q, k, v, kc, vc, cu, table, scales, lens_q, lens_k = _paged_call_inputs(16, seed=4)

    def f(q, kc, vc, cu_q, cu_k, table, qd, kd, vd):
        return exported.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                               block_table=table, q_descale=qd, k_descale=kd, v_descale=vd)

    before = exported.stats["kernel"]
    out = torch.compile(f, fullgraph=True)(q, kc, vc, cu[0], cu[1], table, *scales.values())
    assert exported.stats["kernel"] > before and exported.stats["sdpa"] == 0
    _check_sequences(out, q, k, v, cu, scales)
