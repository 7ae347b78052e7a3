"""The leader's admin summary in the store: what routers' /admin shows in the HA layout.

One row per lease name, written by the reconciler holding that lease and
fenced like the routing table (:meth:`Store.publish_routes`): the insert or
update happens only while the writer holds the lease at its epoch, checked in
the same statement, so a deposed leader's late summary is refused. The row
names its writer (``holder``), and its age is measured by the database's
clock (PostgreSQL's ``now()``; SQLite's one machine), so routers on other
hosts can say how old it is without trusting the leader's clock.

Reading is cheap when nothing changed: :meth:`published_summary` returns the
document only when its ``seq`` differs from the one the caller has, and not
at all when the caller asks for the header alone (``body=False``: a router
nobody looks at does not download and decode the fleet).

This module holds the :class:`AdminSummaryMethods` part of the store interface
and the SQL of both databases. The document's shape is the daemon's business
(:mod:`llmgw.daemon.publications`).
"""

from __future__ import annotations

import abc
import sqlite3
import time
from dataclasses import dataclass

import asyncpg


@dataclass(frozen=True)
class PublishedSummary:
    """The last summary published under a lease: by whom, how old (database clock), and
    the document itself unless the caller already had this ``seq`` (then None)."""

    holder: str
    epoch: int
    seq: int
    age: float  # seconds since it was written, by the database's clock
    doc: str | None


class AdminSummaryMethods(abc.ABC):
    """The published admin summary's part of :class:`~llmgw.store.stores.Store`."""

    @abc.abstractmethod
    async def publish_summary(self, name: str, holder: str, epoch: int, doc: str) -> bool:
        """Replace the summary, fenced: written only while ``holder`` holds lease ``name``
        at ``epoch``, checked in the same statement. False when fenced out."""

    @abc.abstractmethod
    async def published_summary(self, name: str, seen: int | None = None, *,
                                body: bool = True) -> PublishedSummary | None:
        """The last summary published under lease ``name`` (its ``doc`` None when its
        ``seq`` is ``seen`` or ``body`` is False), or None when none was ever published."""


# -- SQLite (runs on the store's own thread) ----------------------------------------------
def sqlite_publish(conn: sqlite3.Connection, name: str, holder: str, epoch: int,
                   doc: str) -> bool:
    now = time.time()
    with conn:
        conn.execute("BEGIN IMMEDIATE")
        held = conn.execute("SELECT 1 FROM leases WHERE name = ? AND holder = ? AND epoch = ? "
                            "AND expires_at > ?", (name, holder, epoch, now)).fetchone()
        if held is None:
            return False
        conn.execute(
            "INSERT INTO published_summaries VALUES (?, ?, ?, 1, ?, ?) ON CONFLICT (name) "
            "DO UPDATE SET holder = excluded.holder, epoch = excluded.epoch, "
            "seq = published_summaries.seq + 1, doc = excluded.doc, "
            "published_at = excluded.published_at", (name, holder, epoch, doc, now))
    return True


def sqlite_published(conn: sqlite3.Connection, name: str, seen: int | None,
                     body: bool) -> PublishedSummary | None:
    found = conn.execute(
        "SELECT holder, epoch, seq, published_at, CASE WHEN ? AND seq IS NOT ? THEN doc END "
        "FROM published_summaries WHERE name = ?", (body, seen, name)).fetchone()
    if found is None:
        return None
    holder, epoch, seq, at, doc = found
    return PublishedSummary(str(holder), int(epoch), int(seq), max(0.0, time.time() - at), doc)


# -- PostgreSQL (on a pooled asyncpg connection) ------------------------------------------
async def postgres_publish(conn: asyncpg.pool.PoolConnectionProxy, name: str, holder: str,
                           epoch: int, doc: str) -> bool:
    found = await conn.fetchval(
        "INSERT INTO published_summaries AS p (name, holder, epoch, seq, doc, published_at) "
        "SELECT $1, $2, $3, 1, $4, now() WHERE EXISTS (SELECT 1 FROM leases WHERE "
        "name = $1 AND holder = $2 AND epoch = $3 AND expires_at > now()) "
        "ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, epoch = EXCLUDED.epoch, "
        "seq = p.seq + 1, doc = EXCLUDED.doc, published_at = EXCLUDED.published_at "
        "RETURNING seq", name, holder, epoch, doc)
    return found is not None


async def postgres_published(conn: asyncpg.pool.PoolConnectionProxy, name: str,
                             seen: int | None, body: bool) -> PublishedSummary | None:
    found = await conn.fetchrow(
        "SELECT holder, epoch, seq, EXTRACT(EPOCH FROM now() - published_at)::float8, "
        "CASE WHEN $3 AND seq IS DISTINCT FROM $2 THEN doc END FROM published_summaries "
        "WHERE name = $1", name, seen, body)
    if found is None:
        return None
    return PublishedSummary(str(found[0]), int(found[1]), int(found[2]),
                            max(0.0, float(found[3])), found[4])
