"""The scaling rules, one row per rule the docs promise (llmgw.planning.scaling).

The planning cases show these rules inside whole plans; these tables hold each
rule on its own, with its reason text, so deleting any one of them fails here.
"""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.fleet.types import Demand, Unit
from llmgw.planning import scaling
from llmgw.planning.replicas import Member, ObservedReplica
from llmgw.spec.models import Model

NOW = 1_000_000.0
POLICY = scaling.Policy(min_lifetime=600.0, evict_idle=300.0)


def _model(**scale: Any) -> Model:
    return Model.model_validate(
        {"profiles": [{"engine": "llama.cpp", "cpu": True}], "scaling": scale}
    )


def _replica(
    *, since: float | None = NOW - 3600, used: float | None = NOW - 3600, ranks: int = 1,
    nodes: list[str] | None = None,
) -> ObservedReplica:
    replica = ObservedReplica("m", 0)
    for rank in range(ranks):
        unit = Unit(name=f"llmgw-m-r0-s{rank}.service", model="m", replica=0, rank=rank,
                    digest="d", state="ready", since=since, last_used=used)
        spec = {"nodes": nodes} if nodes is not None else None
        replica.members[rank] = Member(f"n{rank}", unit, spec, True)
    return replica


ON_DEMAND = _model(min=0, max=1, idle_timeout="30m")


@pytest.mark.parametrize(
    ("model", "replica", "demand", "expected"),
    [
        pytest.param(ON_DEMAND, _replica(), Demand(), (True, "last request 1h ago"),
                     id="idle-on-demand-replica-may-go"),
        pytest.param(_model(min=1, max=2), _replica(), Demand(), (False, "min 1"),
                     id="never-a-model-with-min"),
        pytest.param(ON_DEMAND, _replica(ranks=2), Demand(), (False, "spans nodes"),
                     id="never-one-spanning-nodes-by-members"),
        pytest.param(ON_DEMAND, _replica(nodes=["a", "b"]), Demand(), (False, "spans nodes"),
                     id="never-one-spanning-nodes-by-its-spec"),
        pytest.param(ON_DEMAND, _replica(), Demand(waiting={"m": 1}),
                     (False, "has requests waiting"), id="never-one-with-its-own-waiting"),
        pytest.param(ON_DEMAND, _replica(since=None), Demand(),
                     (False, "no start time reported"), id="never-without-start-time"),
        pytest.param(ON_DEMAND, _replica(since=NOW - 599), Demand(),
                     (False, "started 9m59s ago (minimum lifetime 10m)"),
                     id="never-younger-than-min-lifetime"),
        pytest.param(ON_DEMAND, _replica(since=NOW), Demand(),
                     (False, "started 0s ago (minimum lifetime 10m)"), id="just-started"),
        pytest.param(ON_DEMAND, _replica(since=NOW - 600, used=NOW - 300), Demand(),
                     (True, "last request 5m ago"), id="exactly-at-both-bounds-may-go"),
        pytest.param(ON_DEMAND, _replica(used=None), Demand(), (False, "no reported use"),
                     id="never-without-reported-use"),
        pytest.param(ON_DEMAND, _replica(used=NOW - 299), Demand(),
                     (False, "used 4m59s ago"), id="never-used-within-evict-idle"),
        pytest.param(ON_DEMAND, _replica(used=NOW - 3600), Demand(last_used={"m": NOW - 10}),
                     (False, "used 10s ago"), id="router-last-use-counts"),
        pytest.param(ON_DEMAND, _replica(used=NOW - 10), Demand(last_used={"m": NOW - 3600}),
                     (False, "used 10s ago"), id="agent-last-use-counts"),
    ],
)
def test_evictable(
    model: Model, replica: ObservedReplica, demand: Demand, expected: tuple[bool, str],
) -> None:
    assert scaling.evictable("m", model, replica, demand, NOW, POLICY) == expected


