"""Table tests of planning/placements.py: labels, selectors, misfits, why-not sentences."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from plan_builders import cluster_from, fleet_from

from llmgw.fleet.types import Fleet, SourceFacts, Unit
from llmgw.planning import placements, replicas, shards
from llmgw.planning.nodes import GIB, Capacity
from llmgw.planning.placements import Placement, Request, Slot, current, label, misfits, place
from llmgw.planning.replicas import ObservedReplica
from llmgw.planning.types import Attempt
from llmgw.spec.models import Profile

NOW = 1_700_000_000.0
H100 = {"class": "h100-80g", "count": 4}


def node(address: str, **extra: Any) -> dict[str, Any]:
    return {"address": address, "mgmt_interface": "eno1", "gpus": [H100],
            "fabrics": {"ib-a": ["mlx5_0"]}, "weights_dirs": ["/models"], **extra}


def setup(profile: dict[str, Any], fleet: dict[str, Any] | None = None,
          nodes: dict[str, Any] | None = None) -> tuple[Capacity, Profile]:
    nodes = nodes or {"gpu-01": node("10.0.0.1", labels={"zone": "a"}),
                      "gpu-02": node("10.0.0.2")}
    cluster = cluster_from({
        "fabrics": {"ib-a": {"kind": "infiniband"}},
        # Every node holds /models, where the path source is: a node serves a path
        # source from its weights_dirs only.
        "nodes": {name: {"weights_dirs": ["/models"], **spec} for name, spec in nodes.items()},
        "models": {"m": {"source": "/models/m", "profiles": [profile]}},
    })
    return (Capacity(cluster, fleet_from(cluster, fleet, None, NOW)),
            cluster.models["m"].profiles[0])


VLLM2 = {"engine": "vllm", "gpu_class": "h100-80g", "tensor_parallel": 2}
MULTI = {**VLLM2, "nodes": 2, "pipeline_parallel": 2}
CPU = {"engine": "llama.cpp", "cpu": True, "min_memory_gb": 24}


@pytest.mark.parametrize(("profile", "text"), [
    (VLLM2, "vllm · 2 h100-80g"),
    ({"engine": "vllm", "gpu_class": ["h100-80g", "a100-80g"], "tensor_parallel": 4,
      "nodes": 2, "pipeline_parallel": 2}, "vllm · 2 nodes × 4 h100-80g|a100-80g"),
    (CPU, "llama.cpp · cpu, 24 GiB"),
    ({"engine": "llama.cpp", "cpu": True}, "llama.cpp · cpu"),
])
def test_label(profile: dict[str, Any], text: str) -> None:
    assert label(setup(profile)[1]) == text


@pytest.mark.parametrize(("labels", "selector", "why"), [
    ({"zone": "a"}, {"zone": "a"}, None),
    ({}, {}, None),
    ({"zone": "b"}, {"zone": "a"}, "node_selector wants zone=a; the node has zone=b"),
    ({}, {"zone": "a", "gpu": "x"}, "node_selector wants gpu=x, zone=a; the node has "
     "no such label"),
    ({"zone": "a", "gpu": "y", "rack": "1"}, {"zone": "a", "gpu": "x"},
     "node_selector wants gpu=x; the node has gpu=y, zone=a"),
])
def test_selector_mismatch(labels: dict[str, str], selector: dict[str, str],
                           why: str | None) -> None:
    assert placements.selector_mismatch(labels, selector) == why


def slot(node: str, gpus: tuple[int, ...], gpu_class: str | None = "h100-80g") -> Slot:
    return Slot(node, gpu_class, gpus, tuple(f"GPU-{node}-{i}" for i in gpus), port=18000)


@pytest.mark.parametrize(("profile", "fleet", "placement", "problems"), [
    (VLLM2, None, Placement(0, (slot("gpu-01", (0, 1)),)), []),
    ({**VLLM2, "node_selector": {"zone": "b"}}, None,
     Placement(0, (slot("gpu-01", (0, 1)),)),
     ["gpu-01: node_selector wants zone=b; the node has zone=a"]),
    (VLLM2, None, Placement(0, (slot("gpu-01", (0,)),)),
     ["gpu-01: holds 1 GPU, the profile needs 2"]),
    ({**VLLM2, "tensor_parallel": 1}, None, Placement(0, (slot("gpu-01", (0, 1)),)),
     ["gpu-01: holds 2 GPUs, the profile needs 1"]),
    (VLLM2, None, Placement(0, (slot("gpu-01", (0, 1), "a100-80g"),)),
     ["gpu-01: runs on a100-80g, the profile needs h100-80g"]),
    (VLLM2, None, Placement(0, (slot("gpu-01", (), None),)),
     ["gpu-01: runs on CPU, the profile needs h100-80g", "gpu-01: holds 0 GPUs, the profile "
      "needs 2"]),
    (VLLM2, None, Placement(0, (slot("gpu-01", (0, -1)),)), ["gpu-01: GPU GPU-gpu-01--1 is gone"]),
    (VLLM2, {"gpu-01": {"ecc": [1]}}, Placement(0, (slot("gpu-01", (0, 1)),)),
     ["gpu-01: GPU 1 has uncorrected ECC errors"]),
    (VLLM2, None, Placement(0, (slot("gpu-01", (0, 1)), slot("gpu-02", (0, 1)))),
     ["runs on 2 node(s), the profile needs 1"]),
    (MULTI, None,
     Placement(0, (slot("gpu-01", (0, 1)), slot("gpu-02", (0, 1))), fabric="ib-a"), []),
    (MULTI, None,
     Placement(0, (slot("gpu-01", (0, 1)), slot("gpu-02", (0, 1))), fabric="ib-b"),
     ["gpu-01: not on fabric ib-b", "gpu-02: not on fabric ib-b"]),
    (MULTI, {"gpu-02": {"fabrics_down": {"ib-a": "mlx5_0: DOWN"}}},
     Placement(0, (slot("gpu-01", (0, 1)), slot("gpu-02", (0, 1))), fabric="ib-a"),
     ["gpu-02: fabric ib-a not advertised: mlx5_0: DOWN"]),
    (CPU, None, Placement(0, (slot("gpu-01", (), None),), memory=24 * GIB), []),
    (CPU, None, Placement(0, (slot("gpu-01", (0,)),)), ["the profile runs on CPU"]),
    (CPU, None, Placement(0, (slot("gpu-01", (), None), slot("gpu-02", (), None))),
     ["the profile runs on CPU"]),
    (CPU, {"gpu-01": {"memory": "16GiB"}}, Placement(0, (slot("gpu-01", (), None),)),
     ["gpu-01: has 16 GiB of memory, needs 24"]),
    (CPU, {"gpu-01": {"memory": "24GiB"}}, Placement(0, (slot("gpu-01", (), None),)), []),
])
def test_misfits(profile: dict[str, Any], fleet: dict[str, Any] | None, placement: Placement,
                 problems: list[str]) -> None:
    capacity, spec = setup(profile, fleet)
    assert misfits(capacity, placement, spec) == problems


def test_misfits_counts_its_own_memory_as_free() -> None:
    capacity, spec = setup(CPU, {"gpu-01": {"memory": "30GiB"}})
    here = Placement(0, (slot("gpu-01", (), None),), memory=24 * GIB)
    capacity.take("gpu-01", [], [18000], 24 * GIB, "m", "m/r0")
    assert misfits(capacity, here, spec) == []
    capacity.take("gpu-01", [], [18001], 10 * GIB, "other", "o/r0")
    assert misfits(capacity, here, spec) == ["gpu-01: has 30 GiB of memory, needs 24"]


def reasons(result: Placement | Attempt) -> dict[str, str]:
    assert isinstance(result, Attempt), result
    return dict(result.reasons)


def test_single_why_not() -> None:
    capacity, spec = setup({**VLLM2, "tensor_parallel": 4}, {
        "gpu-01": {"ecc": [2]}, "gpu-02": {"unreachable": "refused"}},
        nodes={"gpu-01": node("10.0.0.1"), "gpu-02": node("10.0.0.2"),
               "cpu-01": {"address": "10.0.0.3"},
               "a-01": {**node("10.0.0.4"), "gpus": [{"class": "a100-80g", "count": 8}]}})
    result = place(capacity, Request("m", 0, spec, "/models/m"))
    assert reasons(result) == {
        "a-01": "no h100-80g GPUs (has 8 a100-80g)",
        "cpu-01": "no GPUs",
        "gpu-01": "GPU 2 has uncorrected ECC errors; 3 free h100-80g, needs 4",
        "gpu-02": "unreachable: refused",
    }


def test_multi_why_not() -> None:
    capacity, spec = setup(MULTI, {"gpu-02": {"ecc": [0]}}, nodes={
        "gpu-01": node("10.0.0.1"), "gpu-02": node("10.0.0.2"),
        "gpu-03": {**node("10.0.0.3"), "mgmt_interface": None},
        "gpu-04": {**node("10.0.0.4"), "fabrics": {}}})
    capacity.take("gpu-02", [1, 2], [], 0, "x", "x/r0")
    result = place(capacity, Request("m", 0, spec, "/models/m"))
    assert reasons(result) == {
        "": "fabric ib-a (h100-80g): 1 node fits, needs 2",
        "gpu-02": "GPU 0 has uncorrected ECC errors; 1 free h100-80g, needs 2",
        "gpu-03": "no mgmt_interface for the NCCL/Gloo bootstrap",
    }


def test_multi_without_fabrics() -> None:
    capacity, spec = setup(MULTI, nodes={
        "gpu-01": {**node("10.0.0.1"), "fabrics": {}}})
    assert reasons(place(capacity, Request("m", 0, spec, "/models/m"))) == {
        "": "no node declares a fabric; a replica across 2 nodes needs one"}


def test_cpu_why_not() -> None:
    capacity, spec = setup(CPU, {"cpu-01": {"memory": "30GiB"}}, nodes={
        "cpu-01": {"address": "10.0.0.1"}, "cpu-02": {"address": "10.0.0.2"},
        "cpu-03": {"address": "10.0.0.3", "cordoned": True}})
    capacity.take("cpu-01", [], [], 8 * GIB, "x", "x/r0")
    assert reasons(place(capacity, Request("m", 0, spec, "/models/m"))) == {
        "cpu-01": "has 30 GiB of memory, 8 GiB held by llmgw replicas, needs 24",
        "cpu-02": "memory not reported",
        "cpu-03": "cordoned",
    }


def test_cpu_prefers_the_node_with_room_left() -> None:
    capacity, spec = setup(CPU, {"cpu-01": {"memory": "64GiB"}, "cpu-02": {"memory": "32GiB"}},
                           nodes={"cpu-01": {"address": "10.0.0.1"},
                                  "cpu-02": {"address": "10.0.0.2"}})
    result = place(capacity, Request("m", 0, spec, "/models/m"))
    assert result == Placement(0, (Slot("cpu-02", None, (), (), port=18000),), memory=24 * GIB)


def cpu_place(fleet: dict[str, Any], nodes: dict[str, Any], profile: dict[str, Any] = CPU,
              held: dict[str, tuple[int, str]] | None = None,
              source: str = "/models/m") -> Placement | Attempt:
    capacity, spec = setup(profile, fleet, nodes)
    for name, (memory, model) in (held or {}).items():
        capacity.take(name, [], [], memory, model, f"{model}/r9")
    return place(capacity, Request("m", 0, spec, source))


def on(result: Placement | Attempt) -> str:
    assert isinstance(result, Placement), result
    return result.slots[0].node


TWO_CPU = {"cpu-01": {"address": "10.0.0.1"}, "cpu-02": {"address": "10.0.0.2"}}
MEM64 = {"cpu-01": {"memory": "64GiB"}, "cpu-02": {"memory": "64GiB"}}


def test_cpu_ranking() -> None:
    # the tightest fit, counting memory llmgw already holds
    assert on(cpu_place({"cpu-01": {"memory": "64GiB"}, "cpu-02": {"memory": "32GiB"}},
                        TWO_CPU, held={"cpu-01": (40 * GIB, "x")})) == "cpu-01"
    # the node with the weights beats the first by name
    assert on(cpu_place({**MEM64, "cpu-02": {"memory": "64GiB", "weights": ["/models/m"]}},
                        TWO_CPU)) == "cpu-02"
    # replicas of one model spread
    assert on(cpu_place(MEM64, TWO_CPU, held={"cpu-01": (0, "m")})) == "cpu-02"
    assert on(cpu_place(MEM64, TWO_CPU, held={"cpu-02": (0, "m")})) == "cpu-01"
    # a GPU node's memory is kept for its engines
    assert on(cpu_place({"gpu-01": {"memory": "32GiB"}, "cpu-09": {"memory": "64GiB"}},
                        {"gpu-01": node("10.0.0.1"), "cpu-09": {"address": "10.0.0.9"}})
              ) == "cpu-09"


def test_cpu_without_min_memory_needs_none() -> None:
    result = cpu_place({"cpu-01": {"memory": "512MiB"}}, {"cpu-01": {"address": "10.0.0.1"}},
                       profile={"engine": "llama.cpp", "cpu": True})
    assert result == Placement(0, (Slot("cpu-01", None, (), (), port=18000),), memory=0)
    capacity, spec = setup({"engine": "llama.cpp", "cpu": True}, {"cpu-01": {"memory": "512MiB"}},
                           {"cpu-01": {"address": "10.0.0.1"}})
    assert misfits(capacity, result, spec) == []


def test_cpu_disk_too_small() -> None:
    capacity, spec = setup(CPU, {"cpu-01": {"memory": "64GiB", "disk_free": "1GB"},
                                 "cpu-02": {"memory": "8GiB"}},
                           {"cpu-01": {"address": "10.0.0.1", "weights_dirs": ["/models"]},
                            "cpu-02": {"address": "10.0.0.2"}})
    capacity.sources["org/m"] = SourceFacts(size_bytes=20 * 10**9)
    assert reasons(place(capacity, Request("m", 0, spec, "org/m"))) == {
        "cpu-01": "needs 21 GB, 1.0 GB free in /models",
        "cpu-02": "has 8 GiB of memory, needs 24",
    }


def test_sglang_ranks_get_a_health_port() -> None:
    capacity, spec = setup({**MULTI, "engine": "sglang"})
    result = place(capacity, Request("m", 0, spec, "/models/m"))
    assert isinstance(result, Placement)
    assert result.slots == (
        Slot("gpu-01", "h100-80g", (0, 1), ("GPU-gpu-01-00", "GPU-gpu-01-01"),
             port=18000, dist_port=18001),
        Slot("gpu-02", "h100-80g", (0, 1), ("GPU-gpu-02-00", "GPU-gpu-02-01"), aux_port=18000),
    )


def test_why_not_names_every_class() -> None:
    two = {**node("10.0.0.1"), "gpus": [H100, {"class": "a100-80g", "count": 2}]}
    capacity, spec = setup({**VLLM2, "gpu_class": ["l40s", "a10"]}, nodes={"gpu-01": two})
    assert reasons(place(capacity, Request("m", 0, spec, "/models/m"))) == {
        "gpu-01": "no l40s or a10 GPUs (has 2 a100-80g, 4 h100-80g)"}
    capacity, spec = setup({**VLLM2, "gpu_class": ["h100-80g", "a100-80g"],
                            "tensor_parallel": 8}, nodes={"gpu-01": two})
    assert reasons(place(capacity, Request("m", 0, spec, "/models/m"))) == {
        "gpu-01": "4 free h100-80g, 2 free a100-80g, needs 8"}
    slot_ = slot("gpu-01", (0, 1), "l4")
    assert misfits(capacity, Placement(0, (slot_,)), spec) == [
        "gpu-01: runs on l4, the profile needs h100-80g or a100-80g",
        "gpu-01: holds 2 GPUs, the profile needs 8"]


def test_misfits_every_gone_gpu() -> None:
    capacity, spec = setup(VLLM2)
    assert misfits(capacity, Placement(0, (slot("gpu-01", (-1, -1)),)), spec) == [
        "gpu-01: GPU GPU-gpu-01--1 is gone", "gpu-01: GPU GPU-gpu-01--1 is gone"]


def test_multi_why_not_local_or_unreachable() -> None:
    capacity, spec = setup(MULTI, {"gpu-02": {"unreachable": "refused"}}, nodes={
        "gpu-01": {**node("local")}, "gpu-02": node("10.0.0.2")})
    assert reasons(place(capacity, Request("m", 0, spec, "/models/m"))) == {
        "": "fabric ib-a (h100-80g): 0 nodes fit, needs 2",
        "gpu-01": "address is local; a replica across nodes needs a reachable address",
        "gpu-02": "unreachable: refused",
    }


# -- current(): a running replica's place, rebuilt from its units' specs --------


def running(capacity: Capacity, fleet: Fleet, placement: Placement,
            drop: int | None = None) -> ObservedReplica:
    """The replica an agent would report after ``placement`` started (less shard ``drop``)."""
    cluster = capacity_cluster[id(capacity)]
    units: dict[str, list[Unit]] = {name: [] for name in fleet.nodes}
    for shard in shards.build(cluster, fleet.nodes, "m", 3, placement):
        if shard.rank == drop:
            continue
        units[shard.node].append(Unit(
            name=shard.unit, model="m", replica=3, rank=shard.rank, digest=shard.digest,
            state="ready", port=shard.port,
            labels={shards.SPEC_LABEL: shards.spec_json(shard.spec)}))
    seen = Fleet(nodes={name: report.model_copy(update={"units": units[name]})
                        for name, report in fleet.nodes.items()})
    return replicas.collect(cluster, seen).replicas[("m", 3)]


capacity_cluster: dict[int, Any] = {}


def two_profiles(second: dict[str, Any], fleet: dict[str, Any] | None = None,
                 ) -> tuple[Capacity, Fleet, Profile]:
    """A cluster whose model's profile 1 is ``second``; returns it with its capacity."""
    cluster = cluster_from({
        "fabrics": {"ib-a": {"kind": "infiniband"}},
        "nodes": {"gpu-01": node("10.0.0.1"), "gpu-02": node("10.0.0.2"),
                  "cpu-01": {"address": "10.0.0.3", "memory": "64GiB",
                             "weights_dirs": ["/models"]}},
        "models": {"m": {"source": "/models/m", "profiles": [VLLM2, second]}},
    })
    observed = fleet_from(cluster, fleet, None, NOW)
    capacity = Capacity(cluster, observed)
    capacity_cluster[id(capacity)] = cluster
    return capacity, observed, cluster.models["m"].profiles[1]


