"""Table tests of planning/nodes.py: weights keys, node state, capacity bookkeeping."""

from __future__ import annotations

from typing import Any

import pytest
from plan_builders import cluster_from, fleet_from

from llmgw.planning import nodes
from llmgw.planning.nodes import Capacity, gib, human_bytes, source_keys, weights_keys

NOW = 1_700_000_000.0


@pytest.mark.parametrize(("path", "keys"), [
    ("/models/meta-llama/Llama-3.1-8B/",
     {"/models/meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B", "Llama-3.1-8B"}),
    ("/m.gguf", {"/m.gguf", "m.gguf"}),
    ("/org/name", {"/org/name", "org/name", "name"}),
    ("/models/MAX/", {"/models/MAX", "models/MAX", "MAX"}),
    ("/hub/models--gpt2", {"/hub/models--gpt2", "models--gpt2", "hub/models--gpt2", "gpt2"}),
    ("/hub/models--a--b--c", {"/hub/models--a--b--c", "models--a--b--c", "hub/models--a--b--c",
                              "a/b/c", "c"}),
    ("/", {""}),
    ("/hub/models--org--name/snapshots/abc",
     {"/hub/models--org--name/snapshots/abc", "abc", "snapshots/abc", "org/name", "name"}),
])
def test_weights_keys(path: str, keys: set[str]) -> None:
    assert weights_keys(path) == keys


@pytest.mark.parametrize(("source", "keys"), [
    ("/models/x/", ["/models/x"]),
    ("org/name", ["org/name", "name"]),
    ("/models/MAX/", ["/models/MAX"]),
    ("a/b/c", ["a/b/c", "c"]),
    ("name", ["name", "name"]),
    ("org/name:Q4_K_M", ["org/name:Q4_K_M"]),
    ("org/name@v1", ["org/name@v1"]),
    ("https://h/x.gguf", ["https://h/x.gguf"]),
])
def test_source_keys(source: str, keys: list[str]) -> None:
    assert source_keys(source) == keys


@pytest.mark.parametrize(("size", "text"), [
    (0, "0 B"), (999, "999 B"), (1000, "1.0 KB"), (9_999, "10.0 KB"), (10_000, "10 KB"),
    (1_500_000, "1.5 MB"), (141_000_000_000, "141 GB"), (5_000_000_000_000_000, "5000 TB"),
])
def test_human_bytes(size: int, text: str) -> None:
    assert human_bytes(size) == text


@pytest.mark.parametrize(("size", "text"), [
    (24 * nodes.GIB, "24"), (int(1.5 * nodes.GIB), "1.5"), (int(24.04 * nodes.GIB), "24"),
    (int(24.06 * nodes.GIB), "24.1"),
])
def test_gib(size: int, text: str) -> None:
    assert gib(size) == text


GPU_NODE = {"address": "10.0.0.1", "mgmt_interface": "eno1",
            "gpus": [{"class": "h100-80g", "count": 4}], "fabrics": {"ib-a": ["mlx5_0", "mlx5_1"]},
            "weights_dirs": ["/models"]}


def capacity(fleet: dict[str, Any] | None = None, fabrics: dict[str, Any] | None = None,
             extra_nodes: dict[str, Any] | None = None,
             sources: dict[str, Any] | None = None) -> Capacity:
    cluster = cluster_from({
        "fabrics": fabrics or {"ib-a": {"kind": "infiniband"}},
        "nodes": {"gpu-01": GPU_NODE, **(extra_nodes or {})},
        "models": {},
    })
    return Capacity(cluster, fleet_from(cluster, fleet, None, NOW, sources=sources))


