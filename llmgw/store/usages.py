"""Usage rows: one per routed request, and spend per project.

A row holds who (project, key id), what (model, endpoint, status, stream),
how much (tokens in and out, cost in USD at the prices in force) and how long
(latency). It has no column for prompt or completion text, so no code path
can store one.

Usage::

    usages.insert(conn, [UsageRow(...)])
    usages.spend_by_project(conn)   # {"research": 12.5}
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class UsageRow:
    ts: float
    project: str | None
    key_id: str | None
    model: str
    endpoint: str
    status: int
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_ms: float
    cost_usd: float = 0.0
    stream: bool = False


_COLUMNS = ", ".join(UsageRow.__dataclass_fields__)
_MARKS = ", ".join("?" * len(UsageRow.__dataclass_fields__))
_INSERT = f"INSERT INTO usage ({_COLUMNS}) VALUES ({_MARKS})"


def insert(conn: sqlite3.Connection, rows: Sequence[UsageRow]) -> None:
    """Append ``rows`` in one transaction (one fsync at most, not one per row)."""
    if not rows:
        return
    with conn:
        conn.execute("BEGIN")
        # Field by field, not dataclasses.astuple: that deep-copies every value, which
        # costs more than the insert itself.
        conn.executemany(_INSERT, [(
            r.ts, r.project, r.key_id, r.model, r.endpoint, r.status, r.prompt_tokens,
            r.completion_tokens, r.latency_ms, r.cost_usd, r.stream,
        ) for r in rows])


def spend_by_project(conn: sqlite3.Connection) -> dict[str, float]:
    """USD charged so far to each project."""
    rows = conn.execute(
        "SELECT project, SUM(cost_usd) FROM usage WHERE project IS NOT NULL GROUP BY project"
    ).fetchall()
    return {project: float(total or 0.0) for project, total in rows}


def last_use_by_model(conn: sqlite3.Connection) -> dict[str, float]:
    """Unix time of each model's last recorded request (by model key)."""
    rows = conn.execute("SELECT model, MAX(ts) FROM usage GROUP BY model").fetchall()
    return {model: float(ts) for model, ts in rows if ts is not None}


def recent(conn: sqlite3.Connection, limit: int = 100) -> list[UsageRow]:
    """The newest ``limit`` rows, newest first."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM usage ORDER BY id DESC LIMIT ?", (limit,)
    ).fetchall()
    names = list(UsageRow.__dataclass_fields__)
    return [UsageRow(**{**dict(zip(names, row, strict=True)), "stream": bool(row[-1])})
            for row in rows]
