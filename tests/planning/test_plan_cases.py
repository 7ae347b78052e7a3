"""Every plan case in ``cases/*.yaml``: spec + fleet in, changes and reasons out.

One file per case, one harness for all (see :mod:`plan_builders` for the
fleet shorthand). A case's ``expect`` lists, exactly and in order:

* ``changes``: ``{change: "create m r0 on gpu-01 [0-1]", why: [...]}``, and
  ``drain: true`` for a destroy drained first (the autoscaler's scale-down)
* ``unplaceable``: ``{replicas: "m r1", wanted: ..., why: [...]}`` where each
  ``why`` line is ``profile N (label): nodes: reason`` as plans group them
* ``unknown``: ``{replica: "m r0 on gpu-02", why: [...]}``
* ``held``: ``{replica: "m r0 on gpu-01", drift: engine_crash, why: [...], evidence: [...]}``
* ``warnings`` (only checked when given)
* ``scaling`` (only checked when given): each autoscaled model's decision, a
  scale or a hold, and why
* ``ports`` (only checked when given): ``m r1: gpu-01 port 18001`` per new shard
  that serves HTTP, in the order of the changes

A change lists its class of drift (``drift: engine_crash``) and, when it has
any, its ``evidence`` as soon as one change of the case says ``drift``: the
drift cases (75-89, 100-102) all do.

``loads:`` gives each autoscaled model's load history (see
:func:`plan_builders.loads_from`); without it the autoscaler has none and holds.

``stable_after_apply: true`` also applies the plan (every new unit ready)
and checks that planning again changes nothing: placement is stable.

Run ``LLMGW_SHOW_ACTUAL=1 pytest tests/planning/test_plan_cases.py`` to see
what the planner produced for a failing case, ready to compare.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from plan_builders import apply, cluster_from, fleet_from, loads_from
from ruamel.yaml import YAML

from llmgw.fleet.types import Demand
from llmgw.planning import outputs, plans
from llmgw.planning.scaling import Policy
from llmgw.planning.types import Change, Plan

CASES = Path(__file__).parent / "cases"
DEFAULT_NOW = 1_700_000_000.0


def load_case(path: Path) -> dict[str, Any]:
    data = YAML(typ="safe").load(path.read_text())
    assert isinstance(data, dict), f"{path}: a case is a mapping"
    assert "description" in data, f"{path}: say what the case shows in `description`"
    return data


def change_line(change: Change) -> str:
    name = f"{change.action} {change.model} r{change.replica}"
    if change.action == "replace":
        if change.strategy == "create-before-destroy":
            name += f" by r{change.new_replica} (create-before-destroy)"
        else:
            name += " (destroy-before-create)"
    shards = change.removes if change.action in ("destroy", "hold") else change.shards
    return f"{name} on {outputs.where(shards)}"


def summarize(plan: Plan, drift: bool = False) -> dict[str, Any]:
    return {
        "changes": [
            {"change": change_line(c), "why": list(c.reasons),
             **({"drain": True} if c.drain else {}),
             **({"drift": c.drift} if drift else {}),
             **({"evidence": list(c.evidence)} if drift and c.evidence else {})}
            for c in plan.changes
        ],
        "held": [
            {"replica": f"{h.model} r{h.replica} on {', '.join(h.nodes)}", "drift": h.drift,
             "why": list(h.reasons), **({"evidence": list(h.evidence)} if h.evidence else {})}
            for h in plan.held
        ],
        "unplaceable": [
            {
                "replicas": f"{u.model} " + ", ".join(f"r{r}" for r in u.replicas),
                "wanted": u.wanted,
                **({"note": u.note} if u.note else {}),
                "why": [f"profile {a.profile} ({a.label}): {line}"
                        for a in u.attempts for line in outputs.group_reasons(a.reasons)],
            }
            for u in plan.unplaceable
        ],
        "unknown": [
            {"replica": f"{u.model} r{u.replica} on {', '.join(u.nodes)}", "why": list(u.reasons)}
            for u in plan.unknown
        ],
        "warnings": list(plan.warnings),
        "scaling": list(plan.scaling),
        "ports": [f"{c.model} r{c.new_replica if c.new_replica is not None else c.replica}: "
                  f"{s.node} port {s.port}"
                  for c in plan.changes if c.action in ("create", "replace")
                  for s in c.shards if s.port is not None],
    }


def run_case(case: dict[str, Any]) -> tuple[Plan, Any, Any, float]:
    now = float(case.get("now", DEFAULT_NOW))
    cluster = cluster_from(case["cluster"])
    fleet = fleet_from(cluster, case.get("fleet"), case.get("running"), now, case.get("gone"),
                       case.get("sources"))
    demand = Demand.model_validate(case.get("demand") or {})
    policy = Policy(**(case.get("policy") or {}))
    loads = loads_from(case.get("loads"), now)
    return (plans.plan(cluster, fleet, now, demand, policy=policy, loads=loads), cluster, fleet,
            now)


@pytest.mark.parametrize("path", sorted(CASES.glob("*.yaml")), ids=lambda p: p.stem)
def test_case(path: Path) -> None:
    case = load_case(path)
    plan, cluster, fleet, now = run_case(case)
    expect = case.get("expect") or {}
    actual = summarize(plan, any("drift" in c for c in expect.get("changes") or []))
    if os.environ.get("LLMGW_SHOW_ACTUAL"):
        yaml = YAML()
        yaml.width = 4096
        import io
        buffer = io.StringIO()
        yaml.dump({"expect": actual}, buffer)
        print(f"\n--- {path.name}\n{buffer.getvalue()}")
    assert actual["changes"] == expect.get("changes", []), case["description"]
    assert actual["unplaceable"] == expect.get("unplaceable", []), case["description"]
    assert actual["unknown"] == expect.get("unknown", []), case["description"]
    assert actual["held"] == expect.get("held", []), case["description"]
    if "warnings" in expect:
        assert actual["warnings"] == expect["warnings"], case["description"]
    if "scaling" in expect:
        assert actual["scaling"] == expect["scaling"], case["description"]
    if "ports" in expect:
        assert actual["ports"] == expect["ports"], case["description"]
    if case.get("stable_after_apply"):
        later = now + 60
        again = plans.plan(cluster, apply(fleet, plan, later), later,
                           Demand.model_validate(case.get("demand") or {}))
        assert [change_line(c) for c in again.changes] == [], "the plan is not stable"


def test_there_are_enough_cases() -> None:
    assert len(list(CASES.glob("*.yaml"))) >= 25
