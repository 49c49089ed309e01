"""The campaign's CPU work as Ray tasks: compile batches, spread over the cluster's CPUs.

The GPU side (verify + benchmark, one fresh process per trial) is the GPU workers' job: workers.py.
"""
from __future__ import annotations

import ray

from .backends import replay_fault


@ray.remote(num_cpus=1, max_retries=1)
def compile_batch(items: list, programs: dict, spec, profile_name: str, cache_dir: str, timeout: float,
                  fake_replay: str | None) -> list[dict]:
    """Translate and compile one batch of candidates into cubins; one result dict per item, in order.

    ``items`` are ``(trial_number, params_dict, schedule)``; ``programs`` maps each schedule (tl.SCHEDULES
    key) to its TL program. With ``fake_replay`` (replay backend without real compiles) nothing is
    compiled: the replay file decides which candidates "fail to compile".
    """
    if fake_replay is not None:
        return [_fake_compile(number, params, schedule, fake_replay) for number, params, schedule in items]
    return _real_compile(items, programs, spec, profile_name, cache_dir, timeout)


def _fake_compile(number: int, params: dict, schedule: str, replay_path: str) -> dict:
    from translate.params import KernelParams

    key = KernelParams.from_dict(params).key()
    if replay_fault(replay_path, params, schedule) == "compile":
        return {"trial": number, "ok": False, "error": "compile error (recorded): ptxas fatal: "
                "Entry function uses too much shared data", "error_kind": "compile"}
    return {"trial": number, "ok": True, "kernel_name": f"replay_{schedule}_{key}", "cubin": f"REPLAY:{key}".encode(),
            "meta": {"replay": True, "key": key}, "source": f"// replay backend: {schedule}:{key} was not compiled\n",
            "registers": None, "spill_stores": None}


def _real_compile(items, programs, spec, profile_name, cache_dir, timeout) -> list[dict]:
    from hardware_profiles import load_profile
    from translate import generate
    from translate.nvcc import compile_kernels
    from translate.params import KernelParams

    profile = load_profile(profile_name)
    results: list[dict | None] = [None] * len(items)
    generated = []
    for i, (number, params, schedule) in enumerate(items):
        try:
            if schedule not in programs:
                raise ValueError(f"no TL program for schedule {schedule!r} (have: {', '.join(programs)})")
            generated.append((i, generate(programs[schedule], KernelParams.from_dict(params), profile, spec)))
        except Exception as exc:  # a parameter set the translator refuses cannot work
            results[i] = {"trial": number, "ok": False, "error": f"translate: {exc}", "error_kind": "translate"}
    if generated:
        compiled = compile_kernels([k for _, k in generated], profile.nvcc_arch, cache_dir=cache_dir,
                                   timeout=timeout, jobs=1, batch_size=len(generated))
        for (i, kernel), cr in zip(generated, compiled):
            number = items[i][0]
            if not cr.ok:
                results[i] = {"trial": number, "ok": False, "error": f"compile: {cr.error_kind}: {cr.log[-1500:]}",
                              "error_kind": cr.error_kind}
                continue
            results[i] = {"trial": number, "ok": True, "kernel_name": kernel.name, "cubin": cr.cubin,
                          "meta": kernel.meta(), "source": kernel.source, "registers": cr.registers,
                          "spill_stores": cr.spill_stores}
    return results  # type: ignore[return-value]
