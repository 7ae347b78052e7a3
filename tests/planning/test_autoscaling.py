"""The autoscaler's decision (llmgw.planning.scaling.decide), one row per rule.

Histories are samples every 10 s, oldest first. The planning cases show the
same rules inside whole plans (``cases/120-*`` on); these hold each rule on its
own with its reason text, so that breaking any one of them fails here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from llmgw.fleet.types import Demand, EngineLoad, Fleet, NodeReport, Unit
from llmgw.planning import scaling
from llmgw.planning.replicas import Member, ObservedReplica
from llmgw.planning.scaling import LoadSample
from llmgw.spec.models import Cluster
from llmgw.spec.servings import Scaling

NOW = 1_000_000.0


def _scaling(**fields: Any) -> Scaling:
    base: dict[str, Any] = {"min": 1, "max": 4, "target": {"waiting_per_replica": 2},
                            "up_window": "30s", "down_window": "60s", "cooldown": "60s"}
    return Scaling.model_validate({**base, **fields})


def _history(waiting: Sequence[float | None], ready: int = 1, step: float = 10.0,
             ) -> tuple[LoadSample, ...]:
    """``waiting`` in total, one sample per ``step`` seconds, the last one at NOW."""
    start = NOW - step * (len(waiting) - 1)
    return tuple(LoadSample(start + i * step, ready, w, 0.0, None)
                 for i, w in enumerate(waiting))


@pytest.mark.parametrize(
    ("spec", "running", "history", "youngest", "expected"),
    [
        pytest.param(_scaling(), 1, _history([7, 7, 7, 7]), None,
                     (4, "scale m 1 → 4: 7 waiting per replica over 30 s (target 2)"),
                     id="up-after-the-whole-up-window"),
        pytest.param(_scaling(max=3), 1, _history([7, 7, 7, 7]), None,
                     (3, "scale m 1 → 3: 7 waiting per replica over 30 s (target 2); max 3"),
                     id="up-never-beyond-max"),
        pytest.param(_scaling(), 1, _history([7, 7, 7]), None,
                     (1, "hold m at 1: load history covers 20s of the 30s up_window"),
                     id="hold-a-history-shorter-than-the-window"),
        pytest.param(_scaling(), 1, (), None,
                     (1, "hold m at 1: no load history (the daemon started, or no daemon "
                         "watches)"),
                     id="hold-no-history-after-a-restart"),
        pytest.param(_scaling(), 1, _history([7, 7, 7, None]), None,
                     (1, "hold m at 1: load unknown (nothing reports waiting per replica)"),
                     id="hold-unknown-load"),
        pytest.param(_scaling(), 1, _history([7, None, 7, 7]), None,
                     (1, "hold m at 1: load unknown during the 30s up_window"),
                     id="hold-a-gap-of-unknown-in-the-window"),
        pytest.param(_scaling(), 2, _history([7, 1, 7, 1, 7, 1, 7], ready=2), None,
                     (2, "hold m at 2: waiting per replica 3.5 (target 2), not above it for "
                         "all of the up_window nor below it for all of the down_window"),
                     id="hold-flapping-load"),
        pytest.param(_scaling(), 3, _history([7, 7, 7, 7], ready=2), None,
                     (3, "hold m at 3: 2 of 3 replicas ready"),
                     id="hold-while-a-replica-starts"),
        pytest.param(_scaling(), 3, _history([0] * 7, ready=3), NOW - 3600,
                     (1, "scale m 3 → 1: at most 0 waiting per replica over 60 s (target 2)"),
                     id="down-after-the-whole-down-window"),
        pytest.param(_scaling(), 3, _history([3] * 7, ready=3), NOW - 3600,
                     (2, "scale m 3 → 2: at most 1 waiting per replica over 60 s (target 2)"),
                     id="down-only-as-far-as-the-load-allows"),
        pytest.param(_scaling(min=2), 3, _history([0] * 7, ready=3), NOW - 3600,
                     (2, "scale m 3 → 2: at most 0 waiting per replica over 60 s (target 2)"),
                     id="down-never-under-min"),
        pytest.param(_scaling(min=0), 1, _history([0] * 7), NOW - 3600,
                     (1, "hold m at 1: at most 0 waiting per replica over 60 s (target 2); "
                         "at the floor 1"),
                     id="down-never-to-zero-that-is-the-idle-timeouts-call"),
        pytest.param(_scaling(), 3, _history([0] * 7, ready=3), NOW - 30,
                     (3, "hold m at 3: cooldown: the replica count changed 30s ago "
                         "(cooldown 1m)"),
                     id="no-down-within-the-cooldown-of-a-start"),
        pytest.param(_scaling(), 2, tuple(LoadSample(NOW - 10 * i, 3 if i > 3 else 2, 0.0)
                                          for i in range(7, -1, -1)), NOW - 3600,
                     (2, "hold m at 2: cooldown: the replica count changed 30s ago "
                         "(cooldown 1m)"),
                     id="no-down-within-the-cooldown-of-a-stop"),
        pytest.param(_scaling(target={"in_flight_per_replica": 4}), 1,
                     tuple(LoadSample(NOW - 10 * i, 1, 0.0, 9.0) for i in range(3, -1, -1)),
                     None,
                     (3, "scale m 1 → 3: 9 in flight per replica over 30 s (target 4)"),
                     id="up-on-in-flight"),
        pytest.param(_scaling(target={"first_token_seconds": "1s"}), 2,
                     tuple(LoadSample(NOW - 10 * i, 2, 0.0, 9.0, 2.5) for i in range(3, -1, -1)),
                     None,
                     (4, "scale m 2 → 4: first token in 2.5 s over 30 s (target 1 s); max 4"),
                     id="up-on-first-token"),
    ],
)
def test_decide(spec: Scaling, running: int, history: tuple[LoadSample, ...],
                youngest: float | None, expected: tuple[int, str]) -> None:
    decision = scaling.decide("m", spec, running, history, NOW, youngest)
    assert decision is not None
    assert (decision.count, decision.reason) == expected


def test_no_target_no_decision() -> None:
    assert scaling.decide("m", Scaling(), 1, _history([50] * 5), NOW) is None


def test_max_reached_is_a_warning_that_says_what_to_do() -> None:
    decision = scaling.decide("m", _scaling(max=2), 2, _history([9] * 4, ready=2), NOW)
    assert decision is not None and decision.count == 2
    assert decision.warning == ("m: 4.5 waiting per replica over 30 s (target 2) asks for "
                                "5 replicas, but scaling.max is 2: raise it to serve the load")


CLUSTER = Cluster.model_validate({
    "cluster": {"name": "c"},
    "nodes": {"n1": {"address": "10.0.0.1"}},
    "models": {"m": {"source": "/m.gguf", "profiles": [{"engine": "llama.cpp", "cpu": True}],
                     "scaling": {"min": 1, "max": 4, "target": {"waiting_per_replica": 2}}}},
})


def _unit(replica: int, state: str = "ready", load: EngineLoad | None = None,
          port: int = 18000) -> Unit:
    return Unit(name=f"llmgw-m-r{replica}.service", model="m", replica=replica, digest="d",
                state=state, port=port + replica, since=NOW - 100 * replica, load=load)  # type: ignore[arg-type]


def _fleet(*units: Unit) -> Fleet:
    return Fleet(nodes={"n1": NodeReport(node="n1", reachable=True, units=list(units))})


def test_a_sample_adds_the_engines_queues_to_the_routers() -> None:
    fleet = _fleet(_unit(0, load=EngineLoad(requests_waiting=3, requests_running=4)),
                   _unit(1, load=EngineLoad(requests_waiting=None)), _unit(2, state="loading"))
    demand = Demand(watched_since=NOW - 60, queued={"m": 2}, waiting={"m": 1},
                    in_flight={"m": 8})
    assert scaling.sample("m", CLUSTER, fleet, demand, NOW) == LoadSample(NOW, 2, 6.0, 8.0, None)


def test_a_sample_without_a_router_is_the_engines_or_unknown() -> None:
    fleet = _fleet(_unit(0, load=EngineLoad(requests_waiting=3, requests_running=4)))
    assert scaling.sample("m", CLUSTER, fleet, Demand(), NOW) == LoadSample(NOW, 1, 3.0, 4.0)
    bare = scaling.sample("m", CLUSTER, _fleet(_unit(0)), Demand(), NOW)
    assert bare == LoadSample(NOW, 1, None, None, None)


def test_a_sample_with_no_request_has_no_first_token_wait() -> None:
    demand = Demand(watched_since=NOW - 60)
    assert scaling.sample("m", CLUSTER, _fleet(_unit(0)), demand, NOW).first_token_seconds == 0.0


def _observed(unit: Unit) -> ObservedReplica:
    return ObservedReplica("m", unit.replica, {0: Member("n1", unit, {}, True)})


def test_scale_down_stops_the_least_loaded_then_the_youngest() -> None:
    replicas = [_observed(_unit(i)) for i in range(4)]
    demand = Demand(replica_in_flight={"http://10.0.0.1:18000": 0, "http://10.0.0.1:18001": 3,
                                       "http://10.0.0.1:18002": 0})
    # r3 reports nothing: unknown load goes last. r0 and r2 carry none: r0 is younger.
    victims = scaling.down_victims(replicas, 3, CLUSTER, demand)
    assert [r.replica for r in victims] == [0, 2, 1]