@pytest.mark.parametrize(("fleet", "spec", "why", "placeable"), [
    ({}, {}, None, True),
    ({"gpu-01": {"absent": True}}, {}, "no report from its agent", False),
    ({"gpu-01": {"unreachable": "connection refused"}}, {},
     "unreachable: connection refused", False),
    ({}, {"cordoned": True}, "cordoned", False),
])
def test_unavailable(fleet: dict[str, Any], spec: dict[str, Any], why: str | None,
                     placeable: bool) -> None:
    cluster = cluster_from({"nodes": {"gpu-01": {**GPU_NODE, **spec}},
                            "fabrics": {"ib-a": {"kind": "infiniband"}}, "models": {}})
    cap = Capacity(cluster, fleet_from(cluster, fleet, None, NOW))
    node = cap.nodes["gpu-01"]
    assert node.unavailable() == why
    assert node.placeable is placeable
    assert node.reachable is (why in (None, "cordoned"))
    node.excluded = "label gpu=a100 wanted"
    assert node.unavailable() == (why or "label gpu=a100 wanted")
    assert node.placeable is False


def test_unreachable_without_error_says_no_answer() -> None:
    cap = capacity()
    node = cap.nodes["gpu-01"]
    assert node.report is not None
    node.report = node.report.model_copy(update={"reachable": False, "error": None})
    assert node.unavailable() == "unreachable: no answer"


def test_memory_total_prefers_the_report() -> None:
    cap = capacity({"gpu-01": {"memory": "16GiB"}}, extra_nodes={
        "cpu-01": {"address": "10.0.0.2", "memory": "64GiB"}})
    assert cap.nodes["gpu-01"].memory_total == 16 * nodes.GIB
    node = cap.nodes["cpu-01"]
    assert node.report is not None
    node.report = node.report.model_copy(update={"memory_total_bytes": None})
    assert node.memory_total == 64 * nodes.GIB


def test_gpus_ports_and_topology() -> None:
    cap = capacity({"gpu-01": {"ecc": [1], "nvlink": "all"}})
    node = cap.nodes["gpu-01"]
    assert node.free("h100-80g") == [0, 2, 3]
    assert node.free("a100-80g") == []
    assert node.classes() == {"h100-80g": 4}
    assert node.fully_connected is True
    assert node.topology_known([0, 1]) is True
    assert node.next_ports(2) == [18000, 18001]
    node.ports.update({18000, 18002})
    assert node.next_ports(3) == [18001, 18003, 18004]
    assert node.next_ports(0) == []
    assert cap.gpu_classes() == ["h100-80g"]
    assert [n.name for n in cap.by_free("h100-80g", 3)] == ["gpu-01"]
    assert list(cap.by_free("h100-80g", 4)) == []
    assert list(cap.by_free("a100-80g", 1)) == []


@pytest.mark.parametrize(("nvlink", "connected", "known"), [
    ("all", True, True), ("pairs", False, True), ("none", False, True),
    ("unknown", False, False),
])
def test_fully_connected(nvlink: str, connected: bool, known: bool) -> None:
    node = capacity({"gpu-01": {"nvlink": nvlink}}).nodes["gpu-01"]
    assert node.fully_connected is connected
    assert node.topology_known([0, 1, 2, 3]) is known


@pytest.mark.parametrize(("fleet", "fabrics", "problem"), [
    ({}, None, None),
    ({"gpu-01": {"fabrics_down": {"ib-a": "mlx5_0: no ACTIVE port"}}}, None,
     "fabric ib-a not advertised: mlx5_0: no ACTIVE port"),
    ({"gpu-01": {"fabrics_down": {"ib-a": ""}}}, None,
     "fabric ib-a not advertised: no ACTIVE adapter"),
    ({"gpu-01": {"adapters_down": {"ib-a": ["mlx5_1"]}}},
     {"ib-a": {"kind": "infiniband", "min_adapters": 2}},
     "fabric ib-a: 1 of 2 adapters ACTIVE, needs 2 (fabrics.ib-a.min_adapters)"),
    ({"gpu-01": {"adapters_down": {"ib-a": ["mlx5_1"]}}},
     {"ib-a": {"kind": "infiniband", "min_adapters": 1}}, None),
    ({"gpu-01": {"adapters_down": {"ib-a": ["mlx5_1"]}}}, None, None),
])
def test_fabric_problems(fleet: dict[str, Any], fabrics: dict[str, Any] | None,
                         problem: str | None) -> None:
    node = capacity(fleet, fabrics).nodes["gpu-01"]
    assert node.fabric_problems.get("ib-a") == problem
    assert ("ib-a" in node.fabrics) is (problem is None)


