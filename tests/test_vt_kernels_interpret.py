"""The Triton V^T copies (tuner/serving/launch/vt_kernels.py) run by Triton's interpreter on CPU tensors: at every FP8
head dim (96: the copies' 64-column tiles do not divide it) each writes the V^T the torch path writes, and nothing past
its head dim (a guard head after the written ones keeps its bytes: before the head dim was masked, the paged copy's
second tile at d96 wrote 32 rows of the next head's V^T). Marked slow; skipped where Triton is absent (CPU torch
wheels do not bring it: PYTHONPATH=/tmp/trsite36 gives Triton 3.6). The interpreter is chosen when Triton jits a
function, so each check runs in a process of its own with TRITON_INTERPRET=1."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytestmark = pytest.mark.slow

from kernel_abi.spec import FP8_HEAD_DIMS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GUARD = 7   # the bytes of the guard head (and of columns no copy writes)

CHECK = textwrap.dedent("""
    import sys
    import torch
    from tuner.serving.launch import paged_vt, plan
    from tuner.serving.launch import transpose_triton as tt

    d, order = int(sys.argv[1]), sys.argv[2]
    acc, h, guard = order == "accumulator", 3, {guard}
    torch.manual_seed(d)

    v = torch.randint(0, 255, (2, 100, h, d), dtype=torch.uint8)
    keys = plan._vt_keys(100, order)
    buf = torch.full((2, h + 1, d, -(-100 // plan.V_KEY_ALIGN) * plan.V_KEY_ALIGN), guard, dtype=torch.uint8)
    assert tt.transpose_into(buf[:, :h], v, keys, acc)
    assert torch.equal(buf[:, :h, :, :keys], plan.transposed_v(v, order=order).permute(0, 2, 1, 3)), "dense"
    assert bool((buf[:, h] == guard).all()), "dense: past the head dim"

    lens, align = [5, 0, 127, 33], 16
    cu = torch.tensor([0, 5, 5, 132, 165], dtype=torch.int32)
    packed = torch.randint(0, 255, (165, h, d), dtype=torch.uint8)
    want = plan.transposed_packed_v(packed, cu, len(lens), align, order=order)
    buf = torch.full((1, h + 1, d, want.shape[-1]), guard, dtype=torch.uint8)
    assert tt.transpose_packed_into(buf[:, :h], packed, cu, len(lens), align, acc)
    assert torch.equal(buf[:, :h], want.permute(0, 2, 1, 3)), "packed"
    assert bool((buf[:, h] == guard).all()), "packed: past the head dim"

    cache = torch.randint(0, 255, (40, 16, h, d), dtype=torch.uint8)
    table = torch.randperm(40)[:40].view(4, 10).to(torch.int32)
    starts = paged_vt.key_starts(torch.tensor(lens, dtype=torch.int32))
    keys = paged_vt.paged_vt_keys(len(lens), 160, align)
    want = paged_vt.transposed_paged_v(cache, table, starts, len(lens), keys, align, order=order)
    buf = torch.full((1, h + 1, d, keys), guard, dtype=torch.uint8)
    assert tt.transpose_paged_into(buf[:, :h], cache, table, starts, len(lens), align, acc)
    written = int(starts[-1]) + align * (len(lens) + 1) + tt.READ_PAST_END   # (the copy leaves the rest unwritten)
    assert torch.equal(buf[:, :h, :, :written], want.permute(0, 2, 1, 3)[..., :written]), "paged"
    assert bool((buf[:, h] == guard).all()), "paged: past the head dim"
    print("ok")
""").format(guard=GUARD)


@pytest.mark.parametrize("order", ["natural", "accumulator"])
@pytest.mark.parametrize("d", FP8_HEAD_DIMS)
def test_the_triton_copies_write_the_torch_v_t_and_nothing_past_the_head_dim(d, order):
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    run = subprocess.run([sys.executable, "-c", CHECK, str(d), order], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
