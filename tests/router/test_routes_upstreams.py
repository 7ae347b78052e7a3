"""The route table with upstreams in it: who is picked, capped and counted."""

from __future__ import annotations

from llmgw.router.routes import Endpoint, Routes

REPLICA = Endpoint("http://10.0.0.1:18000", "gpu-1", 0)
ALWAYS = Endpoint("https://a.example.com", "a", upstream="a", cap=2)
FALLBACK = Endpoint("https://f.example.com", "f", upstream="f", fallback=True)


def table(*endpoints: Endpoint) -> Routes:
    routes = Routes()
    routes.update({"chat": list(endpoints)})
    return routes


def test_a_fallback_waits_for_the_replicas_to_be_tried() -> None:
    routes = table(REPLICA, FALLBACK)
    first = routes.pick("chat")
    assert first is not None and first.endpoint == REPLICA
    second = routes.pick("chat", exclude=[first])
    assert second is not None and second.endpoint == FALLBACK
    assert table(FALLBACK).pick("chat") is not None  # alone, it is picked


def test_a_replica_at_its_cap_queues_rather_than_spill() -> None:
    routes = table(REPLICA, FALLBACK)
    replica = routes.pick("chat", cap=1)
    assert replica is not None
    replica.begin()
    assert routes.pick("chat", cap=1) is None
    assert routes.free("chat", 1) == 0  # the admission queue counts replicas only


def test_an_upstream_has_its_own_cap() -> None:
    routes = table(ALWAYS)
    for _ in range(2):
        chosen = routes.pick("chat", cap=1)  # the model's cap is about its engines
        assert chosen is not None
        chosen.begin()
    assert routes.pick("chat", cap=1) is None
    assert routes.free("chat", 1) == 0


def test_always_is_balanced_with_the_replicas_and_not_demand() -> None:
    routes = table(REPLICA, ALWAYS)
    picked = [routes.pick("chat") for _ in range(2)]
    assert {p.endpoint.base_url for p in picked if p} == {REPLICA.base_url, ALWAYS.base_url}
    for p in picked:
        assert p is not None
        p.begin()
    assert routes.in_flight() == {"chat": 1}  # the autoscaler sees its replicas' load
    assert routes.free("chat", 4) == 3 + 1  # the replica's cap, the upstream's own
    assert table(REPLICA, Endpoint("https://n.example.com", upstream="n")).free(
        "chat", 4) is None  # an upstream without a cap: no queue


def test_one_upstream_fallback_for_one_model_always_for_another() -> None:
    routes = Routes()
    routes.update({"chat": [REPLICA, FALLBACK],
                   "code": [Endpoint(FALLBACK.base_url, "f", upstream="f")]})
    code = routes.pick("code")
    assert code is not None and code.endpoint.upstream == "f"
    chat = routes.pick("chat")
    assert chat is not None and chat.endpoint == REPLICA
