"""Packed query heads (pack_gqa) on a Hopper GPU (marker gpu; skipped elsewhere): a tile's rows are (token, query
head) pairs of one KV head. Each kernel passes the verification gate (its ragged, sq != sk and many-tile shapes)
and, on more head layouts, every group that divides 64 (2 to 64 query heads a KV head) and groups that do not (3,
7: the same kernel then walks one query head a tile), and strided views through the heads-first TMA maps."""
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs a Hopper (sm_90) GPU")]

import tl  # noqa: E402
import translate  # noqa: E402
from hardware_profiles import load_profile  # noqa: E402
from translate import nvcc  # noqa: E402
from translate.defaults import default_params  # noqa: E402
from translate.params import KernelParams  # noqa: E402
from kernel_abi.spec import KernelSpec, Problem  # noqa: E402

# (id, spec, parameter changes on top of the Hopper default, with pack_gqa)
CASES = [
    ("mqa64c", KernelSpec("mqa", 64, 64, True, "bf16"), {}),                       # 192 x 128, three warpgroups
    ("mqa64c_m128", KernelSpec("mqa", 64, 64, True, "bf16"), {"block_m": 128, "num_warps": 8, "producer_regs": 24}),
    ("gqa128c", KernelSpec("gqa", 128, 128, True, "bf16"), {}),
    ("gqa128c_pingpong", KernelSpec("gqa", 128, 128, True, "bf16"), {"pingpong": True, "producer_regs": 56}),
    ("gqa128c_tiles", KernelSpec("gqa", 128, 128, True, "bf16"), {"persistent": False}),
    ("gqa128n", KernelSpec("gqa", 128, 128, False, "bf16"), {}),
    ("mqa128n_fp16", KernelSpec("mqa", 128, 128, False, "fp16"), {}),
]
# (batch, heads_q, heads_kv, seqlen_q, seqlen_k): groups 1 (a GQA kernel called as MHA), 2, 8, 16, 32, 64, and 3
# and 7 (Qwen2's 28/4), which do not divide 64
GROUP_SHAPES = [(2, 4, 4, 300, 300), (1, 4, 2, 1000, 1000), (2, 16, 2, 513, 700), (1, 16, 1, 1031, 1031),
                (1, 32, 1, 200, 450), (1, 64, 1, 333, 333), (3, 8, 1, 129, 100), (1, 6, 2, 300, 420),
                (1, 28, 4, 513, 513), (2, 3, 1, 257, 200)]


@pytest.fixture(scope="module")
def built():
    profile = load_profile("h200" if "h200" in torch.cuda.get_device_name().lower() else "h100")
    gens = []
    for _, spec, changes in CASES:
        base = default_params(profile, spec, "ws_overlap").to_dict()
        params = KernelParams.from_dict({**base, **changes, "pack_gqa": True})
        program = tl.parse_program(tl.load_sketch(spec.variant, spec.causal, "ws_overlap"))
        gens.append(translate.generate(program, params, profile, spec))
    cache = os.environ.get("KERNEL_CACHE_DIR")
    results = nvcc.compile_kernels(gens, "sm_90a", jobs=os.cpu_count() or 4, batch_size=2,
                                   cache_dir=Path(cache) if cache else None)
    return dict(zip([c[0] for c in CASES], zip(gens, results)))


def _load(built, case):
    from tuner.serving.launch import load_kernel

    gen, result = built[case]
    assert result.ok, result.log[-3000:]
    return gen, load_kernel(result.cubin, gen.meta())


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_packed_heads_pass_the_gate_on_every_group(built, case):
    from tuner.measure.verify import default_check_problems, verify

    gen, kernel = _load(built, case)
    spec = gen.spec
    problems = default_check_problems(spec) + [   # an MQA kernel: the shapes with one KV head
        Problem(spec.variant, b, hq, hkv, sq, sk, spec.d_qk, spec.d_v, spec.causal, spec.dtype)
        for b, hq, hkv, sq, sk in GROUP_SHAPES if spec.variant == "gqa" or hkv == 1]
    report = verify(kernel, spec, problems)
    assert report.passed, report.reason


def test_a_packed_kernel_reads_strided_views(built):
    """(b, h, s, d) storage seen as (b, s, h, d): the heads-first maps carry the heads' and tokens' strides."""
    _, kernel = _load(built, "gqa128c")
    q = torch.randn(2, 16, 300, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 2, 300, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 2, 300, 128, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    out = kernel(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    assert (out.float() - ref.transpose(1, 2).float()).norm() / ref.float().norm() < 1e-2
