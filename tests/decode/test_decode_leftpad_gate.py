"""The decode gate's cache_leftpad cases (tuner/measure/verify_decode.py, no GPU): a dense GQA kernel is checked on
leftpads 0, 1, a tile +- 1 and one equal to the length, and a stand-in kernel that ignores the leftpad (or
counts the padding's rows as keys) fails them while one that honours it passes."""
import pytest

from kernel_abi.spec import KernelSpec


def _spec(layout="dense", **features):
    return KernelSpec("gqa", 128, 128, True, "bf16", layout, "decode", **features)


def test_a_dense_kernel_is_checked_at_the_edges_of_a_leftpad():
    from tuner.measure.verify_decode import CHECK_CASES, LEFTPAD_CASES, MLA_CHECK_CASES, check_cases

    cases = [c for c in check_cases(_spec()) if c.leftpad is not None]
    assert cases == list(LEFTPAD_CASES)
    pads = {p for c in cases for p in c.leftpad}
    assert {0, 1, 63, 65, 127, 129} <= pads
    assert any(L == 0 and p > 0 for c in cases for p, L in zip(c.leftpad, c.cache_seqlens))   # no key after it
    assert {1, 4, 16} <= {c.seqlen_q for c in cases}
    assert any(c.num_splits == 1 for c in cases) and any((c.num_splits or 0) > 1 for c in cases)
    assert check_cases(_spec("paged")) == CHECK_CASES                 # a paged cache has no leftpad
    mla = KernelSpec("mla", 576, 512, True, "bf16", "dense", "decode")
    assert check_cases(mla) == MLA_CHECK_CASES
    options = [c for c in check_cases(_spec(local=True, sinks=True)) if c.leftpad is not None]
    assert len(options) == len(LEFTPAD_CASES) and all(c.sinks for c in options)
    assert len({c.window for c in options}) == len(options)          # each with another window


class _StandIn:
    """A dense decode kernel on the CPU (the fp32 reference): honouring the leftpad, ignoring it (keys from row 0),
    or counting from it without moving its loads (the padding's rows read as keys)."""

    def __init__(self, spec, mode="honour"):
        self.spec, self.mode = spec, mode

    def split_plan(self, batch, heads_q, heads_kv, seqlen_q, capacity, num_splits=None):
        from types import SimpleNamespace

        return SimpleNamespace(num_splits=num_splits or 1), 1, 1

    def __call__(self, q, k_cache, v_cache, cache_seqlens=None, page_table=None, num_splits=None, return_lse=False,
                 out=None, workspace=None, window_size=(-1, -1), softcap=0.0, learnable_sink=None,
                 cache_leftpad=None):
        import torch

        from tuner.serving.decode_sdpa import decode_reference
        from tuner.serving.options import ModelOptions

        lens, pad = cache_seqlens, cache_leftpad
        if self.mode == "ignore":
            pad = None
        elif self.mode == "unmoved" and pad is not None:
            lens, pad = cache_seqlens - pad, None
        options = ModelOptions((window_size[0], 0), softcap, learnable_sink)
        o, lse = decode_reference(q, k_cache, v_cache, lens, page_table, self.spec.causal,
                                  1.0 / q.shape[-1] ** 0.5, options, pad)
        out.copy_(o.to(torch.bfloat16))
        return out, lse


@pytest.mark.parametrize("mode", ["honour", "ignore", "unmoved"])
def test_the_gate_fails_a_kernel_that_ignores_the_leftpad(mode):
    import torch

    from tuner.measure.verify_decode import LEFTPAD_CASES, check_case

    spec = _spec()
    gen = torch.Generator().manual_seed(3)
    checks = [check_case(_StandIn(spec, mode), spec, c, gen, 16, device="cpu") for c in LEFTPAD_CASES]
    failed = [c for c in checks if not c.passed]
    if mode == "honour":
        assert not failed, failed[0]
    else:     # every case has a leftpad > 0 before some sequence's keys
        assert len(failed) == len(LEFTPAD_CASES), [c.problem for c in checks if c.passed]
