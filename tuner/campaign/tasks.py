"""The campaign's CPU work as Ray tasks: compile batches, spread over the cluster's CPUs (its CPU-only nodes
when it has any: cluster.CompilePool places each task).

The GPU side (verify + benchmark, one fresh process per trial) is the GPU workers' job: workers.py.
"""
from __future__ import annotations

import ray

from .backends import replay_fault


@ray.remote(num_cpus=1, max_retries=1)
def compile_batch(items: list, kernels: list, arch: str, cache_dir: str, timeout: float,
                  fake_replay: str | None, spec: dict | None = None) -> list[dict]:
    """Compile one batch of candidates into cubins (one translation unit); one result dict per item, in order.

    ``items`` are ``(trial_number, params_dict, schedule)`` and ``kernels`` their translated kernels (the
    driver translates every candidate once: its source is the candidate's identity in the measurement cache).
    With ``fake_replay`` (replay backend without real compiles) nothing is compiled: the replay file decides
    which candidates "fail to compile".
    """
    if fake_replay is not None:
        import time

        started = time.time()
        results = [_fake_compile(number, params, schedule, fake_replay, spec) for number, params, schedule in items]
        timing = {"task_s": round(time.time() - started, 2), "unit_kernels": len(items), "nvcc_cached": False,
                  "unit_nvcc_s": 0.0, "node_id": _node_id()}   # nothing was compiled
        return [{**r, "timing": timing} for r in results]
    return _real_compile(items, kernels, arch, cache_dir, timeout)


def _fake_compile(number: int, params: dict, schedule: str, replay_path: str, spec: dict | None = None) -> dict:
    from search_spaces import params_from

    key = params_from(params, schedule).key()
    if replay_fault(replay_path, params, schedule) == "compile":
        return {"trial": number, "ok": False, "error": "compile error (recorded): ptxas fatal: "
                "Entry function uses too much shared data", "error_kind": "compile"}
    return {"trial": number, "ok": True, "kernel_name": f"replay_{schedule}_{key}", "cubin": f"REPLAY:{schedule}:{key}".encode(),
            # the campaign's kernel spec (``spec``, KernelSpec.to_dict): what a record and an export read its options
            # from, as from a real kernel's metadata
            "meta": {"replay": True, "key": key, **({"spec": spec} if spec is not None else {})},
            "source": f"// replay backend: {schedule}:{key} was not compiled\n",
            "registers": None, "spill_stores": None}


def _real_compile(items, kernels, arch, cache_dir, timeout) -> list[dict]:
    import time

    from translate.nvcc import compile_kernels

    started = time.time()   # host clock: the driver's submit-to-result time minus this task's is its queueing
    compiled = compile_kernels(kernels, arch, cache_dir=cache_dir, timeout=timeout, jobs=1, batch_size=len(kernels))
    task_s = round(time.time() - started, 2)
    node = _node_id()
    results = []
    for (number, _, _), kernel, cr in zip(items, kernels, compiled):
        timing = {"task_s": task_s, "unit_kernels": cr.batch_size, "nvcc_cached": cr.cached,
                  "unit_nvcc_s": round(cr.compile_seconds * cr.batch_size, 2), "node_id": node}
        if not cr.ok:
            results.append({"trial": number, "ok": False, "error": f"compile: {cr.error_kind}: {cr.log[-1500:]}",
                            "error_kind": cr.error_kind, "timing": timing})
            continue
        results.append({"trial": number, "ok": True, "kernel_name": kernel.name, "cubin": cr.cubin,
                        "meta": kernel.meta(), "source": kernel.source, "registers": cr.registers,
                        "spill_stores": cr.spill_stores, "timing": timing})
    return results


def _node_id() -> str:
    """The Ray node this task runs on (recorded with each trial's compile timing)."""
    return ray.get_runtime_context().get_node_id()
