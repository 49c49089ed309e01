"""The FP8 gate (tuner/measure/verify_fp8.py) on the CPU: its inputs, its yardstick, and kernels it must refuse."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from kernel_abi.spec import Problem  # noqa: E402
from tuner.measure import verify_fp8  # noqa: E402
from tuner.measure.verify import default_check_problems  # noqa: E402
from kernel_abi.spec import KernelSpec  # noqa: E402


def _problem(causal=True, hq=4, hkv=2, sq=40, sk=70, d=64):
    return Problem("gqa" if hq != hkv else "mha", 2, hq, hkv, sq, sk, d, d, causal, "fp8")


def _kernel(transform=None):
    """A stand-in FP8 kernel on the CPU: the emulation itself, with its inputs first changed by ``transform``."""
    def run(q, k, v, out, q_descale, k_descale, v_descale):
        scales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
        if transform is not None:
            scales = transform(dict(scales))
        out.copy_(verify_fp8.emulate(q, k, v, scales, causal=run.causal).to(out.dtype))
        return out
    return run


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("index", [0, 2])   # 2: values near e4m3's max
def test_the_emulated_kernel_passes(causal, index):
    gen = torch.Generator().manual_seed(1)
    k = _kernel()
    k.causal = causal
    check = verify_fp8.check_problem(k, _problem(causal), gen, device="cpu", index=index)
    assert check.passed, check.reason
    assert check.torch_lowp_err > 0   # P's rounding to e4m3 is a real error the bound is made of


@pytest.mark.parametrize("ignored", ["q_descale", "k_descale", "v_descale"])
def test_a_kernel_that_ignores_a_descale_fails(ignored):
    gen = torch.Generator().manual_seed(2)

    def drop(scales):
        scales[ignored] = torch.ones_like(scales[ignored])
        return scales
    k = _kernel(drop)
    k.causal = True
    check = verify_fp8.check_problem(k, _problem(True, sq=64, sk=64), gen, device="cpu")
    assert not check.passed
    assert "error" in check.reason


def test_a_kernel_with_16_bit_p_passes_and_the_bound_is_the_emulations():
    """The exact fp32 reference (no P rounding at all) is well inside the bound."""
    gen = torch.Generator().manual_seed(3)

    def exact(q, k, v, out, **scales):
        out.copy_(verify_fp8.reference(q, k, v, scales, True).to(out.dtype))
        return out
    check = verify_fp8.check_problem(exact, _problem(True), gen, device="cpu")
    assert check.passed and check.max_err < check.bound


def test_descales_spread_over_1000x_and_keep_scores_moving():
    gen = torch.Generator().manual_seed(4)
    q_d, k_d, v_d = verify_fp8.descales(4, 8, gen, "cpu")
    for d in (q_d, v_d):
        assert d.shape == (4, 8) and d.dtype == torch.float32
        assert float(d.max() / d.min()) == pytest.approx(1000, rel=1e-3)
    product = (q_d * k_d).log10()
    assert float(product.abs().max()) <= 1.0 + 1e-6 and float(product.max() - product.min()) > 0.5


def test_near_max_inputs_reach_e4m3s_largest_values():
    gen = torch.Generator().manual_seed(5)
    q, _, _, scales = verify_fp8.inputs(_problem(), gen, "cpu", near_max=True)
    assert q.dtype == torch.float8_e4m3fn
    assert float(q.float().abs().max()) == verify_fp8.FP8_MAX
    assert math.isfinite(float(scales["q_descale"].max()))


def test_a_kernel_that_leaves_rows_unwritten_fails():
    gen = torch.Generator().manual_seed(6)

    def lazy(q, k, v, out, **scales):
        out[:, :1] = 0
        return out
    check = verify_fp8.check_problem(lazy, _problem(), gen, device="cpu")
    assert not check.passed and "NaN" in check.reason


def test_fp8_check_shapes_are_the_gate_shapes():
    spec = KernelSpec("gqa", 128, 128, True, "fp8")
    problems = default_check_problems(spec)
    assert all(p.dtype == "fp8" for p in problems) and len(problems) >= 10


# ---- packed sequences (kernel.varlen): descales per sequence ------------------------------------------------


class _VarlenStandIn:
    """An FP8 varlen kernel on the CPU: the emulation per sequence, with ``wrong`` planted (None: correct)."""

    def __init__(self, causal: bool, wrong: str | None = None):
        self.causal, self.wrong = causal, wrong

    def varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=None, out=None,
               **scales):
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        out.zero_()
        for b in range(len(cq) - 1):
            used = int(seqused_k[b]) if seqused_k is not None and self.wrong != "all keys" else ck[b + 1] - ck[b]
            if cq[b + 1] == cq[b] or used == 0:
                continue
            row = 0 if self.wrong == "first sequence's descales" else b
            own = {n: d[row:row + 1] for n, d in scales.items()}
            qs, ks, vs = q[cq[b]:cq[b + 1]][None], k[ck[b]:ck[b] + used][None], v[ck[b]:ck[b] + used][None]
            out[cq[b]:cq[b + 1]] = verify_fp8.emulate(qs, ks, vs, own, self.causal)[0].to(out.dtype)
        return out


def _packed_spec(causal=True):
    return KernelSpec("gqa", 64, 64, causal, "fp8", layout="varlen")


@pytest.mark.parametrize("causal", [True, False])
def test_the_packed_gate_passes_the_emulation_on_every_varlen_mix(causal):
    from tuner.measure.verify_varlen import CHECK_MIXES, check_mix

    gen = torch.Generator().manual_seed(4)
    for i, mix in enumerate(CHECK_MIXES):
        check = check_mix(_VarlenStandIn(causal), _packed_spec(causal), mix, gen, device="cpu", options_index=i)
        assert check.passed, (mix.label(), check.reason)
        assert "fp8_varlen" in check.problem


@pytest.mark.parametrize("wrong", ["first sequence's descales", "all keys"])
def test_the_packed_gate_fails_a_kernel_that_mixes_up_sequences(wrong):
    """Descales read by the wrong sequence (the dense kernel's batch index where a packed tile's sequence belongs),
    or keys past seqused_k let in: each mix that can show it fails."""
    from tuner.measure.verify_varlen import CHECK_MIXES, check_mix

    gen = torch.Generator().manual_seed(5)
    mixes = CHECK_MIXES if wrong != "all keys" else [m for m in CHECK_MIXES if m.seqused_k is not None]
    checks = [check_mix(_VarlenStandIn(True, wrong), _packed_spec(), m, gen, device="cpu") for m in mixes]
    assert not any(c.passed for c in checks), [(c.problem, c.reason) for c in checks if c.passed]


# ---- a paged cache (kernel.paged): descales per sequence, keys through the page table --------------------------


class _PagedStandIn:
    """An FP8 paged kernel on the CPU: each sequence's keys gathered through the table, then the emulation per
    sequence, with ``wrong`` planted (None: correct)."""

    def __init__(self, causal: bool, wrong: str | None = None):
        self.causal, self.wrong = causal, wrong

    def paged(self, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q, out=None,
              max_seqlen_k=None, **scales):
        cq, used_k, page = cu_seqlens_q.tolist(), seqused_k.tolist(), k_cache.shape[1]
        assert max_seqlen_k is not None and max_seqlen_k >= max(used_k)
        out.zero_()
        next_page = 0
        for b in range(len(cq) - 1):
            used = used_k[b]
            if self.wrong == "whole pages":   # the last page's rows past the sequence's keys let in
                used = -(-used // page) * page
            pages = page_table[b, :-(-used // page)].tolist() if used else []
            if self.wrong == "pages in order":   # the table taken for the identity
                pages = list(range(next_page, next_page + len(pages)))
            next_page += len(pages)
            if cq[b + 1] == cq[b] or used == 0:
                continue
            ks = torch.cat([k_cache[p] for p in pages])[:used][None]
            vs = torch.cat([v_cache[p] for p in pages])[:used][None]
            own = {n: d[b:b + 1] for n, d in scales.items()}
            if self.wrong is not None and self.wrong.endswith("ignored"):
                own[self.wrong.split()[0]] = torch.ones_like(own[self.wrong.split()[0]])
            if self.wrong == "first sequence's descales":
                own = {n: d[0:1] for n, d in scales.items()}
            qs = q[cq[b]:cq[b + 1]][None]
            out[cq[b]:cq[b + 1]] = verify_fp8.emulate(qs, ks, vs, own, self.causal)[0].to(out.dtype)
        return out


def _paged_spec(causal=True):
    return KernelSpec("gqa", 64, 64, causal, "fp8", layout="paged")


def _small_paged_mixes():
    """The shapes of CHECK_PAGED_MIXES cut small for the CPU (the GPU runs those): pages smaller than a tile, a
    sequence with no key, pages allocated past the keys used, a chunk of queries on a cached prefix."""
    from tuner.measure.verify_varlen import PagedMix

    return (PagedMix((1, 50, 30), (5, 170, 130), 16), PagedMix((40, 64, 9), (100, 0, 9), 64),
            PagedMix((30, 12), (70, 12), 128, (128, 128)))


@pytest.mark.parametrize("causal", [True, False])
def test_the_paged_gate_passes_the_emulation_on_every_paged_mix(causal):
    from tuner.measure.verify_varlen import check_mix

    gen = torch.Generator().manual_seed(6)
    for i, mix in enumerate(_small_paged_mixes()):
        check = check_mix(_PagedStandIn(causal), _paged_spec(causal), mix, gen, device="cpu", options_index=i)
        assert check.passed, (mix.label(), check.reason)
        assert "fp8_paged" in check.problem and "page" in check.problem


def test_the_paged_gates_cache_is_shuffled_and_poisoned():
    """Pages in an order that is not the table's identity; spare pages (no table row names them) all e4m3 NaN; rows
    past a sequence's keys in its last page at 448."""
    from tuner.measure.verify_varlen import CHECK_PAGED_MIXES, _paged_cache

    mix = CHECK_PAGED_MIXES[0]
    cu, k = [0], []
    for n in mix.keys:
        cu.append(cu[-1] + n)
    k = torch.ones(cu[-1], 2, 64).to(torch.float8_e4m3fn)
    kc, _, table = _paged_cache(k, k, cu, mix, torch.Generator().manual_seed(7), "cpu",
                                unused=verify_fp8.UNUSED_KEY)
    named = {int(p) for b, n in enumerate(mix.keys) for p in table[b, :-(-n // mix.page_size)]}
    spare = [p for p in range(kc.shape[0]) if p not in named]
    assert len(spare) == mix.spare_pages and all(torch.isnan(kc[p].float()).all() for p in spare)
    in_table_order = [int(table[b, j]) for b, n in enumerate(mix.keys) for j in range(-(-n // mix.page_size))]
    assert in_table_order != list(range(len(in_table_order)))   # not the identity
    last = int(table[0, (mix.keys[0] - 1) // mix.page_size])
    assert (kc[last, mix.keys[0] % mix.page_size:].float() == verify_fp8.FP8_MAX).all()


@pytest.mark.parametrize("wrong", ["q_descale ignored", "k_descale ignored", "v_descale ignored",
                                   "first sequence's descales", "pages in order", "whole pages"])
def test_the_paged_gate_fails_a_planted_bug(wrong):
    """A kernel that ignores a descale, reads the first sequence's descales, takes the table for the identity, or lets
    the last page's rows past seqused_k in: some mix fails (each where it can show)."""
    from tuner.measure.verify_varlen import check_mix

    gen = torch.Generator().manual_seed(8)
    checks = [check_mix(_PagedStandIn(True, wrong), _paged_spec(), m, gen, device="cpu", options_index=i)
              for i, m in enumerate(_small_paged_mixes())]
    failed = [c for c in checks if not c.passed]
    assert failed, wrong
    if wrong.endswith("ignored"):   # shows wherever a sequence has keys
        assert len(failed) == len(checks), [(c.problem, c.reason) for c in checks if c.passed]
