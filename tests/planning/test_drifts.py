"""Drift classes beyond the plan cases: the unit rules one by one, the crash-loop
window's edges, node lost in events and JSON, and the class in every output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from plan_builders import cluster_from, fleet_from
from test_plan_cases import CASES, load_case, run_case

from llmgw.fleet.types import UNSEEN_EXIT, NodeReport, Unit
from llmgw.metrics.drifts import DriftCounts
from llmgw.planning import drifts, outputs, plans, replicas
from llmgw.planning.replicas import Member, ObservedReplica
from llmgw.planning.types import ObservedShard, Plan
from llmgw.spec.repairs import CrashLoop

NOW = 1_700_000_000.0


def unit(**fields: object) -> Unit:
    base: dict[str, object] = {"name": "llmgw-m-r0-s0.service", "model": "m", "replica": 0,
                               "digest": "d", "state": "ready"}
    return Unit.model_validate(base | fields)


@pytest.mark.parametrize(
    ("fields", "report", "kind"),
    [
        pytest.param({}, {}, None, id="ready"),
        pytest.param({"state": "starting"}, {}, None, id="starting-no-crash"),
        pytest.param({"state": "starting", "crashes": [NOW - 5]}, {}, "engine_crash",
                     id="restarting-after-crash"),
        pytest.param({"state": "failed"}, {}, "engine_crash", id="failed"),
        pytest.param({"state": "stopped", "stopped_by": "operator",
                      "last_exit": "killed by SIGTERM"}, {}, "stopped_by_hand", id="operator"),
        pytest.param({"state": "stopped", "stopped_by": "llmgw", "crashes": [NOW - 5]}, {},
                     "engine_crash", id="held-by-llmgw"),
        pytest.param({"state": "stopped"}, {"agent_started_at": NOW - 10}, "agent_restarted",
                     id="never-ran-since-agent-start"),
        pytest.param({"state": "stopped"}, {}, "stopped_by_hand", id="old-agent-no-evidence"),
        pytest.param({"state": "stopped", "last_exit": "exited with status 0"},
                     {"agent_started_at": NOW - 10}, "stopped_by_hand", id="exit-seen"),
        pytest.param({"state": "failed", "last_exit": UNSEEN_EXIT}, {}, "agent_restarted",
                     id="ended-unseen"),
    ],
)
def test_unit_rules(fields: dict[str, object], report: dict[str, object], kind: str | None,
                    ) -> None:
    found = drifts.unit_finding("n1", unit(**fields), NodeReport(node="n1", **report), NOW)
    assert (found.kind if found else None) == kind


def _replica(crashes: list[float]) -> ObservedReplica:
    replica = ObservedReplica("m", 0)
    replica.members[0] = Member("n1", unit(state="failed", crashes=crashes), {}, True)
    return replica


def test_crash_loop_counts_only_crashes_inside_the_window() -> None:
    rule = CrashLoop(crashes=3, window=60)
    assert drifts.crash_loop(_replica([NOW - 30, NOW - 20, NOW - 10]), rule, NOW)
    assert not drifts.crash_loop(_replica([NOW - 60, NOW - 20, NOW - 10]), rule, NOW)  # edge
    assert drifts.crash_loop(_replica([NOW - 59.9, NOW - 20, NOW]), rule, NOW)
    assert not drifts.crash_loop(_replica([NOW - 20, NOW - 10]), rule, NOW)
    assert not drifts.crash_loop(_replica([NOW - 30, NOW - 20, NOW - 10]), None, NOW)
    assert not drifts.crash_loop(_replica([NOW - 2, NOW - 1, NOW + 5]), rule, NOW)  # future


def _case(name: str) -> Plan:
    [path] = list(Path(CASES).glob(f"{name}-*.yaml"))
    return run_case(load_case(path))[0]


def test_node_lost_is_an_event_and_in_the_json() -> None:
    plan = _case("87")
    assert ("node_lost", "gpu-02", "llama-8b r0") in drifts.events(plan)
    assert ("declared_change", "gpu-01", "qwen-7b r0") in drifts.events(plan)
    data = json.loads(outputs.json_text(plan))
    assert [u["drift"] for u in data["unknown"]] == ["node_lost"]
    assert [c["drift"] for c in data["changes"]] == ["declared_change"]


def test_every_output_names_the_class_and_the_hold() -> None:
    plan = _case("77")
    text = outputs.text(plan)
    assert "= llama-8b r0 will be held (stopped, not restarted)" in text
    assert "why (engine crash): crash loop: gpu-01:" in text
    assert "evidence: gpu-01: llmgw-llama-8b-r0-s0.service restarting (killed by SIGSEGV" in text
    assert "Held (drift shown, not repaired):" in text
    assert text.rstrip().endswith("1 to hold. 1 replica held (not repaired).")
    data = json.loads(outputs.json_text(plan))
    assert data["summary"]["hold"] == 1 and data["summary"]["held"] == 1
    [change] = data["changes"]
    assert change["action"] == "hold" and change["drift"] == "engine_crash"
    assert [r["unit"] for r in change["removes"]] == ["llmgw-llama-8b-r0-s0.service"]
    assert data["held"][0]["drift"] == "engine_crash"
    markdown = outputs.markdown(plan)
    assert "engine crash: crash loop" in markdown and "| held |" in markdown
    [phase] = plan.changes[0].phases()
    assert [(op.node, op.action) for op in phase] == [("gpu-01", "stop")]


def test_a_lasting_drift_counts_once_and_again_when_it_returns() -> None:
    counts = DriftCounts()
    crash = _case("75")
    calm = _case("20")
    for plan in (crash, crash, calm, crash):
        counts.observe(plan)
    [total, held] = list(counts.families())
    samples = {(s.labels["class"], s.labels["node"]): s.value for s in total.samples
               if s.name == "llmgw_drift_total"}
    assert samples[("engine_crash", "gpu-01")] == 2
    looped = _case("76")
    counts.observe(looped)
    [_, held] = list(counts.families())
    assert [(s.labels["class"], s.value) for s in held.samples] == [("engine_crash", 1)]


def test_stranger_units_are_never_adopted_as_replicas() -> None:
    cluster = cluster_from({
        "nodes": {"gpu-01": {"address": "10.0.0.1", "gpus": [{"class": "l40s-45g", "count": 2}]}},
        "models": {"m": {"source": "org/m", "profiles": [{"engine": "vllm",
                                                          "gpu_class": "l40s-45g"}]}},
    })
    fleet = fleet_from(cluster, None, [{"model": "m", "replica": 0, "on": {"gpu-01": [0]},
                                        "written": False}], NOW)
    assert drifts.kept_strangers(cluster, fleet) == frozenset()  # repair on: nothing kept
    observation = replicas.collect(cluster, fleet)
    assert observation.replicas == {}
    assert [o.reason for o in observation.orphans] == [
        "llmgw-m-r0-s0.service on gpu-01 was not written by llmgw"]


@pytest.mark.parametrize(
    ("case", "classes"),
    [
        ("21", ["replace declared_change"]),  # args changed
        ("23", ["restart engine_crash"]),  # failed, from an agent without evidence
        ("31", ["replace hardware_fault"]),  # ECC errors on its GPU
        ("34", ["replace stopped_by_hand"]),  # a shard's unit gone from a node that answers
        ("43", ["replace hardware_fault"]),  # its GPU gone
    ],
)
def test_the_earlier_cases_get_their_classes(case: str, classes: list[str]) -> None:
    assert [f"{c.action} {c.drift}" for c in _case(case).changes] == classes


def test_evidence_reads_as_the_agent_reported_it() -> None:
    def line(**fields: object) -> str:
        found = drifts.unit_finding("n1", unit(**fields), NodeReport(node="n1"), NOW)
        assert found is not None
        return found.evidence[0]

    assert line(state="failed", last_exit="killed by SIGKILL", last_exit_at=NOW - 0.5,
                restarts=1, crashes=[NOW - 90]) == (
        "n1: llmgw-m-r0-s0.service failed (killed by SIGKILL, just now), restarted 1 time, "
        "1 crash since 1m30s ago")
    assert line(state="failed", last_exit="exited with status 3", last_exit_at=NOW - 1,
                restarts=2, crashes=[NOW - 3, NOW - 1]) == (
        "n1: llmgw-m-r0-s0.service failed (exited with status 3, 1s ago), restarted 2 times, "
        "2 crashes since 3s ago")
    assert line(state="stopped", stopped_by="operator", last_exit="killed by SIGTERM") == (
        "n1: llmgw-m-r0-s0.service stopped by someone other than llmgw (killed by SIGTERM, "
        "at an unknown time)")
    assert drifts.unit_finding("n1", unit(state="failed"), None, NOW) == drifts.Finding(
        "engine_crash", ())


def test_a_hold_stops_exactly_the_units_that_run() -> None:
    plan, _, fleet, _ = run_case(load_case(next(Path(CASES).glob("77-*.yaml"))))
    [observed] = fleet.nodes["gpu-01"].units
    [hold] = plan.changes
    assert hold.removes == (ObservedShard(
        node="gpu-01", unit=observed.name, rank=0, digest=observed.digest, state="starting",
        port=observed.port, detail=observed.detail),)


@pytest.mark.parametrize(
    ("entry", "kind"),
    [
        ({"state": "failed", "log_tail": ["fatal: out of memory"]}, "engine_crash"),
        ({"state": "stopped", "stopped_by": "operator"}, "stopped_by_hand"),
    ],
)
def test_an_unlabelled_replica_in_trouble_is_replaced_for_its_trouble(
    entry: dict[str, object], kind: str,
) -> None:
    cluster = cluster_from({
        "nodes": {"gpu-01": {"address": "10.0.0.1", "gpus": [{"class": "l40s-45g", "count": 2}]}},
        "models": {"m": {"source": "org/m", "profiles": [{"engine": "vllm",
                                                          "gpu_class": "l40s-45g"}]}},
    })
    fleet = fleet_from(cluster, None, [{"model": "m", "replica": 0, "on": {"gpu-01": [0]},
                                        "labels": False, **entry}], NOW)
    plan = plans.plan(cluster, fleet, NOW)
    assert [(c.action, c.drift) for c in plan.changes] == [("replace", kind)]
    assert "its spec is unknown (no X-Llmgw-Spec label)" in plan.changes[0].reasons