@pytest.mark.parametrize("profile", [
    {**MULTI, "engine": "sglang"},  # rank 1 holds a health port of its own
    MULTI,  # rank 1 holds no port at all
    VLLM2,
    CPU,
])
def test_current_gives_back_the_placement_a_replica_started_from(
        profile: dict[str, Any]) -> None:
    capacity, fleet, spec = two_profiles(profile)
    placed = place(capacity, Request("m", 1, spec, "/models/m"))
    assert isinstance(placed, Placement)
    assert current(capacity, running(capacity, fleet, placed)) == placed


def test_current_numbers_and_ports_come_from_the_right_shard() -> None:
    capacity, fleet, spec = two_profiles({**MULTI, "engine": "sglang"})
    placed = place(capacity, Request("m", 1, spec, "/models/m"))
    assert isinstance(placed, Placement)
    rebuilt = current(capacity, running(capacity, fleet, placed))
    assert rebuilt is not None
    assert (rebuilt.profile, rebuilt.fabric, rebuilt.memory) == (1, "ib-a", 0)
    head, second = rebuilt.slots
    assert (head.node, head.port, head.dist_port, head.aux_port) == ("gpu-01", 18000, 18001, None)
    assert (second.node, second.port, second.dist_port, second.aux_port) == (
        "gpu-02", None, None, 18000)
    assert (head.gpus, head.gpu_uuids, head.gpu_class) == (
        (0, 1), ("GPU-gpu-01-00", "GPU-gpu-01-01"), "h100-80g")


