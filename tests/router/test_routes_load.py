"""The load balancing compares: the engine's report, moved by this router's own requests."""

from __future__ import annotations

from llmgw.router import Endpoint
from llmgw.router.routes import Routes, Upstream


def table(a_load: int | None, b_load: int | None, at: float) -> dict[str, list[Endpoint]]:
    return {"m": [Endpoint("http://a:1", load=a_load, load_at=at),
                  Endpoint("http://b:1", load=b_load, load_at=at)]}


def upstream(routes: Routes, url: str) -> Upstream:
    [found] = [u for u in routes._table["m"] if u.endpoint.base_url == url]
    return found


def test_the_report_moves_with_this_routers_requests_and_does_not_drift() -> None:
    routes = Routes()
    routes.update(table(2, 0, at=100.0))
    a = upstream(routes, "http://a:1")
    a.begin()
    a.begin()
    assert a.load() == 4  # two sent since the report
    a.end()
    a.end()
    assert a.load() == 2  # both ended: back to what the engine said, not 4
    a.begin()
    routes.update(table(7, 0, at=105.0))  # a new scrape counts the one in flight
    assert a.load() == 7
    a.end()
    assert a.load() == 6


def test_the_same_report_again_keeps_its_baseline() -> None:
    routes = Routes()
    routes.update(table(3, 0, at=100.0))
    a = upstream(routes, "http://a:1")
    a.begin()
    routes.update(table(3, 0, at=100.0))  # republished, not rescraped
    assert a.load() == 4


def test_without_a_report_every_routers_requests_in_flight_count() -> None:
    routes = Routes()
    routes.update(table(None, None, at=0.0))
    a, b = upstream(routes, "http://a:1"), upstream(routes, "http://b:1")
    routes.set_others({"http://a:1": 3})
    a.begin()
    assert (a.load(), b.load()) == (4, 0)
    assert routes.pick("m") is b
    assert routes.free("m", cap=4) == 4  # a is full (1 + 3 others), b has 4
    assert routes.pick("m", exclude=[b], cap=4) is None


def test_a_request_in_flight_across_a_change_of_its_replica_is_counted_once() -> None:
    # A canary promoted while a request runs on it: the share is lifted, the replica is the
    # same. The request ends on the upstream it began on; the count must come back to 0, or
    # the replica stays at its cap (1 here) and takes nothing again.
    routes = Routes()
    routes.update({"m": [Endpoint("http://a:1", share=0.5)]})
    began_on = upstream(routes, "http://a:1")
    began_on.begin()
    routes.update({"m": [Endpoint("http://a:1")]})
    assert routes.free("m", cap=1) == 0
    began_on.end()
    assert routes.free("m", cap=1) == 1
    assert routes.pick("m", cap=1) is not None
    assert upstream(routes, "http://a:1").endpoint.share is None
