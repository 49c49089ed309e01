"""Decode kernels served through an export on a GPU (marker gpu; skipped elsewhere): the built-in decode sketches'
kernels (paged, page 16, and dense; gqa d128 bf16 causal) built, verified by the decode gate, stored as decode
records, exported and loaded back, then ``flash_attn_with_kvcache`` against the fp32 reference (out and lse),
CUDA-graph capture and replay with new inputs (contents, lengths, tables), torch.compile(fullgraph=True), and a
page size no bucket names falling back to the reference on the device."""
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8,
                                 reason="needs an sm80+ GPU")]

from test_decode_gpu import compile_and_load, kernel_for, profile_here  # noqa: E402

from translate import nvcc  # noqa: E402
from translate.decode import DecodeParams  # noqa: E402
from kernel_abi.spec import KernelSpec  # noqa: E402
from tuner.serving import load_exported  # noqa: E402
from tuner.serving.decode_sdpa import decode_reference  # noqa: E402

HQ, HKV, D = 32, 8, 128
ATOL = 2 ** -7
SKETCHES = Path(__file__).resolve().parents[2] / "tl" / "sketches" / "decode"


def _record(spec, bucket, profile):
    from tuner.store.provenance import collect
    from tuner.store.records import KernelRecord
    from tuner.measure.verify_decode import verify_decode

    params = DecodeParams()
    gk = kernel_for(spec, params, profile)
    result = nvcc.compile_kernel(gk, profile.nvcc_arch, cache_dir=nvcc.default_cache_dir())
    assert result.ok, result.log[-2000:]
    report = verify_decode(compile_and_load(gk, profile), spec, page_size=16)
    assert report.passed, report.reason
    device_name = torch.cuda.get_device_name()
    verification = report.to_dict()      # the store writes JSON without NaN: a non-finite error as None
    verification["checks"] = [{k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in c.items()}
                              for c in verification["checks"]]
    return KernelRecord(
        arch=profile.arch_family, gpu=profile.name, device_name=device_name, variant=spec.variant, dtype=spec.dtype,
        d_qk=spec.d_qk, d_v=spec.d_v, causal=spec.causal, bucket=bucket, params=params.to_dict(),
        kernel_name=gk.name, kernel_meta=gk.meta(), source=gk.source, cubin=result.cubin,
        tl_program=(SKETCHES / f"gqa_{spec.layout}.tl").read_text(), verification=verification, tflops=1.0,
        baselines={}, problem={"layout": spec.layout}, provenance=collect(profile, device_name), study="test",
        layout=spec.layout, phase="decode")


@pytest.fixture(scope="module")
def attn(tmp_path_factory):
    from tuner.store.export import export_records
    from tuner.store.records import KernelStore

    profile = profile_here()
    root = tmp_path_factory.mktemp("decode-export")
    store = KernelStore(root / "study")
    assert store.offer(_record(KernelSpec("gqa", D, D, True, "bf16", "paged", "decode"), "d-b8-kv8k-p16", profile))
    assert store.offer(_record(KernelSpec("gqa", D, D, True, "bf16", "dense", "decode"), "d-b8-kv2k", profile))
    export_records(store.records(), profile, root / "out")
    served = load_exported(root / "out")
    assert sorted((c.layout, c.phase) for c in served.configs) == [("dense", "decode"), ("paged", "decode")]
    return served


def paged_case(lens, sq, page=16, seed=0, spare=7, width=None):
    """q, a shuffled paged cache (spare pages NaN: never read; the last page's tail finite), lengths, the table."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    counts = [-(-n // page) for n in lens]
    order = torch.randperm(sum(counts) + spare, generator=torch.Generator().manual_seed(seed)).tolist()
    kc = torch.full((len(order), page, HKV, D), float("nan"), device="cuda", dtype=torch.bfloat16)
    vc = kc.clone()
    table = torch.zeros(len(lens), width or max(counts), dtype=torch.int32)
    at = 0
    for b, n in enumerate(counts):
        for j in range(n):
            table[b, j], at = order[at], at + 1
    for b, n in enumerate(counts):
        pids = table[b, :n].long().cuda()
        kc[pids] = torch.randn(n, page, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
        vc[pids] = torch.randn(n, page, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    q = torch.randn(len(lens), sq, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, kc, vc, torch.tensor(lens, dtype=torch.int32, device="cuda"), table.cuda()


def capture(call):
    """(graph, its output): two warm-up calls on a side stream (they compile and load what the call needs), then
    the capture."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    return graph, out


def _check(out, q, kc, vc, lens, table, causal=True, scale=None, lse=None):
    ref, ref_lse = decode_reference(q.float(), kc.float(), vc.float(), lens, table, causal, scale)
    lowp = ref.to(torch.bfloat16).float()
    assert torch.isfinite(out).all()
    err = (out.float() - ref).abs().max().item()
    assert err <= 2 * (lowp - ref).abs().max().item() + ATOL, err
    if lse is not None:
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), finite)
        torch.testing.assert_close(lse[finite], ref_lse[finite], atol=1e-2, rtol=1e-3)


