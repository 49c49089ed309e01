"""Problems and the pure validation of kernel parameters."""
import pytest

from hardware_profiles import load_profile
from translate.params import KernelParams, smem_bytes, validate
from kernel_abi.spec import Problem, grid_problems, spec_for


def problem(**changes):
    base = dict(variant="mha", batch=2, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_k=4096, d_qk=128,
                d_v=128, causal=False, dtype="bf16")
    base.update(changes)
    return Problem(**base)


def test_grid_matches_paper_protocol():
    rows = grid_problems("mha", 64, "bf16")
    assert [(p.batch, p.seqlen_q) for p in rows[:6]] == [(32, 512), (16, 1024), (8, 2048), (4, 4096), (2, 8192), (1, 16384)]
    assert all(p.heads_q == 32 for p in rows) and {p.causal for p in rows} == {False, True}
    mla = grid_problems("mla", 192, "bf16", causal=True)[-1]
    assert (mla.d_qk, mla.d_v) == (192, 128)
    # FLOPs = 2*b*h*s^2*(d_qk+d_v), halved when causal (the anchors' convention)
    assert mla.flops == 2 * 1 * 16 * 16384**2 * (192 + 128) / 2


def test_problem_rejects_inconsistent_heads():
    with pytest.raises(ValueError, match="multiple of heads_kv"):
        problem(variant="gqa", heads_q=16, heads_kv=3)
    with pytest.raises(ValueError, match="mqa needs heads_kv == 1"):
        problem(variant="mqa", heads_kv=2)
    with pytest.raises(ValueError, match="unknown variant"):
        problem(variant="linear")


def test_spec_for_mla_and_bad_head_dim():
    assert spec_for("mla", None, "bf16", True).d_v == 128
    with pytest.raises(ValueError, match="choose 64, 96, 128, 192, 256"):
        spec_for("mha", 80, "bf16", True)


def test_validate_accepts_fa2_default_on_h100():
    assert validate(KernelParams(), load_profile("h100"), problem()) == []


@pytest.mark.parametrize(
    "gpu, params, prob, reason",
    [
        ("t4", KernelParams(), problem(dtype="fp16"), "mma_atom SM80_16x8x16 is not available on t4"),
        ("t4", KernelParams(mma_atom="SM75_16x8x8", g2s_atom="UniversalCopy128"), problem(), "no bf16"),
        ("t4", KernelParams(mma_atom="SM75_16x8x8", g2s_atom="UniversalCopy128", block_n=128),
         problem(dtype="fp16"), "exceeds the 64 KB per-block limit"),
        ("h100", KernelParams(block_m=64, num_warps=8), problem(), "multiple of 16 x num_warps"),
        ("h100", KernelParams(block_n=40), problem(), "multiple of 16"),
        ("a100", KernelParams(block_m=256, block_n=128, kv_stages=2), problem(), "exceeds the 163 KB"),
    ],
)
def test_validate_rejects_with_reason(gpu, params, prob, reason):
    errors = validate(params, load_profile(gpu), prob)
    assert any(reason in e for e in errors), errors


def test_smem_counts_q_and_kv_stages():
    p = problem(variant="mla", d_qk=192, d_v=128)
    assert smem_bytes(KernelParams(block_m=128, block_n=64, kv_stages=2), p) == (128 * 192 + 2 * 64 * 320) * 2


def test_params_round_trip_and_unknown_field():
    params = KernelParams(block_n=128, q_in_regs=True)
    assert KernelParams.from_dict(params.to_dict()) == params
    with pytest.raises(ValueError, match="unknown kernel parameter"):
        KernelParams.from_dict({"block_k": 32})
