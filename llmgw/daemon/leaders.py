"""One leader among reconcilers: a lease in the store, renewed, fenced.

Every reconciler runs :meth:`Leadership.run`. The lease (``leases`` row
``reconciler``) names a holder, an **epoch** that grows by one whenever the
holder changes, and an expiry in the *database's* clock. The holder renews it
every ``ttl / 3``; a standby tries every half second, and at the expiry it
read, so it leads within ``ttl`` of the leader's last renewal — at most
``ttl`` after the leader died. A clean stop releases the lease: the standby
takes it at its next try, within half a second.

**Fencing.** A grant says how long the lease has left by the database's
clock; the holder counts that from the moment it *sent* the request, on its
own monotonic clock, minus a margin (``ttl / 4``, at most 5 s). So its own
deadline always falls before the database's expiry: when renewals stop
getting through (a partition, a paused process), the leader stops applying —
:meth:`Leadership.fenced` cancels the work in hand at the deadline — before
any standby can take the lease. On top of that, what the leader writes to the
store (the routing table) is conditioned, in the same statement, on the lease
still being held at its epoch (:meth:`Store.publish_routes`), so a
deposed leader's late write is refused by the database itself.

The margin bounds clock *rate* differences and the cancellation latency; an
RPC already delivered to an agent when the work is cancelled may still
complete there (agents do not check epochs).

With SQLite the store is one file on one machine: the same lease works, with
that machine's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from llmgw.store.stores import Grant, Store, StoreError

log = logging.getLogger("llmgw.leader")
T = TypeVar("T")
LEASE = "reconciler"
STANDBY_POLL = 0.5  # seconds between a standby's tries: two small queries each


class NotLeader(RuntimeError):
    """The work was cancelled, or refused, because this reconciler does not lead."""


def new_holder() -> str:
    """This process's name in the lease: host, pid and a random tag (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


async def leader(store: Store) -> Grant | None:
    """Who leads the reconcilers now (an unexpired lease), or None: what another process
    (``llmgw apply``) asks before it acts beside a daemon."""
    return await store.lease(LEASE)


def holder_words(grant: Grant) -> str:
    """``the daemon on gpu-head (pid 4242)``: a lease holder as :func:`new_holder` names it."""
    host, _, rest = grant.holder.rpartition(":")[0].rpartition(":")
    if host and rest.isdigit():
        return f"the daemon on {host} (pid {rest})"
    return f"the daemon {grant.holder!r}"


class Leadership:
    def __init__(
        self, store: Store, ttl: float, *, holder: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.ttl = ttl
        self.holder = holder or new_holder()
        self.clock = clock
        self.margin = min(ttl / 4, 5.0)
        self.epoch: int | None = None  # of the lease while we hold it
        self.leader: Grant | None = None  # whoever leads, as last read
        self.became_leader_at: float | None = None  # monotonic
        self.transitions = 0
        self._until = 0.0  # our own deadline, monotonic
        self.changed = asyncio.Event()  # set whenever leadership is gained or lost

    def is_leader(self) -> bool:
        return self.epoch is not None and self.clock() < self._until

    def remaining(self) -> float:
        """Seconds of leadership left on our own clock (0 when not leading)."""
        return max(0.0, self._until - self.clock()) if self.epoch is not None else 0.0

    async def run(self, stop: asyncio.Event) -> None:
        """Acquire and renew until ``stop``; then release, so a standby leads at once."""
        try:
            while not stop.is_set():
                delay = await self.try_once()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
        finally:
            await self.release()

    async def try_once(self) -> float:
        """One acquire-or-renew; returns how long to wait before the next."""
        sent = self.clock()
        try:
            grant = await asyncio.wait_for(
                self.store.acquire_lease(LEASE, self.holder, self.ttl), self.ttl / 3)
        except (StoreError, TimeoutError) as exc:
            log.warning("cannot reach the store for the lease: %s", exc or "timed out")
            self._check_lapsed()
            return min(1.0, self.ttl / 5)
        if grant is not None:
            self._until = sent + grant.remaining - self.margin
            self.leader = grant
            if self.epoch != grant.epoch:
                self.epoch = grant.epoch
                self.became_leader_at = self.clock()
                self.transitions += 1
                log.info("leading as %s (epoch %d)", self.holder, grant.epoch)
                self.changed.set()
            return self.ttl / 3
        self._check_lapsed(force=True)
        try:
            self.leader = await self.store.lease(LEASE)
        except StoreError:
            self.leader = None
        if self.leader is None:
            return 0.05  # released or expired between the two statements: try again now
        # Try again when the holder's lease would expire (takeover within ttl of its last
        # renewal), or sooner: a leader that stops cleanly releases the lease, and the
        # standby should notice within STANDBY_POLL, not at the expiry.
        return max(0.05, min(self.leader.remaining + 0.05, STANDBY_POLL))

    def _check_lapsed(self, force: bool = False) -> None:
        if self.epoch is not None and (force or not self.is_leader()):
            log.warning("lost the lease (epoch %d): stopping all applies", self.epoch)
            self.epoch = None
            self.changed.set()

    async def release(self) -> None:
        if self.epoch is None:
            return
        self.epoch = None
        self.changed.set()
        try:
            await asyncio.wait_for(self.store.release_lease(LEASE, self.holder), 5)
            log.info("released the lease: a standby leads now")
        except (StoreError, TimeoutError) as exc:
            log.warning("could not release the lease (it expires by itself): %s", exc)

    async def fenced(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` while we lead; cancel it at our deadline unless renewed meanwhile.

        NotLeader when we do not lead at the start, or lost the lease during the work.
        """
        if not self.is_leader():
            work.close()
            raise NotLeader("not the leader")
        epoch = self.epoch
        task = asyncio.ensure_future(work)
        while not task.done():
            left = self.remaining()
            if left <= 0 or self.epoch != epoch:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                raise NotLeader(f"lost the lease (epoch {epoch}) during the work")
            await asyncio.wait({task}, timeout=min(left, 0.5))
        return task.result()
