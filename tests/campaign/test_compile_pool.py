"""Where compile tasks run (cluster.CompilePool): on the CPU-only nodes when the cluster has any, else on the
CPUs the GPU trials leave free, as on one GPU host."""

import json
import os
import subprocess
import sys

import pytest

from tuner.campaign.cluster import MAX_SLOTS_PER_NODE, compile_pool_of

from .conftest import REPO


def node(node_id: str, cpus: float, gpus: float = 0, **extra) -> dict:
    resources = {"CPU": cpus, **({"GPU": gpus} if gpus else {}), **extra}
    return {"NodeID": node_id, "Alive": True, "Resources": resources}


def test_without_cpu_only_nodes_the_gpu_hosts_free_cpus_compile_wherever_ray_puts_them():
    host = compile_pool_of([node("gpu-host", 16, 1, **{"accelerator_type:H100": 1})], gpu_slots=4)
    assert (host.slots, host.dedicated) == (12, False)          # 16 CPUs - 4 GPU trial processes
    assert host.place({}) is None and host.task_options(None) == {}
    two = compile_pool_of([node("a", 32, 1), node("b", 32, 1)], gpu_slots=8)
    assert two.slots == MAX_SLOTS_PER_NODE and not two.dedicated
    assert compile_pool_of([node("small", 2, 2)], gpu_slots=8).slots == 2   # never fewer than 2


def test_cpu_only_nodes_take_every_compile_and_their_cpus_are_the_slots():
    nodes = [node("head", 4), node("gpu-a", 16, 1), node("gpu-b", 16, 1), node("cpu-big", 64), node("no-cpu", 0)]
    pool = compile_pool_of(nodes, gpu_slots=8)
    assert pool.dedicated and pool.nodes == (("head", 4), ("cpu-big", MAX_SLOTS_PER_NODE))
    assert pool.slots == 4 + MAX_SLOTS_PER_NODE
    assert "CPU-only" in pool.describe()


def test_a_unit_goes_to_the_cpu_only_node_with_the_most_free_slots():
    pool = compile_pool_of([node("x", 2), node("y", 4)], gpu_slots=4)
    assert pool.place({}) == "y"
    assert pool.place({"y": 2}) == "x"                    # 2 free on each: the first listed
    assert pool.place({"x": 2, "y": 3}) == "y"
    assert pool.place({"x": 3, "y": 5}) == "x"            # all full (one batch can split in two units): still pinned
    real = "ab" * 28                                      # a Ray node id
    strategy = compile_pool_of([node(real, 2)], gpu_slots=4).task_options(real)["scheduling_strategy"]
    assert strategy.node_id == real and strategy.soft     # a node that died: Ray runs the unit elsewhere


@pytest.mark.slow
def test_multinode_cluster_compiles_on_the_cpu_only_node_and_trials_stay_on_the_gpu_nodes(tmp_path):
    """ray.cluster_utils.Cluster: a head and a second node with a fake H100 each, then a CPU-only node joins.
    The node ids the trials recorded: before it joined, compiles ran on the GPU nodes (as today); after,
    every compile task ran on the CPU-only node and every GPU trial on the H100 nodes."""
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "tests.campaign.multinode_campaign", str(tmp_path)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    gpu_nodes = {out["nodes"]["head"], out["nodes"]["gpu"]}
    before, after = out["without_cpu_node"], out["with_cpu_node"]
    assert before["rc"] == 0 and before["measured"] >= 3
    assert set(before["compile_nodes"]) <= gpu_nodes and set(before["trial_nodes"]) <= gpu_nodes
    assert after["rc"] == 0 and after["measured"] >= 3 and after["compiled"] >= after["measured"]
    assert after["compile_nodes"] == [out["nodes"]["cpu"]]
    assert set(after["trial_nodes"]) <= gpu_nodes
    assert after["slots"] == 2                              # the CPU-only node's 2 CPUs
