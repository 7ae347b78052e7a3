"""What the router has seen, for the daemon's scaling decisions.

The router records, per model key, the requests now waiting for a ready
replica and the time of the last request (restored from the store's usage rows
at start, so a restart does not forget it), and since when it has been watching
(``watched_since``): before that, no request is known. ``snapshot()`` hands the daemon a
:class:`llmgw.fleet.Demand`; deciding to start, stop or evict replicas from it
is the planner's job (pure, in :mod:`llmgw.planning`), never the router's.
"""

from __future__ import annotations

from llmgw.fleet.types import Demand


class Demands:
    def __init__(self, watched_since: float | None = None) -> None:
        self.watched_since = watched_since  # when this router began to see requests
        self._waiting: dict[str, int] = {}
        self._last_used: dict[str, float] = {}
        self._max_replicas: dict[str, int] = {}

    def touch(self, model: str, now: float) -> None:
        """A request for ``model`` arrived at unix time ``now``."""
        self._last_used[model] = now

    def wait_started(self, model: str, max_replicas: int = 1) -> None:
        self._waiting[model] = self._waiting.get(model, 0) + 1
        self._max_replicas[model] = max_replicas

    def wait_ended(self, model: str) -> None:
        left = self._waiting.get(model, 0) - 1
        if left > 0:
            self._waiting[model] = left
        else:
            self._waiting.pop(model, None)

    def snapshot(self) -> Demand:
        """Demand now. A model with requests waiting for a replica wants one (on demand,
        0 → 1). How many more its load asks for is not the router's call: the planner
        decides from the load history (:func:`llmgw.planning.scaling.decide`)."""
        return Demand(
            waiting=dict(self._waiting),
            last_used=dict(self._last_used),
            wanted={model: 1 for model in self._waiting},
            watched_since=self.watched_since,
        )
