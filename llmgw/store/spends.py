"""Spend per project, for ever or since a budget period's start, without summing usage.

Two running totals are kept in the transaction that inserts usage rows
(:func:`totals`): ``project_spend`` (migration 5, the lifetime figure) and
``spend_buckets`` (a project's cost per :data:`BUCKET` seconds of usage
``ts``). The spend since a period's start ``since`` is then exact and cheap::

    buckets starting at or after edge(since)  +  usage rows in [since, edge(since))

at most a month of buckets (2,976 rows) plus one bucket's worth of usage rows
(through the index ``usage (project, ts)``), however many rows the period
holds. Calendar periods start on whole quarter hours in every time zone in use,
so the second part is empty for them; it keeps an arbitrary start (a test's)
exact. :func:`bucket` and :func:`edge` are exact in floating point: a row is
in the bucket its ``ts`` says, and ``edge`` is a multiple of :data:`BUCKET`.

This module holds the SQL of both databases; the migration that adds the
buckets fills them with the same rule.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Mapping, Sequence

import asyncpg

from llmgw.store import sqlrows
from llmgw.store.usages import Record

BUCKET = 900.0  # seconds: a quarter hour, the finest offset of any time zone in use


def bucket(ts: float) -> float:
    """The start of the bucket holding ``ts``: the largest multiple of :data:`BUCKET`
    at or below it (corrected where the division rounded). Purely computational."""
    start = math.floor(ts / BUCKET) * BUCKET
    if start > ts:
        return start - BUCKET
    if start + BUCKET <= ts:
        return start + BUCKET
    return start


def edge(since: float) -> float:
    """The first bucket start at or after ``since``. Purely computational."""
    start = math.ceil(since / BUCKET) * BUCKET
    return start + BUCKET if start < since else start


def totals(records: Sequence[Record]) -> tuple[dict[str, float], dict[tuple[str, float], float]]:
    """What ``records`` add to each project's lifetime spend and to each bucket."""
    lifetime: dict[str, float] = {}
    buckets: dict[tuple[str, float], float] = {}
    for record in records:
        ts, project, cost = record[0], record[1], record[9]
        if project is not None and cost:
            lifetime[project] = lifetime.get(project, 0.0) + cost
            where = (project, bucket(ts))
            buckets[where] = buckets.get(where, 0.0) + cost
    return lifetime, buckets


# -- SQLite ---------------------------------------------------------------------------------
_SQLITE_LIFETIME = "SELECT spent FROM project_spend WHERE project = ?"
_SQLITE_SINCE = """SELECT
    COALESCE((SELECT SUM(spent) FROM spend_buckets WHERE project = ? AND start >= ?), 0)
  + COALESCE((SELECT SUM(cost_usd) FROM usage WHERE project = ? AND ts >= ? AND ts < ?), 0)"""


def sqlite_add(conn: sqlite3.Connection, records: Sequence[Record]) -> None:
    """Add ``records``' cost to the running totals (inside the caller's transaction)."""
    lifetime, buckets = totals(records)
    sqlrows.insert(conn, "INSERT INTO project_spend", list(lifetime.items()),
                   "ON CONFLICT (project) DO UPDATE SET spent = project_spend.spent + "
                   "excluded.spent")
    sqlrows.insert(conn, "INSERT INTO spend_buckets", [(p, s, c) for (p, s), c in buckets.items()],
                   "ON CONFLICT (project, start) DO UPDATE SET spent = spend_buckets.spent + "
                   "excluded.spent")


def sqlite_spent(conn: sqlite3.Connection, project: str, since: float | None) -> float:
    """USD ``project`` spent since ``since`` (None: for ever)."""
    if since is None:
        found = conn.execute(_SQLITE_LIFETIME, (project,)).fetchone()
        return float(found[0]) if found else 0.0
    cut = edge(since)
    return float(conn.execute(_SQLITE_SINCE, (project, cut, project, since, cut)).fetchone()[0])


def sqlite_spend(conn: sqlite3.Connection,
                 starts: Mapping[str, float | None]) -> dict[str, float]:
    """Every project's lifetime spend, but since ``starts[p]`` for the projects in it."""
    found = {p: float(s) for p, s in conn.execute("SELECT project, spent FROM project_spend")}
    for project, since in starts.items():
        if since is not None:
            found[project] = sqlite_spent(conn, project, since)
    return found


# -- PostgreSQL (llmgw_spent_since: the migration that adds the buckets) --------------------
async def postgres_add(conn: asyncpg.pool.PoolConnectionProxy,
                       records: Sequence[Record]) -> None:
    lifetime, buckets = totals(records)
    if lifetime:
        await conn.executemany(
            "INSERT INTO project_spend VALUES ($1, $2) ON CONFLICT (project) DO UPDATE "
            "SET spent = project_spend.spent + EXCLUDED.spent", list(lifetime.items()))
    if buckets:
        await conn.executemany(
            "INSERT INTO spend_buckets VALUES ($1, $2, $3) ON CONFLICT (project, start) "
            "DO UPDATE SET spent = spend_buckets.spent + EXCLUDED.spent",
            [(p, s, c) for (p, s), c in buckets.items()])


async def postgres_spend(conn: asyncpg.pool.PoolConnectionProxy,
                         starts: Mapping[str, float | None]) -> dict[str, float]:
    rows = await conn.fetch("SELECT project, spent FROM project_spend")
    found = {r[0]: float(r[1]) for r in rows}
    periodic = {p: s for p, s in starts.items() if s is not None}
    if periodic:
        rows = await conn.fetch(
            "SELECT p, llmgw_spent_since(p, s) FROM unnest($1::text[], $2::float8[]) AS t(p, s)",
            list(periodic), [float(s) for s in periodic.values()])
        found.update({r[0]: float(r[1]) for r in rows})
    return found
