"""Budget reservations owned by live routers: heartbeats, progress, release.

A reservation row (migration 9) names the router that took it and what to
bill if that router dies: its key, model, endpoint and what the request had
produced so far (``prompt_tokens``, ``completion_tokens``, ``used`` USD),
which the router writes as it goes (:meth:`ReservationMethods.beat`). Each
router renews one row in ``router_heartbeats`` with an expiry it states
itself (three heartbeat intervals ahead). A reservation whose router's
heartbeat expired, or whose own backstop ``expires_at`` passed, is *stale*:
any router releases it (:meth:`ReservationMethods.release_stale`) by writing
a usage row for what was recorded (status :data:`RELEASED_STATUS`) and
zeroing the reservation, in one transaction, so the cost moves from reserved
to spent exactly once even when two routers sweep together.

A released row stays, marked, for a day: a router that was only frozen or cut
off from the store (not dead) writes its request's own usage row later, and
that row then bills only what the release did not (:func:`deduct`), in the
transaction that drops the reservation.

Budget periods: a reservation records its request's arrival by its router's
clock (``started``, :attr:`Owner.ts`), which is also its usage row's ``ts``.
Admission for a period starting at ``since`` counts only reservations with
``started`` at or after it (one without, from before the periods, counts in
every period), and a release bills at ``started``: a reservation counts, and
is billed, in the period it was taken, so within each period spent + reserved
stays under budget + one reservation, as for a lifetime budget.

This module holds the :class:`ReservationMethods` part of the store interface
and the SQL of both databases.
"""

from __future__ import annotations

import abc
import dataclasses
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import EllipsisType
from typing import Any

import asyncpg

from llmgw.store import sqlrows
from llmgw.store.usages import UsageRow

# The usage row of a reservation released because its router died mid-request: the
# client's answer ended with the router, as a gateway failure does.
RELEASED_STATUS = 502


@dataclass(frozen=True)
class Owner:
    """Who holds a reservation and what it is for: what a release bills."""

    router: str
    key_id: str | None
    model: str
    endpoint: str
    stream: bool = False
    user_name: str | None = None
    # The request's arrival by its router's clock, which is its usage row's ts: the
    # reservation counts in the budget period holding it, and a release bills it there.
    ts: float | None = None


@dataclass(frozen=True)
class Progress:
    """What a request in flight has produced so far, as its router counted it."""

    id: str
    prompt_tokens: int
    completion_tokens: int
    used: float  # USD at the model's prices


@dataclass(frozen=True)
class Held:
    """One reservation as ``llmgw keys reservations`` lists it."""

    id: str
    project: str
    amount: float  # USD held against the budget
    used: float  # USD the request had produced when its router last recorded
    router: str | None
    key_id: str | None
    model: str | None
    created_at: float  # Unix time
    router_alive: bool


class ReservationMethods(abc.ABC):
    """The reservations' part of :class:`~llmgw.store.stores.Store`."""

    @abc.abstractmethod
    async def beat(self, router: str, ttl: float, progress: Sequence[Progress] = ()) -> None:
        """Renew ``router``'s heartbeat for ``ttl`` seconds and record ``progress`` of
        its requests in flight, in one transaction."""

    @abc.abstractmethod
    async def drop_heartbeat(self, router: str) -> None:
        """``router`` stops cleanly: its heartbeat row goes."""

    @abc.abstractmethod
    async def release_stale(self) -> list[Held]:
        """Release every reservation whose router's heartbeat expired (or whose own
        backstop expiry passed), billing what it recorded; the ones released."""

    @abc.abstractmethod
    async def list_reservations(self) -> list[Held]:
        """Every reservation, oldest first."""

    @abc.abstractmethod
    async def release_reservations(self, ids: Sequence[str] | None) -> list[Held]:
        """Release the reservations ``ids`` (None: all), billing what each recorded."""


def deduct(rows: Sequence[UsageRow], settled: Sequence[str | None],
           released: dict[str, tuple[int, int, float]]) -> list[UsageRow]:
    """``rows`` less what a release already billed: ``settled[i]`` is ``rows[i]``'s
    reservation, and ``released`` maps a released one to the (prompt tokens, completion
    tokens, USD) its release billed. This is a purely computational function."""
    out = list(rows)
    for i, rid in enumerate(settled[:len(out)]):
        if rid is None or rid not in released:
            continue
        prompt, completion, used = released[rid]
        row = out[i]
        out[i] = dataclasses.replace(
            row, cost_usd=max(row.cost_usd - used, 0.0),
            prompt_tokens=None if row.prompt_tokens is None else max(row.prompt_tokens - prompt, 0),
            completion_tokens=None if row.completion_tokens is None
            else max(row.completion_tokens - completion, 0))
    return out


_HELD = ("r.id, r.project, r.amount, r.used, r.router, r.key_id, r.model, r.created_at, "
         "h.router IS NOT NULL")
_BILL = ("r.project, r.key_id, r.model, r.endpoint, r.prompt_tokens, r.completion_tokens, "
         "r.used, r.stream, r.user_name, r.created_at, r.started")


