"""The one fleet summary (capacity, free whole nodes, replicas' GPUs, idle replicas)."""

from __future__ import annotations

import json

import pytest

from llmgw.fleet.types import FabricStatus, Fleet, Gpu, NodeReport, Unit
from llmgw.planning import shards, summaries
from llmgw.spec.models import Cluster

NOW = 1_800_000_000.0
CPU = [{"engine": "llama.cpp", "cpu": True}]
CLUSTER = Cluster.model_validate({
    "cluster": {"name": "lab"},
    "fabrics": {"ib-a": {"kind": "infiniband"}},
    "nodes": {name: {"address": f"10.0.0.{i}", "fabrics": {"ib-a": ["mlx5_0"]},
                     **({"cordoned": True} if name == "g3" else {})}
              for i, name in enumerate(("g1", "g2", "g3"), start=1)},
    "models": {"big": {"profiles": CPU}, "lazy": {"profiles": CPU,
                                                   "scaling": {"min": 1, "idle_timeout": "5m"}}},
})
IB = [FabricStatus(name="ib-a", kind="infiniband", adapters=["mlx5_0"], advertised=True)]


def gpus(node: str, count: int = 2, ecc: int | None = None) -> list[Gpu]:
    return [Gpu(index=i, uuid=f"GPU-{node}-{i}", name="H100", gpu_class="h100-80g",
                ecc_uncorrected=ecc if i == 1 else None) for i in range(count)]


def unit(model: str, node: str, indices: list[int], state: str = "ready",
         last_used: float | None = None) -> Unit:
    spec = {"model": model, "gpus": [f"GPU-{node}-{i}" for i in indices]}
    return Unit(name=f"llmgw-{model}-r0-s0.service", model=model, replica=0, digest=shards.digest(
        spec), state=state, since=NOW - 3600, last_used=last_used,
        labels={shards.SPEC_LABEL: json.dumps(spec)})


def fleet(*units_on_g1: Unit, g2_ecc: int | None = None) -> Fleet:
    return Fleet(nodes={
        "g1": NodeReport(node="g1", gpus=gpus("g1"), fabrics=IB, units=list(units_on_g1)),
        "g2": NodeReport(node="g2", gpus=gpus("g2", ecc=g2_ecc), fabrics=IB),
        "g3": NodeReport(node="g3", gpus=gpus("g3"), fabrics=IB),
    })


def test_units_hold_the_gpus_named_in_their_spec_label() -> None:
    summary = summaries.summarize(CLUSTER, fleet(unit("big", "g1", [0, 1])), NOW)
    counts = summary.capacity["h100-80g"]
    assert (counts.total, counts.used, counts.free, counts.faulty) == (6, 2, 4, 0)
    assert [s.gpus for s in summary.replicas[0].shards] == [(0, 1)]


@pytest.mark.parametrize(
    ("g1_units", "g2_ecc", "free"),
    [
        pytest.param([], None, ["g1", "g2"], id="idle-fleet-cordoned-node-left-out"),
        pytest.param([unit("big", "g1", [0])], None, ["g2"], id="one-used-gpu-takes-the-node"),
        pytest.param([], 2, ["g1"], id="a-faulty-gpu-takes-the-node"),
        pytest.param([unit("big", "g1", [0], state="failed")], None, ["g1", "g2"],
                     id="a-failed-unit-holds-nothing"),
    ],
)
def test_free_whole_nodes_per_fabric(g1_units: list[Unit], g2_ecc: int | None,
                                     free: list[str]) -> None:
    summary = summaries.summarize(CLUSTER, fleet(*g1_units, g2_ecc=g2_ecc), NOW)
    assert summary.free_nodes == {"ib-a": free}


@pytest.mark.parametrize(
    ("model", "last_used", "router_last_used", "idle"),
    [
        pytest.param("big", None, None, True, id="never-used-for-an-hour"),
        pytest.param("big", NOW - 60, None, False, id="used-a-minute-ago"),
        pytest.param("big", None, NOW - 60, False, id="the-router-saw-a-request"),
        pytest.param("lazy", NOW - 600, None, True, id="past-its-idle-timeout"),
        pytest.param("lazy", NOW - 60, None, False, id="within-its-idle-timeout"),
    ],
)
def test_idle_replicas_holding_gpus(model: str, last_used: float | None,
                                    router_last_used: float | None, idle: bool) -> None:
    seen = {model: router_last_used} if router_last_used else {}
    summary = summaries.summarize(CLUSTER, fleet(unit(model, "g1", [0], last_used=last_used)),
                                  NOW, seen)
    assert [i.replica.model for i in summary.idle] == ([model] if idle else [])


def test_a_draining_node_is_not_a_free_whole_node() -> None:
    draining = CLUSTER.model_copy(update={"nodes": {
        **CLUSTER.nodes, "g2": CLUSTER.nodes["g2"].model_copy(update={"drain": True})}})
    summary = summaries.summarize(draining, fleet(), NOW)
    assert summary.free_nodes == {"ib-a": ["g1"]}


def test_unreachable_nodes_are_listed_and_their_gpus_not_counted() -> None:
    nodes = fleet(g2_ecc=2).nodes
    nodes["g0"] = NodeReport(node="g0", gpus=gpus("g0"), fabrics=IB, reachable=False,
                             error="ssh: connection refused")
    # g0 first: one unreachable node does not end the count of the nodes after it.
    down_first = Fleet(nodes={name: nodes[name] for name in ("g0", "g1", "g2", "g3")})
    summary = summaries.summarize(CLUSTER, down_first, NOW)
    assert summary.unreachable == ["g0"]
    assert summary.nodes == 4
    counts = summary.capacity["h100-80g"]
    assert (counts.total, counts.used, counts.free, counts.faulty) == (6, 0, 5, 1)


def test_gpu_counts_alone_finds_the_gpus_units_hold() -> None:
    # inventory calls gpu_counts without the held map summarize passes in.
    counts = summaries.gpu_counts(fleet(unit("big", "g1", [0, 1])))["h100-80g"]
    assert (counts.total, counts.used, counts.free, counts.faulty) == (6, 2, 4, 0)


def test_units_of_two_models_are_two_replicas() -> None:
    summary = summaries.summarize(
        CLUSTER, fleet(unit("big", "g1", [0]), unit("lazy", "g1", [1])), NOW)
    assert [(r.model, r.replica, [s.gpus for s in r.shards]) for r in summary.replicas] == [
        ("big", 0, [(0,)]), ("lazy", 0, [(1,)])]


def test_an_idle_replica_carries_its_threshold_and_time_unused() -> None:
    summary = summaries.summarize(
        CLUSTER, fleet(unit("lazy", "g1", [0], last_used=NOW - 600)), NOW)
    [idle] = summary.idle
    assert (idle.unused_for, idle.threshold) == (600.0, 300.0)
