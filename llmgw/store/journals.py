"""The apply journal: every apply, who started it, each change and how it ended.

A journal entry is written once, when an apply ends (by the daemon under
``sync: auto`` or by ``llmgw apply``), and never updated: ``llmgw history`` and
``GET /api/v1/history`` read it back newest first. It holds what a plan shows
— models, replicas, actions, nodes, reasons — and how each change ended,
never a secret: plans carry secret *paths* only, and the writer scrubs any
secret value out of error text before it gets here.

Columns that later features fill stay NULL until then: a change's drift
``class`` (classified drift), an apply's and a change's ``gate`` verdict and
``rolled_back`` / ``rollback_of`` (gated rollouts with automatic rollback).

This module holds the rows, the :class:`JournalMethods` part of the store
interface, and the SQL of both databases (the stores delegate here, so this
feature's SQL lives in one place).
"""

from __future__ import annotations

import abc
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

MAX_LIMIT = 1000
"""The most entries one read returns: the journal grows without bound, reads do not."""


@dataclass(frozen=True)
class ChangeEntry:
    """One change of an apply as it ended."""

    model: str
    replica: int
    action: str  # create, replace, restart, destroy, hold
    nodes: tuple[str, ...]
    why: str  # the plan's reasons, "; "-joined
    ok: bool
    error: str | None = None  # failed: why, with the engine's last log line when there is one
    duration: float | None = None  # seconds from the apply's start to the change's last step
    new_replica: int | None = None  # a replace: the index of the replica that replaces it
    drift_class: str | None = None  # the class of drift it repaired (llmgw.planning.drifts)
    gate: str | None = None  # gated rollouts: the gate's verdict
    rolled_back: bool | None = None  # gated rollouts: the change was rolled back


@dataclass(frozen=True)
class ApplyEntry:
    """One apply: when, of which revision, by whom, how long, and its changes."""

    started_at: float  # Unix time
    duration: float
    revision: str | None
    started_by: str  # "daemon", or user@host for `llmgw apply`
    ok: bool
    changes: tuple[ChangeEntry, ...] = ()
    gate: str | None = None  # gated rollouts
    rollback_of: int | None = None  # gated rollouts: the apply this one rolled back
    id: int | None = None  # set by the store


class JournalMethods(abc.ABC):
    """The journal's part of :class:`~llmgw.store.stores.Store`."""

    @abc.abstractmethod
    async def record_apply(self, entry: ApplyEntry) -> int:
        """Append ``entry`` with its changes in one transaction; its id."""

    @abc.abstractmethod
    async def history(self, model: str | None = None, limit: int = 50) -> list[ApplyEntry]:
        """The newest ``limit`` (at most :data:`MAX_LIMIT`) applies, newest first; with
        ``model``, only applies that changed it, holding only its changes."""


_APPLY_COLUMNS = "started_at, duration, revision, started_by, ok, gate, rollback_of"
_CHANGE_COLUMNS = ("model, replica, action, nodes, why, ok, error, duration, new_replica, "
                   "class, gate, rolled_back")


def _apply_values(entry: ApplyEntry) -> tuple[Any, ...]:
    return (entry.started_at, entry.duration, entry.revision, entry.started_by, entry.ok,
            entry.gate, entry.rollback_of)


def _change_values(apply_id: int, seq: int, change: ChangeEntry) -> tuple[Any, ...]:
    return (apply_id, seq, change.model, change.replica, change.action, ",".join(change.nodes),
            change.why, change.ok, change.error, change.duration, change.new_replica,
            change.drift_class,
            change.gate, change.rolled_back)


def _change(row: Sequence[Any]) -> ChangeEntry:
    model, replica, action, nodes, why, ok, error, duration, new, cls, gate, rolled = row
    return ChangeEntry(model, int(replica), action, tuple(n for n in nodes.split(",") if n),
                       why, bool(ok), error, duration, None if new is None else int(new), cls,
                       gate, None if rolled is None else bool(rolled))


def _entry(row: Sequence[Any], changes: list[ChangeEntry]) -> ApplyEntry:
    apply_id, started_at, duration, revision, by, ok, gate, rollback_of = row
    return ApplyEntry(started_at, duration, revision, by, bool(ok), tuple(changes), gate,
                      rollback_of, int(apply_id))


def _bounded(limit: int) -> int:
    return max(0, min(limit, MAX_LIMIT))


# -- SQLite (runs on the store's own thread) ----------------------------------------------
def sqlite_record(conn: sqlite3.Connection, entry: ApplyEntry) -> int:
    with conn:
        conn.execute("BEGIN")
        cursor = conn.execute(
            f"INSERT INTO applies ({_APPLY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            _apply_values(entry))
        apply_id = cursor.lastrowid
        assert apply_id is not None
        conn.executemany(
            f"INSERT INTO apply_changes (apply_id, seq, {_CHANGE_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [_change_values(apply_id, i, c) for i, c in enumerate(entry.changes)])
    return apply_id


def sqlite_history(conn: sqlite3.Connection, model: str | None, limit: int) -> list[ApplyEntry]:
    if model is None:
        rows = conn.execute(f"SELECT id, {_APPLY_COLUMNS} FROM applies ORDER BY id DESC "
                            "LIMIT ?", (_bounded(limit),)).fetchall()
    else:
        rows = conn.execute(
            f"SELECT id, {_APPLY_COLUMNS} FROM applies a WHERE EXISTS (SELECT 1 FROM "
            "apply_changes c WHERE c.apply_id = a.id AND c.model = ?) ORDER BY id DESC "
            "LIMIT ?", (model, _bounded(limit))).fetchall()
    entries = []
    for row in rows:
        changes = conn.execute(
            f"SELECT {_CHANGE_COLUMNS} FROM apply_changes WHERE apply_id = ? "
            "AND (? IS NULL OR model = ?) ORDER BY seq", (row[0], model, model)).fetchall()
        entries.append(_entry(row, [_change(c) for c in changes]))
    return entries


# -- PostgreSQL (on a pooled asyncpg connection) ------------------------------------------
async def postgres_record(conn: asyncpg.pool.PoolConnectionProxy, entry: ApplyEntry) -> int:
    async with conn.transaction():
        apply_id: int = await conn.fetchval(
            f"INSERT INTO applies ({_APPLY_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7) "
            "RETURNING id", *_apply_values(entry))
        await conn.executemany(
            f"INSERT INTO apply_changes (apply_id, seq, {_CHANGE_COLUMNS}) VALUES "
            "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
            [_change_values(apply_id, i, c) for i, c in enumerate(entry.changes)])
    return apply_id


async def postgres_history(conn: asyncpg.pool.PoolConnectionProxy, model: str | None,
                           limit: int) -> list[ApplyEntry]:
    rows = await conn.fetch(
        f"SELECT id, {_APPLY_COLUMNS} FROM applies a WHERE $1::text IS NULL OR EXISTS "
        "(SELECT 1 FROM apply_changes c WHERE c.apply_id = a.id AND c.model = $1) "
        "ORDER BY id DESC LIMIT $2", model, _bounded(limit))
    changes = await conn.fetch(
        f"SELECT apply_id, {_CHANGE_COLUMNS} FROM apply_changes WHERE apply_id = ANY($1) "
        "AND ($2::text IS NULL OR model = $2) ORDER BY apply_id, seq",
        [r["id"] for r in rows], model)
    by_apply: dict[int, list[ChangeEntry]] = {}
    for change in changes:
        by_apply.setdefault(change["apply_id"], []).append(_change(tuple(change)[1:]))
    return [_entry(tuple(r), by_apply.get(r["id"], [])) for r in rows]

