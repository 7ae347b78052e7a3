"""What lets routers ride out a store outage: key change notices, key re-reads, and
usage rows written once however often they are sent.

* **Key change notices.** On PostgreSQL a trigger on ``keys`` (migration 19)
  sends ``NOTIFY llmgw_keys, '<key id>'`` when a key is created, revoked or
  deleted, at commit. :class:`PostgresKeyWatch` listens on a connection of its
  own (asyncpg ``add_listener``), outside the pool, and calls ``changed(id)``
  for each notice. A notice sent while it was not connected is lost, so on
  every (re)connection it calls ``changed(None)``: read every cached key
  again. It checks its connection every ``check`` seconds (``SELECT 1``), so a
  silent network cut is noticed too. SQLite has no notices: its routers poll
  (:meth:`OutageMethods.key_rows` of the keys they hold).
* **Usage rows once.** A row carries its request's id (``request_id``, a
  unique index where set): :func:`sqlite_unseen` and :func:`postgres_unseen`
  drop, inside the writing transaction, rows whose id is already stored — a
  row buffered on a router's disk during an outage and written again on
  recovery, after a write whose commit landed but whose answer was lost.

This module holds the :class:`OutageMethods` part of the store interface and
the SQL of both databases.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import asyncpg

from llmgw.store import sqlrows

if TYPE_CHECKING:
    from llmgw.store.stores import KeyRow
    from llmgw.store.usages import UsageRow

log = logging.getLogger(__name__)

CHANNEL = "llmgw_keys"


class KeyWatch(abc.ABC):
    """A running watch on key changes; :attr:`connected` says whether notices arrive."""

    connected: bool = False

    @abc.abstractmethod
    async def close(self) -> None: ...


class OutageMethods(abc.ABC):
    """The outage part of :class:`~llmgw.store.stores.Store`."""

    @abc.abstractmethod
    async def key_rows(self, ids: Sequence[str]) -> list[KeyRow]:
        """The stored rows of the keys ``ids`` (ids without a row are left out)."""

    async def watch_keys(self, changed: Callable[[str | None], None]) -> KeyWatch | None:
        """Call ``changed(key id)`` when a key changes, and ``changed(None)`` when notices
        may have been missed (read everything again); None where the database sends no
        notices (SQLite: poll :meth:`key_rows`)."""
        return None


class PostgresKeyWatch(KeyWatch):
    """LISTEN on :data:`CHANNEL` on a connection of its own, reconnecting every ``retry``
    seconds while the database is away."""

    def __init__(self, dsn: str, changed: Callable[[str | None], None], *,
                 retry: float = 1.0, check: float = 5.0) -> None:
        self._dsn = dsn
        self._changed = changed
        self._retry = retry
        self._check = check
        self._task: asyncio.Task[None] | None = None
        self._conn: asyncpg.Connection | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: object) -> None:
        self._changed(payload if isinstance(payload, str) and payload else None)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError,
                                     TimeoutError):
                await self._listen()
            self.connected = False
            await asyncio.sleep(self._retry)

    async def _listen(self) -> None:
        conn = self._conn = await asyncpg.connect(self._dsn, timeout=self._check)
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _c: lost.set())
        try:
            await conn.add_listener(CHANNEL, self._notified)
            self.connected = True
            self._changed(None)  # what changed while nobody listened is read again
            while not lost.is_set():
                try:  # asyncio.timeout: a cancel is never swallowed (wait_for on 3.11 can)
                    async with asyncio.timeout(self._check):
                        await lost.wait()
                except TimeoutError:
                    await conn.fetchval("SELECT 1", timeout=self._check)
        finally:
            self.connected = False
            self._conn = None
            conn.terminate()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def _first(rows: Sequence[UsageRow]) -> list[UsageRow]:
    """``rows`` without a second row of the same request id."""
    seen: set[str] = set()
    out = []
    for row in rows:
        if row.request_id is not None:
            if row.request_id in seen:
                continue
            seen.add(row.request_id)
        out.append(row)
    return out


def sqlite_unseen(conn: sqlite3.Connection, rows: Sequence[UsageRow]) -> list[UsageRow]:
    """``rows`` less those whose request id is stored already (inside the transaction)."""
    ids = [r.request_id for r in rows if r.request_id is not None]
    if not ids:
        return list(rows)
    stored: set[str] = set()
    for chunk in sqlrows.chunks(ids):
        stored.update(r[0] for r in conn.execute(
            f"SELECT request_id FROM usage WHERE request_id IN {sqlrows.marks(len(chunk))}",
            chunk))
    return _first([r for r in rows if r.request_id is None or r.request_id not in stored])


async def postgres_unseen(conn: asyncpg.pool.PoolConnectionProxy,
                          rows: Sequence[UsageRow]) -> list[UsageRow]:
    ids = [r.request_id for r in rows if r.request_id is not None]
    if not ids:
        return list(rows)
    stored = {r[0] for r in await conn.fetch(
        "SELECT request_id FROM usage WHERE request_id = ANY($1::text[])", ids)}
    return _first([r for r in rows if r.request_id is None or r.request_id not in stored])


def sqlite_key_rows(conn: sqlite3.Connection, ids: Sequence[str],
                    columns: str) -> list[tuple[Any, ...]]:
    found: list[tuple[Any, ...]] = []
    for chunk in sqlrows.chunks(ids):
        found += conn.execute(f"SELECT {columns} FROM keys WHERE id IN "
                              f"{sqlrows.marks(len(chunk))}", list(chunk)).fetchall()
    return found


async def postgres_key_rows(conn: asyncpg.pool.PoolConnectionProxy, ids: Sequence[str],
                            columns: str) -> list[tuple[Any, ...]]:
    rows = await conn.fetch(f"SELECT {columns} FROM keys WHERE id = ANY($1::text[])", list(ids))
    return [tuple(r) for r in rows]
