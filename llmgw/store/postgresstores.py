"""The PostgreSQL store: asyncpg on the event loop, a small connection pool.

Why asyncpg rather than psycopg 3: it speaks PostgreSQL's binary protocol
natively on asyncio (no libpq, no thread hand-off per query), has a built-in
pool and prepared-statement cache, and is the faster of the two on the
router's hot path — a primary-key probe per request. Its type stubs
(``asyncpg-stubs``) keep this module under ``mypy --strict``.

The pages' records (users, sessions, conversations, usage charts) are in the
:class:`~llmgw.store.postgrespages.PostgresPages` mixin.

Migrations run in one transaction under an advisory lock, so reconcilers and
routers starting together migrate once; a schema newer than this llmgw is
refused. The lease compares ``expires_at`` with the database's ``now()``,
never a client's clock.

Usage::

    store = await PostgresStore.open("postgresql://llmgw@db:5432/llmgw", "db")
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Literal

import asyncpg

from llmgw.spec.rollouts import Hold
from llmgw.store import (
    adminsummaries,
    audits,
    exports,
    holds,
    journals,
    migrations,
    outages,
    ratelimits,
    reservations,
    spends,
    tableio,
)
from llmgw.store.postgrespages import PostgresPages
from llmgw.store.reservations import Chosen, Held, Owner, Progress
from llmgw.store.stores import Admission, Grant, KeyListing, KeyRow, Published, Store, StoreError
from llmgw.store.usages import COLUMNS, Record, UsageRow, from_record, to_record

_KEY_COLUMNS = "id, digest, project, name, created_at, revoked_at, rpm, tpm, owner"
_INSERT_USAGE = (f"INSERT INTO usage ({', '.join(COLUMNS)}) VALUES "
                 f"({', '.join(f'${i + 1}' for i in range(len(COLUMNS)))})")
_INSERT_KEY = f"INSERT INTO keys ({_KEY_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
# Budget reservations: admission (llmgw_reserve, migrations 5 and 9) and settling.
_RESERVE = ("SELECT spent, reserved, admitted FROM "
            "llmgw_reserve($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)")
_SETTLE = "UPDATE reservations SET amount = $2 WHERE id = $1 AND released_at IS NULL"
_MIGRATION_LOCK = 0x6C6C6D6777  # "llmgw": one advisory lock id for schema changes
_POOL_SIZE = 8
_ACQUIRE = """
INSERT INTO leases AS l (name, holder, epoch, expires_at)
VALUES ($1, $2, 1, now() + make_interval(secs => $3))
ON CONFLICT (name) DO UPDATE SET
    holder = EXCLUDED.holder,
    epoch = CASE WHEN l.holder = EXCLUDED.holder THEN l.epoch ELSE l.epoch + 1 END,
    expires_at = EXCLUDED.expires_at