def test_current_memory_of_a_cpu_replica() -> None:
    capacity, fleet, spec = two_profiles(CPU)
    placed = place(capacity, Request("m", 1, spec, "/models/m"))
    assert isinstance(placed, Placement)
    rebuilt = current(capacity, running(capacity, fleet, placed))
    assert rebuilt is not None and rebuilt.memory == 24 * GIB
    assert rebuilt.slots == (Slot("cpu-01", None, (), (), port=18000),)


def test_current_of_a_replica_with_a_shard_missing_is_none() -> None:
    capacity, fleet, spec = two_profiles(MULTI)
    placed = place(capacity, Request("m", 1, spec, "/models/m"))
    assert isinstance(placed, Placement)
    assert current(capacity, running(capacity, fleet, placed, drop=1)) is None
    assert current(capacity, running(capacity, fleet, placed, drop=0)) is None


def test_current_of_a_replica_whose_specs_name_no_nodes_is_none() -> None:
    capacity, fleet, spec = two_profiles(VLLM2)
    placed = place(capacity, Request("m", 1, spec, "/models/m"))
    assert isinstance(placed, Placement)
    replica = running(capacity, fleet, placed)
    for nodes in ([], None):
        member = replica.members[0]
        head = {**(member.spec or {}), "nodes": nodes}
        if nodes is None:
            del head["nodes"]
        replica.members[0] = replace(member, spec=head)
        assert current(capacity, replica) is None


