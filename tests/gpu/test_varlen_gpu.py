"""Packed sequences on a Hopper GPU (marker gpu; skipped elsewhere): varlen and paged kernels of the
reference sketches (tl/layout.py) pass the verification gate (tuner/measure/verify_varlen.py: lengths 0/1/127/128/
129, one long among short, chunked prefill, seqused_k, causal rows that see no key; pages of 16/64/128/256 in
a shuffled cache beside NaN spare pages), and wrong ones are caught."""
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs a Hopper (sm_90) GPU")]

import tl  # noqa: E402
import translate  # noqa: E402
from hardware_profiles import load_profile  # noqa: E402
from translate import nvcc  # noqa: E402
from translate.defaults import default_params  # noqa: E402
from translate.params import KernelParams  # noqa: E402
from kernel_abi.spec import KernelSpec  # noqa: E402

TMA = {"g2s_atom": "SM90_TMA", "producer_regs": 40}
# (id, spec, parameter changes on top of the Hopper defaults)
CASES = [
    ("gqa128c", KernelSpec("gqa", 128, 128, True, "bf16", "varlen"), {}),
    ("gqa128n", KernelSpec("gqa", 128, 128, False, "bf16", "varlen"), {}),
    ("gqa128c_given", KernelSpec("gqa", 128, 128, True, "bf16", "varlen"), {"longest_first": False}),
    ("mha128c_fp16_tiles", KernelSpec("mha", 128, 128, True, "fp16", "varlen"), {"persistent": False}),
    ("mha64c", KernelSpec("mha", 64, 64, True, "bf16", "varlen"), {}),
    ("mla_c", KernelSpec("mla", 192, 128, True, "bf16", "varlen"), {}),
    # paged: the default producer copies with cp.async through the page table (any multiple of 8 keys a page,
    # 48 included); TMA boxes of min(block N, page size) rows as the other choice, and for MLA's head dims
    ("paged_gqa128c", KernelSpec("gqa", 128, 128, True, "bf16", "paged"), {}),
    ("paged_gqa128n_tma", KernelSpec("gqa", 128, 128, False, "bf16", "paged"), TMA),
    ("paged_gqa128c_tma", KernelSpec("gqa", 128, 128, True, "bf16", "paged"), TMA),
    ("paged_mla_c_fp16", KernelSpec("mla", 192, 128, True, "fp16", "paged"), {}),
    ("paged_mha64n", KernelSpec("mha", 64, 64, False, "bf16", "paged"), {}),
    ("paged_gqa128n_n176", KernelSpec("gqa", 128, 128, False, "bf16", "paged"), {"block_n": 176}),
    # head dim 96: the varlen epilogue's and the cp.async producer's 32-column blocks of the 64-byte swizzle
    ("gqa96c", KernelSpec("gqa", 96, 96, True, "bf16", "varlen"), {}),
    ("paged_gqa96c", KernelSpec("gqa", 96, 96, True, "bf16", "paged"), {}),
    # head dim 256: 64-key tiles, the paged one beside the cp.async producer's 56 registers (spills outside the loop)
    ("gqa256c", KernelSpec("gqa", 256, 256, True, "bf16", "varlen"), {}),
    ("paged_gqa256c", KernelSpec("gqa", 256, 256, True, "bf16", "paged"), {}),
    ("paged_gqa256n", KernelSpec("gqa", 256, 256, False, "bf16", "paged"), {}),
]


def build(spec, changes, profile):
    base = default_params(profile, spec, "ws_overlap")
    params = KernelParams.from_dict({**base.to_dict(), **changes})
    program = tl.parse_program(tl.load_sketch(spec.variant, spec.causal, "ws_overlap", spec.layout))
    return translate.generate(program, params, profile, spec)


def profile_of_this_gpu():
    return load_profile("h200" if "h200" in torch.cuda.get_device_name().lower() else "h100")


@pytest.fixture(scope="module")
def built():
    profile = profile_of_this_gpu()
    gens = [build(spec, changes, profile) for _, spec, changes in CASES]
    cache = os.environ.get("KERNEL_CACHE_DIR")
    results = nvcc.compile_kernels(gens, "sm_90a", jobs=os.cpu_count() or 4, batch_size=1,
                                   cache_dir=Path(cache) if cache else None)
    return dict(zip([c[0] for c in CASES], zip(gens, results)))


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_varlen_kernels_pass_the_gate(built, case):
    from tuner.serving.launch import load_kernel
    from tuner.measure.verify_varlen import verify_varlen

    gen, result = built[case]
    assert result.ok, result.log[-3000:]
    report = verify_varlen(load_kernel(result.cubin, gen.meta()), gen.spec)
    assert report.passed, report.reason
    print(case, max(c.max_err for c in report.checks), "max error;", [round(c.rel_err, 5) for c in report.checks])


