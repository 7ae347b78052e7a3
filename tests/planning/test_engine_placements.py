"""What the planner hands the engines: ports, addresses and GPUs of multi-node shards."""

from __future__ import annotations

from typing import Any

from plan_builders import apply, cluster_from, fleet_from

from llmgw.planning import plans
from llmgw.planning.types import Shard

NOW = 1_700_000_000.0
NODES: dict[str, Any] = {
    "gpu-01": {"address": "gpu-01.lab", "mgmt_address": "10.0.1.11", "mgmt_interface": "eno1",
               "gpus": [{"class": "h100-80g", "count": 8}], "fabrics": {"ib-a": ["mlx5_0"]}},
    "gpu-02": {"address": "10.0.1.12", "mgmt_interface": "eno1",
               "gpus": [{"class": "h100-80g", "count": 8}], "fabrics": {"ib-a": ["mlx5_0"]}},
}


def sglang_cluster(replicas: int) -> dict[str, Any]:
    return {
        "fabrics": {"ib-a": {"kind": "infiniband"}},
        "nodes": NODES,
        "models": {"qwen": {
            "source": "Qwen/Qwen2.5-72B-Instruct", "scaling": {"min": replicas, "max": replicas},
            "profiles": [{"engine": "sglang", "gpu_class": "h100-80g", "nodes": 2,
                          "tensor_parallel": 8}],
        }},
    }


def shards(data: dict[str, Any]) -> list[Shard]:
    cluster = cluster_from(data)
    plan = plans.plan(cluster, fleet_from(cluster, {}, [], NOW), NOW)
    return [s for change in plan.changes for s in change.shards]


def test_sglang_followers_on_one_node_get_their_own_health_ports() -> None:
    followers = [s for s in shards(sglang_cluster(2)) if s.rank > 0]
    assert len(followers) == 2 and {s.node for s in followers} == {"gpu-02"}
    ports = []
    for shard in followers:
        argv = shard.spec["argv"]
        assert argv[argv.index("--host") + 1] == "127.0.0.1"
        ports.append(int(argv[argv.index("--port") + 1]))
        assert shard.port is None  # not an API: nothing probes or routes to it
    assert len(set(ports)) == 2, ports


def test_a_placed_follower_keeps_its_port_on_the_next_plan() -> None:
    cluster = cluster_from(sglang_cluster(1))
    first = plans.plan(cluster, fleet_from(cluster, {}, [], NOW), NOW)
    fleet = apply(fleet_from(cluster, {}, [], NOW), first, NOW)
    again = plans.plan(cluster, fleet, NOW)
    assert again.changes == ()


def test_multi_node_rendezvous_and_host_ip_use_management_addresses() -> None:
    by_rank = {s.rank: s for s in shards(sglang_cluster(1))}
    head, follower = by_rank[0].spec, by_rank[1].spec
    assert "10.0.1.11:" in " ".join(head["argv"])  # mgmt_address, not the SSH name
    assert head["env"]["SGLANG_HOST_IP"] == "10.0.1.11"
    assert follower["env"]["SGLANG_HOST_IP"] == "10.0.1.12"  # address, an IP, by default


def test_an_engine_upgrade_replaces_the_replica_and_says_so() -> None:
    data = sglang_cluster(1)
    data["models"]["qwen"]["profiles"][0]["engine_version"] = "0.5.22"
    cluster = cluster_from(data)
    first = plans.plan(cluster, fleet_from(cluster, {}, [], NOW), NOW)
    fleet = apply(fleet_from(cluster, {}, [], NOW), first, NOW)
    assert {s.spec["engine_version"] for c in first.changes for s in c.shards} == {"0.5.22"}
    data["models"]["qwen"]["profiles"][0]["engine_version"] = "0.5.23"
    upgraded = cluster_from(data)
    [change] = plans.plan(upgraded, fleet, NOW).changes
    assert change.action == "replace"
    assert "engine version changed: 0.5.22 → 0.5.23" in change.reasons