def test_current_marks_a_gpu_the_node_no_longer_reports() -> None:
    capacity, fleet, spec = two_profiles(VLLM2)
    placed = Placement(1, (Slot("gpu-01", "h100-80g", (2, 3),
                                ("GPU-gpu-01-02", "GPU-gone"), port=18000),))
    rebuilt = current(capacity, running(capacity, fleet, placed))
    assert rebuilt is not None and rebuilt.slots[0].gpus == (2, -1)


# -- one profile's node_selector is that profile's only -------------------------


def test_a_selector_leaves_no_node_excluded_for_the_next_profile() -> None:
    picky = {**VLLM2, "node_selector": {"zone": "b"}}
    capacity, spec = setup(picky)
    plain = Profile.model_validate(VLLM2)
    result = place(capacity, Request("m", 0, spec, "/models/m"))
    assert reasons(result) == {
        "gpu-01": "node_selector wants zone=b; the node has zone=a",
        "gpu-02": "node_selector wants zone=b; the node has no such label"}
    assert [n.excluded for n in capacity.nodes.values()] == [None, None]
    assert on(place(capacity, Request("m", 0, plain, "/models/m"))) == "gpu-01"
    capacity.take("gpu-01", [0, 1, 2, 3], [], 0, "x", "x/r0")
    capacity.take("gpu-02", [0, 1, 2, 3], [], 0, "x", "x/r1")
    assert reasons(place(capacity, Request("m", 0, plain, "/models/m"))) == {
        "gpu-01": "0 free h100-80g, needs 2", "gpu-02": "0 free h100-80g, needs 2"}


