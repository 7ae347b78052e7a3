"""Known keys without a store round trip, and whether the store is there.

:class:`KeyCache` maps a key id to its stored row (digest, project, limits,
revocation). A request's key is checked against the cached row in constant
time (:func:`llmgw.store.keys.check`); only a key not cached asks the store.
A cached key keeps working while the store is away; an unknown one gets 503
``store_unavailable`` then, never 401 (the router cannot know it is wrong).

**Revocation bound.** PostgreSQL: the ``llmgw_keys`` notice (migration 19)
drops the key from the cache at the revoke's commit, within
:data:`NOTIFY_BOUND` (1 s) while this router's watch is connected. Every
``poll`` seconds the router reads its cached keys again (SQLite:
:data:`POLL_INTERVAL`, 1 s; PostgreSQL: :data:`POSTGRES_POLL`, the backstop
for a notice missed while disconnected; on every reconnection all are read
again). A re-read that started just before the revoke's commit misses it, so
on SQLite a revoked key is refused within two intervals. The bound stated
for both (docs/ha.md, and what the tests wait for) is
:data:`REVOCATION_BOUND` = 2 × :data:`POLL_INTERVAL` + :data:`NOTIFY_BOUND`
= 3 s. A key read from the store while its notice arrives is not cached (the
notice may be older than the read's answer). A router cut off from the store
keeps a key revoked meanwhile until it reaches the store again, plus one poll.

:class:`StoreHealth` logs one line when the store goes away and one when it
returns, whatever the number of requests that failed meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from llmgw.store.outages import KeyWatch
from llmgw.store.stores import KeyRow, Store, StoreError

log = logging.getLogger(__name__)

NOTIFY_BOUND = 1.0  # seconds: a revocation reaches a connected PostgreSQL router
POLL_INTERVAL = 1.0  # seconds between re-reads of the cached keys on SQLite
POSTGRES_POLL = 30.0  # ... and on PostgreSQL, behind the notices
MAX_KEYS = 100_000  # cached keys; the least recently used goes first
REVOCATION_BOUND = 2 * POLL_INTERVAL + NOTIFY_BOUND  # seconds, both stores (docs/ha.md)


class StoreHealth:
    """Up or down, by the last store call on the request path; logs transitions only."""

    def __init__(self, changed: Callable[[bool], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.up = True
        self.since = clock()
        self._clock = clock
        self._changed = changed or (lambda up: None)

    def failed(self, exc: BaseException) -> None:
        if self.up:
            self.up, self.since = False, self._clock()
            log.error("the store is unreachable; known keys keep working on this router's "
                      "cache and local ledger, usage rows are buffered: %s", exc)
            self._changed(False)

    def ok(self) -> None:
        if not self.up:
            log.warning("the store is back after %.1f s", self._clock() - self.since)
            self.up, self.since = True, self._clock()
            self._changed(True)


class KeyCache:
    def __init__(self, store: Store, health: StoreHealth, poll: float | None = None,
                 hit: Callable[[bool], None] | None = None) -> None:
        self.store = store
        self.health = health
        self.poll = poll if poll is not None else (
            POSTGRES_POLL if store.kind == "postgresql" else POLL_INTERVAL)
        self._rows: OrderedDict[str, KeyRow] = OrderedDict()
        self._hit = hit or (lambda found: None)
        self._watch: KeyWatch | None = None
        self._task: asyncio.Task[None] | None = None
        self._everything = asyncio.Event()  # a notice asked to read every key again
        self._notices = 0  # notices so far: a read overtaken by one is not cached

    async def row(self, key_id: str) -> KeyRow | None:
        """The key's row, cached or from the store; StoreError when it is not cached and
        the store cannot be reached."""
        found = self._rows.get(key_id)
        if found is not None:
            self._rows.move_to_end(key_id)
            self._hit(True)
            return found
        self._hit(False)
        notices = self._notices
        row = await self.store.key_row(key_id)
        if row is not None and row.revoked_at is None and notices == self._notices:
            self._rows[key_id] = row
            while len(self._rows) > MAX_KEYS:
                self._rows.popitem(last=False)
        return row

    def changed(self, key_id: str | None) -> None:
        """A notice: drop ``key_id`` (read again at its next use); None: re-read all."""
        self._notices += 1
        if key_id is None:
            self._everything.set()
        else:
            self._rows.pop(key_id, None)

    async def refresh(self) -> None:
        """Read every cached key again: a revoked or deleted one leaves the cache."""
        ids = list(self._rows)
        if not ids:
            return
        rows = {r.id: r for r in await self.store.key_rows(ids)}
        for key_id in ids:
            row = rows.get(key_id)
            if row is None or row.revoked_at is not None:
                self._rows.pop(key_id, None)
            elif key_id in self._rows:
                self._rows[key_id] = row

    async def start(self) -> None:
        if self._task is None:
            self._watch = await self.store.watch_keys(self.changed)
            self._task = asyncio.get_running_loop().create_task(self._forever())

    async def _forever(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that
            # meets the event, and close() would wait for ever
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll):
                    await self._everything.wait()
            self._everything.clear()
            try:
                await self.refresh()
            except StoreError as exc:
                self.health.failed(exc)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._watch is not None:
            await self._watch.close()
            self._watch = None