def test_fabric_not_reported() -> None:
    cap = capacity()
    node = cap.nodes["gpu-01"]
    assert node.report is not None
    report = node.report.model_copy(update={"fabrics": []})
    state = nodes._node_state("gpu-01", node.spec, report)
    assert state.fabric_problems == {"ib-a": "fabric ib-a not reported by the agent"}
    assert cap.fabric_nodes == {"ib-a": ["gpu-01"]}


def test_fabric_status_kept_and_reasons_joined() -> None:
    cap = capacity(extra_nodes={"gpu-02": {**GPU_NODE, "address": "10.0.0.2"}})
    node = cap.nodes["gpu-01"]
    assert node.report is not None
    status = node.report.fabrics[0]
    assert node.fabrics == {"ib-a": status}
    down = status.model_copy(update={"advertised": False, "reasons": ["mlx5_0 DOWN", "no GID"]})
    report = node.report.model_copy(update={"fabrics": [down]})
    state = nodes._node_state("gpu-01", node.spec, report)
    assert state.fabric_problems == {"ib-a": "fabric ib-a not advertised: mlx5_0 DOWN; no GID"}
    assert state.fabrics == {}


def test_every_weights_path_is_filed() -> None:
    cap = capacity({"gpu-01": {"weights": ["/models/org/a", "/models/org/b"]}})
    assert cap.nodes["gpu-01"].weights >= {"org/a", "a", "org/b", "b"}


def test_take_and_give_back() -> None:
    cap = capacity(extra_nodes={"gpu-02": {**GPU_NODE, "address": "10.0.0.2"}})
    node = cap.nodes["gpu-01"]
    cap.take("gpu-01", [0, 1], [18000], 5, "m", "m/r0")
    assert node.used == {0: "m/r0", 1: "m/r0"}
    assert node.ports == {18000}
    assert node.memory_held == 5
    assert node.version == 1
    assert cap.same_model("m", "gpu-01") == 1
    assert cap.same_model("m", "gpu-02") == 0
    assert cap.same_model("other", "gpu-01") == 0
    assert [n.name for n in cap.by_free("h100-80g", 2)] == ["gpu-01", "gpu-02"]
    assert [n.name for n in cap.by_free("h100-80g", 3)] == ["gpu-02"]
    cap.take("gpu-01", [2], [18001], 7, "m", "m/r1")
    assert node.memory_held == 12
    assert cap.same_model("m", "gpu-01") == 2
    cap.give_back("gpu-01", [0, 1], [18000], 5, "m")
    assert node.used == {2: "m/r1"}
    assert node.ports == {18001}
    assert node.memory_held == 7
    assert node.version == 3
    assert cap.same_model("m", "gpu-01") == 1
    assert [n.name for n in cap.by_free("h100-80g", 3)] == ["gpu-01", "gpu-02"]
    cap.give_back("gpu-01", [2], [18001], 7, "m")
    cap.give_back("gpu-01", [], [], 0, "m")  # never below zero
    cap.give_back("gpu-01", [3], [], 0, "m")  # a GPU nobody held: nothing to undo
    assert node.used == {}
    assert cap.same_model("m", "gpu-01") == 0
    assert [n.name for n in cap.by_free("h100-80g", 4)] == ["gpu-01", "gpu-02"]
    node.excluded = "cordoned by selector"
    assert [n.name for n in cap.by_free("h100-80g", 4)] == ["gpu-02"]