# -- ranking: NVLink, then spreading, then weights, then the tightest fit -------


def ranked(fleet: dict[str, Any], held: dict[str, list[tuple[list[int], str]]],
           profile: dict[str, Any] = VLLM2, count: int = 4) -> Placement | Attempt:
    nodes = {"gpu-01": {**node("10.0.0.1"), "gpus": [{"class": "h100-80g", "count": count}]},
             "gpu-02": {**node("10.0.0.2"), "gpus": [{"class": "h100-80g", "count": count}]},
             "gpu-03": {**node("10.0.0.3"), "gpus": [{"class": "h100-80g", "count": count}]}}
    capacity, spec = setup(profile, fleet, nodes)
    for name, takes in held.items():
        for number, (gpus, model) in enumerate(takes):
            capacity.take(name, gpus, [], 0, model, f"{model}/r{number}")
    return place(capacity, Request("m", 0, spec, "/models/m"))


WEIGHTS = {"weights": ["/models/m"]}


@pytest.mark.parametrize(("fleet", "held", "winner"), [
    # NVLink beats spreading: gpu-01 already runs m but has an NVLink pair free
    ({"gpu-02": {"nvlink": "none"}, "gpu-03": {"nvlink": "none"}},
     {"gpu-01": [([0], "m")]}, "gpu-01"),
    # spreading beats the weights: gpu-01 has them, and already runs m
    ({"gpu-01": WEIGHTS}, {"gpu-01": [([0], "m")]}, "gpu-02"),
    # two replicas of m on gpu-01, one on gpu-02: the one with fewer
    ({}, {"gpu-01": [([0], "m"), ([1], "m")], "gpu-02": [([0], "m")], "gpu-03": [([0], "m")]},
     "gpu-02"),
    # the weights beat the tightest fit
    ({"gpu-03": WEIGHTS}, {"gpu-01": [([0, 1], "x")]}, "gpu-03"),
    # the tightest fit beats the name
    ({}, {"gpu-02": [([0], "x")]}, "gpu-02"),
    ({}, {"gpu-03": [([0, 1], "x")], "gpu-02": [([0], "x")]}, "gpu-03"),
    # otherwise the name
    ({}, {}, "gpu-01"),
])
def test_single_node_ranking(fleet: dict[str, Any], held: dict[str, Any], winner: str) -> None:
    assert on(ranked(fleet, held)) == winner


