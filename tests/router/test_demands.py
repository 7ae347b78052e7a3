"""What the router hands the autoscaler: queue depth, requests in flight, first tokens."""

from __future__ import annotations

from llmgw.router import Endpoint, Router
from llmgw.router.catalogs import Catalog
from llmgw.router.demands import FIRST_TOKEN_WINDOW, Demands


def test_first_token_is_the_median_of_the_recent_window() -> None:
    demands = Demands(watched_since=0.0)
    for seconds in (0.1, 0.2, 0.9):
        demands.first_token("m", seconds, now=1000.0)
    demands.first_token("old", 5.0, now=1000.0 - FIRST_TOKEN_WINDOW - 1)
    snapshot = demands.snapshot(now=1000.0)
    assert snapshot.first_token_seconds == {"m": 0.2}  # "old" aged out: absent, not 0
    assert demands.snapshot(now=1000.0 + FIRST_TOKEN_WINDOW + 1).first_token_seconds == {}


def test_the_snapshot_carries_queued_and_in_flight_and_leaves_wanted_alone() -> None:
    demands = Demands(watched_since=0.0)
    demands.wait_started("m")
    snapshot = demands.snapshot(queued={"m": 3}, in_flight={"m": 2},
                                replica_in_flight={"http://a:1": 2})
    assert (snapshot.queued, snapshot.in_flight, snapshot.replica_in_flight) == (
        {"m": 3}, {"m": 2}, {"http://a:1": 2})
    assert snapshot.wanted == {"m": 1}
    assert snapshot.waiting == {"m": 1}


async def test_the_routers_demand_counts_its_requests_in_flight() -> None:
    router = Router(Catalog(auth="none"))
    router.update_routes({"m": [Endpoint("http://a:1"), Endpoint("http://b:1")]})
    try:
        for _ in range(3):
            picked = router.routes.pick("m")
            assert picked is not None
            picked.begin()
        demand = router.demand()
        assert demand.in_flight == {"m": 3}
        assert sorted(demand.replica_in_flight.values()) == [1, 2]
        assert demand.queued == {}
    finally:
        await router.close()
