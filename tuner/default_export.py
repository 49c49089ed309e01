"""An export of a GPU profile's default kernels, without a campaign: what `tune build` makes for each spec,
through the same gate as a campaign's kernels (tuner.verify on the GPU), stored and exported with
`tune export`'s code. The serving GPU tests and scripts/bench_serving.py serve it; ``compile_defaults``
(no GPU) fills the nvcc cache ahead of a device run.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from tuner.problem import KernelSpec, Problem


@dataclass(frozen=True)
class DefaultKernel:
    spec: KernelSpec
    generated: object            # translate.GeneratedKernel
    tl_text: str
    cubin: bytes | None
    log: str


def compile_defaults(gpu: str, specs: Sequence[KernelSpec], cache_dir: Path | None = None,
                     jobs: int | None = None) -> list[DefaultKernel]:
    """Translate and compile the profile's default kernel of each spec (the Hopper default is the
    warp-specialised schedule); CPU only."""
    import tl
    import translate
    from hardware_profiles import load_profile
    from tl.pipelines import has_roles
    from translate import nvcc
    from translate.defaults import default_params
    from tuner.build_cmd import resolve_schedule

    profile = load_profile(gpu)
    schedule = resolve_schedule(None, profile)
    gens, texts = [], []
    for spec in specs:
        text = tl.load_sketch(spec.variant, spec.causal, schedule, spec.layout)
        program = tl.parse_program(text)
        kind = "ws_overlap" if has_roles(program.statements) else "fa2"
        gens.append(translate.generate(program, default_params(profile, spec, kind), profile, spec))
        texts.append(text)
    results = nvcc.compile_kernels(gens, profile.nvcc_arch, jobs=jobs or os.cpu_count() or 2, batch_size=1,
                                   cache_dir=cache_dir)
    return [DefaultKernel(spec, g, t, r.cubin if r.ok else None, r.log) for spec, g, t, r in zip(specs, gens, texts,
                                                                                              results)]


def export_defaults(gpu: str, specs: Sequence[KernelSpec], out_dir: Path, *, cache_dir: Path | None = None,
                    buckets: Sequence[str] = ("s1024", "s4096"), study_dir: Path | None = None) -> list[Path]:
    """Compile, verify (the campaign's gate), time once, store under ``study_dir`` and export to ``out_dir``
    the default kernel of each spec, for every bucket in ``buckets``. RuntimeError naming the kernel when
    one fails to compile or verify: nothing unverified is exported."""
    import torch

    from hardware_profiles import load_profile
    from tuner import bench, runtime
    from tuner.export import collect_records, export_records
    from tuner.provenance import collect
    from tuner.store import KernelRecord, KernelStore
    from tuner.verify import verify
    from tuner.verify_varlen import verify_varlen

    profile = load_profile(gpu)
    device_name = torch.cuda.get_device_name()
    store = KernelStore(Path(study_dir) if study_dir is not None else Path(out_dir).parent / "default-studies")
    for k in compile_defaults(gpu, specs, cache_dir):
        if k.cubin is None:
            raise RuntimeError(f"{k.generated.name} did not compile: {k.log[-2000:]}")
        kernel = runtime.load_kernel(k.cubin, k.generated.meta())
        report = verify_varlen(kernel, k.spec) if k.spec.layout == "varlen" else verify(kernel, k.spec)
        if not report.passed:
            raise RuntimeError(f"{k.generated.name} failed verification: {report.reason}")
        problem = Problem(k.spec.variant, 4, 16, 16 if k.spec.variant == "mha" else 2, 4096, 4096, k.spec.d_qk,
                          k.spec.d_v, k.spec.causal, k.spec.dtype)
        if k.spec.layout == "varlen":   # the same tokens as 4 x 4096, packed
            q, kk, v = bench.make_inputs(problem, 1)[0]
            cu = torch.arange(0, 5 * 4096, 4096, dtype=torch.int32, device="cuda")
            packed = [t.flatten(0, 1) for t in (q, kk, v)]
            ms = bench.time_ms(lambda: kernel.varlen(*packed, cu, cu, 4096, 4096))
        else:
            ms = bench.measure_problem(kernel, problem)
        for bucket in buckets:
            store.offer(KernelRecord(
                arch=profile.arch_family, gpu=profile.name, device_name=device_name, variant=k.spec.variant,
                dtype=k.spec.dtype, d_qk=k.spec.d_qk, d_v=k.spec.d_v, causal=k.spec.causal, bucket=bucket,
                params=k.generated.params.to_dict(), kernel_name=k.generated.name, kernel_meta=k.generated.meta(),
                source=k.generated.source, cubin=k.cubin, tl_program=k.tl_text, verification=report.to_dict(),
                tflops=bench.tflops(problem, ms), baselines={}, problem={"seqlen_k": 4096},
                provenance=collect(profile, device_name), study="defaults", trial=-1, layout=k.spec.layout))
    records = collect_records(store.root, profile.arch_family, profile.name, None)
    return export_records(records, profile, Path(out_dir))
