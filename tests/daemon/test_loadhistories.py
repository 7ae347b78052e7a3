"""The daemon's load histories (llmgw.daemon.loadhistories): one sample per plan, bounded."""

from __future__ import annotations

from typing import Any

from llmgw.daemon import loadhistories
from llmgw.daemon.loadhistories import LoadHistories
from llmgw.fleet.types import Demand, Fleet, NodeReport, Unit
from llmgw.spec.models import Cluster

NOW = 1_000_000.0


def _cluster(**scaling: Any) -> Cluster:
    return Cluster.model_validate({
        "cluster": {"name": "c"},
        "nodes": {"n1": {"address": "10.0.0.1"}},
        "models": {
            "m": {"source": "/m.gguf", "profiles": [{"engine": "llama.cpp", "cpu": True}],
                  "scaling": {"max": 4, "target": {"waiting_per_replica": 2}, **scaling}},
            "fixed": {"source": "/f.gguf", "profiles": [{"engine": "llama.cpp", "cpu": True}]},
        },
    })


FLEET = Fleet(nodes={"n1": NodeReport(node="n1", reachable=True, units=[
    Unit(name="llmgw-m-r0.service", model="m", replica=0, digest="d", state="ready")])})


def test_each_record_adds_a_sample_for_each_autoscaled_model() -> None:
    histories = LoadHistories()
    cluster = _cluster()
    for i, waiting in enumerate([0, 5, 9]):
        loads = histories.record(cluster, FLEET, Demand(watched_since=0.0,
                                                        waiting={"m": waiting}), NOW + i)
    assert list(loads) == ["m"]  # no target, no history
    assert [(s.at, s.ready, s.waiting) for s in loads["m"]] == [
        (NOW, 1, 0.0), (NOW + 1, 1, 5.0), (NOW + 2, 1, 9.0)]


def test_the_history_is_bounded_in_count_and_age() -> None:
    cluster = _cluster(up_window="10s", down_window="20s")
    histories = LoadHistories(limit=30)
    for i in range(100):
        histories.record(cluster, FLEET, Demand(), NOW + i)
    kept = histories.history("m")
    # Twice the longest window, and one sample at or before its start.
    assert [s.at for s in kept] == [NOW + i for i in range(59, 100)][-30:]
    histories = LoadHistories(limit=1000)
    for i in range(100):
        histories.record(cluster, FLEET, Demand(), NOW + i)
    assert histories.history("m")[0].at == NOW + 59


def test_a_model_that_stops_autoscaling_forgets_its_history() -> None:
    histories = LoadHistories()
    histories.record(_cluster(), FLEET, Demand(), NOW)
    without = Cluster.model_validate(_cluster().model_dump(by_alias=True) | {"models": {}})
    assert histories.record(without, FLEET, Demand(), NOW + 1) == {}
    assert histories.history("m") == ()


def test_the_plan_interval_judges_windows_on_several_samples() -> None:
    assert loadhistories.tick(_cluster(up_window="30s")) == 7.5
    assert loadhistories.tick(_cluster(up_window="2s")) == loadhistories.MIN_TICK
    assert loadhistories.tick(Cluster.model_validate(
        _cluster().model_dump(by_alias=True) | {"models": {}})) is None
