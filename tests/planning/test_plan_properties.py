"""Properties over random fleets: plan() never fails, and a plan once applied is final.

For any cluster and fleet (random GPU classes and counts, NVLink topologies,
faulty GPUs, unreachable and cordoned nodes, fabrics up or down, models of
every engine on one or two nodes): planning never raises, every placed shard
sits on healthy GPUs of its class on a reachable node with no GPU given
twice, and planning again after the plan ran changes nothing — except
creating what waited for room a create-before-destroy replace gave back.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from plan_builders import apply, cluster_from, fleet_from

from llmgw.fleet.types import Fleet
from llmgw.planning import plans
from llmgw.planning.types import Plan
from llmgw.spec.models import Cluster

CLASSES = ("h100-80g", "a100-80g", "l40s-45g")
NOW = 1_700_000_000.0


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    node_count = draw(st.integers(1, 6))
    classes = draw(st.lists(st.sampled_from(CLASSES), min_size=1, max_size=2, unique=True))
    nodes: dict[str, Any] = {}
    fleet: dict[str, Any] = {}
    for i in range(node_count):
        name = f"n{i}"
        cpu_only = draw(st.booleans()) and i > 0
        spec: dict[str, Any] = {"address": f"10.0.0.{i + 1}", "mgmt_interface": "eno1",
                                "memory": f"{draw(st.sampled_from([8, 32, 256]))}GiB"}
        count = draw(st.sampled_from([1, 2, 4, 8]))
        if not cpu_only:
            spec["gpus"] = [{"class": draw(st.sampled_from(classes)), "count": count}]
        if draw(st.integers(0, 3)) > 0:
            spec["fabrics"] = {"ib-a": ["mlx5_0", "mlx5_1"]}
        spec["cordoned"] = draw(st.integers(0, 5)) == 0
        nodes[name] = spec
        override: dict[str, Any] = {"nvlink": draw(st.sampled_from(["all", "pairs", "none",
                                                                     "unknown"]))}
        if not cpu_only and draw(st.booleans()):
            override["ecc"] = [draw(st.integers(0, count - 1))]
        if draw(st.integers(0, 6)) == 0:
            override["unreachable"] = "connection refused"
        if "fabrics" in spec and draw(st.integers(0, 3)) == 0:
            override["fabrics_down"] = {"ib-a": "mlx5_0: no ACTIVE port"}
        fleet[name] = override
    models: dict[str, Any] = {}
    for i in range(draw(st.integers(1, 5))):
        engine = draw(st.sampled_from(["vllm", "sglang", "llama.cpp"]))
        profile: dict[str, Any] = {"engine": engine}
        if engine == "llama.cpp" and draw(st.booleans()):
            profile.update(cpu=True, min_memory_gb=draw(st.sampled_from([1, 16, 64])))
        else:
            profile["gpu_class"] = draw(st.sampled_from(classes))
            span = 1 if engine == "llama.cpp" else draw(st.sampled_from([1, 1, 2]))
            tp = draw(st.sampled_from([1, 2, 4]))
            profile.update(nodes=span, tensor_parallel=tp * span)
            if engine == "vllm" and span > 1:
                profile["multi_node"] = draw(st.sampled_from(["native", "ray"]))
        low = draw(st.integers(0, 2))
        models[f"m{i}"] = {
            "source": f"/models/m{i}.gguf" if engine == "llama.cpp" else f"org/m{i}",
            "scaling": {"min": low, "max": low + draw(st.integers(0, 2)) or 1},
            "profiles": [profile],
        }
    cluster = {"fabrics": {"ib-a": {"kind": "infiniband"}}, "nodes": nodes, "models": models}
    return cluster, fleet


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_plans_are_sound_and_final(scenario: tuple[dict[str, Any], dict[str, Any]]) -> None:
    data, overrides = scenario
    cluster = cluster_from(data)
    fleet = fleet_from(cluster, overrides, [], NOW)
    plan = plans.plan(cluster, fleet, NOW)
    event("something placed" if plan.changes else "nothing placed")
    event("multi-node placed" if any(len(c.shards) > 1 for c in plan.changes)
          else "no multi-node placed")
    taken: set[tuple[str, int]] = set()
    for change in plan.changes:
        for shard in change.shards:
            report = fleet.nodes[shard.node]
            assert report.reachable and not cluster.nodes[shard.node].cordoned
            gpus = {g.index: g for g in report.gpus}
            for index in shard.gpus:
                assert (shard.node, index) not in taken, "a GPU given twice"
                taken.add((shard.node, index))
                assert not gpus[index].faults
                assert gpus[index].gpu_class == shard.gpu_class
    later = NOW + 60
    running = apply(fleet, plan, later)
    again = plans.plan(cluster, running, later)
    assert [(c.action, c.model, c.replica) for c in again.changes] == []
    # Then a node stops answering (its units still known) and a GPU fails:
    # nothing is placed twice, no GPU is given to two shards, max holds.
    names = sorted(n for n, r in running.nodes.items() if r.reachable)
    if names:
        down = names[draw_index(len(names), seed=len(plan.changes))]
        sick = names[draw_index(len(names), seed=len(plan.changes) + 1)]
        nodes = dict(running.nodes)
        report = nodes[sick]
        if report.gpus:
            gpus = list(report.gpus)
            gpus[0] = gpus[0].model_copy(update={"ecc_uncorrected": 3})
            nodes[sick] = report.model_copy(update={"gpus": gpus})
        nodes[down] = nodes[down].model_copy(update={"reachable": False, "error": "timeout"})
        troubled = Fleet(nodes=nodes)
        check_sound(cluster, troubled, plans.plan(cluster, troubled, later))
    # Change every model's flags: every running replica is replaced, and once
    # that plan ran, nothing is left to do either.
    for model in data["models"].values():
        model["profiles"][0]["args"] = {"max-model-len": 4096}
    changed = cluster_from(data)
    replacing = plans.plan(changed, running, later)
    replaced = {(c.model, c.replica) for c in replacing.changes if c.action == "replace"}
    kept = {(c.model, c.replica) for c in again.changes}
    assert not kept
    event("replaced something" if replaced else "replaced nothing")
    final = plans.plan(changed, apply(running, replacing, later + 60), later + 60)
    # Replicas created before their old selves were destroyed held both places
    # during that plan; the room they free may take what did not fit then.
    waited = {u.model for u in replacing.unplaceable}
    assert [(c.action, c.model) for c in final.changes
            if c.action != "create" or c.model not in waited] == []


def draw_index(size: int, seed: int) -> int:
    return (seed * 7919) % size


def check_sound(cluster: Cluster, fleet: Fleet, plan: Plan) -> None:
    """No GPU is given to two shards at once; unknown replicas are not placed again."""
    held: dict[tuple[str, int], str] = {}
    for name, report in fleet.nodes.items():
        by_uuid = {g.uuid: g.index for g in report.gpus}
        for unit in report.units:
            spec = json.loads(unit.labels["X-Llmgw-Spec"])
            for uuid in spec["gpus"]:
                if uuid in by_uuid:
                    held[(name, by_uuid[uuid])] = unit.name
    freed = {(s.node, g) for c in plan.changes for s in c.removes for g in s.gpus
             if c.action == "destroy"}
    for change in plan.changes:
        own = ({(s.node, g) for s in change.removes for g in s.gpus}
               if change.strategy == "destroy-before-create" else set())
        for shard in change.shards:
            for index in shard.gpus:
                spot = (shard.node, index)
                holder = held.get(spot)
                if change.action == "restart":
                    continue
                assert holder is None or spot in freed | own, f"{spot} held by {holder}"
                held[spot] = shard.unit
    alive: dict[str, set[int]] = {}
    for report in fleet.nodes.values():
        for unit in report.units:
            alive.setdefault(unit.model, set()).add(unit.replica)
    for change in plan.changes:
        if change.action == "create":
            assert change.replica not in alive.get(change.model, set())
            alive.setdefault(change.model, set()).add(change.replica)
        if change.action == "destroy":
            alive.get(change.model, set()).discard(change.replica)
    for model, replicas in alive.items():
        assert len(replicas) <= cluster.models[model].scaling.max, model
