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
