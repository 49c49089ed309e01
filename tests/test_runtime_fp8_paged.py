"""An FP8 paged kernel's runtime on the CPU: its launch plan (K's maps over the pages in boxes of a page's rows, V's map
over the packed V^T the runtime gathers, bf16 output, the descales after the layout's pointers), the V^T's geometry
and column -> key mapping (a pure-python reference of attn_sm90::packed_vt_key0's layout), the page sizes it refuses."""
import pytest
import torch

from fp8_pages import spread_over_pages
from test_runtime import FakeTensor, _fake_encoding
from tuner.serving.launch import kernel as attention, paged_vt, plan as launch_plan, tma
from tuner.serving.launch.paging import fp8_page_misfit

E4M3 = torch.float8_e4m3fn


def _paged_kernel(d=128, causal=True, variant="gqa", page_size=128):
    """The FP8 paged default built for ``page_size``: pages of 128 (whole tiles) read K by TMA, as these tests plan."""
    import tl
    import translate
    from hardware_profiles import load_profile
    from kernel_abi.spec import KernelSpec
    from translate.defaults import hopper_params

    profile = load_profile("h100")
    spec = KernelSpec(variant, d, d, causal, "fp8", layout="paged")
    gen = translate.generate(tl.parse_program(tl.load_sketch(variant, causal, "ws_overlap", "paged")),
                             hopper_params(profile, spec, page_size=page_size), profile, spec)
    return attention.AttentionKernel(meta=gen.meta(), device_index=0, _module=None, _function=None, _sm_count=132)


@pytest.mark.parametrize("d, page_size", [(128, 16), (64, 64), (128, 256)])
def test_the_plan_maps_k_by_pages_and_v_over_the_gathered_v_t(monkeypatch, d, page_size):
    monkeypatch.setattr(tma, "encode_bytes", _fake_encoding)
    monkeypatch.setattr(tma, "_offsets", {})
    kern = _paged_kernel(d)
    total_q, hq, hkv, pages, batch = 300, 16, 2, 40, 3
    q = FakeTensor((total_q, hq, d), 0x1000_0000, dtype=E4M3)
    k = FakeTensor((pages, page_size, hkv, d), 0x2000_0000, dtype=E4M3)
    v = FakeTensor((pages, page_size, hkv, d), 0x3000_0000, dtype=E4M3)
    keys = paged_vt.paged_vt_keys(batch, 1000, 16)
    plan = launch_plan.build_paged_plan(kern, q, k, v, None, None, batch, 128, 8, vt_keys=keys)
    assert plan.out_dtype == torch.bfloat16 and plan.out_shape == (total_q, hq, d)
    maps = {"qkvo"[slot.index]: slot for slot in plan.maps}
    chunk = 128 if d == 128 else 64   # bytes of a K box's rows (frame.fp8_chunk)
    block_n = int(kern.meta["block_n"])
    assert maps["k"].spec.dims == (d, page_size, hkv, pages)
    assert maps["k"].spec.box == (chunk, min(block_n, page_size), 1, 1)   # one box a page's rows
    assert maps["k"].spec.swizzle_bytes == chunk and maps["k"].dtype == "fp8"
    vt = maps["v"].spec   # (keys, d, heads, 1): the packed V^T, boxes of the kernel's keys x d_v rows
    assert vt.dims == (keys, d, hkv, 1) and vt.strides_bytes == (keys, d * keys, hkv * d * keys)
    assert vt.box == (128, d, 1, 1)
    assert maps["o"].dtype == "bf16"
    names = [n for n, _ in kern.args]
    pointers = ("cu_seqlens_q", "cu_seqlens_k", "seqused_k", "page_table", *launch_plan.FP8_DESCALES)
    assert list(plan.dynamic_offsets) == [plan.pointers[names.index(n)] - plan.pointers[0] for n in pointers]


def test_an_fp8_paged_plan_needs_its_v_t_width_and_pages_of_multiples_of_8(monkeypatch):
    monkeypatch.setattr(tma, "encode_bytes", _fake_encoding)
    kern = _paged_kernel(128)
    q = FakeTensor((64, 16, 128), 0x1000_0000, dtype=E4M3)
    k = FakeTensor((8, 16, 2, 128), 0x2000_0000, dtype=E4M3)
    with pytest.raises(launch_plan.PlanError, match="needs the V\\^T's keys"):
        launch_plan.build_paged_plan(kern, q, k, k, None, None, 2, 64, 4)
    k4 = FakeTensor((8, 4, 2, 128), 0x2000_0000, dtype=E4M3)
    with pytest.raises(ValueError, match="page size 4 is not a multiple of 8: an FP8 paged kernel"):
        launch_plan.build_paged_plan(kern, q, k4, k4, None, None, 2, 64, 4, vt_keys=128)
    kb = FakeTensor((8, 16, 2, 128), 0x2000_0000)
    with pytest.raises(ValueError, match="this kernel was built for torch.float8_e4m3fn"):
        launch_plan.build_paged_plan(kern, q, kb, kb, None, None, 2, 64, 4, vt_keys=128)
    assert fp8_page_misfit(16) is None and fp8_page_misfit(8) is None and fp8_page_misfit(12)


