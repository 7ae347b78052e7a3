"""Several routers' demand merged for the leader: unknown stays unknown."""

from __future__ import annotations

import pytest

from llmgw.daemon import routetables
from llmgw.fleet.types import Demand


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
