"""planning/replicas.py: replicas rebuilt from reported units, and labels it will not trust.

A unit's ``X-Llmgw-Spec`` label is text on the node; anyone who can edit the
unit file can also recompute its digest. A label whose fields are not what
llmgw writes is treated like no label at all — the plan warns and goes on —
where it used to stop the planner with a TypeError (``gpus: null``) or a
ValueError (``profile: "x"``, ``memory: "x"``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from plan_builders import cluster_from, fleet_from

from llmgw.fleet.types import Demand, Fleet, Unit
from llmgw.planning import plans, replicas, shards

NOW = 1_700_000_000.0
NODE = {"mgmt_interface": "eno1", "gpus": [{"class": "h100-80g", "count": 8}],
        "fabrics": {"ib-a": ["mlx5_0"]}}
CLUSTER = {
    "fabrics": {"ib-a": {"kind": "infiniband"}},
    "nodes": {"gpu-01": {"address": "10.0.1.1", **NODE}, "gpu-02": {"address": "10.0.1.2", **NODE}},
    "models": {"m": {"source": "org/m", "profiles": [
        {"engine": "vllm", "gpu_class": "h100-80g", "nodes": 2, "tensor_parallel": 8,
         "pipeline_parallel": 2}]}},
}
RUNNING = [{"model": "m", "replica": 0, "fabric": "ib-a",
            "on": {"gpu-01": list(range(8)), "gpu-02": list(range(8))}}]
UNIT = "llmgw-m-r0-s0.service"


def tampered(fleet: Fleet, field: str, value: Any) -> Fleet:
    """``fleet`` with rank 0's spec label changed and its digest recomputed to match."""
    nodes = {}
    for name, report in fleet.nodes.items():
        units = []
        for unit in report.units:
            if unit.rank == 0:
                spec = json.loads(unit.labels[shards.SPEC_LABEL])
                spec[field] = value
                digest = shards.digest(spec)
                unit = unit.model_copy(update={"digest": digest, "labels": {
                    **unit.labels, shards.SPEC_LABEL: shards.spec_json(spec),
                    "X-Llmgw-Digest": digest}})
            units.append(unit)
        nodes[name] = report.model_copy(update={"units": units})
    return fleet.model_copy(update={"nodes": nodes})


HOSTILE = [
    ("gpus", None, "gpus is not a list of GPU UUIDs"),
    ("gpus", [0, 1], "gpus is not a list of GPU UUIDs"),
    ("gpus", "GPU-gpu-01-00", "gpus is not a list of GPU UUIDs"),
    ("nodes", ["gpu-01", 2], "nodes is not a list of names"),
    ("nodes", "gpu-01", "nodes is not a list of names"),
    ("profile", "x", "profile is not a profile number"),
    ("profile", -1, "profile is not a profile number"),
    ("profile", True, "profile is not a profile number"),
    ("memory", "x", "memory is not a number of bytes"),
    ("memory", None, "memory is not a number of bytes"),
    ("port", "18000", "port is not a port"),
    ("dist_port", 1.5, "dist_port is not a port"),
    ("aux_port", None, "aux_port is not a port"),
    ("fabric", 7, "fabric is not a fabric name"),
    ("gpu_class", ["h100-80g"], "gpu_class is not a GPU class"),
]


@pytest.mark.parametrize(("field", "value", "why"), HOSTILE,
                         ids=[f"{f}={v!r}" for f, v, _ in HOSTILE])
def test_a_spec_label_llmgw_did_not_write_is_not_trusted(field: str, value: Any,
                                                          why: str) -> None:
    cluster = cluster_from(CLUSTER)
    fleet = tampered(fleet_from(cluster, None, RUNNING, NOW), field, value)
    unit = next(u for u in fleet.nodes["gpu-01"].units if u.rank == 0)
    assert replicas.parse_spec(unit) is None
    seen = replicas.collect(cluster, fleet)
    warning = f"gpu-01: {UNIT}: its X-Llmgw-Spec label's {why}; treating its spec as unknown"
    assert seen.warnings == [warning]
    assert seen.replicas[("m", 0)].members[0].spec is None

    plan = plans.plan(cluster, fleet, NOW, Demand())
    assert warning in plan.warnings
    assert plan.changes == ()  # kept as it runs: nothing says it is wrong


