"""The SQLite store: one file, one connection, one dedicated thread.

Every statement runs on a single-thread executor that owns the connection, so
the event loop never waits on the disk (a WAL checkpoint or a ``busy_timeout``
wait lands on that thread, not on requests) and statements never interleave.
Several processes may share the file (``llmgw keys`` beside ``serve``, or
``--workers``): SQLite's own locking orders their writes.

The pages' records (users, sessions, conversations, usage charts) are in the
:class:`~llmgw.store.sqlitepages.SQLitePages` mixin, on the same thread.

The lease uses the same table as PostgreSQL with this machine's clock: on one
machine that is the only clock there is.

Usage::

    store = await SQLiteStore.open(Path("cluster/llmgw.db"))
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal, TypeVar

from llmgw.spec.rollouts import Hold
from llmgw.store import (
    adminsummaries,
    audits,
    databases,
    exports,
    holds,
    journals,
    outages,
    ratelimits,
    reservations,
    spends,
    sqlrows,
    tableio,
)
from llmgw.store.reservations import Chosen, Held, Owner, Progress
from llmgw.store.sqlitepages import SQLitePages
from llmgw.store.stores import (
    Admission,
    Grant,
    KeyListing,
    KeyRow,
    Published,
    Store,
    StoreError,
    shown_path,
)
from llmgw.store.usages import COLUMNS, Record, UsageRow, from_record, to_record

T = TypeVar("T")
_INSERT_USAGE = f"INSERT INTO usage ({', '.join(COLUMNS)})"  # VALUES: sqlrows.insert
_KEY_COLUMNS = "id, digest, project, name, created_at, revoked_at, rpm, tpm, owner"
_KEY_MARKS = ", ".join("?" * 9)
# Budget reservations: what live reservations of the period hold (llmgw.store.spends has
# what was spent), taking and settling one.
_RESERVED = ("SELECT COALESCE(SUM(amount), 0) FROM reservations WHERE project = ? "
             "AND expires_at > ? AND (? IS NULL OR started IS NULL OR started >= ?)")
_SETTLE = "UPDATE reservations SET amount = ? WHERE id = ? AND released_at IS NULL"
_SETTLE_MANY = ("UPDATE reservations SET amount = v.column2 FROM (VALUES {values}) AS v "
                "WHERE reservations.id = v.column1 AND reservations.released_at IS NULL")


class SQLiteStore(SQLitePages, Store):
    kind: Literal["sqlite", "postgresql"] = "sqlite"

    def __init__(self, path: Path, executor: ThreadPoolExecutor,
                 conn: sqlite3.Connection) -> None:
        self.path = path
        self.where = shown_path(path)
        self._executor = executor
        self._conn = conn

    @classmethod
    async def open(cls, path: Path) -> SQLiteStore:
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmgw-sqlite")
        try:
            conn = await asyncio.get_running_loop().run_in_executor(
                executor, databases.connect, path)
        except (sqlite3.Error, OSError) as exc:
            executor.shutdown(wait=False)
            raise StoreError(f"cannot open the store {path}: {exc}") from None
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(path, executor, conn)

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            try:
                return fn(self._conn)
            except sqlite3.Error as exc:
                raise StoreError(f"{self.where}: {exc}") from exc
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    # -- the apply journal (SQL in llmgw.store.journals) ------------------------------------
    async def record_apply(self, entry: journals.ApplyEntry) -> int:
        return await self._run(lambda conn: journals.sqlite_record(conn, entry))

    async def history(self, model: str | None = None,
                      limit: int = 50) -> list[journals.ApplyEntry]:
        return await self._run(lambda conn: journals.sqlite_history(conn, model, limit))

    # -- the audit log (SQL in llmgw.store.audits) ------------------------------------------
    async def insert_audit(self, entry: audits.Entry) -> int:
        return await self._run(lambda conn: audits.sqlite_insert(conn, entry))

    async def audit_entries(self, since: float | None = None,
                            limit: int = 100) -> list[audits.Entry]:
        return await self._run(lambda conn: audits.sqlite_audits(conn, since, limit))

    async def purge_audits(self, before: float) -> int:
        return await self._run(lambda conn: audits.sqlite_purge(conn, before))

    async def usage_sums(self, start: float, end: float, columns: Sequence[str],
                         slot: float | None) -> list[exports.Sums]:
        return await self._run(lambda conn: exports.sqlite_sums(conn, start, end, columns, slot))

    # -- held revisions (SQL in llmgw.store.holds) ------------------------------------------
    async def put_hold(self, hold: Hold) -> None:
        await self._run(lambda conn: holds.sqlite_put(conn, hold))

    async def holds(self) -> list[Hold]:
        return await self._run(holds.sqlite_holds)

    async def release_holds(self, models: Sequence[str] | None = None) -> list[Hold]:
        return await self._run(lambda conn: holds.sqlite_release(conn, models))

    # -- rate limits (SQL in llmgw.store.ratelimits) -----------------------------------------
    async def take_rate(self, slot: int,
                        counts: Sequence[ratelimits.Count]) -> ratelimits.Taken:
        return await self._run(lambda conn: ratelimits.sqlite_take(conn, slot, counts))

    async def adjust_rate(self, slot: int, name: str, delta: int) -> None:
        await self._run(lambda conn: ratelimits.sqlite_adjust(conn, slot, name, delta))

    # -- keys ---------------------------------------------------------------------------
    async def insert_key(self, row: KeyRow) -> bool:
        def insert(conn: sqlite3.Connection) -> bool:
            try:
                conn.execute(f"INSERT INTO keys ({_KEY_COLUMNS}) VALUES ({_KEY_MARKS})",
                             _key_tuple(row))
            except sqlite3.IntegrityError:
                return False
            return True
        return await self._run(insert)

    async def key_row(self, key_id: str) -> KeyRow | None:
        def select(conn: sqlite3.Connection) -> KeyRow | None:
            found = conn.execute(f"SELECT {_KEY_COLUMNS} FROM keys WHERE id = ?",
                                 (key_id,)).fetchone()
            return KeyRow(*found) if found else None
        return await self._run(select)

    async def key_rows(self, ids: Sequence[str]) -> list[KeyRow]:
        return await self._run(lambda conn: [
            KeyRow(*r) for r in outages.sqlite_key_rows(conn, ids, _KEY_COLUMNS)])

    async def list_keys(self) -> list[KeyListing]:
        def select(conn: sqlite3.Connection) -> list[KeyListing]:
            rows = conn.execute(
                f"SELECT {_KEY_COLUMNS}, (SELECT MAX(ts) FROM usage u WHERE u.key_id = k.id) "
                "FROM keys k ORDER BY k.created_at, k.id").fetchall()
            return [KeyListing(KeyRow(*r[:9]), r[9]) for r in rows]
        return await self._run(select)

    async def revoke_key(self, key_id: str, when: float) -> KeyRow | None:
        def revoke(conn: sqlite3.Connection) -> KeyRow | None:
            conn.execute("UPDATE keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                         (when, key_id))
            found = conn.execute(f"SELECT {_KEY_COLUMNS} FROM keys WHERE id = ?",
                                 (key_id,)).fetchone()
            return KeyRow(*found) if found else None
        return await self._run(revoke)

    async def set_key_limits(self, key_id: str, rpm: int | None,
                             tpm: int | None) -> KeyRow | None:
        def limit(conn: sqlite3.Connection) -> KeyRow | None:
            conn.execute("UPDATE keys SET rpm = ?, tpm = ? WHERE id = ?", (rpm, tpm, key_id))
            found = conn.execute(f"SELECT {_KEY_COLUMNS} FROM keys WHERE id = ?",
                                 (key_id,)).fetchone()
            return KeyRow(*found) if found else None
        return await self._run(limit)

    # -- usage --------------------------------------------------------------------------
    async def insert_usage(self, rows: Sequence[UsageRow],
                           settled: Sequence[str | None] = ()) -> None:
        if not rows and not settled:
            return
        ids = [i for i in settled if i is not None]

        def insert(conn: sqlite3.Connection) -> None:
            with conn:
                conn.execute("BEGIN")
                released = reservations.sqlite_settle(conn, ids) if ids else {}
                billed = reservations.deduct(rows, settled, released) if released else rows
                billed = outages.sqlite_unseen(conn, billed)
                _append_usage(conn, [to_record(r) for r in billed])
        await self._run(insert)

    async def spend_by_project(
        self, starts: Mapping[str, float | None] | None = None,
    ) -> dict[str, float]:
        return await self._run(lambda conn: spends.sqlite_spend(conn, starts or {}))

    async def last_use_by_model(self) -> dict[str, float]:
        def select(conn: sqlite3.Connection) -> dict[str, float]:
            rows = conn.execute("SELECT model, MAX(ts + latency_ms / 1000.0) FROM usage "
                                "GROUP BY model").fetchall()
            return {model: float(ts) for model, ts in rows if ts is not None}
        return await self._run(select)

    async def reserve(self, project: str, budget: float, amount: float,
                      hold: float, owner: Owner | None = None,
                      since: float | None = None) -> Admission:
        def reserve(conn: sqlite3.Connection) -> Admission:
            now = time.time()
            with conn:
                conn.execute("BEGIN IMMEDIATE")  # the write lock orders every router's check
                spent_usd = spends.sqlite_spent(conn, project, since)
                reserved = conn.execute(_RESERVED, (project, now, since, since)).fetchone()[0]
                if spent_usd + reserved >= budget:
                    return Admission(None, spent_usd, float(reserved))
                reservation = secrets.token_hex(8)
                reservations.sqlite_insert(conn, reservation, project, amount, now + hold,
                                           owner, now)
            return Admission(reservation, spent_usd, float(reserved))
        return await self._run(reserve)

    async def settle_reservation(self, reservation: str, cost: float) -> None:
        await self._run(lambda conn: conn.execute(_SETTLE, (cost, reservation)))

    async def settle_reservations(self, settled: Sequence[tuple[str, float]]) -> None:
        def settle(conn: sqlite3.Connection) -> None:
            with conn:
                conn.execute("BEGIN")
                for chunk in sqlrows.chunks(settled, sqlrows.ROWS_PER_STATEMENT):
                    conn.execute(_SETTLE_MANY.format(values=sqlrows.values(chunk)),
                                 sqlrows.flat(chunk))
        await self._run(settle)

    # -- reservations' owners (SQL in llmgw.store.reservations) -----------------------------
    async def beat(self, router: str, ttl: float, progress: Sequence[Progress] = ()) -> None:
        await self._run(lambda conn: reservations.sqlite_beat(conn, router, ttl, progress))

    async def drop_heartbeat(self, router: str) -> None:
        await self._run(lambda conn: reservations.sqlite_drop_heartbeat(conn, router))

    async def release_stale(self) -> list[Held]:
        return await self._release(...)

    async def list_reservations(self) -> list[Held]:
        return await self._run(reservations.sqlite_list)

    async def release_reservations(self, ids: Sequence[str] | None) -> list[Held]:
        return await self._release(ids)

    async def _release(self, ids: Chosen) -> list[Held]:
        def bill(conn: sqlite3.Connection, rows: list[UsageRow]) -> None:
            _append_usage(conn, [to_record(r) for r in rows])
        return await self._run(lambda conn: reservations.sqlite_release(conn, ids, bill))

    async def recent_usage(self, limit: int) -> list[UsageRow]:
        def select(conn: sqlite3.Connection) -> list[UsageRow]:
            rows = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM usage "
                                "ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
            return [from_record(r) for r in rows]
        return await self._run(select)

    async def usage_after(self, after_id: int, limit: int) -> list[tuple[int, UsageRow]]:
        def select(conn: sqlite3.Connection) -> list[tuple[int, UsageRow]]:
            rows = conn.execute(f"SELECT id, {', '.join(COLUMNS)} FROM usage WHERE id > ? "
                                "ORDER BY id LIMIT ?", (after_id, limit)).fetchall()
            return [(r[0], from_record(r[1:])) for r in rows]
        return await self._run(select)

    # -- lease --------------------------------------------------------------------------
    async def acquire_lease(self, name: str, holder: str, ttl: float) -> Grant | None:
        def acquire(conn: sqlite3.Connection) -> Grant | None:
            now = time.time()
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                found = conn.execute("SELECT holder, epoch, expires_at FROM leases "
                                     "WHERE name = ?", (name,)).fetchone()
                if found is None:
                    epoch = 1
                elif found[0] == holder:
                    epoch = found[1]
                elif found[2] <= now:
                    epoch = found[1] + 1
                else:
                    return None
                conn.execute("INSERT INTO leases (name, holder, epoch, expires_at) "
                             "VALUES (?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                             "holder = excluded.holder, epoch = excluded.epoch, "
                             "expires_at = excluded.expires_at", (name, holder, epoch, now + ttl))
            return Grant(name, holder, epoch, ttl)
        return await self._run(acquire)

    async def release_lease(self, name: str, holder: str) -> None:
        await self._run(lambda conn: conn.execute(
            "UPDATE leases SET expires_at = 0 WHERE name = ? AND holder = ?", (name, holder)))

    async def lease(self, name: str) -> Grant | None:
        def select(conn: sqlite3.Connection) -> Grant | None:
            now = time.time()
            found = conn.execute("SELECT holder, epoch, expires_at FROM leases WHERE name = ? "
                                 "AND expires_at > ?", (name, now)).fetchone()
            return Grant(name, found[0], found[1], found[2] - now) if found else None
        return await self._run(select)

    async def publish_routes(self, name: str, holder: str, epoch: int, doc: str) -> bool:
        def publish(conn: sqlite3.Connection) -> bool:
            now = time.time()
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                held = conn.execute("SELECT 1 FROM leases WHERE name = ? AND holder = ? AND "
                                    "epoch = ? AND expires_at > ?",
                                    (name, holder, epoch, now)).fetchone()
                if held is None:
                    return False
                conn.execute(
                    "INSERT INTO published_routes VALUES (?, ?, 1, ?, ?) ON CONFLICT (name) "
                    "DO UPDATE SET epoch = excluded.epoch, seq = published_routes.seq + 1, "
                    "doc = excluded.doc, published_at = excluded.published_at",
                    (name, epoch, doc, now))
            return True
        return await self._run(publish)

    async def published_routes(self, name: str) -> Published | None:
        def select(conn: sqlite3.Connection) -> Published | None:
            found = conn.execute("SELECT epoch, seq, doc FROM published_routes WHERE name = ?",
                                 (name,)).fetchone()
            return Published(*found) if found else None
        return await self._run(select)

    async def publish_summary(self, name: str, holder: str, epoch: int, doc: str) -> bool:
        return await self._run(
            lambda conn: adminsummaries.sqlite_publish(conn, name, holder, epoch, doc))

    async def published_summary(self, name: str, seen: int | None = None, *,
                                body: bool = True) -> adminsummaries.PublishedSummary | None:
        return await self._run(
            lambda conn: adminsummaries.sqlite_published(conn, name, seen, body))

    async def put_signals(self, router: str, doc: str) -> None:
        await self._run(lambda conn: conn.execute(
            "INSERT INTO router_signals VALUES (?, ?, ?) ON CONFLICT (router) DO UPDATE SET "
            "doc = excluded.doc, updated_at = excluded.updated_at", (router, doc, time.time())))

    async def signals(self, max_age: float) -> list[str]:
        def select(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute("SELECT doc FROM router_signals WHERE updated_at > ? "
                                "ORDER BY router", (time.time() - max_age,)).fetchall()
            return [r[0] for r in rows]
        return await self._run(select)

    async def drop_signals(self, router: str) -> None:
        await self._run(lambda conn: conn.execute(
            "DELETE FROM router_signals WHERE router = ?", (router,)))

    # -- the whole store ----------------------------------------------------------------
    async def schema_version(self) -> int:
        return await self._run(databases.version)

    async def is_empty(self) -> bool:
        def count(conn: sqlite3.Connection) -> bool:
            return not conn.execute("SELECT EXISTS (SELECT 1 FROM keys) "
                                    "OR EXISTS (SELECT 1 FROM usage)").fetchone()[0]
        return await self._run(count)

    # -- whole tables, for `llmgw store migrate` (SQL in llmgw.store.tableio) -------------
    async def shapes(self) -> dict[str, tableio.Shape]:
        return await tableio.sqlite_shapes(self._run)

    async def copy_marks(self, source: str) -> dict[str, int] | None:
        return await tableio.sqlite_marks(self._run, source)

    @contextlib.asynccontextmanager
    async def reading(self) -> AsyncIterator[tableio.TableReader]:
        # A read transaction, pinned by its first SELECT: WAL keeps this snapshot while
        # a daemon goes on writing.
        await self._run(lambda conn: conn.execute("BEGIN").execute(
            "SELECT COUNT(*) FROM sqlite_master").fetchone())
        try:
            yield tableio.SQLiteTables(self._run)
        finally:
            await self._run(lambda conn: conn.execute("ROLLBACK"))

    @contextlib.asynccontextmanager
    async def writing(self) -> AsyncIterator[tableio.TableWriter]:
        await self._run(lambda conn: conn.execute("BEGIN IMMEDIATE"))
        try:
            yield tableio.SQLiteTables(self._run)
        except BaseException:
            await self._run(lambda conn: conn.execute("ROLLBACK"))
            raise
        await self._run(lambda conn: conn.execute("COMMIT"))

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._conn.close)
        self._executor.shutdown(wait=True)


def _append_usage(conn: sqlite3.Connection, records: list[Record]) -> None:
    """Insert usage records and add their cost to the running totals (inside a
    transaction): project_spend and spend_buckets (:mod:`llmgw.store.spends`)."""
    sqlrows.insert(conn, _INSERT_USAGE, records)
    spends.sqlite_add(conn, records)


def _key_tuple(row: KeyRow) -> tuple[str, str, str, str, float, float | None,
                                     int | None, int | None, str | None]:
    return (row.id, row.digest, row.project, row.name, row.created_at, row.revoked_at,
            row.rpm, row.tpm, row.owner)
