"""The varlen/paged verification's inputs on the CPU: what a paged mix puts where (the check itself needs a
GPU: tests/gpu/test_varlen_gpu.py)."""
import torch

from kernel_abi.spec import KernelSpec
from tuner.measure.verify_varlen import CHECK_PAGED_MIXES, PagedMix, _packed_case, _paged_cache, _UNUSED_KEY


def test_a_paged_cache_holds_each_sequence_in_its_pages_and_nan_elsewhere():
    spec = KernelSpec("gqa", 64, 64, True, "bf16", "paged")
    mix = PagedMix((3, 50), (20, 33), 16, (32, 48), spare_pages=5)
    gen = torch.Generator().manual_seed(0)
    q, k, v, cu_q, cu_k, out = _packed_case(spec, mix, gen, "cpu")
    kc, vc, table = _paged_cache(k, v, cu_k, mix, gen, "cpu")
    assert kc.shape == (2 + 3 + 5, 16, 2, 64) and table.shape == (2, 3)
    named = set()
    for b, used in enumerate(mix.used):
        pages = table[b, :-(-mix.keys[b] // 16)].tolist()
        named |= set(pages)
        gathered = kc[pages].flatten(0, 1)[:mix.keys[b]]
        assert torch.equal(gathered, k[cu_k[b]:cu_k[b + 1]])
        assert (gathered[used:] == _UNUSED_KEY).all()             # the keys past seqused_k
    assert table.tolist() != sorted(table.flatten().tolist())     # shuffled, not the identity
    spare = [p for p in range(kc.shape[0]) if p not in named]
    assert len(spare) == 5 and kc[spare].isnan().all() and vc[spare].isnan().all()
    assert out.isnan().all()


def test_the_paged_mixes_cover_pages_smaller_equal_and_larger_than_a_tile():
    assert {m.page_size for m in CHECK_PAGED_MIXES} >= {16, 128, 256}
    assert any(0 in m.seqused_k for m in CHECK_PAGED_MIXES)
    assert any(u < a for m in CHECK_PAGED_MIXES for u, a in zip(m.used, m.keys))