def members(result: Placement | Attempt) -> tuple[str | None, list[str]]:
    assert isinstance(result, Placement), result
    return result.fabric, [slot.node for slot in result.slots]


def two_fabrics(fleet: dict[str, Any], held: dict[str, list[tuple[list[int], str]]],
                ) -> Placement | Attempt:
    """gpu-01 and gpu-02 on fabric ib-a, gpu-03 and gpu-04 on ib-b; which pair wins."""
    def on_fabric(address: str, fabric: str) -> dict[str, Any]:
        return {**node(address), "fabrics": {fabric: ["mlx5_0"]}}
    cluster = cluster_from({
        "fabrics": {"ib-a": {"kind": "infiniband"}, "ib-b": {"kind": "infiniband"}},
        "nodes": {"gpu-01": on_fabric("10.0.0.1", "ib-a"), "gpu-02": on_fabric("10.0.0.2", "ib-a"),
                  "gpu-03": on_fabric("10.0.0.3", "ib-b"), "gpu-04": on_fabric("10.0.0.4", "ib-b")},
        "models": {"m": {"source": "/models/m", "profiles": [MULTI]}},
    })
    capacity = Capacity(cluster, fleet_from(cluster, fleet, None, NOW))
    for name, takes in held.items():
        for number, (gpus, model) in enumerate(takes):
            capacity.take(name, gpus, [], 0, model, f"{model}/r{number}")
    return place(capacity, Request("m", 0, cluster.models["m"].profiles[0], "/models/m"))