@pytest.mark.parametrize(
    ("model", "demand", "running", "expected"),
    [
        pytest.param(_model(min=2, max=4), Demand(), 1,
                     scaling.Want(2, "scaling: min 2, 1 running"), id="min-always"),
        pytest.param(ON_DEMAND, Demand(), 0,
                     scaling.Want(0, "scaling: min 0, 0 running"), id="on-demand-idle"),
        pytest.param(ON_DEMAND, Demand(waiting={"m": 1}), 0,
                     scaling.Want(1, "on demand: 1 request waiting, 0 running"),
                     id="one-waiting-loads-one"),
        pytest.param(ON_DEMAND, Demand(waiting={"m": 3}), 0,
                     scaling.Want(1, "on demand: 3 requests waiting, 0 running"),
                     id="waiting-is-plural"),
        pytest.param(_model(min=1, max=4), Demand(wanted={"m": 3}), 1,
                     scaling.Want(3, "demand: the router wants 3 (max 4), 1 running"),
                     id="router-wants-more"),
        pytest.param(_model(min=1, max=2), Demand(wanted={"m": 9}), 2,
                     scaling.Want(2, "demand: the router wants 9 (max 2), 2 running"),
                     id="never-above-max"),
        pytest.param(_model(min=0, max=3), Demand(waiting={"m": 2}, wanted={"m": 2}), 1,
                     scaling.Want(2, "demand: the router wants 2 (max 3), 1 running"),
                     id="router-count-beats-waiting"),
        pytest.param(_model(min=0, max=3), Demand(waiting={"m": 1}), 0,
                     scaling.Want(1, "on demand: 1 request waiting, 0 running"),
                     id="waiting-alone-loads-one-not-more"),
        pytest.param(_model(min=1, max=2), Demand(waiting={"m": 1}), 1,
                     scaling.Want(1, "scaling: min 1, 1 running"),
                     id="waiting-served-by-min-is-no-demand"),
        pytest.param(_model(min=0, max=3), Demand(waiting={"m": 2}, wanted={"m": 1}), 0,
                     scaling.Want(1, "on demand: 2 requests waiting, 0 running"),
                     id="router-asking-one-is-on-demand"),
        pytest.param(_model(min=2, max=3), Demand(wanted={"m": 1}), 2,
                     scaling.Want(2, "scaling: min 2, 2 running"), id="never-below-min"),
    ],
)
def test_want(model: Model, demand: Demand, running: int, expected: scaling.Want) -> None:
    assert scaling.want("m", model, demand, running) == expected


@pytest.mark.parametrize(
    ("model", "replica", "demand", "expected"),
    [
        pytest.param(ON_DEMAND, _replica(used=NOW - 1800), Demand(),
                     "idle: no requests for 30m (idle_timeout 30m)", id="idle-at-timeout"),
        pytest.param(ON_DEMAND, _replica(used=NOW - 1799), Demand(), None,
                     id="not-idle-before-timeout"),
        pytest.param(ON_DEMAND, _replica(used=NOW - 7200), Demand(waiting={"m": 1}), None,
                     id="never-idle-with-requests-waiting"),
        pytest.param(ON_DEMAND, _replica(used=NOW - 7200), Demand(last_used={"m": NOW - 5}),
                     None, id="router-last-use-counts"),
        pytest.param(_model(min=1, max=2), _replica(used=NOW - 7200), Demand(), None,
                     id="no-idle-timeout-never-idle"),
        pytest.param(ON_DEMAND, _replica(used=None, since=NOW - 1799),
                     Demand(watched_since=NOW - 7200), None,
                     id="unused-replica-not-stopped-right-after-start"),
        pytest.param(ON_DEMAND, _replica(used=None, since=NOW - 1800),
                     Demand(watched_since=NOW - 1800),
                     "idle: no requests since it started 30m ago (idle_timeout 30m)",
                     id="unused-since-start-past-timeout"),
        pytest.param(ON_DEMAND, _replica(used=None, since=NOW - 7200),
                     Demand(watched_since=NOW - 1799), None,
                     id="unknown-not-idle-router-watched-less-than-timeout"),
        pytest.param(ON_DEMAND, _replica(used=None, since=NOW - 7200),
                     Demand(last_used={"m": NOW - 3600}, watched_since=NOW - 60), None,
                     id="unknown-not-idle-restored-last-use-but-just-restarted"),
        pytest.param(ON_DEMAND, _replica(used=None, since=NOW - 7200),
                     Demand(last_used={"m": NOW - 3600}, watched_since=NOW - 1800),
                     "idle: no requests for 1h (idle_timeout 30m)",
                     id="restored-last-use-once-watched-long-enough"),
        pytest.param(ON_DEMAND, _replica(used=None, since=NOW - 7200), Demand(), None,
                     id="unknown-not-idle-no-router-watching"),
        pytest.param(ON_DEMAND, _replica(used=None, since=None), Demand(), None,
                     id="nothing-reported-cannot-prove-idle"),
    ],
)
def test_idle_reason(
    model: Model, replica: ObservedReplica, demand: Demand, expected: str | None,
) -> None:
    assert scaling.idle_reason("m", model, replica, demand, NOW) == expected


def test_last_use_is_the_latest_of_router_and_agent() -> None:
    replica = _replica(used=NOW - 100)
    assert scaling.last_use("m", replica, Demand(last_used={"m": NOW - 50})) == NOW - 50
    assert scaling.last_use("m", replica, Demand(last_used={"m": NOW - 500})) == NOW - 100
    assert scaling.last_use("m", _replica(used=None), Demand()) is None