def test_weights_filed_by_key() -> None:
    cap = capacity({"gpu-01": {"weights": ["/models/org/name"], "fetched": ["org/x:Q4_K_M"]}},
                   extra_nodes={"gpu-02": {**GPU_NODE, "address": "10.0.0.2"}})
    assert cap.with_weights("org/name") == {"gpu-01"}
    assert cap.with_weights("/models/org/name/") == {"gpu-01"}
    assert cap.with_weights("org/x:Q4_K_M") == {"gpu-01"}
    assert cap.with_weights("org/x") == set()
    assert cap.with_weights("other/y") == set()


@pytest.mark.parametrize(("fleet", "sources", "source", "why"), [
    ({"gpu-01": {"disk_free": "10GB"}}, {"org/big": "20GB"}, "org/big",
     "needs 21 GB, 10 GB free in /models"),
    ({"gpu-01": {"disk_free": "10GB"}}, {"org/big": "1GB"}, "org/big",
     None),
    ({"gpu-01": {"disk_free": "1.2GB"}}, {"org/big": "1GB"}, "org/big",
     "needs 1.3 GB, 1.2 GB free in /models"),
    ({"gpu-01": {"disk_free": "21GB"}}, {"org/big": "20GB"}, "org/big", None),
    ({"gpu-01": {"disk_free": "10GB"}}, {}, "org/big", None),
    ({"gpu-01": {"disk_free": "10GB", "fetched": ["org/big"]}}, {"org/big": "20GB"}, "org/big",
     None),
    ({"gpu-01": {"disk_free": "10GB"}}, {"/models/x": "20GB"}, "/models/x", None),
    ({}, {"org/big": "20GB"}, "org/big", None),
])
def test_weights_room(fleet: dict[str, Any], sources: dict[str, Any], source: str,
                      why: str | None) -> None:
    cap = capacity(fleet, sources=sources)
    assert cap.weights_room(cap.nodes["gpu-01"], source) == why


def test_weights_room_without_dirs_or_report() -> None:
    cap = capacity({"gpu-01": {"disk_free": "1GB"}}, sources={"org/big": "20GB"},
                   extra_nodes={"gpu-02": {**GPU_NODE, "address": "10.0.0.2",
                                           "weights_dirs": []}})
    assert cap.weights_room(cap.nodes["gpu-02"], "org/big") is None
    node = cap.nodes["gpu-01"]
    assert cap.weights_room(node, "org/big") == "needs 21 GB, 1.0 GB free in /models"
    node.report = None
    assert cap.weights_room(node, "org/big") is None


def test_a_fabric_over_two_subnet_managers_is_a_located_problem() -> None:
    """The recorded node's ib-a spans two subnet managers: the node cannot carry a
    multi-node replica over it, and the reason names node, adapters and both SMs."""
    from pathlib import Path

    from llmgw.discovery import adapters, fabrics
    from llmgw.discovery.fabrics import DeclaredFabric

    sysfs = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs" / "two-ib-roce" / "sys"
    found = adapters.read(sysfs)
    [status] = fabrics.check([DeclaredFabric("ib-a", "infiniband", ("mlx5_0", "mlx5_2"))], found)
    cap = capacity()
    node = cap.nodes["gpu-01"]
    assert node.report is not None
    report = node.report.model_copy(update={"fabrics": [status], "adapters": found})
    state = nodes._node_state("gpu-01", node.spec, report)
    assert state.fabric_problems == {"ib-a": (
        "fabric ib-a not advertised: ib-a's adapters answer to 2 different subnet managers "
        "(mlx5_0: SM LID 0x1, GID prefix fe80:0000:0000:0000; mlx5_2: SM LID 0x2a, GID prefix "
        "fec0:0000:0000:0002); fix: declare each as its own fabric in the cluster's `fabrics:` "
        "and the node's `fabrics:` in nodes.yaml, or cable them to one subnet")}
    assert "ib-a" not in state.fabrics
