"""Several routers' demand merged for the leader: unknown stays unknown."""

from __future__ import annotations

import json

import pytest

from llmgw.daemon import reconcilers, routetables
from llmgw.fleet.types import Demand, EngineLoad, Fleet, NodeReport, Unit
from llmgw.router import Endpoint, Router
from llmgw.router.catalogs import Catalog
from llmgw.spec.models import Cluster, StoreSettings
from llmgw.store import stores


@pytest.mark.parametrize("watched, merged", [
    pytest.param([None, None], None, id="no router watched"),
    pytest.param([100.0, None], 100.0, id="a demand without a router adds nothing"),
    pytest.param([100.0, 250.0], 250.0, id="counts from the router that started last"),
])
def test_watching_counts_from_the_latest_router(
    watched: list[float | None], merged: float | None
) -> None:
    demands = [Demand(watched_since=w, last_used={"m": 90.0 + i}) for i, w in enumerate(watched)]
    result = routetables.merge(demands)
    assert result.watched_since == merged
    assert result.last_used == {"m": 91.0}


def test_load_adds_up_over_routers_and_the_slowest_first_token_wins() -> None:
    one = Demand(watched_since=1.0, queued={"m": 2}, in_flight={"m": 3},
                 replica_in_flight={"http://a": 1, "http://b": 2},
                 first_token_seconds={"m": 0.5})
    two = Demand(watched_since=2.0, queued={"m": 1, "n": 4}, in_flight={"m": 1},
                 replica_in_flight={"http://b": 5}, first_token_seconds={"m": 1.5, "n": 0.2})
    result = routetables.merge([one, two])
    assert result.queued == {"m": 3, "n": 4}
    assert result.in_flight == {"m": 4}
    assert result.replica_in_flight == {"http://a": 1, "http://b": 7}
    assert result.first_token_seconds == {"m": 1.5, "n": 0.2}


# -- the route table's engine load, and other routers' requests in flight -------------

def test_engine_load_travels_in_the_table_and_absent_stays_absent() -> None:
    table = {"m": [Endpoint("http://a:1", "n1", 0, load=4, load_at=1000.5),
                   Endpoint("http://b:1", "n2", 1)]}
    doc = routetables.encode(table)
    assert json.loads(doc)["load"] == {"http://a:1": [4, 1000.5]}
    [a, b] = routetables.decode(doc)["m"]
    assert (a.load, a.load_at) == (4, 1000.5)
    assert (b.load, b.load_at) == (None, None)
    assert "load" not in json.loads(routetables.encode({"m": [Endpoint("http://b:1")]}))


@pytest.mark.parametrize("load", [
    pytest.param({"http://a:1": ["4", 1.0]}, id="not a number"),
    pytest.param({"http://a:1": [-1, 1.0]}, id="negative"),
    pytest.param({"http://a:1": [True, 1.0]}, id="a boolean"),
    pytest.param({"http://a:1": [4]}, id="no time"),
    pytest.param(["http://a:1"], id="not a mapping"),
])
def test_a_load_entry_that_is_not_one_is_left_out_not_fatal(load: object) -> None:
    doc = json.dumps({"routes": {"m": [["http://a:1", "n1", 0]]}, "load": load})
    [a] = routetables.decode(doc)["m"]
    assert a.load is None


def test_endpoints_carry_the_engines_running_plus_waiting() -> None:
    cluster = Cluster.model_validate({
        "cluster": {"name": "lab"},
        "nodes": {"n1": {"address": "10.0.0.1"}},
        "models": {"m": {"profiles": [{"engine": "llama.cpp", "cpu": True}]}},
    })

    def unit(replica: int, load: EngineLoad | None) -> Unit:
        return Unit(name=f"llmgw-m-r{replica}-s0.service", model="m", replica=replica, rank=0,
                    digest="d", state="ready", port=18000 + replica, load=load)

    fleet = Fleet(nodes={"n1": NodeReport(node="n1", units=[
        unit(0, EngineLoad(requests_running=2, requests_waiting=3, scraped_at=99.0)),
        unit(1, EngineLoad(requests_running=2)),  # waiting unknown: the sum is unknown
        unit(2, None),
    ])})
    loads = [(e.load, e.load_at) for e in reconcilers.endpoints(cluster, fleet)["m"]]
    assert loads == [(5, 99.0), (None, None), (None, None)]


async def test_each_router_sees_the_others_requests_in_flight(
        store_settings: dict[str, str]) -> None:
    store = await stores.open_store(StoreSettings.model_validate(store_settings))
    table = {"m": [Endpoint("http://a:1"), Endpoint("http://b:1")]}
    one, two = Router(Catalog(auth="none")), Router(Catalog(auth="none"))
    for router in (one, two):
        router.update_routes(table)
    try:
        busy = one.routes.pick("m")
        assert busy is not None
        busy.begin()  # a request in flight on router one
        await routetables.Follower(store, one, "one", leading=lambda: True).step()
        await routetables.Follower(store, two, "two", leading=lambda: True).step()
        assert one.demand().replica_in_flight == {busy.endpoint.base_url: 1}
        assert two.demand().replica_in_flight == {}  # its own: none
        for _ in range(3):  # router two sends its own requests to the other replica
            picked = two.routes.pick("m")
            assert picked is not None and picked.endpoint.base_url != busy.endpoint.base_url
    finally:
        await one.close()
        await two.close()
        await store.close()