def test_v_t_is_sized_by_max_seqlen_k_within_the_tables_capacity():
    assert paged_vt.max_keys_of(10, 16) == 160                      # the table's capacity
    assert paged_vt.max_keys_of(10, 16, 100) == 100 and paged_vt.max_keys_of(10, 16, 1000) == 160
    assert paged_vt.max_keys_of(10, 16, None, cache_pages=4) == 64   # a sequence's pages are distinct
    assert paged_vt.paged_vt_keys(3, 100, 16) == launch_plan.packed_vt_keys(300, 3, 16) == 304 + 48
    with pytest.raises(ValueError, match="max_seqlen_k must be an int >= 0"):
        paged_vt.max_keys_of(10, 16, -1)


def _reference_columns(lens, keys, align):
    """Column c -> (sequence, key) the pure-python way: sequence b's keys from align x ceil(cu[b] / align) + align x b
    (attn_sm90::packed_vt_key0), every other column None."""
    out, cu = [None] * keys, 0
    for b, n in enumerate(lens):
        first = -(-cu // align) * align + align * b
        for j in range(n):
            out[first + j] = (b, j)
        cu += n
    return out


@pytest.mark.parametrize("lens", [[5], [0, 1, 127, 5, 33], [16, 16, 0, 0, 17], [64] * 7])
def test_column_keys_map_each_column_as_the_kernel_reads_it(lens):
    starts = paged_vt.key_starts(torch.tensor(lens, dtype=torch.int32))
    assert starts.tolist() == [0, *torch.tensor(lens).cumsum(0).tolist()]
    keys = paged_vt.paged_vt_keys(len(lens), max(max(lens), 1), 16)
    seq, key, valid = paged_vt.column_keys(keys, starts, len(lens), 16)
    want = _reference_columns(lens, keys, 16)
    got = [(int(s), int(k)) if ok else None for s, k, ok in zip(seq, key, valid)]
    assert got == want


@pytest.mark.parametrize("d", [32, 96, 256])
def test_the_gathered_v_t_holds_each_sequences_keys_from_its_pages_in_table_order_and_zeros_elsewhere(d):
    """Pages out of order, shared by no two sequences, unused pages poisoned with e4m3 NaN bytes, the last page of each
    sequence partly used (its unused rows poisoned too): V^T holds exactly the used keys, zeros elsewhere."""
    page_size, hkv, pages = 16, 2, 24
    lens = [37, 0, 16, 5]
    v_cache = torch.full((pages, page_size, hkv, d), 0x7F, dtype=torch.uint8)   # 0x7F: e4m3 NaN
    order = torch.randperm(pages, generator=torch.Generator().manual_seed(1))
    table = torch.zeros(len(lens), 4, dtype=torch.int32)
    taken, real = 0, {}
    for b, n in enumerate(lens):
        for p in range(-(-n // page_size)):
            page = int(order[taken])
            taken += 1
            table[b, p] = page
            rows = min(page_size, n - p * page_size)
            vals = torch.randint(1, 120, (rows, hkv, d), dtype=torch.uint8)
            v_cache[page, :rows] = vals
            for r in range(rows):
                real[(b, p * page_size + r)] = vals[r]
    starts = paged_vt.key_starts(torch.tensor(lens, dtype=torch.int32))
    keys = paged_vt.paged_vt_keys(len(lens), 64, 16)
    vt = paged_vt.transposed_paged_v(v_cache.view(E4M3), table, starts, len(lens), keys, 16)
    assert tuple(vt.shape) == (1, d, hkv, keys) and vt.stride(-1) == 1
    probe = paged_vt.transposed_paged_v(v_cache.view(E4M3), None, None, len(lens), keys, 16, alloc=False)
    assert probe.shape == tuple(vt.shape) and probe.stride() == vt.stride()
    cols = vt[0].permute(2, 1, 0).view(torch.uint8)   # (keys, heads, d)
    for c, where in enumerate(_reference_columns(lens, keys, 16)):
        if where is None:
            assert not cols[c].any(), c
        else:
            assert torch.equal(cols[c], real[where]), (c, where)


@pytest.mark.parametrize("change, message", [
    ({"k_descale": None}, "k_descale is missing"),
    ({"v_descale": torch.ones(4, 2)}, r"v_descale must have shape \(2, 2\)"),
    ({"q_descale": torch.tensor([[1.0, float("nan")]] * 2)}, "q_descale holds values that are not finite"),
])
def test_a_paged_call_refuses_bad_descales_by_name_before_any_launch(change, message, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)   # (CPU torch)
    kern = _paged_kernel(128)
    kern._launch = lambda *a, **k: pytest.fail("launched")
    q = torch.zeros(8, 4, 128, dtype=E4M3)
    cache = torch.zeros(4, 16, 2, 128, dtype=E4M3)
    scales = {n: torch.ones(2, 2) for n in launch_plan.FP8_DESCALES}
    scales.update(change)
    cu = torch.tensor([0, 4, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match=message):
        kern.paged(q, cache, cache, cu, torch.tensor([4, 4], dtype=torch.int32),
                   torch.zeros(2, 2, dtype=torch.int32), 4, **scales)


def test_a_paged_fp8_call_launches_on_the_gathered_v_t_with_the_key_starts_as_cu_seqlens_k(monkeypatch):
    """What kernel.paged hands the launch (CPU tensors, the plan and the launch stood in): V^T of the plan's width
    holding the gathered keys, the key starts (running sum of seqused_k) where cu_seqlens_k goes, then seqused_k, the
    table and the three descales; the plan sized by max_seqlen_k."""
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)   # (CPU torch)
    kern = _paged_kernel(128)
    planned, launched, starts = [], [], []
    monkeypatch.setattr(attention, "build_paged_plan", lambda *a, **kw: planned.append(kw["vt_keys"]) or
                        SimpleNamespace(out_shape=(a[1].shape[0], a[1].shape[1], 128), out_dtype=torch.bfloat16))
    real_starts = paged_vt.key_starts
    monkeypatch.setattr(paged_vt, "key_starts", lambda used: starts.append(real_starts(used)) or starts[-1])
    kern._launch = lambda plan, q, k, v, out, extra: launched.append((v, extra))
    lens, page = [20, 0, 33], 16
    cache = torch.randint(1, 100, (9, page, 2, 128), dtype=torch.uint8).view(E4M3)
    table = torch.tensor([[4, 7, 0], [0, 0, 0], [8, 1, 2]], dtype=torch.int32)
    used = torch.tensor(lens, dtype=torch.int32)
    q = torch.zeros(12, 8, 128, dtype=E4M3)
    cu_q = torch.tensor([0, 4, 4, 12], dtype=torch.int32)
    scales = {n: torch.ones(3, 2) for n in launch_plan.FP8_DESCALES}
    out = kern.paged(q, cache, cache, cu_q, used, table, 8, max_seqlen_k=40, **scales)
    assert out.dtype == torch.bfloat16 and planned == [paged_vt.paged_vt_keys(3, 40, 16)]
    (v, extra), = launched
    assert tuple(v.shape) == (1, 128, 2, planned[0])
    assert starts[0].tolist() == [0, 20, 20, 53] and extra[1] == starts[0].data_ptr()
    assert extra[0] == cu_q.data_ptr() and extra[2] == used.data_ptr() and extra[3] == table.data_ptr()
    assert extra[4:] == tuple(t.data_ptr() for t in scales.values())
    want = paged_vt.transposed_paged_v(cache, table, starts[0], 3, planned[0], 16,
                                       order=launch_plan.vt_key_order(kern.meta))
    assert torch.equal(v.view(torch.uint8), want.view(torch.uint8))
    kern.paged(q, cache, cache, cu_q, used, table, 8, **scales)   # no max_seqlen_k: the table's capacity, 48 keys
    assert planned[-1] == paged_vt.paged_vt_keys(3, 48, 16)


@pytest.mark.parametrize("order", ["natural", "accumulator"])
def test_the_paged_v_t_is_the_packed_v_t_of_the_same_keys(order):
    """The FP8 paged and varlen kernels read V^T the same way (attn_sm90::packed_vt_key0), in either key order: a paged
    call's gathered V^T equals the varlen runtime's V^T of the same keys packed (plan.transposed_packed_v), column for
    column, and is zero past it (both map columns to keys by plan.vt_key / vt_kernels.vt_key)."""
    page, lens = 16, [37, 0, 16, 5, 100]
    gen = torch.Generator().manual_seed(3)
    packed = torch.randint(1, 120, (sum(lens), 2, 64), generator=gen, dtype=torch.uint8)
    cache, table = spread_over_pages(packed, lens, page, gen, spare=3)
    starts = paged_vt.key_starts(torch.tensor(lens, dtype=torch.int32))
    varlen = launch_plan.transposed_packed_v(packed.view(E4M3), starts, len(lens), 16, order=order).view(torch.uint8)
    paged = paged_vt.transposed_paged_v(cache.view(E4M3), table, starts, len(lens),
                                        paged_vt.paged_vt_keys(len(lens), max(lens), 16), 16,
                                        order=order).view(torch.uint8)
    width = varlen.shape[-1]
    assert paged.shape[-1] >= width
    assert torch.equal(paged[..., :width], varlen) and not paged[..., width:].any()
