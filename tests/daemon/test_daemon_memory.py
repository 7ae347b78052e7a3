"""The daemon remembers what an unreachable node last ran, even nothing, and says as of when:
that is what lets the planner tell a node with no replicas from one nobody has seen."""

from __future__ import annotations

from pathlib import Path

from llmgw.daemon.reconcilers import Daemon
from llmgw.fleet.types import Fleet, NodeReport, Unit
from llmgw.planning import plans
from llmgw.spec.models import Cluster

SPEC = {
    "cluster": {"name": "memory"},
    "nodes": {"cpu-01": {"address": "local", "memory": "64GiB", "weights_dirs": ["/models"]},
              "cpu-02": {"address": "10.0.0.2", "memory": "64GiB", "weights_dirs": ["/models"]}},
    "models": {"tiny": {"source": "/models/tiny.gguf",
                        "profiles": [{"engine": "llama.cpp", "cpu": True}]}},
}
UNIT = Unit(name="llmgw-tiny-r0-s0.service", model="tiny", replica=0, digest="d", state="ready")


def reports(**nodes: NodeReport) -> Fleet:
    return Fleet(nodes=nodes)


def up(name: str, at: float, units: list[Unit] | None = None) -> NodeReport:
    return NodeReport(node=name, memory_total_bytes=64 * 2**30, collected_at=at,
                      units=units or [])


def down(name: str) -> NodeReport:
    return NodeReport(node=name, reachable=False, error="ssh: connection refused")


def test_a_node_seen_empty_then_lost_is_remembered_empty(tmp_path: Path) -> None:
    cluster = Cluster.model_validate(SPEC)
    daemon = Daemon(tmp_path, cluster, clock=lambda: 500.0)
    daemon._remember(reports(**{"cpu-01": up("cpu-01", 100.0), "cpu-02": up("cpu-02", 100.0)}))
    fleet = daemon._remember(reports(**{"cpu-01": up("cpu-01", 200.0), "cpu-02": down("cpu-02")}))
    lost = fleet.nodes["cpu-02"]
    assert (lost.units, lost.units_as_of, lost.units_known) == ([], 100.0, True)
    # Nothing can hide there: the model is placed on the node that answers.
    plan = plans.plan(cluster, fleet, 500.0)
    assert [(c.action, c.shards[0].node) for c in plan.changes] == [("create", "cpu-01")]


def test_a_node_never_seen_is_unknown_and_its_models_wait(tmp_path: Path) -> None:
    cluster = Cluster.model_validate(SPEC)
    daemon = Daemon(tmp_path, cluster, clock=lambda: 500.0)
    fleet = daemon._remember(reports(**{"cpu-01": up("cpu-01", 200.0), "cpu-02": down("cpu-02")}))
    assert fleet.nodes["cpu-02"].units_as_of is None and not fleet.nodes["cpu-02"].units_known
    plan = plans.plan(cluster, fleet, 500.0)
    assert plan.changes == ()
    [entry] = plan.unplaceable
    assert entry.note.startswith("a replica may still run on cpu-02 (unreachable)")


def test_a_lost_nodes_units_come_back_as_of_its_last_report(tmp_path: Path) -> None:
    cluster = Cluster.model_validate(SPEC)
    daemon = Daemon(tmp_path, cluster, clock=lambda: 500.0)
    daemon._remember(reports(**{"cpu-02": up("cpu-02", 100.0, [UNIT])}))
    fleet = daemon._remember(reports(**{"cpu-02": down("cpu-02")}))
    assert fleet.nodes["cpu-02"].units == [UNIT] and fleet.nodes["cpu-02"].units_as_of == 100.0
