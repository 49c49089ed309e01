"""On a GPU: a real kernel goes translate -> nvcc -> verify -> store -> export -> loader, and the loader's
kernel path agrees with torch SDPA."""
import math

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _profile_of_this_gpu():
    from hardware_profiles import load_all_profiles

    name = torch.cuda.get_device_name()
    profiles = load_all_profiles()
    for p in profiles:
        if name in p.device_names:
            return p
    cc = torch.cuda.get_device_capability()
    same = [p for p in profiles if p.compute_capability == cc]
    if not same:
        pytest.skip(f"no hardware profile for {name} (compute capability {cc})")
    return same[0]


def _rel_err(out, ref) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def _inputs(b, sq, sk, hq, hkv, d, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, generator=g)
    return q, k, v


def build_kernel(profile, spec, tmp_path) -> dict:
    """The reference sketch with the profile's default parameters, translated and compiled."""
    import translate
    from translate import nvcc
    from translate.defaults import default_params
    from tuner.build import load_checked_program

    program, text, _, diagnostics = load_checked_program(spec.variant, spec.causal, None)
    assert program is not None and not diagnostics
    params = default_params(profile, spec)
    generated = translate.generate(program, params, profile, spec)
    compiled = nvcc.compile_kernel(generated, profile.nvcc_arch, cache_dir=tmp_path / "nvcc-cache")
    if compiled.error_kind == "nvcc-missing":
        pytest.skip(f"no toolchain here to build the kernel: {compiled.log.splitlines()[0] if compiled.log else ''}")
    assert compiled.ok, compiled.log[-4000:]
    return {"name": generated.name, "meta": generated.meta(), "source": generated.source, "cubin": compiled.cubin,
            "tl": text, "params": params.to_dict()}


def test_exported_kernel_runs_through_the_loader_and_matches_sdpa(tmp_path):
    runtime = pytest.importorskip("tuner.serving.launch.kernel")
    from tuner.store.export import run_export
    from tuner.serving import load_exported, sdpa_attention
    from kernel_abi.spec import KernelSpec, Problem
    from tuner.store.provenance import collect
    from tuner.store.records import KernelRecord, KernelStore

    profile = _profile_of_this_gpu()
    device_name = torch.cuda.get_device_name()
    spec = KernelSpec("mha", 128, 128, True, "bf16")
    built = build_kernel(profile, spec, tmp_path)

    # Verification in the protocol's spirit: fresh inputs, ragged and sq != sk shapes, fp32 reference.
    kernel = runtime.load_kernel(built["cubin"], built["meta"])
    errors = []
    for b, sq, sk, h in [(2, 1024, 1024, 8), (1, 77, 77, 4), (1, 100, 300, 4)]:
        q, k, v = _inputs(b, sq, sk, h, h, 128, seed=sq)
        ref = sdpa_attention(q.float(), k.float(), v.float(), causal=True)
        errors.append(_rel_err(kernel(q, k, v), ref))
    verification = {"passed": all(e < 2e-2 for e in errors), "max_rel_error": max(errors), "checks": errors}
    assert verification["passed"], errors

    problem = Problem("mha", 4, 16, 16, 4096, 4096, 128, 128, True, "bf16")
    q, k, v = _inputs(4, 4096, 4096, 16, 16, 128)
    for _ in range(3):
        kernel(q, k, v)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        kernel(q, k, v)
    end.record()
    torch.cuda.synchronize()
    tflops = problem.flops / (start.elapsed_time(end) / 10 * 1e-3) / 1e12
    assert math.isfinite(tflops) and tflops > 0

    store = KernelStore(tmp_path / "studies")
    for bucket in ("s1024", "s4096"):
        assert store.offer(KernelRecord(
            arch=profile.arch_family, gpu=profile.name, device_name=device_name, variant="mha", dtype="bf16",
            d_qk=128, d_v=128, causal=True, bucket=bucket, params=built["params"], kernel_name=built["name"],
            kernel_meta=built["meta"], source=built["source"], cubin=built["cubin"], tl_program=built["tl"],
            verification=verification, tflops=tflops, baselines={"flash": None, "cudnn": None, "efficient": None},
            problem={"seqlen_k": 4096}, provenance=collect(profile, device_name), study="gpu-test", trial=0))

    out = tmp_path / "export"
    assert run_export(gpu=profile.name, variant="mha", study_dir=tmp_path / "studies", out_dir=out) == 0
    attention = load_exported(out)

    for b, sq, sk, h in [(2, 1000, 1000, 8), (1, 333, 700, 16), (1, 3000, 3000, 4)]:
        q, k, v = _inputs(b, sq, sk, h, h, 128, seed=b * sq + sk)
        out_kernel = attention(q, k, v, causal=True)
        assert attention.last_path == "kernel", attention.last_reason
        out_sdpa = sdpa_attention(q, k, v, causal=True)
        assert out_kernel.shape == out_sdpa.shape
        assert _rel_err(out_kernel, out_sdpa) < 2e-2
        assert _rel_err(out_kernel, sdpa_attention(q.float(), k.float(), v.float(), causal=True)) < 2e-2
    assert attention.stats["kernel"] == 3

    # A call nobody exported (non-causal) goes to SDPA on the same GPU.
    q, k, v = _inputs(1, 128, 128, 4, 4, 128)
    torch.testing.assert_close(attention(q, k, v, causal=False), sdpa_attention(q, k, v, causal=False))
    assert attention.last_path == "sdpa"
