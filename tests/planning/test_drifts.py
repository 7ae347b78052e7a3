"""Drift classes beyond the plan cases: the unit rules one by one, the crash-loop
window's edges, node lost in events and JSON, and the class in every output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from plan_builders import cluster_from, fleet_from
from test_plan_cases import CASES, load_case, run_case

from llmgw.fleet.types import UNSEEN_EXIT, FabricStatus, Gpu, GpuProcess, NodeReport, Unit
from llmgw.metrics.drifts import DriftCounts
from llmgw.planning import drifts, outputs, plans, replicas
from llmgw.planning.replicas import Member, ObservedReplica
from llmgw.planning.types import Change, ObservedShard, Plan
from llmgw.spec.repairs import CrashLoop, DriftSettings

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


# -- the rules the mutation run found unheld (docs/testing.md, drifts row) ---------


@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        pytest.param({"state": "stopped", "last_exit": UNSEEN_EXIT}, "agent_restarted",
                     id="stopped-ended-unseen"),
        pytest.param({"state": "starting", "last_exit": UNSEEN_EXIT}, "agent_restarted",
                     id="starting-ended-unseen"),
        pytest.param({"state": "loading", "crashes": [NOW - 5]}, "engine_crash",
                     id="loading-after-crash"),
    ],
)
def test_more_unit_rules(fields: dict[str, object], kind: str) -> None:
    found = drifts.unit_finding("n1", unit(**fields), NodeReport(node="n1"), NOW)
    assert found is not None and found.kind == kind


def test_evidence_of_each_stopped_unit_reads_in_full() -> None:
    where = "n1: llmgw-m-r0-s0.service"

    def evidence(fields: dict[str, object], report: NodeReport | None) -> tuple[str, ...]:
        found = drifts.unit_finding("n1", unit(**fields), report, NOW)
        assert found is not None
        return found.evidence

    assert evidence({"state": "failed", "last_exit": UNSEEN_EXIT}, None) == (
        f"{where}: its engine {UNSEEN_EXIT}; the agent started at an unknown time",)
    assert evidence({"state": "stopped", "stopped_by": "llmgw", "crashes": [NOW - 5]},
                    NodeReport(node="n1")) == (
        f"{where} held stopped by llmgw, 1 crash since 5s ago",)
    assert evidence({"state": "stopped"}, NodeReport(node="n1", agent_started_at=NOW - 10)) == (
        f"{where} has not run since its agent started (the agent 10s ago)",)
    assert evidence({"state": "stopped"}, NodeReport(node="n1")) == (
        f"{where} stopped (its agent does not say by whom)",)


def _gpu(index: int, **fields: object) -> Gpu:
    return Gpu.model_validate({"index": index, "uuid": f"GPU-{index}", "name": "NVIDIA L40S",
                               "gpu_class": "l40s-45g"} | fields)


def _member(node: str, spec: dict[str, object]) -> Member:
    return Member(node, unit(), spec, True)


def _fabric(name: str, advertised: bool, reasons: list[str]) -> FabricStatus:
    return FabricStatus(name=name, kind="infiniband", adapters=[], advertised=advertised,
                        reasons=reasons)


def test_hardware_evidence_names_every_fault_on_every_reachable_node() -> None:
    # Rank 0's node is unreachable and says nothing; rank 1's GPUs: one gone, one in MIG
    # mode, one with ECC errors, and the fabric down with the agent's reason.
    replica = ObservedReplica("m", 0)
    spec = {"nodes": ["n0", "n1"], "fabric": "ib0"}
    replica.members[0] = _member("n0", {**spec, "gpus": ["GPU-0"]})
    replica.members[1] = _member("n1", {**spec, "gpus": ["GPU-9", "GPU-1", "GPU-2"]})
    reports = {
        "n0": NodeReport(node="n0", reachable=False),
        "n1": NodeReport(node="n1", gpus=[_gpu(1, mig_mode="Enabled"),
                                         _gpu(2, ecc_uncorrected=2)],
                         fabrics=[_fabric("roce0", True, []),
                                  _fabric("ib0", False, ["mlx5_0 is DOWN", "no GID"])]),
    }
    assert drifts.replica_finding(replica, reports, NOW) == drifts.Finding("hardware_fault", (
        "n1: GPU GPU-9 is gone", "n1: GPU 1 is in MIG mode",
        "n1: GPU 2 has 2 uncorrected ECC errors",
        "n1: fabric ib0 is down: mlx5_0 is DOWN; no GID"))


def test_a_fabric_down_without_a_reason_says_not_advertised() -> None:
    replica = ObservedReplica("m", 0)
    spec = {"nodes": ["n1", "n2", "n3"], "fabric": "ib0"}
    for rank, node in enumerate(["n1", "n2", "n3"]):
        replica.members[rank] = _member(node, spec)
    reports = {"n1": NodeReport(node="n1", fabrics=[_fabric("ib0", False, [])]),
               "n2": NodeReport(node="n2")}  # n3: no report at all
    assert drifts.replica_finding(replica, reports, NOW) == drifts.Finding("hardware_fault", (
        "n1: fabric ib0 is down: not advertised", "n2: fabric ib0 is down: not advertised"))


def test_a_single_node_replica_does_not_need_its_fabric() -> None:
    replica = ObservedReplica("m", 0)
    replica.members[0] = _member("n1", {"nodes": ["n1"], "fabric": "ib0"})
    reports = {"n1": NodeReport(node="n1", fabrics=[_fabric("ib0", False, ["down"])])}
    assert drifts.replica_finding(replica, reports, NOW) is None


def test_a_foreign_process_without_a_name_is_named_by_pid() -> None:
    replica = ObservedReplica("m", 0)
    replica.members[0] = _member("n1", {"gpus": ["GPU-0"]})
    gpu = _gpu(0, processes=[GpuProcess(pid=42), GpuProcess(pid=7, name="python3")])
    found = drifts.replica_finding(replica, {"n1": NodeReport(node="n1", gpus=[gpu])}, NOW)
    assert found == drifts.Finding("foreign_process", (
        "n1: GPU 0 has memory held by pid 42, not started by llmgw",
        "n1: GPU 0 has memory held by pid 7 (python3), not started by llmgw"))


def test_a_missing_shard_counts_only_on_a_node_that_answers() -> None:
    replica = ObservedReplica("m", 0)
    replica.members[0] = _member("n1", {"nodes": ["n1", "n2"]})
    answering = {"n1": NodeReport(node="n1"), "n2": NodeReport(node="n2")}
    assert drifts.replica_finding(replica, answering, NOW) == drifts.Finding(
        "stopped_by_hand", ("n2: shard 1 is gone (its unit was removed)",))
    silent = {"n1": NodeReport(node="n1"), "n2": NodeReport(node="n2", reachable=False)}
    assert drifts.replica_finding(replica, silent, NOW) is None


def test_a_node_without_a_report_is_warned_about_in_full() -> None:
    cluster = cluster_from({
        "nodes": {"gpu-01": {"address": "10.0.0.1", "gpus": [{"class": "l40s-45g", "count": 1}]}},
        "models": {},
    })
    assert drifts.blind_nodes(cluster, {}) == [
        "gpu-01: no report from its agent; replicas there, if any, cannot be seen"]


def test_a_class_without_a_setting_is_repaired() -> None:
    settings = DriftSettings.model_validate({"stopped_by_hand": {"repair": False}})
    assert drifts.repairs(settings, "declared_change") is True  # no setting: follows `sync`
    assert drifts.repairs(settings, "agent_restarted") is True
    assert drifts.repairs(settings, "stopped_by_hand") is False
    assert drifts.repairs(settings, "engine_crash") is True


def test_removing_a_unit_no_node_reports_is_a_declared_change() -> None:
    cluster = cluster_from({
        "nodes": {"gpu-01": {"address": "10.0.0.1", "gpus": [{"class": "l40s-45g", "count": 1}]}},
        "models": {},
    })
    fleet = fleet_from(cluster, None, [], NOW)
    gone = ObservedShard(node="gpu-09", unit="llmgw-m-r0-s0.service", rank=0, digest="d",
                         state="ready", port=None, detail="")
    change = Change("destroy", "m", 0, ("not in the cluster",), removes=(gone,))
    assert drifts._classify(change, None, None, fleet) == drifts.Finding("declared_change")


DRIFT_CLUSTER = {
    "nodes": {name: {"address": f"10.0.0.{i}", "gpus": [{"class": "l40s-45g", "count": 1}]}
              for i, name in enumerate(["gpu-01", "gpu-02", "gpu-03", "gpu-04"], 1)},
    "models": {name: {"source": f"org/{name}",
                      "profiles": [{"engine": "vllm", "gpu_class": "l40s-45g"}]}
               for name in ["a-model", "b-model", "c-model"]},
}


def test_held_replicas_are_all_listed_in_model_order() -> None:
    # Held from changes (b, c: stopped by hand, repair off) come before the kept strangers
    # (a) as they are found; the plan lists them by model, and only strangers are kept.
    cluster = cluster_from({**DRIFT_CLUSTER, "cluster": {"name": "t", "drift": {
        "stopped_by_hand": {"repair": False}, "stranger_unit": {"repair": False}}}})
    fleet = fleet_from(cluster, None, [
        {"model": "a-model", "replica": 0, "on": {"gpu-01": [0]}, "written": False},
        {"model": "b-model", "replica": 0, "on": {"gpu-02": [0]}, "state": "stopped",
         "stopped_by": "operator"},
        {"model": "c-model", "replica": 0, "on": {"gpu-03": [0]}, "state": "stopped",
         "stopped_by": "operator"},
    ], NOW)
    plan = plans.plan(cluster, fleet, NOW)
    assert [(h.model, h.drift) for h in plan.held] == [
        ("a-model", "stranger_unit"), ("b-model", "stopped_by_hand"),
        ("c-model", "stopped_by_hand")]


def test_only_an_engine_crash_restart_is_held_for_a_crash_loop() -> None:
    # b crash-loops (held); c was stopped by hand after as many crashes: restarted all the same.
    cluster = cluster_from({**DRIFT_CLUSTER, "cluster": {"name": "t", "drift": {
        "engine_crash": {"crash_loop": {"crashes": 3, "window": "10m"}}}}})
    crashes = [-50, -40, -30]
    fleet = fleet_from(cluster, None, [
        {"model": "b-model", "replica": 0, "on": {"gpu-02": [0]}, "state": "failed",
         "crashes": crashes},
        {"model": "c-model", "replica": 0, "on": {"gpu-03": [0]}, "state": "stopped",
         "stopped_by": "operator", "crashes": crashes},
    ], NOW)
    plan = plans.plan(cluster, fleet, NOW)
    assert [(c.action, c.model, c.drift) for c in plan.changes if c.action != "create"] == [
        ("restart", "c-model", "stopped_by_hand")]
    assert [(h.model, h.drift) for h in plan.held] == [("b-model", "engine_crash")]


def test_every_restarting_crash_loop_gets_its_hold() -> None:
    # a runs; b restarts after one crash (no loop); c after three: only c is held and
    # stopped, its unit as the agent reported it (the loading detail included).
    cluster = cluster_from({**DRIFT_CLUSTER, "cluster": {"name": "t", "drift": {
        "engine_crash": {"crash_loop": {"crashes": 3, "window": "10m"}}}}})
    fleet = fleet_from(cluster, None, [
        {"model": "a-model", "replica": 0, "on": {"gpu-01": [0]}},
        {"model": "b-model", "replica": 0, "on": {"gpu-02": [0]}, "state": "starting",
         "crashes": [-20]},
        {"model": "c-model", "replica": 0, "on": {"gpu-03": [0]}, "state": "starting",
         "crashes": [-50, -40, -30]},
    ], NOW)
    units = fleet.nodes["gpu-03"].units
    units[0] = units[0].model_copy(update={"detail": "loading weights (40 %)"})
    plan = plans.plan(cluster, fleet, NOW)
    assert [(c.action, c.model) for c in plan.changes] == [("hold", "c-model")]
    [removed] = plan.changes[0].removes
    assert (removed.unit, removed.state, removed.detail) == (
        "llmgw-c-model-r0-s0.service", "starting", "loading weights (40 %)")


def test_a_hold_stops_no_unit_on_a_node_that_does_not_answer() -> None:
    # A two-node replica crash-loops on gpu-a-01; gpu-a-02 stopped answering (its units are
    # the last report's): the hold stops the unit it can reach, and names both nodes.
    case = load_case(next(Path(CASES).glob("34-*.yaml")))
    cluster = cluster_from({**case["cluster"], "cluster": {"name": "t", "drift": {
        "engine_crash": {"crash_loop": {"crashes": 3, "window": "10m"}}}}})
    eight = list(range(8))
    fleet = fleet_from(cluster, None, [
        {"model": "llama-70b", "replica": 0, "on": {"gpu-a-01": eight, "gpu-a-02": eight},
         "fabric": "ib-a", "state": "starting", "crashes": [-50, -40, -30]}], NOW)
    fleet.nodes["gpu-a-02"] = fleet.nodes["gpu-a-02"].model_copy(update={"reachable": False})
    plan = plans.plan(cluster, fleet, NOW)
    [hold] = plan.changes
    assert (hold.action, [r.node for r in hold.removes]) == ("hold", ["gpu-a-01"])
    assert [h.nodes for h in plan.held] == [("gpu-a-01", "gpu-a-02")]
