"""Two replay campaigns on one local multi-node Ray cluster with fake resources (ray.cluster_utils.Cluster):

1. a head node and a second node with one fake H100 each (GPU resource and accelerator label), no CPU-only
   node: compiles go wherever Ray puts them, as on one GPU host;
2. the same cluster after a CPU-only node joined: every compile task is pinned to it (cluster.CompilePool),
   the trials stay on the GPU nodes.

Prints one JSON line: the node ids by role and, per campaign, the nodes its compile tasks and its GPU trials
ran on (the node ids the trials recorded), its compile slots and its exit code.

    python -m tests.campaign.multinode_campaign STUDY_DIR

Run from the repository root (the test does, tests/campaign/test_compile_pool.py): its own cluster, not
the test session's.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

H100 = {"ray.io/accelerator-type": "H100"}
STUDY = "h100-mha-bf16-d128-causal"


def _wait_alive(count: int, timeout: float = 60.0) -> None:
    import ray

    end = time.time() + timeout
    while sum(1 for n in ray.nodes() if n["Alive"]) < count:
        if time.time() > end:
            raise TimeoutError(f"{count} nodes did not come up")
        time.sleep(0.2)


def _campaign(study_dir: Path, address: str) -> dict:
    import optuna

    from tests.campaign.conftest import replay_options
    from tuner.campaign import run_campaign
    from tuner.campaign.cluster import compile_pool
    from tuner.campaign.study import make_storage

    rc = run_campaign(replay_options(study_dir, trials=4, ray_address=address, gpu_overlap=1))
    study = optuna.load_study(study_name=STUDY, storage=make_storage(None, study_dir, STUDY))
    compiled = [t.user_attrs["compile"]["node_id"] for t in study.trials if (t.user_attrs.get("compile") or {}).get("node_id")]
    measured = [t.user_attrs["node_id"] for t in study.trials if t.user_attrs.get("node_id")]
    return {"rc": rc, "compile_nodes": sorted(set(compiled)), "compiled": len(compiled),
            "trial_nodes": sorted(set(measured)), "measured": len(measured), "slots": compile_pool(2).slots}


def main(study_dir: str) -> int:
    os.environ["RAY_AUTH_MODE"] = "disabled"
    import ray
    from ray.cluster_utils import Cluster

    small = {"object_store_memory": 80 * 1024 * 1024, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 1, "labels": H100, **small})
    try:
        gpu_node = cluster.add_node(num_cpus=1, num_gpus=1, labels=H100, **small)
        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
        _wait_alive(2)
        nodes = {"head": cluster.head_node.node_id, "gpu": gpu_node.node_id}
        without = _campaign(Path(study_dir) / "without-cpu-node", cluster.address)
        cpu_node = cluster.add_node(num_cpus=2, **small)
        _wait_alive(3)
        nodes["cpu"] = cpu_node.node_id
        with_cpu = _campaign(Path(study_dir) / "with-cpu-node", cluster.address)
        print(json.dumps({"nodes": nodes, "without_cpu_node": without, "with_cpu_node": with_cpu}), flush=True)
        return 0
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