def test_a_wrong_varlen_kernel_is_rejected(built, monkeypatch):
    """The gate must fail a kernel whose sequences leak into each other: one that is told every sequence
    starts at row 0 of the packed tensors."""
    from tuner.serving.launch import load_kernel
    from tuner.measure.verify_varlen import verify_varlen

    gen, result = built["gqa128c"]
    kernel = load_kernel(result.cubin, gen.meta())
    real = kernel.varlen

    def shifted(q, k, v, cu_q, cu_k, *args, **kwargs):
        return real(q, k, v, cu_q, torch.zeros_like(cu_k), *args, **kwargs)

    monkeypatch.setattr(kernel, "varlen", shifted)
    assert not verify_varlen(kernel, gen.spec).passed


def test_varlen_matches_the_dense_kernel_on_equal_lengths(built):
    """Packed equal-length sequences give what the dense kernel of the same parameters gives on the
    (batch, seqlen) tensors: the tiles are the same, only the addressing differs."""
    from tuner.serving.launch import load_kernel

    gen, result = built["gqa128c"]
    varlen = load_kernel(result.cubin, gen.meta())
    # the same parameters: the dense default rescales on a threshold (translate/defaults.py), the varlen one not
    dense_gen = build(KernelSpec("gqa", 128, 128, True, "bf16"), {"producer_regs": gen.params.producer_regs,
                                                                  "rescale_threshold": gen.params.rescale_threshold},
                      profile_of_this_gpu())
    cache = os.environ.get("KERNEL_CACHE_DIR")
    dense_result = nvcc.compile_kernels([dense_gen], "sm_90a", batch_size=1, cache_dir=Path(cache) if cache else None)[0]
    assert dense_result.ok, dense_result.log[-2000:]
    dense = load_kernel(dense_result.cubin, dense_gen.meta())
    b, s = 3, 1000
    q = torch.randn(b, s, 8, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, s, 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, s, 2, 128, device="cuda", dtype=torch.bfloat16)
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device="cuda")
    packed = varlen.varlen(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, s, s)
    torch.testing.assert_close(packed.view(b, s, 8, 128), dense(q, k, v), atol=0, rtol=0)


def test_a_paged_kernel_that_ignores_the_page_table_is_rejected(built, monkeypatch):
    """Given the pages in the order they were allocated (the identity table), not the shuffled table: the
    gate sees wrong keys, or NaN from the spare pages."""
    from tuner.serving.launch import load_kernel
    from tuner.measure.verify_varlen import verify_varlen

    gen, result = built["paged_gqa128c"]
    kernel = load_kernel(result.cubin, gen.meta())
    real = kernel.paged

    def identity_table(q, kc, vc, cu_q, used, table, *args, **kwargs):
        ident = torch.arange(table.numel(), dtype=torch.int32, device=table.device).view_as(table)
        return real(q, kc, vc, cu_q, used, ident.remainder(kc.shape[0]), *args, **kwargs)

    monkeypatch.setattr(kernel, "paged", identity_table)
    assert not verify_varlen(kernel, gen.spec).passed


@pytest.mark.parametrize("count", [9, 150])
def test_the_sequence_order_changes_which_cta_runs_a_tile_not_its_result(built, count):
    """Longest first (attn_sm90::order_sequences) against the order given, on a mix whose longest sequence is
    last: bit for bit the same output (a tile's arithmetic does not depend on its CTA). 150 sequences is past
    kMaxOrderedSeqs: the order given, in both."""
    from tuner.serving.launch import load_kernel

    kernels = [load_kernel(built[c][1].cubin, built[c][0].meta()) for c in ("gqa128c", "gqa128c_given")]
    gen = torch.Generator().manual_seed(count)
    lengths = [int(x) for x in torch.randint(0, 300, (count - 1,), generator=gen)] + [2500]
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32).cuda()
    total = int(cu[-1])
    q = torch.randn(total, 8, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(total, 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(total, 2, 128, device="cuda", dtype=torch.bfloat16)
    ordered, given = (kern.varlen(q, k, v, cu, cu, max(lengths), max(lengths)) for kern in kernels)
    assert torch.isfinite(ordered).all() and torch.equal(ordered, given)
