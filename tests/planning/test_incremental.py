"""The incremental planner plans what the full planner plans, byte for byte.

One :class:`Planner` lives through a seeded random walk of edits, as the
daemon's does through ticks: models added, removed and changed (an engine
flag, ``min``), an engine failing, nodes lost, back and gone without a
report, GPUs faulted, healed and taken by a foreign process, a fabric down,
nodes added to and removed from the cluster; between edits the plan is
applied (every new unit ready), and every report is re-collected (new
objects, a new ``collected_at``) as agents answer each tick, or, at half the
ticks, an unchanged node's report is the same object again, as the pool hands
out pushed observations. At every step
the planner's plan, serialized, must equal ``plans.plan``'s.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
from plan_builders import apply, cluster_from, fleet_from

from llmgw.fleet.types import Fleet, GpuProcess, NodeReport
from llmgw.planning import outputs, plans
from llmgw.planning.planners import Planner
from llmgw.planning.types import Plan

NOW = 1_767_600_000.0
STEPS = 40


def _data(nodes: int, models: int) -> dict[str, Any]:
    node_specs: dict[str, Any] = {}
    for i in range(nodes):
        node_specs[f"gpu-{i:02d}"] = _node(i)
    return {"cluster": {"name": "walk"}, "fabrics": {"ib-a": {"kind": "infiniband"}},
            "nodes": node_specs, "models": {f"m{i:02d}": _model(i) for i in range(models)}}


def _node(i: int) -> dict[str, Any]:
    h100 = i % 3 != 2
    spec: dict[str, Any] = {
        "address": f"10.0.{i}.10", "mgmt_interface": "eno1", "weights_dirs": ["/models"],
        "gpus": [{"class": "h100-80g" if h100 else "a100-80g", "count": 8}],
    }
    if h100:
        spec["fabrics"] = {"ib-a": ["mlx5_0", "mlx5_1"]}
    return spec


def _model(i: int) -> dict[str, Any]:
    tp = (1, 2, 4, 8)[i % 4]
    args = {"max-model-len": 8192}
    if i % 7 == 3:
        profiles = [{"engine": "vllm", "gpu_class": "h100-80g", "nodes": 2,
                     "tensor_parallel": 8, "pipeline_parallel": 2, "args": args}]
    else:
        profiles = [{"engine": "vllm", "gpu_class": "h100-80g", "tensor_parallel": tp,
                     "args": args},
                    {"engine": "vllm", "gpu_class": "a100-80g", "tensor_parallel": tp,
                     "args": dict(args)}]
    return {"source": f"org/m{i:02d}", "scaling": {"min": 1 + i % 2, "max": 3},
            "profiles": profiles}


class Walk:
    """The cluster's data and the fleet, edited at random."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.data = _data(12, 10)
        self.next_node = 12
        self.next_model = 10
        self.cluster = cluster_from(self.data)
        self.fleet = fleet_from(self.cluster, {}, [], NOW)
        self.lost: dict[str, NodeReport] = {}  # node → its report before it was lost
        self.now = NOW

    def edit(self) -> str:
        rng, models, nodes = self.rng, self.data["models"], self.data["nodes"]
        kind = rng.choice(["add model", "remove model", "flag", "min", "lose node",
                           "node back", "node absent", "gpu fault", "gpu heals", "fabric down",
                           "unit fails", "foreign process", "add node", "remove node",
                           "nothing"])
        reports = dict(self.fleet.nodes)
        if kind == "add model":
            models[f"m{self.next_model:02d}"] = _model(self.next_model)
            self.next_model += 1
        elif kind == "remove model" and len(models) > 2:
            del models[rng.choice(sorted(models))]
        elif kind == "flag" and models:
            name = rng.choice(sorted(models))
            for profile in models[name]["profiles"]:
                profile["args"]["max-model-len"] = rng.choice([4096, 8192, 16384])
        elif kind == "min" and models:
            name = rng.choice(sorted(models))
            models[name]["scaling"]["min"] = rng.randint(0, 3)
        elif kind == "lose node" and reports:
            name = rng.choice(sorted(reports))
            if reports[name].reachable:
                self.lost[name] = reports[name]
                reports[name] = reports[name].model_copy(
                    update={"reachable": False, "error": "connection refused"})
        elif kind == "node back" and self.lost:
            name = rng.choice(sorted(self.lost))
            report = self.lost.pop(name)
            if name in nodes:
                reports[name] = report
        elif kind == "node absent" and reports:
            name = rng.choice(sorted(reports))
            self.lost[name] = reports.pop(name)
        elif kind in ("gpu fault", "gpu heals") and reports:
            name = rng.choice(sorted(reports))
            report = reports[name]
            if report.gpus:
                index = rng.randrange(len(report.gpus))
                gpus = list(report.gpus)
                gpus[index] = gpus[index].model_copy(
                    update={"ecc_uncorrected": 1 if kind == "gpu fault" else 0})
                reports[name] = report.model_copy(update={"gpus": gpus})
        elif kind == "foreign process" and reports:
            name = rng.choice(sorted(reports))
            report = reports[name]
            if report.gpus:
                index = rng.randrange(len(report.gpus))
                gpus = list(report.gpus)
                gpus[index] = gpus[index].model_copy(update={"processes": [
                    GpuProcess(pid=rng.randint(100, 999), name="python", used_memory_mib=512)]})
                reports[name] = report.model_copy(update={"gpus": gpus})
        elif kind == "fabric down" and reports:
            name = rng.choice(sorted(reports))
            report = reports[name]
            fabrics = [f.model_copy(update={"advertised": False, "adapters": [],
                                            "reasons": ["mlx5_0: no ACTIVE port"]})
                       for f in report.fabrics]
            reports[name] = report.model_copy(update={"fabrics": fabrics})
        elif kind == "unit fails":
            running = sorted(n for n, r in reports.items() if r.units)
            if running:
                name = rng.choice(running)
                units = list(reports[name].units)
                index = rng.randrange(len(units))
                units[index] = units[index].model_copy(update={"state": "failed"})
                reports[name] = reports[name].model_copy(update={"units": units})
        elif kind == "add node":
            name = f"gpu-{self.next_node:02d}"
            nodes[name] = _node(self.next_node)
            self.next_node += 1
            self.cluster = cluster_from(self.data)
            reports[name] = fleet_from(self.cluster, {}, [], self.now).nodes[name]
        elif kind == "remove node" and len(nodes) > 4:
            name = rng.choice(sorted(nodes))
            del nodes[name]
            reports.pop(name, None)
            self.lost.pop(name, None)
        self.cluster = cluster_from(copy.deepcopy(self.data))
        self.fleet = Fleet(nodes=reports, sources=self.fleet.sources)
        return kind

    def tick(self, plan: Plan) -> None:
        """The plan ran; every agent answers again (new reports, same content) or, as
        pushed observations are, a node whose units did not change hands the same report
        object again."""
        self.now += 30
        pushed = self.rng.random() < 0.5
        reachable = Fleet(nodes={n: r for n, r in self.fleet.nodes.items() if r.reachable})
        ran = apply(reachable, plan, self.now)

        def answer(name: str, report: NodeReport) -> NodeReport:
            if name not in ran.nodes:
                return report
            if pushed and ran.nodes[name].units == report.units:
                return report
            return ran.nodes[name].model_copy(update={"collected_at": self.now}, deep=True)

        self.fleet = Fleet(nodes={name: answer(name, report)
                                  for name, report in self.fleet.nodes.items()})


