"""Reservation settlements sent together: one store round trip for all that wait.

At a request's end its reservation shrinks to what it cost
(:meth:`llmgw.router.accounts.Accounts.settle`), and the request waits for that
write before it answers, so the next request of the project is admitted against the
real figure. One write per request was one store round trip per request: on
PostgreSQL, with 32 clients, the settlements queued on the pool behind each other.
Here a settlement joins the batch that is waiting for the store; the batch goes as one
call (:meth:`llmgw.store.stores.Store.settle_reservations`) as soon as the previous one
returned, so under load each round trip carries every settlement that arrived during
the last, and a lone request still writes at once: no timer, no added wait.

Nothing about the budget changes: each request still waits for its own settlement (or
its batch's StoreError) before it returns, exactly as it waited for its own write, and a
settlement only ever lowers a reservation, so spend stays under budget + one
reservation as :mod:`llmgw.router.accounts` states.

    settlements = Settlements(store)
    await settlements.settle(reservation_id, cost)  # raises StoreError as the store would
"""

from __future__ import annotations

import asyncio

from llmgw.store.stores import Store


class Settlements:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._pending: list[tuple[str, float]] = []
        self._next: asyncio.Future[None] | None = None  # resolves when _pending is written
        self._writer: asyncio.Task[None] | None = None
        self.batches = 0  # store calls made (tests, and a figure for the bench)

    async def settle(self, reservation: str, cost: float) -> None:
        """Hold ``cost`` for ``reservation`` in the store; returns once it is written."""
        self._pending.append((reservation, cost))
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        done = self._next
        if self._writer is None:
            self._writer = asyncio.create_task(self._write())
        # shield: a request cancelled while waiting leaves the batch to the others.
        await asyncio.shield(done)

    async def _write(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                done, self._next = self._next, None
                assert done is not None
                try:
                    self.batches += 1
                    await self.store.settle_reservations(batch)
                except Exception as exc:  # the waiters handle it (StoreError) as they did
                    _resolve(done, exc)
                else:
                    _resolve(done, None)
        finally:
            self._writer = None


def _resolve(done: asyncio.Future[None], error: Exception | None) -> None:
    if done.done():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)
        # Every waiter may have been cancelled; then nobody reads it, and that is fine.
        done.add_done_callback(lambda f: f.exception())