@pytest.mark.parametrize("sq", [1, 4])
@pytest.mark.parametrize("keyword", ["block_table", "page_table"])
def test_a_paged_decode_call_through_the_export(attn, sq, keyword):
    lens = [1, 100, 3000, 777]                        # batch 4, 188 pages of 16: class (8, 8k)
    q, kc, vc, seqlens, table = paged_case(lens, sq, seed=sq)
    out, lse = attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=True, return_softmax_lse=True,
                                            **{keyword: table})
    assert attn.last_path == "kernel" and attn.last_bucket == "d-b8-kv8k-p16", attn.last_reason
    assert lse.shape == (4, HQ, sq) and lse.dtype == torch.float32
    _check(out, q, kc, vc, seqlens, table, lse=lse)


def test_a_dense_decode_call_and_num_splits(attn):
    g = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(2, 2, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
    kc = torch.randn(2, 1024, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    vc = torch.randn(2, 1024, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    lens = torch.tensor([1000, 5], dtype=torch.int32, device="cuda")
    for splits in (0, 1, 7):
        out = attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, softmax_scale=0.06,
                                           num_splits=splits)
        assert attn.last_path == "kernel" and attn.last_bucket == "d-b8-kv2k", attn.last_reason
        _check(out, q, kc, vc, lens, None, scale=0.06)
    out = attn.flash_attn_with_kvcache(q, kc, vc, causal=True)            # no lengths: the whole cache
    _check(out, q, kc, vc, None, None)


def test_decode_cuda_graph_capture_and_replay_with_new_inputs(attn):
    lens = [900, 40, 2048, 5]
    static = list(paged_case(lens, 1, seed=11, width=160, spare=60))     # room for the later cases' pages
    q, kc, vc, seqlens, table = static

    def call():
        return attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table, causal=True)

    graph, out = capture(call)
    assert attn.last_path == "kernel"
    for seed, new in ((12, lens), (13, [2500, 1, 77, 1300])):          # new contents, then new lengths and tables
        fresh = paged_case(new, 1, seed=seed, width=160, spare=0)
        q.copy_(fresh[0])
        kc.fill_(float("nan"))
        vc.fill_(float("nan"))
        kc[:fresh[1].shape[0]], vc[:fresh[2].shape[0]] = fresh[1], fresh[2]
        seqlens.copy_(fresh[3])
        table.copy_(fresh[4])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(out, fresh[0], fresh[1], fresh[2], fresh[3], fresh[4])


def test_decode_under_torch_compile_fullgraph(attn):
    def step(q, kc, vc, lens, table):
        out, lse = attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True,
                                                return_softmax_lse=True)
        return out.float() * 0.5, lse

    args = paged_case([300, 4000, 1], 2, seed=21)
    assert torch._dynamo.explain(step)(*args).graph_break_count == 0
    compiled = torch.compile(step, fullgraph=True)
    before = attn.stats["kernel"]
    out, lse = compiled(*args)
    assert attn.stats["kernel"] == before + 1 and attn.last_path == "kernel"
    _check(out * 2, *args, lse=lse)


def test_a_page_size_no_bucket_names_runs_the_reference_on_the_device(attn):
    q, kc, vc, seqlens, table = paged_case([500, 64], 1, page=64, seed=31)
    before = attn.reasons["decode-page-size"]
    out = attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table, causal=True)
    assert attn.last_path == "sdpa" and attn.reasons["decode-page-size"] == before + 1
    _check(out, q, kc, vc, seqlens, table)


