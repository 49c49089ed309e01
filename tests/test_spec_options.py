"""The options of kernel_abi.spec: windows, soft-capping and sinks as a problem states them, the pairs a window
leaves visible (what TFLOPS count), and the kernel spec they make (its label, and its stored form unchanged for a
spec without them)."""
import pytest

from kernel_abi.spec import KernelSpec, Problem, visible_pairs


def brute_pairs(sq, sk, left, right):
    off = sk - sq
    return sum(1 for i in range(sq) for j in range(sk)
               if (left < 0 or j >= i + off - left) and (right < 0 or j <= i + off + right))


@pytest.mark.parametrize("sq,sk", [(1, 1), (7, 7), (5, 13), (13, 5), (64, 200)])
@pytest.mark.parametrize("left,right", [(-1, -1), (-1, 0), (0, 0), (3, 0), (3, 2), (-1, 4), (0, -1), (100, 100)])
def test_visible_pairs_count_what_the_window_leaves(sq, sk, left, right):
    assert visible_pairs(sq, sk, left, right) == brute_pairs(sq, sk, left, right)


def test_a_window_counts_its_visible_pairs_and_causal_keeps_its_half_square():
    causal = Problem("mha", 2, 4, 4, 1000, 1000, 128, 128, True, "bf16")
    assert causal.flops == 2 * 2 * 4 * 1000 * 1000 * 256 / 2
    local = causal.with_(window=(100, -1))         # causal: the right side is 0
    assert local.local and local.effective_window == (100, 0)
    assert local.flops == 2 * 2 * 4 * 256 * sum(min(i, 100) + 1 for i in range(1000))
    assert not causal.with_(window=(-1, 0)).local   # just causal
    assert Problem("mha", 1, 1, 1, 8, 8, 64, 64, False, "bf16", window=(-1, 2)).local


@pytest.mark.parametrize("changes,words", [
    ({"window": (-2, 0)}, "window sizes must be >= -1"), ({"window": (1, 3), "causal": True}, "causal window's right"),
    ({"window": (1,)}, "(left, right) pair"), ({"softcap": -1.0}, "softcap must be"),
    ({"softcap": float("nan")}, "softcap must be")])
def test_a_bad_option_is_refused_with_its_reason(changes, words):
    base = dict(variant="mha", batch=1, heads_q=2, heads_kv=2, seqlen_q=8, seqlen_k=8, d_qk=64, d_v=64,
                causal=False, dtype="bf16")
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        Problem(**{**base, **changes})


def test_the_kernel_spec_of_a_problem_names_its_options_and_stores_as_before_without_them():
    p = Problem("gqa", 1, 8, 2, 64, 64, 128, 128, True, "bf16", window=(64, 0), softcap=30.0, sinks=True)
    spec = KernelSpec.of(p)
    assert (spec.local, spec.softcap, spec.sinks) == (True, True, True)
    assert spec.label() == "gqa_d128x128_causal_bf16_local_softcap_sinks"
    assert spec.to_dict()["local"] and spec.to_dict()["sinks"]
    plain = KernelSpec("gqa", 128, 128, True, "bf16")
    assert plain.to_dict() == {"variant": "gqa", "d_qk": 128, "d_v": 128, "causal": True, "dtype": "bf16",
                               "layout": "dense", "phase": "prefill"}     # the keys and hashes of stored kernels
    assert plain.label() == "gqa_d128x128_causal_bf16" and plain.features == ()
    assert "window64,0 softcap30 sinks" in p.label()


def test_a_problem_read_back_from_json_is_the_problem_written():
    import dataclasses
    import json

    from kernel_abi.spec import Problem

    for window in ((-1, -1), (128, 0)):
        p = Problem("gqa", 2, 8, 2, 512, 512, 64, 64, True, "bf16", window=window, sinks=True)
        assert Problem(**json.loads(json.dumps(dataclasses.asdict(p)))) == p
