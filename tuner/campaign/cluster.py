"""Joining or starting the Ray cluster, pinning GPU tasks to the requested accelerator type, and placing the
compile tasks: on the CPU-only nodes when the cluster has any (compile workers), else on any CPU."""
from __future__ import annotations

import os
from dataclasses import dataclass

ACCEL_LABEL = "ray.io/accelerator-type"
ACCEL_RESOURCE_PREFIX = "accelerator_type:"


class ClusterError(RuntimeError):
    """The cluster cannot run this campaign (no such GPU type, cannot connect)."""


@dataclass(frozen=True)
class GpuPool:
    accelerator_type: str
    gpus: int                  # GPUs of that type over the alive nodes
    node_ids: tuple[str, ...]
    by_label: bool             # pin with label_selector (else the accelerator_type resource)

    def task_options(self) -> dict:
        if self.by_label:
            return {"label_selector": {ACCEL_LABEL: self.accelerator_type}}
        return {"accelerator_type": self.accelerator_type}


def connect(address: str | None, quiet: bool = True) -> None:
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        return
    try:
        if address:
            ray.init(address=address, log_to_driver=not quiet, logging_level="WARNING")
        else:
            # "local": always a fresh cluster, never one that happens to run on this machine
            ray.init(address="local", include_dashboard=False, log_to_driver=not quiet, logging_level="WARNING")
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterError(f"cannot {'join the Ray cluster at ' + address if address else 'start a local Ray cluster'}: {exc}") from None


def _node_types(node: dict) -> set[str]:
    types = set()
    label = (node.get("Labels") or {}).get(ACCEL_LABEL)
    if label:
        types.add(label)
    for res in (node.get("Resources") or {}):
        if res.startswith(ACCEL_RESOURCE_PREFIX):
            types.add(res[len(ACCEL_RESOURCE_PREFIX):])
    return types


def alive_nodes() -> list[dict]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def accelerator_types_present() -> dict[str, int]:
    """Accelerator type -> GPUs of that type over the alive nodes."""
    out: dict[str, int] = {}
    for node in alive_nodes():
        for t in _node_types(node):
            out[t] = out.get(t, 0) + int(node.get("Resources", {}).get("GPU", 0))
    return out


def gpu_pool(accelerator_type: str) -> GpuPool:
    nodes = [n for n in alive_nodes() if accelerator_type in _node_types(n)
             and n.get("Resources", {}).get("GPU", 0) >= 1]
    if not nodes:
        present = accelerator_types_present()
        listing = ", ".join(f"{t} ({n} GPU{'s' if n != 1 else ''})" for t, n in sorted(present.items())) or "none"
        raise ClusterError(
            f"the Ray cluster has no {accelerator_type} GPU; accelerator types present: {listing}. "
            f"Join a cluster with one (--ray-address), or use --dry-run to compile and validate without a GPU.")
    by_label = all((n.get("Labels") or {}).get(ACCEL_LABEL) == accelerator_type for n in nodes)
    return GpuPool(accelerator_type, int(sum(n["Resources"]["GPU"] for n in nodes)),
                   tuple(n["NodeID"] for n in nodes), by_label)


# nvcc units in flight per node (the cap one GPU host always had): each unit is one single-threaded nvcc of
# 0.9 GB (a lone Hopper kernel) to 2.6 GB (eight of different tiles in one unit; peak RSS, 2026-11-24), so 16
# stay under ~42 GB.
MAX_SLOTS_PER_NODE = 16


@dataclass(frozen=True)
class CompilePool:
    """Where the compile tasks run and how many run at once.

    A cluster with CPU-only nodes (no GPU resource) compiles there and nowhere else: every nvcc unit is
    pinned to one of them (``place``), so the GPU nodes' CPUs stay with the trial processes and the fork
    servers, and the compile slots are those nodes' CPUs (at most MAX_SLOTS_PER_NODE each). A cluster
    without any (one GPU host, the default local cluster) compiles on the CPUs the GPU trial slots leave
    free, wherever Ray puts the task, as before.
    """

    slots: int
    nodes: tuple[tuple[str, int], ...] = ()    # (node id, its compile slots) of the CPU-only nodes; () = any

    @property
    def dedicated(self) -> bool:
        return bool(self.nodes)

    def place(self, busy: dict[str, int]) -> str | None:
        """The CPU-only node with the most free compile slots given ``busy`` (node id -> units in flight
        there), the first listed on a tie; None when the pool has no CPU-only nodes (Ray places the task)."""
        free = [(cap - busy.get(node, 0), -i, node) for i, (node, cap) in enumerate(self.nodes)]
        return max(free)[2] if free else None

    def task_options(self, node: str | None) -> dict:
        """Ray options of a compile task placed on ``node`` (soft: if that node died, Ray runs it elsewhere)."""
        if node is None:
            return {}
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node, soft=True)}

    def describe(self) -> str:
        if not self.dedicated:
            return f"{self.slots} compile slot(s) on the cluster's CPUs"
        return f"{self.slots} compile slot(s) on {len(self.nodes)} CPU-only node(s)"


def compile_pool_of(nodes: list[dict], gpu_slots: int) -> CompilePool:
    """The compile pool of a cluster of alive ``nodes`` (ray.nodes() entries) whose GPU trials take
    ``gpu_slots`` trial processes, one CPU each (see CompilePool)."""
    cpu_only = [(n["NodeID"], int(n.get("Resources", {}).get("CPU", 0))) for n in nodes
                if not n.get("Resources", {}).get("GPU") and n.get("Resources", {}).get("CPU", 0) >= 1]
    if cpu_only:
        placed = tuple((node, min(MAX_SLOTS_PER_NODE, cpus)) for node, cpus in cpu_only)
        return CompilePool(sum(cap for _, cap in placed), placed)
    cpus = int(sum(n.get("Resources", {}).get("CPU", 0) for n in nodes)) or 1
    return CompilePool(max(min(2, cpus), min(MAX_SLOTS_PER_NODE, cpus - gpu_slots)))


def compile_pool(gpu_slots: int) -> CompilePool:
    return compile_pool_of(alive_nodes(), gpu_slots)