def _held(row: Sequence[Any]) -> Held:
    rid, project, amount, used, router, key_id, model, created, alive = row
    return Held(str(rid), str(project), float(amount), float(used or 0.0), router, key_id,
                model, float(created or 0.0), bool(alive))


def _bill(row: Sequence[Any], now: float) -> UsageRow | None:
    """The usage row a released reservation writes; None for a row from before migration
    9 (nothing recorded, nothing known to bill). Its ts is the request's (``started``),
    so it lands in the budget period the reservation counted in; ``now`` without one."""
    (project, key_id, model, endpoint, prompt, completion, used, stream, user, created,
     started) = row
    if model is None:
        return None
    return UsageRow(ts=now if started is None else float(started), project=project,
                    key_id=key_id, model=model, endpoint=endpoint or "", status=RELEASED_STATUS,
                    prompt_tokens=int(prompt or 0), completion_tokens=int(completion or 0),
                    latency_ms=round(max(now - float(created or now), 0.0) * 1000, 3),
                    cost_usd=float(used or 0.0), stream=bool(stream), user_name=user)


_KEPT = 86400.0  # seconds a released row (and a dead router's heartbeat) is kept


# -- SQLite (runs on the store's own thread, times are this machine's Unix time) ----------
_SQLITE_ALIVE = "LEFT JOIN router_heartbeats h ON h.router = r.router AND h.expires_at > ?"
_SQLITE_STALE = f"""SELECT r.id FROM reservations r {_SQLITE_ALIVE} WHERE r.released_at IS NULL
    AND ((r.router IS NOT NULL AND h.router IS NULL) OR r.expires_at <= ?)"""
_RELEASED = "prompt_tokens, completion_tokens, used"


def sqlite_insert(conn: sqlite3.Connection, rid: str, project: str, amount: float,
                  expires_at: float, owner: Owner | None, now: float) -> None:
    o = owner
    conn.execute(
        "INSERT INTO reservations (id, project, amount, expires_at, router, key_id, model, "
        "endpoint, stream, user_name, created_at, started) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (rid, project, amount, expires_at, o and o.router, o and o.key_id, o and o.model,
         o and o.endpoint, bool(o and o.stream), o and o.user_name, now, o and o.ts))


def sqlite_beat(conn: sqlite3.Connection, router: str, ttl: float,
                progress: Sequence[Progress]) -> None:
    with conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO router_heartbeats VALUES (?, ?) ON CONFLICT (router) DO "
                     "UPDATE SET expires_at = excluded.expires_at", (router, time.time() + ttl))
        conn.executemany(
            "UPDATE reservations SET prompt_tokens = ?, completion_tokens = ?, used = ? "
            "WHERE id = ? AND router = ? AND released_at IS NULL",
            [(p.prompt_tokens, p.completion_tokens, p.used, p.id, router) for p in progress])


def sqlite_drop_heartbeat(conn: sqlite3.Connection, router: str) -> None:
    with conn:
        conn.execute("DELETE FROM router_heartbeats WHERE router = ?", (router,))


def sqlite_list(conn: sqlite3.Connection) -> list[Held]:
    rows = conn.execute(f"SELECT {_HELD} FROM reservations r {_SQLITE_ALIVE} "
                        "WHERE r.released_at IS NULL ORDER BY r.created_at, r.id",
                        (time.time(),)).fetchall()
    return [_held(r) for r in rows]


Chosen = Sequence[str] | None | EllipsisType  # these ids; None: all; ``...``: the stale ones


def sqlite_release(conn: sqlite3.Connection, ids: Chosen,
                   append: Callable[[sqlite3.Connection, list[UsageRow]], None]) -> list[Held]:
    """Release ``ids`` (None: all; ``...``: the stale ones); ``append(conn, rows)`` writes
    usage rows and spend (the store's own helper)."""
    now = time.time()
    with conn:
        conn.execute("BEGIN IMMEDIATE")  # one sweeper at a time: each row billed once
        everything = {h.id: h for h in sqlite_list(conn)}
        if ids is ...:
            chosen = [r[0] for r in conn.execute(_SQLITE_STALE, (now, now)).fetchall()]
        else:
            chosen = list(everything) if ids is None else [i for i in ids if i in everything]
        chosen = list(dict.fromkeys(chosen))
        billed = []
        for rid in chosen:
            found = conn.execute(f"SELECT {_BILL} FROM reservations r WHERE r.id = ?",
                                 (rid,)).fetchone()
            if found is not None and (row := _bill(found, now)) is not None:
                billed.append(row)
        append(conn, billed)
        conn.executemany("UPDATE reservations SET amount = 0, released_at = ? WHERE id = ?",
                         [(now, i) for i in chosen])
        conn.execute("DELETE FROM reservations WHERE released_at <= ?", (now - _KEPT,))
        conn.execute("DELETE FROM router_heartbeats WHERE expires_at <= ?", (now - _KEPT,))
    return [everything[i] for i in chosen if i in everything]