@pytest.mark.parametrize("seed", range(4))
def test_incremental_plans_equal_full_plans(seed: int) -> None:
    walk = Walk(seed)
    planner = Planner()
    reused = 0
    for step in range(STEPS):
        kind = walk.edit() if step else "start"
        full = plans.plan(walk.cluster, walk.fleet, walk.now)
        incremental = planner.plan(walk.cluster, walk.fleet, walk.now)
        assert outputs.json_text(incremental) == outputs.json_text(full), \
            f"seed {seed}, step {step} ({kind})"
        reused += len(walk.cluster.nodes) - planner.derived
        walk.tick(full)
    # Incremental it is: most nodes' states came from the plan before.
    assert reused > STEPS * len(walk.cluster.nodes) // 2


def test_a_changed_report_is_read_again() -> None:
    walk = Walk(0)
    planner = Planner()
    planner.plan(walk.cluster, walk.fleet, walk.now)
    planner.plan(walk.cluster, walk.fleet, walk.now)
    assert planner.derived == 0
    report = walk.fleet.nodes["gpu-00"]
    gpus = [report.gpus[0].model_copy(update={"ecc_uncorrected": 2}), *report.gpus[1:]]
    fleet = Fleet(nodes={**walk.fleet.nodes, "gpu-00": report.model_copy(update={"gpus": gpus})})
    full = plans.plan(walk.cluster, fleet, walk.now)
    assert outputs.json_text(planner.plan(walk.cluster, fleet, walk.now)) == \
        outputs.json_text(full)
    assert planner.derived == 1
