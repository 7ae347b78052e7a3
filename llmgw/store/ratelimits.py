"""Rate-limit counters shared by every router: requests and tokens per minute.

One row per counter and minute (migration 11, ``rate_counts``): a counter is
named for what it limits (``p:<project>:requests``, ``k:<key id>:tokens``) and
``slot`` is the minute, ``floor(unix time / 60)`` by the caller's clock. An
admission (:meth:`RateLimitMethods.take_rate`) adds a request's amounts to
all its counters of the minute **or to none**: when any would pass its limit,
nothing is added. It is atomic across routers and processes on both
databases — SQLite under ``BEGIN IMMEDIATE`` (the write lock orders every
router's admission), PostgreSQL in one statement (``llmgw_take_rate``: an
upsert per counter that holds its row lock to the statement's end, and takes
the amounts back before it when one is over). So the count of admitted
requests in a minute never passes its limit, however many routers share the
store. Names are sorted before the rows are locked, so two admissions always
lock in the same order and cannot deadlock.

:meth:`RateLimitMethods.adjust_rate` corrects a counter afterwards (a
request's real tokens less what it was admitted with); rows older than the
previous minute are deleted by the next admission of the same counter.

This module holds the :class:`RateLimitMethods` part of the store interface
and the SQL of both databases.
"""

from __future__ import annotations

import abc
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg


@dataclass(frozen=True)
class Count:
    """What an admission adds to one counter, and the most that counter may hold."""

    name: str
    limit: int
    amount: int


@dataclass(frozen=True)
class Taken:
    """An admission's answer: ``used[i]`` is ``counts[i]``'s counter after it (admitted),
    or as it was found (refused: nothing was added)."""

    admitted: bool
    used: tuple[int, ...]


class RateLimitMethods(abc.ABC):
    """The rate limits' part of :class:`~llmgw.store.stores.Store`."""

    @abc.abstractmethod
    async def take_rate(self, slot: int, counts: Sequence[Count]) -> Taken:
        """Add each ``amount`` to its counter of minute ``slot`` if every counter then
        holds at most its ``limit``; otherwise add nothing. Atomic across routers."""

    @abc.abstractmethod
    async def adjust_rate(self, slot: int, name: str, delta: int) -> None:
        """Add ``delta`` (negative: give back) to counter ``name`` of minute ``slot``,
        never below zero; nothing when that minute has no row (it was deleted)."""


def ordered(counts: Sequence[Count]) -> list[int]:
    """Indices of ``counts`` in the order rows are locked: by name (one order for every
    admission). This is a purely computational function."""
    return sorted(range(len(counts)), key=lambda i: counts[i].name)


# -- SQLite (runs on the store's own thread) ----------------------------------------------
def sqlite_take(conn: sqlite3.Connection, slot: int, counts: Sequence[Count]) -> Taken:
    with conn:
        conn.execute("BEGIN IMMEDIATE")  # the write lock orders every router's admission
        found = []
        for c in counts:
            row = conn.execute("SELECT used FROM rate_counts WHERE name = ? AND slot = ?",
                               (c.name, slot)).fetchone()
            found.append(int(row[0]) if row else 0)
        if any(used + c.amount > c.limit for used, c in zip(found, counts, strict=True)):
            return Taken(False, tuple(found))
        conn.executemany(
            "INSERT INTO rate_counts (name, slot, used) VALUES (?, ?, ?) ON CONFLICT "
            "(name, slot) DO UPDATE SET used = rate_counts.used + excluded.used",
            [(c.name, slot, c.amount) for c in counts])
        conn.executemany("DELETE FROM rate_counts WHERE name = ? AND slot < ?",
                         [(c.name, slot - 1) for c in counts])
    return Taken(True, tuple(used + c.amount for used, c in zip(found, counts, strict=True)))


def sqlite_adjust(conn: sqlite3.Connection, slot: int, name: str, delta: int) -> None:
    with conn:
        conn.execute("UPDATE rate_counts SET used = MAX(used + ?, 0) WHERE name = ? AND slot = ?",
                     (delta, name, slot))


# -- PostgreSQL (on a pooled asyncpg connection) ------------------------------------------
async def postgres_take(conn: asyncpg.pool.PoolConnectionProxy, slot: int,
                        counts: Sequence[Count]) -> Taken:
    order = ordered(counts)
    found = await conn.fetchrow(
        "SELECT used, admitted FROM llmgw_take_rate($1, $2::text[], $3::bigint[], $4::bigint[])",
        slot, [counts[i].name for i in order], [counts[i].limit for i in order],
        [counts[i].amount for i in order])
    assert found is not None
    used = [0] * len(counts)
    for position, i in enumerate(order):
        used[i] = int(found[0][position])
    return Taken(bool(found[1]), tuple(used))


async def postgres_adjust(conn: asyncpg.pool.PoolConnectionProxy, slot: int, name: str,
                          delta: int) -> None:
    await conn.execute("UPDATE rate_counts SET used = GREATEST(used + $1, 0) "
                       "WHERE name = $2 AND slot = $3", delta, name, slot)