@pytest.mark.parametrize(("field", "value"), [
    ("port", None), ("dist_port", None), ("fabric", None), ("gpu_class", None),
    ("gpus", []), ("nodes", ["gpu-01", "gpu-02"]), ("profile", 0), ("memory", 0),
    ("aux_port", 18000),
])
def test_a_spec_label_as_llmgw_writes_it_is_trusted(field: str, value: Any) -> None:
    cluster = cluster_from(CLUSTER)
    fleet = tampered(fleet_from(cluster, None, RUNNING, NOW), field, value)
    unit = next(u for u in fleet.nodes["gpu-01"].units if u.rank == 0)
    spec = replicas.parse_spec(unit)
    assert spec is not None and spec[field] == value
    assert replicas.collect(cluster, fleet).warnings == []


def test_a_label_that_does_not_match_its_digest() -> None:
    cluster = cluster_from(CLUSTER)
    fleet = fleet_from(cluster, None, RUNNING, NOW)
    report = fleet.nodes["gpu-01"]
    unit = report.units[0].model_copy(update={"digest": "0" * 16})
    fleet = fleet.model_copy(update={"nodes": {
        **fleet.nodes, "gpu-01": report.model_copy(update={"units": [unit]})}})
    assert replicas.parse_spec(unit) is None
    assert replicas.collect(cluster, fleet).warnings == [
        f"gpu-01: {UNIT}: its X-Llmgw-Spec label does not match its digest; treating its "
        "spec as unknown"]


# -- failure(): why a unit failed, in one line ---------------------------------


def failed(detail: str = "", log_tail: tuple[str, ...] = ()) -> replicas.Member:
    unit = Unit(name=UNIT, model="m", replica=0, digest="0" * 16, state="failed",
                detail=detail, log_tail=list(log_tail))
    return replicas.Member("gpu-01", unit, None, True)


@pytest.mark.parametrize(("detail", "log_tail", "line"), [
    # the last two lines that name an error say more than a generic last line
    ("exited with status 1", ("loading", "ValueError: bad config", "OSError: no such file",
                              "RuntimeError: CUDA error", "shutting down"),
     "OSError: no such file | RuntimeError: CUDA error"),
    ("exited with status 1", ("permission denied: /dev/nvidia0", "  "),
     "permission denied: /dev/nvidia0"),
    # no error line: the agent's detail, else the last line of the log
    ("exited with status 1", ("starting", "stopping"), "exited with status 1"),
    ("", ("starting", "  stopping  ", "   "), "stopping"),
    ("", (), ""),
])
def test_failure_names_the_cause(detail: str, log_tail: tuple[str, ...], line: str) -> None:
    expected = f"gpu-01: {UNIT} failed" + (f": {line}" if line else "")
    assert replicas.failure(failed(detail, log_tail)) == expected


def test_failure_is_bounded() -> None:
    text = replicas.failure(failed("x" * 1000))
    assert text == f"gpu-01: {UNIT} failed: " + "x" * 297 + "..."


# -- collect(): one replica per (model, replica), duplicates set aside ---------


def test_a_second_copy_of_a_shard_is_an_orphan_and_the_rest_is_still_read() -> None:
    cluster = cluster_from(CLUSTER)
    one = fleet_from(cluster, None, [{"model": "m", "replica": 0, "fabric": "ib-a",
                                      "on": {"gpu-01": [0], "gpu-02": [0]}}], NOW)
    copy = next(u for u in one.nodes["gpu-01"].units if u.rank == 0)
    later = copy.model_copy(update={"replica": 7, "name": "llmgw-m-r7-s0.service",
                                    "labels": {}})
    second = one.nodes["gpu-02"]
    fleet = one.model_copy(update={"nodes": {
        **one.nodes, "gpu-02": second.model_copy(update={"units": [*second.units, copy, later]})}})
    seen = replicas.collect(cluster, fleet)
    assert [(o.node, o.unit, o.reason) for o in seen.orphans] == [
        ("gpu-02", copy, "duplicate of shard 0 on gpu-01")]
    assert seen.replicas[("m", 0)].members[0].node == "gpu-01"
    assert sorted(seen.replicas) == [("m", 0), ("m", 7)]


def test_since_is_the_first_shards() -> None:
    head, other = failed(), failed()
    head.unit = head.unit.model_copy(update={"since": 100.0})
    other.unit = other.unit.model_copy(update={"rank": 1, "since": 200.0})
    assert replicas.ObservedReplica("m", 0, {0: head, 1: other}).since() == 100.0
    assert replicas.ObservedReplica("m", 0, {1: other}).since() is None
