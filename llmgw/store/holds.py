"""Held revisions in the store: a model whose replacement failed its rollout gate.

One row per model (a newer failure replaces the older one), written by the
daemon when a gate rolls a replacement back, read before every plan
(:mod:`llmgw.planning.holds` keeps the model's replacements out of it), and
deleted by ``llmgw apply --retry`` or when a commit changed the model. Kept in
the store, not in the daemon's memory, so a restarted or new leader does not
retry a revision that failed, and ``llmgw plan`` in CI can show the hold.

This module holds the :class:`HoldMethods` part of the store interface and the
SQL of both databases.
"""

from __future__ import annotations

import abc
import sqlite3
from collections.abc import Sequence
from typing import Any

import asyncpg

from llmgw.spec.rollouts import Hold

_COLUMNS = "model, digest, revision, reason, held_at"


class HoldMethods(abc.ABC):
    """The holds' part of :class:`~llmgw.store.stores.Store`."""

    @abc.abstractmethod
    async def put_hold(self, hold: Hold) -> None:
        """Hold ``hold.model`` (replacing any older hold of it)."""

    @abc.abstractmethod
    async def holds(self) -> list[Hold]:
        """Every hold, by model."""

    @abc.abstractmethod
    async def release_holds(self, models: Sequence[str] | None = None) -> list[Hold]:
        """Delete the holds of ``models`` (None: all); the holds deleted."""


def _hold(row: Sequence[Any]) -> Hold:
    model, digest, revision, reason, held_at = row
    return Hold(str(model), str(digest), revision, str(reason), float(held_at))


def _values(hold: Hold) -> tuple[Any, ...]:
    return (hold.model, hold.digest, hold.revision, hold.reason, hold.held_at)


# -- SQLite (runs on the store's own thread) ----------------------------------------------
def sqlite_put(conn: sqlite3.Connection, hold: Hold) -> None:
    with conn:
        conn.execute(f"INSERT OR REPLACE INTO holds ({_COLUMNS}) VALUES (?, ?, ?, ?, ?)",
                     _values(hold))


def sqlite_holds(conn: sqlite3.Connection) -> list[Hold]:
    return [_hold(r) for r in conn.execute(f"SELECT {_COLUMNS} FROM holds ORDER BY model")]


def sqlite_release(conn: sqlite3.Connection, models: Sequence[str] | None) -> list[Hold]:
    with conn:
        found = [h for h in sqlite_holds(conn) if models is None or h.model in models]
        conn.executemany("DELETE FROM holds WHERE model = ?", [(h.model,) for h in found])
    return found


# -- PostgreSQL (on a pooled asyncpg connection) ------------------------------------------
async def postgres_put(conn: asyncpg.pool.PoolConnectionProxy, hold: Hold) -> None:
    await conn.execute(
        f"INSERT INTO holds ({_COLUMNS}) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (model) DO "
        "UPDATE SET digest = $2, revision = $3, reason = $4, held_at = $5", *_values(hold))


async def postgres_holds(conn: asyncpg.pool.PoolConnectionProxy) -> list[Hold]:
    return [_hold(tuple(r)) for r in
            await conn.fetch(f"SELECT {_COLUMNS} FROM holds ORDER BY model")]


async def postgres_release(conn: asyncpg.pool.PoolConnectionProxy,
                           models: Sequence[str] | None) -> list[Hold]:
    rows = await conn.fetch(
        f"DELETE FROM holds WHERE $1::text[] IS NULL OR model = ANY($1) RETURNING {_COLUMNS}",
        None if models is None else list(models))
    return sorted((_hold(tuple(r)) for r in rows), key=lambda h: h.model)
