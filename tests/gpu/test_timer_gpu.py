"""The clean-flush timer (Timing l2_flush "read") on a GPU (marker gpu): on a call long enough that L2's state is
noise, it reads what do_bench reads; on a short memory-bound call it reads no more than do_bench's dirty flush."""
import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]

from tuner.measure.timer import Timing, time_ms  # noqa: E402


def test_read_flush_times_a_long_copy_as_do_bench_does():
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    zero = time_ms(lambda: dst.copy_(src), timing=Timing())
    read = time_ms(lambda: dst.copy_(src), timing=Timing(l2_flush="read"))
    assert 0.9 < read / zero < 1.1, (read, zero)


def test_read_flush_leaves_no_write_back_to_a_short_read():
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")   # 64 MB read, ~15 us: a decode call's size
    zero = time_ms(lambda: x.max(), timing=Timing())
    read = time_ms(lambda: x.max(), timing=Timing(l2_flush="read"))
    assert read <= zero * 1.02, (read, zero)