IB_A, IB_B = ("ib-a", ["gpu-01", "gpu-02"]), ("ib-b", ["gpu-03", "gpu-04"])


@pytest.mark.parametrize(("fleet", "held", "winner"), [
    # NVLink on every member beats spreading
    ({"gpu-01": {"nvlink": "none"}}, {"gpu-03": [([0], "m")], "gpu-04": [([0], "m")]}, IB_B),
    # spreading beats the weights
    ({"gpu-01": WEIGHTS, "gpu-02": WEIGHTS}, {"gpu-01": [([0], "m")]}, IB_B),
    # the weights beat the tightest fit
    ({"gpu-03": WEIGHTS}, {"gpu-01": [([0], "x")], "gpu-02": [([0], "x")]}, IB_B),
    # the tightest fit beats the fabric's name
    ({}, {"gpu-03": [([0], "x")], "gpu-04": [([0], "x")]}, IB_B),
    ({}, {"gpu-03": [([0], "x")]}, IB_B),
    ({}, {"gpu-01": [([0], "x")]}, IB_A),
    ({}, {}, IB_A),
])
def test_multi_node_ranking_between_fabrics(fleet: dict[str, Any], held: dict[str, Any],
                                            winner: tuple[str, list[str]]) -> None:
    assert members(two_fabrics(fleet, held)) == winner


