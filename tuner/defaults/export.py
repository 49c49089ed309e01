"""An export of a GPU profile's default kernels, without a campaign: what `tune build` makes for each spec,
through the same gate as a campaign's kernels (tuner.measure.verify on the GPU), stored and exported with
`tune export`'s code. A decode spec (phase decode, with or without options) gets `tune build --phase decode`'s
kernel, the decode gate, and a record per decode bucket (a config of phase decode, its features in the metadata). The serving GPU tests and scripts/bench_serving.py serve it; ``compile_defaults``
(no GPU) fills the nvcc cache ahead of a device run.

Dense kernels are stored under the key-length buckets given. Varlen and paged kernels are stored under the
serving buckets (tuner/measure/mixes.py) of their layout's mixes, each timed on its own mix (paged: at each page size
of ``page_sizes``), after the gate of packed sequences (tuner.measure.verify_varlen: its paged mixes for a paged
kernel). ``SERVING_SPECS`` are the serving kernels the GPU tests export beside the dense ones.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from kernel_abi.spec import KernelSpec, Problem

SERVING_LAYOUTS = ("varlen", "paged")
SERVING_SPECS = (KernelSpec("gqa", 128, 128, True, "bf16", "varlen"),
                 KernelSpec("gqa", 128, 128, True, "bf16", "paged"))


@dataclass(frozen=True)
class DefaultKernel:
    spec: KernelSpec
    generated: object            # translate.GeneratedKernel
    tl_text: str
    cubin: bytes | None
    log: str
    buckets: tuple[str, ...] | None = None   # the dense buckets whose default this is; None: every bucket asked
    page_sizes: tuple[int, ...] | None = None   # paged: the page sizes whose default this is; None: every one asked


def compile_defaults(gpu: str, specs: Sequence[KernelSpec], cache_dir: Path | None = None,
                     jobs: int | None = None, buckets: Sequence[str] | None = None,
                     page_sizes: Sequence[int] | None = None) -> list[DefaultKernel]:
    """Translate and compile the profile's default kernel of each spec (the Hopper default is the
    warp-specialised schedule); with ``buckets``, a warp-specialised dense spec gets one kernel per distinct
    default of those buckets (tuner/defaults/table.py); with ``page_sizes``, a paged spec one kernel per distinct
    default of those page sizes (translate.defaults.WHOLE_TILE_PAGES). CPU only."""
    import tl
    import translate
    from hardware_profiles import load_profile
    from tl.pipelines import has_roles
    from translate import nvcc
    from translate.defaults import default_params
    from tuner.defaults.table import applies_to, group_buckets
    from tuner.build import resolve_schedule

    profile = load_profile(gpu)
    schedule = resolve_schedule(None, profile)
    items = []   # (spec, generated, sketch text, buckets served)
    for spec in specs:
        decode = spec.phase == "decode"
        text = tl.load_sketch(spec.variant, spec.causal, "decode" if decode else schedule, spec.layout)
        if spec.features:   # the reference sketch with the statements of the spec's options (tl/options.py)
            from tl.options import with_options

            text = tl.format_program(with_options(tl.parse_program(text), spec.local, spec.softcap, spec.sinks))
        program = tl.parse_program(text)
        if decode:          # `tune build --phase decode`'s kernel: the decode sketch and parameters
            from translate.decode.params import default_decode_params

            items.append((spec, translate.generate(program, default_decode_params(spec, _heads(spec.variant)[0],
                                                                                  profile), profile, spec),
                          text, None, None))
            continue
        kind = "ws_overlap" if has_roles(program.statements) else "fa2"
        if spec.layout == "paged" and page_sizes:
            by_params: dict[str, tuple] = {}   # key -> (params, page sizes), in the order first asked
            for page in page_sizes:
                params = default_params(profile, spec, kind, page_size=page)
                by_params.setdefault(params.key(), (params, []))[1].append(page)
            for params, pages in by_params.values():
                items.append((spec, translate.generate(program, params, profile, spec), text, None, tuple(pages)))
            continue
        if buckets is None or not applies_to(spec, kind):
            items.append((spec, translate.generate(program, default_params(profile, spec, kind), profile, spec), text,
                          None, None))
            continue
        for params, served in group_buckets(profile, spec, buckets, kind):
            items.append((spec, translate.generate(program, params, profile, spec), text, tuple(served), None))
    results = nvcc.compile_kernels([item[1] for item in items], profile.nvcc_arch, jobs=jobs or os.cpu_count() or 2,
                                   batch_size=1, cache_dir=cache_dir)
    return [DefaultKernel(spec, g, t, r.cubin if r.ok else None, r.log, served, pages)
            for (spec, g, t, served, pages), r in zip(items, results)]


def compile_changes(gpu: str, items: Sequence[tuple[KernelSpec, dict[str, dict]]], cache_dir: Path | None = None,
                    schedule: str = "ws_overlap") -> list[dict[str, tuple]]:
    """The profile's default kernel of each spec with each named change of its KernelParams fields (``{}``: the
    default itself), translated from ``schedule``'s sketch and compiled in one nvcc pool, a kernel a unit (each
    its own cubin); per item, ``{name: (GeneratedKernel, CompileResult)}`` in the order given. The A/B scripts
    (param_ab_check, dense_profile, bench_serving --variants) build their kernels here; CPU only."""
    import tl
    import translate
    from hardware_profiles import load_profile
    from translate import nvcc
    from translate.defaults import default_params
    from translate.params import KernelParams

    profile = load_profile(gpu)
    gens: list[tuple[int, str, object]] = []
    for i, (spec, changes) in enumerate(items):
        program = tl.parse_program(tl.load_sketch(spec.variant, spec.causal, schedule, spec.layout))
        base = default_params(profile, spec, schedule).to_dict()
        gens += [(i, name, translate.generate(program, KernelParams.from_dict({**base, **change}), profile, spec))
                 for name, change in changes.items()]
    results = nvcc.compile_kernels([g for _, _, g in gens], profile.nvcc_arch, batch_size=1, cache_dir=cache_dir)
    built: list[dict[str, tuple]] = [{} for _ in items]
    for (i, name, gen), res in zip(gens, results):
        built[i][name] = (gen, res)
    return built


def load_verified(built: dict[str, tuple], spec: KernelSpec, label: str) -> dict:
    """{name: loaded kernel} of one compile_changes item's kernels that built and passed the gate (tuner.measure.verify);
    each verdict is printed as "LABEL NAME: ...". The A/B scripts time only these (GPU)."""
    from tuner.serving.launch import load_kernel
    from tuner.measure.verify import verify

    kernels = {}
    for name, (gen, res) in built.items():
        if not res.ok:
            print(f"{label} {name}: {gen.name} did not compile: {res.log[-400:]}", flush=True)
            continue
        kernel = load_kernel(res.cubin, gen.meta())
        report = verify(kernel, spec)
        print(f"{label} {name}: {gen.name} regs {res.registers} spills {res.spill_stores} "
              f"verified={report.passed} {report.reason or ''}", flush=True)
        if report.passed:
            kernels[name] = kernel
    return kernels


def _heads(variant: str) -> tuple[int, int]:
    return 16, 16 if variant == "mha" else 2     # what the dense kernels were always timed with


# The option values a kernel built with options is timed with (its verification covers the edge values): a
# window of 1024 keys (the Gemma 3 / Mistral scale), Gemma 2's cap of 50, and sinks (their values cost nothing).
TIMED_WINDOW = 1024
TIMED_SOFTCAP = 50.0


def timed_values(spec: KernelSpec) -> tuple:
    """(window, softcap) a kernel of ``spec`` is timed with ((-1, -1) and 0 where it has none)."""
    window = (TIMED_WINDOW, 0 if spec.causal else TIMED_WINDOW) if spec.local else (-1, -1)
    return window, TIMED_SOFTCAP if spec.softcap else 0.0


def timed_options(spec: KernelSpec, heads_q: int, device: str = "cuda") -> dict:
    """The keyword arguments of a timed call of a kernel of ``spec`` (none for a plain kernel)."""
    out = {}
    window, softcap = timed_values(spec)
    if spec.local:
        out["window_size"] = window
    if spec.softcap:
        out["softcap"] = softcap
    if spec.sinks:
        import torch

        out["sinks"] = torch.zeros(heads_q, dtype=torch.float32, device=device)
    return out


def serving_call(kernel, problem, device: str = "cuda", options: dict | None = None):
    """``() -> out`` running ``kernel`` on random inputs of a ServingProblem: packed sequences, or (paged) their
    keys in a shuffled cache of ``problem.page_size`` rows a page; ``options`` the kernel's option arguments."""
    options = options or {}
    import torch

    if problem.dtype == "fp8":   # e4m3 with descales (no options): the benchmark's own inputs and call
        from tuner.measure.serving import ours_call
        from tuner.measure.serving_inputs import make_mix_inputs

        return ours_call(kernel, problem, make_mix_inputs(problem, device))
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[problem.dtype]
    g = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dt)

    def offsets(lengths):
        return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)

    q = randn(problem.total_q, problem.heads_q, problem.d_qk)
    cu_q, max_q = offsets(problem.seqlens_q), problem.max_seqlen_q
    if problem.layout == "varlen":
        k, v = randn(problem.total_k, problem.heads_kv, problem.d_qk), randn(problem.total_k, problem.heads_kv,
                                                                             problem.d_v)
        cu_k = offsets(problem.seqlens_k)
        return lambda: kernel.varlen(q, k, v, cu_q, cu_k, max_q, problem.max_seqlen_k, **options)
    page = problem.page_size
    per = max(-(-n // page) for n in problem.seqlens_k)
    table = torch.randperm(problem.batch * per).to(device=device, dtype=torch.int32).view(problem.batch, per)
    kc = randn(problem.batch * per, page, problem.heads_kv, problem.d_qk)
    vc = randn(problem.batch * per, page, problem.heads_kv, problem.d_v)
    used = torch.tensor(problem.seqlens_k, dtype=torch.int32, device=device)
    return lambda: kernel.paged(q, kc, vc, cu_q, used, table, max_q, **options)


def _decode_measurements(kernel, spec: KernelSpec, page_sizes: Sequence[int]):
    """(bucket, TFLOPS, the problem measured) of a decode kernel: each decode bucket's representative call (a
    campaign's problems: tuner.measure.decode_problem), at each page size of ``page_sizes`` when paged, with the
    timed options of a kernel built with them."""
    from tuner.measure import decode, timer
    from tuner.measure.decode_problem import decode_problems

    hq, hkv = _heads(spec.variant)
    window, softcap = timed_values(spec)
    out = []
    for page in (page_sizes if spec.layout == "paged" else (None,)):
        for problem in decode_problems(spec.variant, hq, hkv, spec.d_qk, spec.d_v, spec.causal, spec.dtype, page,
                                       window, softcap, spec.sinks):
            x = decode.problem_inputs(problem, "cuda")
            ms = timer.time_ms(decode.ours_call(kernel, problem, x))
            out.append((problem.bucket, decode.problem_tflops(problem, ms), problem.to_dict()))
            del x
    return out


def _measurements(kernel, spec: KernelSpec, buckets: Sequence[str], page_sizes: Sequence[int]):
    """(bucket, TFLOPS, the problem measured) of one kernel: each dense bucket timed on 4 x 4096; a serving
    kernel on each mix of its layout, under the mix's serving bucket; a decode kernel on each decode bucket."""
    from dataclasses import asdict

    from tuner.measure import dense
    from tuner.measure import timer
    from tuner.measure.mixes import serving_problems

    if spec.phase == "decode":
        return _decode_measurements(kernel, spec, page_sizes)
    hq, hkv = _heads(spec.variant)
    if spec.layout not in SERVING_LAYOUTS:
        options = timed_options(spec, hq)
        problem = Problem(spec.variant, 4, hq, hkv, 4096, 4096, spec.d_qk, spec.d_v, spec.causal, spec.dtype,
                          window=options.get("window_size", (-1, -1)), softcap=options.get("softcap", 0.0),
                          sinks=spec.sinks)
        value = dense.tflops(problem, dense.measure_problem(kernel, problem))
        return [(bucket, value, {"seqlen_k": 4096}) for bucket in buckets]
    out = []
    for page in (page_sizes if spec.layout == "paged" else (None,)):
        for problem in serving_problems(spec.layout, spec.variant, hq, hkv, spec.d_qk, spec.d_v, spec.causal,
                                        spec.dtype, page):
            ms = timer.time_ms(serving_call(kernel, problem, options=timed_options(spec, hq)))
            out.append((problem.bucket, problem.flops / (ms * 1e-3) / 1e12, asdict(problem)))
    return out


def export_defaults(gpu: str, specs: Sequence[KernelSpec], out_dir: Path, *, cache_dir: Path | None = None,
                    buckets: Sequence[str] = ("s1024", "s4096"), page_sizes: Sequence[int] = (16,),
                    study_dir: Path | None = None) -> list[Path]:
    """Compile, verify (the campaign's gate), time, store under ``study_dir`` and export to ``out_dir`` the
    default kernel of each spec: a dense one for every bucket in ``buckets`` (each bucket's own default where the
    profile's bucket table changes it: tuner/defaults/table.py), a varlen or paged one for the
    serving bucket of each mix of its layout (paged: at each page size of ``page_sizes``). RuntimeError naming
    the kernel when one fails to compile or verify: nothing unverified is exported."""
    import torch

    from hardware_profiles import load_profile
    from tuner.store.export import collect_records, export_records
    from tuner.store.provenance import collect
    from tuner.store.records import KernelRecord, KernelStore

    profile = load_profile(gpu)
    device_name = torch.cuda.get_device_name()
    store = KernelStore(Path(study_dir) if study_dir is not None else Path(out_dir).parent / "default-studies")
    for k in compile_defaults(gpu, specs, cache_dir, buckets=buckets, page_sizes=page_sizes):
        if k.cubin is None:
            raise RuntimeError(f"{k.generated.name} did not compile: {k.log[-2000:]}")
        kernel, report = _load_and_verify(k, page_sizes)
        if not report.passed:
            raise RuntimeError(f"{k.generated.name} failed verification: {report.reason}")
        for bucket, value, problem in _measurements(kernel, k.spec, k.buckets or buckets, k.page_sizes or page_sizes):
            store.offer(KernelRecord(
                arch=profile.arch_family, gpu=profile.name, device_name=device_name, variant=k.spec.variant,
                dtype=k.spec.dtype, d_qk=k.spec.d_qk, d_v=k.spec.d_v, causal=k.spec.causal, bucket=bucket,
                params=k.generated.params.to_dict(), kernel_name=k.generated.name, kernel_meta=k.generated.meta(),
                source=k.generated.source, cubin=k.cubin, tl_program=k.tl_text, verification=report.to_dict(),
                tflops=value, baselines={}, problem=problem,
                provenance=collect(profile, device_name), study="defaults", trial=-1, layout=k.spec.layout,
                phase=k.spec.phase))
    records = collect_records(store.root, profile.arch_family, profile.name, None)
    return export_records(records, profile, Path(out_dir))


def _load_and_verify(k: DefaultKernel, page_sizes: Sequence[int]):
    """(the loaded kernel, its gate's report): the decode gate for a decode kernel (paged: at the first page size),
    the packed sequences' for a serving one, else the dense one (GPU)."""
    if k.spec.phase == "decode":
        from tuner.measure.verify_decode import verify_decode
        from tuner.serving.launch.decode_kernel import load_decode_kernel

        kernel = load_decode_kernel(k.cubin, k.generated.meta())
        return kernel, verify_decode(kernel, k.spec, page_size=page_sizes[0] if k.spec.layout == "paged" else None)
    from tuner.measure.verify import verify
    from tuner.measure.verify_varlen import verify_varlen
    from tuner.serving import launch

    kernel = launch.load_kernel(k.cubin, k.generated.meta())
    return kernel, verify_varlen(kernel, k.spec) if k.spec.layout in SERVING_LAYOUTS else verify(kernel, k.spec)
