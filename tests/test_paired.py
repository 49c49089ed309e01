"""The A/B tools' paired timing (tuner/measure/paired.py) on the CPU: round order, and an FP8 problem's calls."""
import torch

from kernel_abi.spec import Problem
from tuner.measure import paired


def test_each_round_rotates_the_order_so_none_is_always_first():
    roles = ["default", "a", "b"]
    assert [paired.rotated(roles, r)[0] for r in range(4)] == ["default", "a", "b", "default"]


def test_fp8_calls_rotate_e4m3_input_sets_and_pass_their_descales():
    """Each call reads the next of the e4m3 sets (the FP8 gate's inputs) with its three descales, as the runtime
    takes them: a kernel that forgot the descales could not be timed on another signature."""
    problem = Problem("gqa", 2, 4, 2, 64, 64, 64, 64, True, "fp8")
    seen = []

    def kernel(q, k, v, **scales):
        seen.append((q.data_ptr(), sorted(scales)))
        assert q.dtype == k.dtype == v.dtype == torch.float8_e4m3fn and q.shape == (2, 64, 4, 64)
        assert all(s.shape == (2, 2) and s.dtype == torch.float32 for s in scales.values())

    calls = paired.fp8_calls(problem, {"default": kernel, "changed": kernel}, sets=3, device="cpu")
    for _ in range(4):
        calls["default"]()
    assert [names for _, names in seen] == [["k_descale", "q_descale", "v_descale"]] * 4
    assert len({ptr for ptr, _ in seen[:3]}) == 3 and seen[3][0] == seen[0][0]   # three sets, then the first again


def test_a_timing_names_its_l2_flush():
    import pytest

    from tuner.measure.timer import Timing

    assert Timing().l2_flush == "zero" and Timing(l2_flush="read").l2_flush == "read"
    with pytest.raises(ValueError, match="l2_flush must be one of"):
        Timing(l2_flush="memset")