def _rotary(rows, rotary_dim=64):
    freqs = 10000.0 ** (-torch.arange(rotary_dim // 2, device="cuda", dtype=torch.float32) / (rotary_dim // 2))
    theta = torch.arange(rows, device="cuda", dtype=torch.float32)[:, None] * freqs[None, :]
    return theta.cos().to(torch.bfloat16), theta.sin().to(torch.bfloat16)


def _landed(cache, table, positions, page=16):
    pages = table.gather(1, torch.div(positions, page, rounding_mode="floor")).long()
    return cache[pages, positions % page]


def test_appending_rotated_rows_through_the_kernel(attn):
    """FA2's k=/v= with rotary (NeoX halves), two new tokens: the rows land in the table's pages at cache_seqlens
    (one crossing a page boundary, one into an empty cache) and the kernel attends over the grown cache."""
    from tuner.serving.kvcache_append import new_positions, rotate

    lens = [15, 3000, 0, 777]
    q, kc, vc, _, table = paged_case([n + 2 for n in lens], 2, seed=31)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(32)
    k = torch.randn(4, 2, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(4, 2, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    cos, sin = _rotary(4096)
    q0 = q.clone()
    out = attn.flash_attn_with_kvcache(q, kc, vc, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
                                       block_table=table, causal=True, rotary_interleaved=False)
    assert attn.last_path == "kernel" and attn.last_bucket == "d-b8-kv8k-p16", attn.last_reason
    positions = new_positions(seqlens, 2)
    assert torch.equal(_landed(kc, table, positions), rotate(k, cos, sin, positions, False))
    assert torch.equal(_landed(vc, table, positions), v)
    _check(out, rotate(q0, cos, sin, positions, False), kc, vc, seqlens + 2, table)


def test_an_appending_call_captures_in_a_cuda_graph(attn):
    """One decode step (append one row, attend) captured once and replayed three times, the lengths advanced in
    place between replays: each replay writes its row where the lengths say and attends over it."""
    from tuner.serving.kvcache_append import new_positions

    lens = [100, 40, 2000, 5]
    q, kc, vc, _, table = paged_case([n + 8 for n in lens], 1, seed=41)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    k = torch.zeros(4, 1, HKV, D, device="cuda", dtype=torch.bfloat16)
    v = torch.zeros_like(k)

    def call():
        return attn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, block_table=table, causal=True)

    graph, out = capture(call)
    assert attn.last_path == "kernel"
    g = torch.Generator(device="cuda").manual_seed(42)
    for _ in range(3):
        for t in (q, k, v):
            t.copy_(torch.randn(t.shape, device="cuda", dtype=t.dtype, generator=g))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        positions = new_positions(seqlens, 1)
        assert torch.equal(_landed(kc, table, positions), k) and torch.equal(_landed(vc, table, positions), v)
        _check(out, q, kc, vc, seqlens + 1, table)
        seqlens.add_(1)


@pytest.mark.parametrize("layout", ["paged", "dense", "absorbed", "strided"])
def test_the_triton_write_is_the_torch_write(layout):
    """kvcache_append_triton.write_rows (eager CUDA calls) against the torch ops that compiled calls use: the same
    cache contents and new lengths, for a paged and a dense cache, k alone (absorbed MLA), and new rows and a
    cache that are strided views, a page table whose columns are strided."""
    from tuner.serving import kvcache_append_triton as fused
    from tuner.serving.kvcache_append import _write_rows, cache_slots, new_positions

    g = torch.Generator(device="cuda").manual_seed(51)
    heads, d, dv, s_new = (1, 576, 512, 3) if layout == "absorbed" else (HKV, D, D, 3)
    lens = torch.tensor([0, 15, 61, 33], dtype=torch.int32, device="cuda")
    if layout in ("paged", "absorbed"):
        kc = torch.randn(40, 16, heads, d, device="cuda", dtype=torch.bfloat16, generator=g)
        # a transposed view: the table's columns are strided too
        table = torch.randperm(40, device="cuda", generator=g)[:32].reshape(8, 4).to(torch.int32).t()
    else:
        big = torch.randn(4, 80 if layout == "strided" else 64, heads, d, device="cuda", dtype=torch.bfloat16,
                          generator=g)
        kc, table = big[:, :64], None
    vc = None if layout == "absorbed" else torch.randn_like(kc)
    k = torch.randn(4, s_new, heads, d + 8, device="cuda", dtype=torch.bfloat16, generator=g)[..., :d]
    v = None if layout == "absorbed" else torch.randn(4, s_new, heads, dv, device="cuda", dtype=torch.bfloat16,
                                                      generator=g)
    assert fused.usable(kc, k, v)
    want_k, want_v = kc.clone(), None if vc is None else vc.clone()
    flat = cache_slots(new_positions(lens, s_new), table, kc.shape[1])
    _write_rows(want_k, flat, k)
    if vc is not None:
        _write_rows(want_v, flat, v)
    got = fused.write_rows(kc, vc, k, v, lens, table)
    assert torch.equal(got, lens + s_new) and got.dtype == torch.int32
    assert torch.equal(kc, want_k) and (vc is None or torch.equal(vc, want_v))


def test_an_appending_call_under_torch_compile(attn):
    """Compiled (fullgraph, Inductor): the torch ops write the rows, the kernel attends over them."""
    from tuner.serving.kvcache_append import new_positions

    def step(q, kc, vc, k, v, lens, table):
        return attn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, block_table=table, causal=True)

    lens = [300, 4000, 1]
    q, kc, vc, _, table = paged_case([n + 1 for n in lens], 1, seed=61)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    k = torch.randn(3, 1, HKV, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    compiled = torch.compile(step, fullgraph=True)
    before = attn.stats["kernel"]
    out = compiled(q, kc, vc, k, v, seqlens, table)
    assert attn.stats["kernel"] == before + 1
    positions = new_positions(seqlens, 1)
    assert torch.equal(_landed(kc, table, positions), k) and torch.equal(_landed(vc, table, positions), v)
    _check(out, q, kc, vc, seqlens + 1, table)
