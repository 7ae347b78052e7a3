"""A running two-node replica under every change to its fabric: the planner never fails.

Each test starts a two-node replica on fabric ``ib-a`` (built from the
cluster as it was), changes the cluster and the fleet one way, plans, applies
the plan and plans again. Whatever changed, planning returns a plan, no shard
is given an empty NCCL adapter list, and the replica is never destroyed
without a replacement — it moves, is replaced in place, or keeps running
with the reason it should move (cases 41, 48 and 50–56 hold the exact
outcomes of the main ones).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from plan_builders import apply, cluster_from, fleet_from

from llmgw.fleet.types import Demand
from llmgw.planning import outputs, plans

NOW = 1_700_000_000.0
Cluster = dict[str, Any]


def base(engine: str) -> Cluster:
    nodes = {f"gpu-{i}": {"address": f"10.0.1.{i}", "mgmt_interface": "eno1",
                          "gpus": [{"class": "h100-80g", "count": 8}],
                          "fabrics": {"ib-a": ["mlx5_0", "mlx5_1"]}} for i in (1, 2, 3)}
    profile = ({"engine": "vllm", "gpu_class": "h100-80g", "nodes": 2, "tensor_parallel": 8,
                "pipeline_parallel": 2} if engine == "vllm" else
               {"engine": "sglang", "gpu_class": "h100-80g", "nodes": 2, "tensor_parallel": 16})
    return {"fabrics": {"ib-a": {"kind": "roce", "gid_index": 3}}, "nodes": nodes,
            "models": {"m": {"source": "org/m", "profiles": [profile]}}}


def _other_fabric(c: Cluster) -> None:
    c["fabrics"]["ib-b"] = {"kind": "infiniband"}
    c["nodes"]["gpu-2"]["fabrics"] = {"ib-b": ["mlx5_0"]}


def _renamed(c: Cluster) -> None:
    c["fabrics"]["ib-z"] = c["fabrics"].pop("ib-a")
    for spec in c["nodes"].values():
        spec["fabrics"] = {"ib-z": spec["fabrics"]["ib-a"]}


def _removed(c: Cluster) -> None:
    c["fabrics"] = {}
    for spec in c["nodes"].values():
        spec.pop("fabrics")
    c["models"]["m"]["profiles"] = [{"engine": "vllm", "gpu_class": "h100-80g",
                                     "tensor_parallel": 8}]


CHANGES: dict[str, Callable[[Cluster], None]] = {
    "none": lambda c: None,
    "fabric-removed": _removed,
    "fabric-renamed": _renamed,
    "to-infiniband": lambda c: c["fabrics"].update({"ib-a": {"kind": "infiniband"}}),
    "gid-index-unset": lambda c: c["fabrics"]["ib-a"].pop("gid_index"),
    "min-adapters-2": lambda c: c["fabrics"]["ib-a"].update({"min_adapters": 2}),
    "node-off-fabric": lambda c: c["nodes"]["gpu-2"].pop("fabrics"),
    "node-on-another-fabric": _other_fabric,
    "adapters-redeclared": lambda c: c["nodes"]["gpu-2"]["fabrics"].update(
        {"ib-a": ["mlx5_7"]}),
    "adapter-undeclared": lambda c: c["nodes"]["gpu-2"]["fabrics"].update({"ib-a": ["mlx5_1"]}),
    "no-mgmt-interface": lambda c: c["nodes"]["gpu-2"].pop("mgmt_interface"),
    "node-removed": lambda c: c["nodes"].pop("gpu-2"),
    "head-removed": lambda c: c["nodes"].pop("gpu-1"),
    "cordoned": lambda c: c["nodes"]["gpu-2"].update({"cordoned": True}),
    "one-node-profile": lambda c: c["models"]["m"].update({"profiles": [
        {"engine": "vllm", "gpu_class": "h100-80g", "tensor_parallel": 8}]}),
    "one-node-profile-first": lambda c: c["models"]["m"]["profiles"].insert(0, {
        "engine": "vllm", "gpu_class": "h100-80g", "tensor_parallel": 8}),
}

FLEETS: dict[str, dict[str, Any]] = {
    "healthy": {},
    "fabric-down": {"gpu-2": {"fabrics_down": {"ib-a": "mlx5_0: port 1 is DOWN"}}},
    "adapters-down": {"gpu-2": {"adapters_down": {"ib-a": ["mlx5_0", "mlx5_1"]}}},
    "unreachable": {"gpu-2": {"unreachable": "connection refused"}},
    "no-report": {"gpu-2": {"absent": True}},
}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("unit_state", ["ready", "failed"])
@pytest.mark.parametrize("fleet_state", sorted(FLEETS))
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_the_planner_copes_with_every_fabric_change(
        change: str, fleet_state: str, unit_state: str, engine: str) -> None:
    before = base(engine)
    after = copy.deepcopy(before)
    CHANGES[change](after)
    cluster = cluster_from(after)
    state = FLEETS[fleet_state]
    running = [{"model": "m", "replica": 0, "fabric": "ib-a",
                "on": {"gpu-1": list(range(8)), "gpu-2": list(range(8))},
                "states": {"gpu-2": unit_state}}]
    # The units were started from the cluster as it was; nodes without a
    # report are dropped from what the fleet says afterwards.
    seen = fleet_from(cluster_from(before),
                      {n: o for n, o in state.items() if not o.get("absent")}, running, NOW)
    seen = seen.model_copy(update={"nodes": {
        n: r for n, r in seen.nodes.items() if not state.get(n, {}).get("absent")}})

    plan = plans.plan(cluster, seen, NOW, Demand())
    assert outputs.text(plan) and outputs.markdown(plan)
    destroyed = [c for c in plan.changes if c.action == "destroy" and c.model == "m"]
    replaced = [c for c in plan.changes if c.action == "replace" and c.model == "m"]
    if change not in ("node-removed", "head-removed"):  # those units are orphans
        assert not destroyed, [c.reasons for c in destroyed]
    assert all(c.shards for c in replaced)
    # NCCL is never pointed at no adapter at all ("=" alone).
    assert all(s.spec["env"].get("NCCL_IB_HCA") != "=" for c in plan.changes for s in c.shards)
    again = plans.plan(cluster, apply(seen, plan, NOW + 60), NOW + 60, Demand())
    assert outputs.text(again)