@pytest.mark.parametrize(("fleet", "held", "winners"), [
    # NVLink on both nodes beats spreading
    ({"gpu-03": {"nvlink": "none"}}, {"gpu-01": [([0], "m")], "gpu-02": [([0], "m")]},
     ["gpu-01", "gpu-02"]),
    # spreading beats the weights
    ({"gpu-01": WEIGHTS, "gpu-02": WEIGHTS}, {"gpu-01": [([0], "m")]}, ["gpu-02", "gpu-03"]),
    # the weights beat the tightest fit
    ({"gpu-03": WEIGHTS}, {"gpu-01": [([0], "x")], "gpu-02": [([0], "x")]},
     ["gpu-01", "gpu-03"]),
    # the tightest fit beats the name
    ({}, {"gpu-02": [([0], "x")], "gpu-03": [([0], "x")]}, ["gpu-02", "gpu-03"]),
    ({}, {}, ["gpu-01", "gpu-02"]),
])
def test_multi_node_ranking_on_one_fabric(fleet: dict[str, Any], held: dict[str, Any],
                                          winners: list[str]) -> None:
    assert members(ranked(fleet, held, MULTI)) == ("ib-a", winners)


VLLM_CPU2 = {"engine": "vllm", "cpu": True, "nodes": 2, "min_memory_gb": 4,
             "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}}
THREE_CPU = {**TWO_CPU, "cpu-03": {"address": "10.0.0.3"}}


def test_a_vllm_cpu_replica_spans_nodes_without_a_fabric() -> None:
    """Rank 0 (first by name) holds the HTTP and rendezvous ports; every node the memory."""
    result = cpu_place({**MEM64, "cpu-03": {"memory": "8GiB"}}, THREE_CPU, profile=VLLM_CPU2,
                       held={"cpu-01": (61 * GIB, "x")})
    assert result == Placement(0, (Slot("cpu-02", None, (), (), port=18000, dist_port=18001),
                                   Slot("cpu-03", None, (), ())), memory=4 * GIB)
    capacity, spec = setup(VLLM_CPU2, {**MEM64, "cpu-03": {"memory": "8GiB"}}, THREE_CPU)
    assert misfits(capacity, result, spec) == []
    one = Placement(0, (Slot("cpu-02", None, (), (), port=18000),), memory=4 * GIB)
    assert misfits(capacity, one, spec) == ["runs on 1 node(s), the profile needs 2"]


def test_a_vllm_cpu_replica_says_why_too_few_nodes_fit() -> None:
    result = cpu_place({"cpu-01": {"memory": "64GiB"}, "cpu-02": {"memory": "2GiB"}}, TWO_CPU,
                       profile=VLLM_CPU2)
    assert reasons(result) == {"": "1 node fits, needs 2",
                               "cpu-02": "has 2 GiB of memory, needs 4"}
