"""Who is asking and who pays: API key checks, budgets, and usage rows.

:class:`Accounts` authenticates a request's ``Authorization: Bearer`` key
against the store (one primary-key probe, constant-time digest compare; see
:mod:`llmgw.store.keys`), refuses projects at or over their budget, and
records one usage row per request. Spend per project is loaded from the store
once and then kept in memory, in a :class:`~llmgw.router.budgets.Ledger`, so the
budget check reads no database. Rows are buffered and written in one transaction
every ``flush_interval`` seconds (and on close) by a worker thread on a connection
of its own, so neither a request nor the event loop ever waits on a disk write or
on a store another process has locked; a failed write keeps its rows for the next.

Budgets: a request reserves its estimated cost before it is sent and settles to its
real cost after (see :mod:`llmgw.router.budgets` for the rule and its bound).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
from dataclasses import dataclass

from llmgw.router import budgets
from llmgw.router.budgets import NOTHING, Reservation
from llmgw.router.catalogs import Catalog
from llmgw.router.errors import ApiError
from llmgw.store import databases, keys, usages
from llmgw.store.usages import UsageRow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Principal:
    project: str | None  # None under `auth: none`
    key_id: str | None


ANONYMOUS = Principal(None, None)
_HOW_TO = "send `Authorization: Bearer <key>`; an operator creates keys with `llmgw keys create`"


class Accounts:
    def __init__(
        self, store: sqlite3.Connection | None, catalog: Catalog, flush_interval: float = 1.0
    ) -> None:
        if store is None and catalog.auth != "none":
            raise ValueError("auth: keys needs a store to check keys against")
        self.store = store
        self.catalog = catalog
        self.flush_interval = flush_interval
        self.ledger = budgets.Ledger(usages.spend_by_project(store) if store else {})
        self._rows: list[UsageRow] = []
        self._flusher: asyncio.Task[None] | None = None
        self._writer: sqlite3.Connection | None = None  # opened by the first flush
        self._writing = threading.Lock()  # one flush at a time, thread or loop

    @property
    def spent(self) -> dict[str, float]:
        """USD charged so far per project (settled requests only)."""
        return self.ledger.spent

    def authenticate(self, authorization: str | None) -> Principal:
        """The caller's project and key, or ApiError 401/403."""
        if self.catalog.auth == "none":
            return ANONYMOUS
        if not authorization:
            raise ApiError(401, f"missing API key: {_HOW_TO}", code="missing_api_key")
        scheme, _, token = authorization.partition(" ")
        # Only Bearer: a key sent under another scheme (Basic, Token, ...) was meant for
        # something else, or a client is guessing what this server accepts.
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, f"malformed Authorization header: {_HOW_TO}",
                           code="invalid_api_key")
        assert self.store is not None
        info = keys.verify(self.store, token.strip())
        if info is None:
            raise ApiError(401, "invalid API key (unknown, mistyped or revoked)",
                           code="invalid_api_key")
        if info.project not in self.catalog.budgets:
            raise ApiError(403, f"this key's project {info.project!r} is not defined in the "
                           "cluster's projects", code="unknown_project")
        return Principal(info.project, info.id)

    def reserve(self, principal: Principal, cost: float) -> Reservation:
        """Hold ``cost`` USD of the caller's budget until :meth:`record`; ApiError 429 when
        what the project has spent and reserved already reaches its budget."""
        project = principal.project
        if project is None:
            return NOTHING
        budget = self.catalog.budgets.get(project)
        reservation = self.ledger.reserve(project, budget, cost)
        if reservation is None:
            assert budget is not None
            spent = self.ledger.spent.get(project, 0.0)
            raise ApiError(
                429,
                f"project {project!r} is over its budget: spent {_usd(spent)} of "
                f"{_usd(budget)} (requests in flight hold "
                f"{_usd(self.ledger.committed(project) - spent)} more); raise budget_usd in "
                "the cluster's projects to continue",
                code="insufficient_quota", type="insufficient_quota",
            )
        return reservation

    def record(self, row: UsageRow, reservation: Reservation = NOTHING) -> None:
        """Settle ``reservation`` to the row's cost now; write the row at the next flush."""
        if reservation.project is not None:
            self.ledger.settle(reservation, row.cost_usd)
        elif row.project is not None:
            self.ledger.charge(row.project, row.cost_usd)
        if self.store is not None:
            self._rows.append(row)

    def flush(self) -> None:
        """Write buffered rows now, in one transaction; blocks (for close and tests),
        after waiting for a write under way in the worker thread."""
        with self._writing:
            rows, self._rows = self._rows, []
            self._keep(self._write(rows))

    async def flush_in_thread(self) -> None:
        """Write buffered rows from a worker thread; the loop goes on meanwhile."""
        if not self._rows or not self._writing.acquire(blocking=False):
            return  # nothing to write, or the last write is still under way
        rows, self._rows = self._rows, []
        writing = asyncio.ensure_future(asyncio.to_thread(self._write_and_release, rows))
        try:
            failed = await asyncio.shield(writing)
        except asyncio.CancelledError:  # closing: the write finishes, its failures are kept
            self._keep(await writing)
            raise
        self._keep(failed)

    def _write_and_release(self, rows: list[UsageRow]) -> list[UsageRow]:
        try:
            return self._write(rows)
        finally:
            self._writing.release()  # taken on the loop by flush_in_thread

    def _write(self, rows: list[UsageRow]) -> list[UsageRow]:
        """Rows that could not be written (all or none); the caller holds ``_writing``."""
        if not rows or self.store is None:
            return []
        try:
            if self._writer is None:
                self._writer = databases.reopen(self.store)
            usages.insert(self._writer, rows)
        except sqlite3.Error as exc:
            log.warning("could not write %d usage rows (%s); will retry", len(rows), exc)
            return rows
        return []

    def _keep(self, failed: list[UsageRow]) -> None:
        # Kept for the next flush, oldest first: a locked or full disk must not lose spend.
        self._rows[:0] = failed

    def start(self) -> None:
        if self._flusher is None and self.store is not None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_forever())

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        self.flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval)
            await self.flush_in_thread()


def _usd(amount: float) -> str:
    """Dollars to the cent, or to the micro-dollar below a cent (token prices are tiny)."""
    return f"${amount:,.2f}" if amount >= 0.01 or amount == 0 else f"${amount:.6f}"
