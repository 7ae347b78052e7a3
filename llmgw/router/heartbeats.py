"""A router's heartbeat: it owns its budget reservations while it beats.

Every ``interval`` seconds the router renews its row in the store with an
expiry of :data:`MISSED_BEATS` intervals ahead, records what each of its
requests in flight has produced so far (tokens and USD, into the request's
reservation), and releases every stale reservation in the store — those of a
router whose heartbeat expired — billing what that router last recorded (see
:mod:`llmgw.store.reservations`). A router that is SIGKILLed mid-stream thus
holds its reservations for at most ``(MISSED_BEATS + 1) × interval`` seconds
while any router sharing the store runs (20 s at the default 5 s), and a router
that starts releases them too once they are stale.

Usage::

    beat = Heartbeat(store, "host:1234:ab12", 5.0, accounts.progress)
    await beat.start()   # beats once, releases what is stale, then every interval
    ...
    await beat.close()   # stops and drops its row (a clean stop)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from llmgw.store.reservations import Progress
from llmgw.store.stores import Store, StoreError

log = logging.getLogger(__name__)

MISSED_BEATS = 3  # a router whose heartbeat is this many intervals old is dead
DEFAULT_INTERVAL = 5.0  # seconds


def bound(interval: float) -> float:
    """Seconds after a router's death by which another router releases its reservations."""
    return (MISSED_BEATS + 1) * interval


class Heartbeat:
    def __init__(self, store: Store, router_id: str, interval: float,
                 progress: Callable[[], Sequence[Progress]]) -> None:
        self.store = store
        self.router_id = router_id
        self.interval = interval
        self.progress = progress
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    async def start(self) -> None:
        """Beat once before the first request (its reservations are never orphans), release
        what dead routers left, then keep beating."""
        if self._task is None:
            await self.step()
            self._task = asyncio.get_running_loop().create_task(self._forever())

    async def step(self) -> None:
        try:
            await self.store.beat(self.router_id, MISSED_BEATS * self.interval,
                                  self.progress())
            released = await self.store.release_stale()
        except StoreError as exc:  # keep routing; the next beat retries
            if not self._failing:
                log.warning("cannot renew the router's heartbeat: %s", exc)
            self._failing = True
            return
        self._failing = False
        for held in released:
            log.warning("released reservation %s of project %s (router %s stopped "
                        "beating), billing the $%.6f it recorded", held.id, held.project,
                        held.router or "unknown", held.used)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            with contextlib.suppress(StoreError, TimeoutError):
                await asyncio.wait_for(self.store.drop_heartbeat(self.router_id), 2)

    async def _forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.step()