def sqlite_settle(conn: sqlite3.Connection,
                  ids: Sequence[str]) -> dict[str, tuple[int, int, float]]:
    """Drop the reservations ``ids`` (inside the caller's transaction); what the released
    ones among them billed."""
    released = {}
    for chunk in sqlrows.chunks(ids):
        marks = sqlrows.marks(len(chunk))
        for rid, *found in conn.execute(f"SELECT id, {_RELEASED} FROM reservations WHERE id "
                                        f"IN {marks} AND released_at IS NOT NULL", chunk):
            released[rid] = (int(found[0]), int(found[1]), float(found[2]))
        conn.execute(f"DELETE FROM reservations WHERE id IN {marks}", chunk)
    return released


# -- PostgreSQL (times are the database's now()) --------------------------------------------
_PG_HELD = (f"SELECT {_HELD.replace('r.created_at', 'EXTRACT(EPOCH FROM r.created_at)')} "
            "FROM reservations r LEFT JOIN router_heartbeats h ON h.router = r.router "
            "AND h.expires_at > now() WHERE r.released_at IS NULL")
_PG_RETURNING = ("id, project, key_id, model, endpoint, prompt_tokens, completion_tokens, "
                 "used, stream, user_name, EXTRACT(EPOCH FROM created_at), "
                 "EXTRACT(EPOCH FROM now()), started")
# UPDATE … WHERE released_at IS NULL: a second sweeper blocked on the same row re-checks
# the condition after the first commits, and skips it.
_PG_RELEASE_STALE = f"""UPDATE reservations r SET amount = 0, released_at = now()
    WHERE r.released_at IS NULL AND (r.expires_at <= now() OR (
        r.router IS NOT NULL AND NOT EXISTS (SELECT 1 FROM router_heartbeats h
            WHERE h.router = r.router AND h.expires_at > now())))
    RETURNING {_PG_RETURNING}"""
_PG_RELEASE = f"""UPDATE reservations SET amount = 0, released_at = now()
    WHERE released_at IS NULL AND ($1::text[] IS NULL OR id = ANY($1))
    RETURNING {_PG_RETURNING}"""
_PG_SETTLE = f"""DELETE FROM reservations WHERE id = ANY($1::text[])
    RETURNING id, released_at IS NOT NULL, {_RELEASED}"""


async def postgres_beat(conn: asyncpg.pool.PoolConnectionProxy, router: str, ttl: float,
                        progress: Sequence[Progress]) -> None:
    async with conn.transaction():
        await conn.execute(
            "INSERT INTO router_heartbeats VALUES ($1, now() + make_interval(secs => $2)) "
            "ON CONFLICT (router) DO UPDATE SET expires_at = EXCLUDED.expires_at",
            router, float(ttl))
        if progress:
            await conn.executemany(
                "UPDATE reservations SET prompt_tokens = $1, completion_tokens = $2, used = $3 "
                "WHERE id = $4 AND router = $5 AND released_at IS NULL",
                [(p.prompt_tokens, p.completion_tokens, p.used, p.id, router) for p in progress])


async def postgres_list(conn: asyncpg.pool.PoolConnectionProxy) -> list[Held]:
    rows = await conn.fetch(f"{_PG_HELD} ORDER BY r.created_at, r.id")
    return [_held(tuple(r)) for r in rows]


async def postgres_release(
    conn: asyncpg.pool.PoolConnectionProxy, ids: Chosen,
    append: Callable[[asyncpg.pool.PoolConnectionProxy, list[UsageRow]], Awaitable[None]],
) -> list[Held]:
    """Release ``ids`` (None: all; ``...``: the stale ones). DELETE … RETURNING takes
    each row once, however many routers sweep at the same moment."""
    async with conn.transaction():
        before = {h.id: h for h in await postgres_list(conn)}
        if ids is ...:
            rows = await conn.fetch(_PG_RELEASE_STALE)
        else:
            rows = await conn.fetch(_PG_RELEASE, None if ids is None else list(ids))
        billed = []
        for r in rows:
            now = float(r[11])
            row = _bill((*tuple(r)[1:10], float(r[10]), r[12]), now)
            if row is not None:
                billed.append(row)
        await append(conn, billed)
        await conn.execute("DELETE FROM reservations WHERE released_at <= now() - "
                           "make_interval(secs => $1)", _KEPT)
        await conn.execute("DELETE FROM router_heartbeats WHERE expires_at <= now() - "
                           "make_interval(secs => $1)", _KEPT)
    return [before[r[0]] for r in rows if r[0] in before]


async def postgres_settle(conn: asyncpg.pool.PoolConnectionProxy,
                          ids: Sequence[str]) -> dict[str, tuple[int, int, float]]:
    """Drop the reservations ``ids`` (inside the caller's transaction); what the released
    ones among them billed."""
    rows = await conn.fetch(_PG_SETTLE, list(ids))
    return {r[0]: (int(r[2]), int(r[3]), float(r[4])) for r in rows if r[1]}