WHERE l.holder = EXCLUDED.holder OR l.expires_at <= now()
RETURNING epoch, EXTRACT(EPOCH FROM expires_at - now())::float8
"""


class PostgresStore(PostgresPages, Store):
    kind: Literal["sqlite", "postgresql"] = "postgresql"

    def __init__(self, pool: asyncpg.Pool, where: str, dsn: str | None = None) -> None:
        self._pool = pool
        self.where = where
        self._dsn = dsn  # for the key watch's own connection (LISTEN is outside the pool)

    @classmethod
    async def open(cls, dsn: str, where: str) -> PostgresStore:
        try:
            pool = await asyncpg.create_pool(dsn, min_size=1, max_size=_POOL_SIZE,
                                             timeout=10, command_timeout=30,
                                             reset=_no_session_state)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StoreError(f"cannot connect to the store {where}: {exc}") from None
        store = cls(pool, where, dsn)
        try:
            await store._migrate()
        except BaseException:
            await pool.close()
            raise
        return store

    @contextlib.asynccontextmanager
    async def _conn(self) -> AsyncIterator[asyncpg.pool.PoolConnectionProxy]:
        """A pooled connection; every database failure becomes one StoreError."""
        try:
            async with self._pool.acquire() as conn:
                yield conn
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StoreError(f"{self.where}: {exc}") from exc

    async def _migrate(self) -> None:
        async with self._conn() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
            await conn.execute("CREATE TABLE IF NOT EXISTS llmgw_schema (version INTEGER NOT NULL)")
            found = await conn.fetchval("SELECT version FROM llmgw_schema")
            if found is None:
                await conn.execute("INSERT INTO llmgw_schema VALUES (0)")
                found = 0
            for step in migrations.pending(int(found), self.where):
                await conn.execute(step.postgres)
                await conn.execute("UPDATE llmgw_schema SET version = $1", step.version)

    # -- the apply journal (SQL in llmgw.store.journals) ------------------------------------
    async def record_apply(self, entry: journals.ApplyEntry) -> int:
        async with self._conn() as conn:
            return await journals.postgres_record(conn, entry)

    async def history(self, model: str | None = None,
                      limit: int = 50) -> list[journals.ApplyEntry]:
        async with self._conn() as conn:
            return await journals.postgres_history(conn, model, limit)

    # -- the audit log (SQL in llmgw.store.audits) ------------------------------------------
    async def insert_audit(self, entry: audits.Entry) -> int:
        async with self._conn() as conn:
            return await audits.postgres_insert(conn, entry)

    async def audit_entries(self, since: float | None = None,
                            limit: int = 100) -> list[audits.Entry]:
        async with self._conn() as conn:
            return await audits.postgres_audits(conn, since, limit)

    async def purge_audits(self, before: float) -> int:
        async with self._conn() as conn:
            return await audits.postgres_purge(conn, before)

    async def usage_sums(self, start: float, end: float, columns: Sequence[str],
                         slot: float | None) -> list[exports.Sums]:
        async with self._conn() as conn:
            return await exports.postgres_sums(conn, start, end, columns, slot)

    # -- held revisions (SQL in llmgw.store.holds) ------------------------------------------
    async def put_hold(self, hold: Hold) -> None:
        async with self._conn() as conn:
            await holds.postgres_put(conn, hold)

    async def holds(self) -> list[Hold]:
        async with self._conn() as conn:
            return await holds.postgres_holds(conn)

    async def release_holds(self, models: Sequence[str] | None = None) -> list[Hold]:
        async with self._conn() as conn:
            return await holds.postgres_release(conn, models)

    # -- rate limits (SQL in llmgw.store.ratelimits) -----------------------------------------
    async def take_rate(self, slot: int,
                        counts: Sequence[ratelimits.Count]) -> ratelimits.Taken:
        async with self._conn() as conn:
            return await ratelimits.postgres_take(conn, slot, counts)

    async def adjust_rate(self, slot: int, name: str, delta: int) -> None:
        async with self._conn() as conn:
            await ratelimits.postgres_adjust(conn, slot, name, delta)

    # -- keys ---------------------------------------------------------------------------
    async def insert_key(self, row: KeyRow) -> bool:
        async with self._conn() as conn:
            status = await conn.execute(f"{_INSERT_KEY} ON CONFLICT (id) DO NOTHING",
                                        *_key_tuple(row))
        return bool(status.endswith(" 1"))

    async def key_row(self, key_id: str) -> KeyRow | None:
        async with self._conn() as conn:
            found = await conn.fetchrow(f"SELECT {_KEY_COLUMNS} FROM keys WHERE id = $1", key_id)
        return KeyRow(*found) if found else None

    async def set_key_limits(self, key_id: str, rpm: int | None,
                             tpm: int | None) -> KeyRow | None:
        async with self._conn() as conn:
            found = await conn.fetchrow(f"UPDATE keys SET rpm = $1, tpm = $2 WHERE id = $3 "
                                        f"RETURNING {_KEY_COLUMNS}", rpm, tpm, key_id)
        return KeyRow(*found) if found else None

    async def key_rows(self, ids: Sequence[str]) -> list[KeyRow]:
        async with self._conn() as conn:
            return [KeyRow(*r) for r in await outages.postgres_key_rows(conn, ids, _KEY_COLUMNS)]

    async def watch_keys(self, changed: Callable[[str | None], None]) -> outages.KeyWatch | None:
        if self._dsn is None:
            return None
        watch = outages.PostgresKeyWatch(self._dsn, changed)
        watch.start()
        return watch

    async def list_keys(self) -> list[KeyListing]:
        async with self._conn() as conn:
            rows = await conn.fetch(
                f"SELECT {_KEY_COLUMNS}, (SELECT MAX(ts) FROM usage u WHERE u.key_id = k.id) "
                "FROM keys k ORDER BY k.created_at, k.id")
        return [KeyListing(KeyRow(*r[:9]), r[9]) for r in rows]

    async def revoke_key(self, key_id: str, when: float) -> KeyRow | None:
        async with self._conn() as conn:
            await conn.execute("UPDATE keys SET revoked_at = $1 WHERE id = $2 "
                               "AND revoked_at IS NULL", when, key_id)
            found = await conn.fetchrow(f"SELECT {_KEY_COLUMNS} FROM keys WHERE id = $1", key_id)
        return KeyRow(*found) if found else None

    # -- usage --------------------------------------------------------------------------
    async def insert_usage(self, rows: Sequence[UsageRow],
                           settled: Sequence[str | None] = ()) -> None:
        if not rows and not settled:
            return
        ids = [i for i in settled if i is not None]
        async with self._conn() as conn, conn.transaction():
            released = await reservations.postgres_settle(conn, ids) if ids else {}
            billed = reservations.deduct(rows, settled, released) if released else rows
            billed = await outages.postgres_unseen(conn, billed)
            await _append_usage(conn, [to_record(r) for r in billed])

    async def spend_by_project(
        self, starts: Mapping[str, float | None] | None = None,
    ) -> dict[str, float]:
        async with self._conn() as conn:
            return await spends.postgres_spend(conn, starts or {})

    async def reserve(self, project: str, budget: float, amount: float,
                      hold: float, owner: Owner | None = None,
                      since: float | None = None) -> Admission:
        # One round trip: llmgw_reserve (migrations 5, 9, and the budget periods') locks
        # the project's spend row, so every router's admission for this project waits its
        # turn and none can see room for a request another has just taken.
        reservation = secrets.token_hex(8)
        async with self._conn() as conn:
            o = owner
            found = await conn.fetchrow(
                _RESERVE, project, float(budget), float(amount), float(hold), reservation,
                o and o.router, o and o.key_id, o and o.model, o and o.endpoint,
                bool(o and o.stream), o and o.user_name,
                None if since is None else float(since),
                None if o is None or o.ts is None else float(o.ts))
        assert found is not None
        spent, reserved = float(found[0]), float(found[1])
        if not found[2]:
            return Admission(None, spent, reserved)
        return Admission(reservation, spent, reserved)

    async def settle_reservation(self, reservation: str, cost: float) -> None:
        async with self._conn() as conn:
            await conn.execute(_SETTLE, reservation, cost)

    async def settle_reservations(self, settled: Sequence[tuple[str, float]]) -> None:
        async with self._conn() as conn:
            await conn.executemany(_SETTLE, [(r, float(c)) for r, c in settled])

    # -- reservations' owners (SQL in llmgw.store.reservations) -----------------------------
    async def beat(self, router: str, ttl: float, progress: Sequence[Progress] = ()) -> None:
        async with self._conn() as conn:
            await reservations.postgres_beat(conn, router, ttl, progress)

    async def drop_heartbeat(self, router: str) -> None:
        async with self._conn() as conn:
            await conn.execute("DELETE FROM router_heartbeats WHERE router = $1", router)

    async def release_stale(self) -> list[Held]:
        return await self._release(...)

    async def list_reservations(self) -> list[Held]:
        async with self._conn() as conn:
            return await reservations.postgres_list(conn)

    async def release_reservations(self, ids: Sequence[str] | None) -> list[Held]:
        return await self._release(ids)

    async def _release(self, ids: Chosen) -> list[Held]:
        async def bill(conn: asyncpg.pool.PoolConnectionProxy, rows: list[UsageRow]) -> None:
            await _append_usage(conn, [to_record(r) for r in rows])
        async with self._conn() as conn:
            return await reservations.postgres_release(conn, ids, bill)

    async def last_use_by_model(self) -> dict[str, float]:
        async with self._conn() as conn:
            rows = await conn.fetch("SELECT model, MAX(ts + latency_ms / 1000.0) FROM usage "
                                    "GROUP BY model")
        return {r[0]: float(r[1]) for r in rows if r[1] is not None}

    async def recent_usage(self, limit: int) -> list[UsageRow]:
        async with self._conn() as conn:
            rows = await conn.fetch(f"SELECT {', '.join(COLUMNS)} FROM usage "
                                    "ORDER BY id DESC LIMIT $1", limit)
        return [from_record(tuple(r)) for r in rows]

    async def usage_after(self, after_id: int, limit: int) -> list[tuple[int, UsageRow]]:
        async with self._conn() as conn:
            rows = await conn.fetch(f"SELECT id, {', '.join(COLUMNS)} FROM usage WHERE id > $1 "
                                    "ORDER BY id LIMIT $2", after_id, limit)
        return [(r[0], from_record(tuple(r)[1:])) for r in rows]

    # -- lease --------------------------------------------------------------------------
    async def acquire_lease(self, name: str, holder: str, ttl: float) -> Grant | None:
        async with self._conn() as conn:
            found = await conn.fetchrow(_ACQUIRE, name, holder, float(ttl))
        return Grant(name, holder, int(found[0]), float(found[1])) if found else None

    async def release_lease(self, name: str, holder: str) -> None:
        async with self._conn() as conn:
            await conn.execute("UPDATE leases SET expires_at = now() "
                               "WHERE name = $1 AND holder = $2", name, holder)

    async def lease(self, name: str) -> Grant | None:
        async with self._conn() as conn:
            found = await conn.fetchrow(
                "SELECT holder, epoch, EXTRACT(EPOCH FROM expires_at - now())::float8 "
                "FROM leases WHERE name = $1 AND expires_at > now()", name)
        return Grant(name, found[0], int(found[1]), float(found[2])) if found else None

    async def publish_routes(self, name: str, holder: str, epoch: int, doc: str) -> bool:
        async with self._conn() as conn:
            found = await conn.fetchval(
                "INSERT INTO published_routes AS p (name, epoch, seq, doc, published_at) "
                "SELECT $1, $3, 1, $4, now() WHERE EXISTS (SELECT 1 FROM leases WHERE "
                "name = $1 AND holder = $2 AND epoch = $3 AND expires_at > now()) "
                "ON CONFLICT (name) DO UPDATE SET epoch = EXCLUDED.epoch, seq = p.seq + 1, "
                "doc = EXCLUDED.doc, published_at = EXCLUDED.published_at RETURNING seq",
                name, holder, epoch, doc)
        return found is not None

    async def published_routes(self, name: str) -> Published | None:
        async with self._conn() as conn:
            found = await conn.fetchrow("SELECT epoch, seq, doc FROM published_routes "
                                        "WHERE name = $1", name)
        return Published(int(found[0]), int(found[1]), found[2]) if found else None

    async def publish_summary(self, name: str, holder: str, epoch: int, doc: str) -> bool:
        async with self._conn() as conn:
            return await adminsummaries.postgres_publish(conn, name, holder, epoch, doc)

    async def published_summary(self, name: str, seen: int | None = None, *,
                                body: bool = True) -> adminsummaries.PublishedSummary | None:
        async with self._conn() as conn:
            return await adminsummaries.postgres_published(conn, name, seen, body)

    async def put_signals(self, router: str, doc: str) -> None:
        async with self._conn() as conn:
            await conn.execute(
                "INSERT INTO router_signals VALUES ($1, $2, now()) ON CONFLICT (router) DO "
                "UPDATE SET doc = EXCLUDED.doc, updated_at = EXCLUDED.updated_at", router, doc)

    async def signals(self, max_age: float) -> list[str]:
        async with self._conn() as conn:
            rows = await conn.fetch(
                "SELECT doc FROM router_signals WHERE updated_at > now() - "
                "make_interval(secs => $1) ORDER BY router", float(max_age))
        return [r[0] for r in rows]

    async def drop_signals(self, router: str) -> None:
        async with self._conn() as conn:
            await conn.execute("DELETE FROM router_signals WHERE router = $1", router)

    # -- the whole store ----------------------------------------------------------------
    async def schema_version(self) -> int:
        async with self._conn() as conn:
            return int(await conn.fetchval("SELECT version FROM llmgw_schema"))

    async def is_empty(self) -> bool:
        async with self._conn() as conn:
            return not await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM keys) OR EXISTS (SELECT 1 FROM usage)")

    # -- whole tables, for `llmgw store migrate` (SQL in llmgw.store.tableio) -------------
    async def shapes(self) -> dict[str, tableio.Shape]:
        async with self._conn() as conn:
            return await tableio.postgres_shapes(conn)

    async def copy_marks(self, source: str) -> dict[str, int] | None:
        async with self._conn() as conn:
            return await tableio.postgres_marks(conn, source)

    @contextlib.asynccontextmanager
    async def reading(self) -> AsyncIterator[tableio.TableReader]:
        async with self._conn() as conn, conn.transaction(isolation="repeatable_read",
                                                          readonly=True):
            yield tableio.PostgresTables(conn)

    @contextlib.asynccontextmanager
    async def writing(self) -> AsyncIterator[tableio.TableWriter]:
        async with self._conn() as conn, conn.transaction():
            yield tableio.PostgresTables(conn)

    async def close(self) -> None:
        await self._pool.close()


async def _append_usage(conn: asyncpg.pool.PoolConnectionProxy, records: list[Record]) -> None:
    """Insert usage records and add their cost to the running totals (inside a
    transaction): project_spend and spend_buckets (:mod:`llmgw.store.spends`)."""
    if not records:
        return
    await conn.executemany(_INSERT_USAGE, records)
    await spends.postgres_add(conn, records)


async def _no_session_state(_: asyncpg.Connection) -> None:
    """Skip asyncpg's reset query on every release (a round trip per store call): this
    module sets no session variables, listens to nothing and takes advisory locks only
    for a transaction; an open transaction is still rolled back by the pool."""


def _key_tuple(row: KeyRow) -> tuple[str, str, str, str, float, float | None,
                                     int | None, int | None, str | None]:
    return (row.id, row.digest, row.project, row.name, row.created_at, row.revoked_at,
            row.rpm, row.tpm, row.owner)
