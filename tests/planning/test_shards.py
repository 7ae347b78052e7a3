"""planning/shards.py: from a placement to the shards' specs, digests and unit files."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from plan_builders import cluster_from, fleet_from

from llmgw.fleet.types import CachedWeights, SourceFacts, Weights
from llmgw.planning import shards
from llmgw.planning.placements import Placement, Slot
from llmgw.planning.types import Shard

NOW = 1_700_000_000.0
NODE = {"mgmt_interface": "eno1", "mgmt_address": "10.1.0.1",
        "gpus": [{"class": "h100-80g", "count": 2}], "weights_dirs": ["/models"]}


def cluster(profile: dict[str, Any], fabric: dict[str, Any] | None = None) -> Any:
    adapters = {"ib-a": ["mlx5_0", "mlx5_1"]}
    return cluster_from({
        "fabrics": {"ib-a": fabric or {"kind": "infiniband"}},
        "nodes": {"gpu-01": {"address": "10.0.0.1", **NODE, "fabrics": adapters},
                  "gpu-02": {"address": "10.0.0.2", **NODE, "mgmt_address": "10.1.0.2",
                             "fabrics": adapters}},
        "models": {"m": {"source": "org/m", "served_name": "public-m", "profiles": [profile]}},
    })


def slot(node: str, **ports: int) -> Slot:
    return Slot(node, "h100-80g", (0, 1), (f"GPU-{node}-00", f"GPU-{node}-01"), **ports)


ONE = Placement(0, (slot("gpu-01", port=18000),))
TWO = Placement(0, (slot("gpu-01", port=18000, dist_port=18001), slot("gpu-02", aux_port=18000)),
                fabric="ib-a")
VLLM = {"engine": "vllm", "gpu_class": "h100-80g", "tensor_parallel": 2}
SGLANG2 = {"engine": "sglang", "gpu_class": "h100-80g", "tensor_parallel": 4, "nodes": 2}


def test_unit_files_only_when_asked() -> None:
    spec = cluster(VLLM)
    reports = fleet_from(spec, None, None, NOW).nodes
    assert [s.files for s in shards.build(spec, reports, "m", 0, ONE)] == [None]
    (rendered,) = shards.build(spec, reports, "m", 0, ONE, render=True)
    assert rendered.files is not None and rendered.files == shards.files(rendered)


def test_spec_carries_the_health_port_and_the_engine_version() -> None:
    spec = cluster({**SGLANG2, "engine_version": "0.5.23"})
    head, second = shards.build(spec, fleet_from(spec, None, None, NOW).nodes, "m", 0, TWO)
    assert "aux_port" not in head.spec and second.spec["aux_port"] == 18000
    assert head.spec["engine_version"] == second.spec["engine_version"] == "0.5.23"
    plain = shards.build(cluster(SGLANG2), fleet_from(spec, None, None, NOW).nodes, "m", 0, TWO)
    assert "engine_version" not in plain[0].spec


def test_nccl_gets_what_the_agent_found_on_each_node() -> None:
    spec = cluster(SGLANG2, {"kind": "roce"})
    fleet = fleet_from(spec, {"gpu-02": {"adapters_down": {"ib-a": ["mlx5_0"]}}}, None, NOW)
    reports = dict(fleet.nodes)
    for name in reports:  # the RoCE v2 GID index the agent found
        fabrics = [f.model_copy(update={"gid_index": 3}) for f in reports[name].fabrics]
        reports[name] = reports[name].model_copy(update={"fabrics": fabrics})
    head, second = shards.build(spec, reports, "m", 0, TWO)
    assert (head.spec["env"]["NCCL_IB_HCA"], head.spec["env"]["NCCL_IB_GID_INDEX"]) == (
        "=mlx5_0,mlx5_1", "3")
    assert (second.spec["env"]["NCCL_IB_HCA"], second.spec["env"]["NCCL_IB_GID_INDEX"]) == (
        "=mlx5_1", "3")


def test_unit_file_names_the_served_name_and_runs_the_prelude() -> None:
    spec = cluster(VLLM)
    (built,) = shards.build(spec, fleet_from(spec, None, None, NOW).nodes, "m", 0, ONE)
    assert "X-Llmgw-Served-Name=public-m\n" in shards.files(built).unit_text
    nameless = {key: value for key, value in built.spec.items() if key != "served_name"}
    assert "X-Llmgw-Served-Name=m\n" in shards.files(replace(built, spec=nameless)).unit_text
    prelude = {**built.spec, "prelude": [["mkdir", "-p", "/models/cache"]]}
    unit = shards.files(replace(built, spec=prelude)).unit_text
    assert "mkdir -p /models/cache" in unit
    assert "mkdir" not in shards.files(built).unit_text


def test_weights_an_operator_placed_twice_the_first_path_wins() -> None:
    spec = cluster(VLLM)
    fleet = fleet_from(spec, None, None, NOW)
    found = [Weights(path=path, format="safetensors", size_bytes=1)
             for path in ("/srv/models/org/m", "/data/org/m")]
    report = fleet.nodes["gpu-01"].model_copy(update={"weights": found})
    (built,) = shards.build(spec, {"gpu-01": report}, "m", 0, ONE)
    assert built.spec["source"] == "org/m" and "/data/org/m" in built.spec["argv"]
    assert "weights" not in built.spec  # nothing to fetch
    pinned = cluster({**VLLM, "source": "org/m@v2"})
    (fetched,) = shards.build(pinned, {"gpu-01": report}, "m", 0, ONE)
    assert fetched.spec["weights"] == {"source": "org/m@v2", "dir": "/models"}


def shard_fetching(source: str) -> Shard:
    spec = cluster({**VLLM, "source": source})
    (built,) = shards.build(spec, fleet_from(spec, None, None, NOW).nodes, "m", 0, ONE)
    return built


@pytest.mark.parametrize(("cached", "facts", "note"), [
    (["org/m@v2"], {}, "present in /models"),
    (["org/m"], {}, "will fetch org/m@v2 into /models"),
    ([], {"org/m@v2": SourceFacts(size_bytes=16 * 10**9)}, "will fetch 16 GB into /models"),
    ([], {"org/m": SourceFacts(size_bytes=16 * 10**9)}, "will fetch org/m@v2 into /models"),
    ([], {"org/m@v2": SourceFacts(error="hub said 401")},
     "will fetch org/m@v2 into /models (size unknown: hub said 401)"),
])
def test_weights_note(cached: list[str], facts: dict[str, SourceFacts], note: str) -> None:
    built = shard_fetching("org/m@v2")
    spec = cluster(VLLM)
    report = fleet_from(spec, None, None, NOW).nodes["gpu-01"].model_copy(update={
        "cached_weights": [CachedWeights(source=s, path=f"/models/hub/{s}", size_bytes=1)
                           for s in cached]})
    assert shards.weights_note(built, report, facts) == note
    assert shards.weights_note(built, None, facts) == (
        note if not cached else "will fetch org/m@v2 into /models")


@pytest.mark.parametrize(("allowed", "fetch"), [
    ([], {"endpoint": None, "token_file": None, "disk_margin": 0.05}),
    (["files.lab"], {"endpoint": None, "token_file": None, "disk_margin": 0.05,
                     "allowed_hosts": ["files.lab"]}),
])
def test_the_node_is_told_the_allowed_hosts(allowed: list[str], fetch: dict[str, Any]) -> None:
    """The agent checks each connection of its download against them (llmgw.hub.reaches)."""
    data = cluster({**VLLM, "source": "http://files.lab/m.gguf"}).model_dump(
        by_alias=True, exclude_none=True)
    data["cluster"]["weights"]["allowed_hosts"] = allowed
    spec = cluster_from(data)
    (built,) = shards.build(spec, fleet_from(spec, None, None, NOW).nodes, "m", 0, ONE)
    assert built.spec["fetch"] == fetch
