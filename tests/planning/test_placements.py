"""Table tests of planning/placements.py: labels, selectors, misfits, why-not sentences."""

from __future__ import annotations

from typing import Any

import pytest
from plan_builders import cluster_from, fleet_from

from llmgw.fleet.types import SourceFacts
from llmgw.planning import placements
from llmgw.planning.nodes import GIB, Capacity
from llmgw.planning.placements import Placement, Request, Slot, label, misfits, place
from llmgw.planning.types import Attempt
from llmgw.spec.models import Profile

NOW = 1_700_000_000.0
H100 = {"class": "h100-80g", "count": 4}


def node(address: str, **extra: Any) -> dict[str, Any]:
    return {"address": address, "mgmt_interface": "eno1", "gpus": [H100],
            "fabrics": {"ib-a": ["mlx5_0"]}, **extra}


def setup(profile: dict[str, Any], fleet: dict[str, Any] | None = None,
          nodes: dict[str, Any] | None = None) -> tuple[Capacity, Profile]:
    cluster = cluster_from({
        "fabrics": {"ib-a": {"kind": "infiniband"}},
        "nodes": nodes or {"gpu-01": node("10.0.0.1", labels={"zone": "a"}),
                           "gpu-02": node("10.0.0.2")},
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
