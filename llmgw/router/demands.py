"""What the router has seen, for the daemon's scaling decisions.

The router records, per model key, the requests now waiting for a ready
replica and the time of the last request (restored from the store's usage rows
at start, so a restart does not forget it), and since when it has been watching
(``watched_since``): before that, no request is known. It also records each
stream's time to first token; ``snapshot()`` gives their median over the last
:data:`FIRST_TOKEN_WINDOW` seconds, with the admission queues' depth and the
requests in flight (per model and per replica) that the router passes in.
``snapshot()`` hands the daemon a :class:`llmgw.fleet.Demand`; deciding to
start, stop or evict replicas from it is the planner's job (pure, in
:mod:`llmgw.planning`), never the router's.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Mapping

from llmgw.fleet.types import Demand

FIRST_TOKEN_WINDOW = 60.0  # seconds of first tokens the median is taken over
# A request an upstream served for an on-demand model with no replica counts as one
# waiting this long: the daemon starts a replica although no request had to wait.
FALLBACK_WINDOW = 10.0
_FIRST_TOKENS_KEPT = 256  # per model: a median of the latest ones is as good as of all


class Demands:
    def __init__(self, watched_since: float | None = None) -> None:
        self.watched_since = watched_since  # when this router began to see requests
        self._waiting: dict[str, int] = {}
        self._last_used: dict[str, float] = {}
        self._first_tokens: dict[str, deque[tuple[float, float]]] = {}  # (unix time, s)
        self._served_elsewhere: dict[str, float] = {}  # model → unix time of the last one

    def touch(self, model: str, now: float) -> None:
        """A request for ``model`` arrived at unix time ``now``."""
        self._last_used[model] = now

    def served_elsewhere(self, model: str, now: float) -> None:
        """A request for ``model``, which has no replica, goes to an upstream instead of
        waiting: for :data:`FALLBACK_WINDOW` seconds it counts as one waiting (a model
        started on demand must still be started)."""
        self._served_elsewhere[model] = now

    def wait_started(self, model: str) -> None:
        self._waiting[model] = self._waiting.get(model, 0) + 1

    def wait_ended(self, model: str) -> None:
        left = self._waiting.get(model, 0) - 1
        if left > 0:
            self._waiting[model] = left
        else:
            self._waiting.pop(model, None)

    def first_token(self, model: str, seconds: float, now: float) -> None:
        """A stream of ``model`` sent its first event ``seconds`` after it arrived."""
        kept = self._first_tokens.get(model)
        if kept is None:
            kept = self._first_tokens[model] = deque(maxlen=_FIRST_TOKENS_KEPT)
        kept.append((now, seconds))

    def snapshot(
        self, *, queued: Mapping[str, int] | None = None,
        in_flight: Mapping[str, int] | None = None,
        replica_in_flight: Mapping[str, int] | None = None, now: float | None = None,
    ) -> Demand:
        """Demand now. A model with requests waiting for a replica wants one (on demand,
        0 → 1). How many more its load asks for is not the router's call: the planner
        decides from the load history (:func:`llmgw.planning.scaling.decide`).

        ``queued`` (admission queues), ``in_flight`` (by model) and
        ``replica_in_flight`` (by replica URL) are this router's counts now.
        """
        now = time.time() if now is None else now
        first_token = {}
        for model, kept in list(self._first_tokens.items()):
            while kept and kept[0][0] < now - FIRST_TOKEN_WINDOW:
                kept.popleft()
            if kept:
                first_token[model] = statistics.median(seconds for _, seconds in kept)
            else:
                del self._first_tokens[model]
        waiting = dict(self._waiting)
        for model, at in list(self._served_elsewhere.items()):
            if now - at < FALLBACK_WINDOW:
                waiting[model] = waiting.get(model, 0) + 1
            else:
                del self._served_elsewhere[model]
        return Demand(
            waiting=waiting,
            last_used=dict(self._last_used),
            wanted={model: 1 for model in waiting},
            watched_since=self.watched_since,
            queued=dict(queued or {}),
            in_flight=dict(in_flight or {}),
            replica_in_flight=dict(replica_in_flight or {}),
            first_token_seconds=first_token,
        )
