"""Joining or starting the Ray cluster, and pinning GPU tasks to the requested accelerator type."""
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


def cpu_count() -> int:
    import ray

    return int(ray.cluster_resources().get("CPU", 1))
