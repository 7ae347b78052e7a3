"""Many rows in few SQLite statements: multi-row ``VALUES`` and ``IN`` lists.

Not ``executemany`` or a statement per id: the sqlite3 module gives the GIL up
around each step (and each prepare) and takes it back after. With the router's
event loop holding the GIL, each take waits up to the interpreter's switch
interval (5 ms), so a store call that steps once per row, on the store's own
thread, crawls while the loop is busy: 4,000 usage rows took 15 s beside a busy
thread with ``executemany``, 0.14 s in statements of 200 rows (each alone: 26
and 20 ms; ``tests/bench/router.py``'s profile found the flush there).

Usage::

    sqlrows.insert(conn, "INSERT INTO usage (a, b)", [(1, 2), (3, 4)])
    conn.execute(f"DELETE FROM t WHERE id IN {sqlrows.marks(len(ids))}", ids)
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

ROWS_PER_STATEMENT = 200  # 200 rows of the widest table (usage, 14) use 2,800 of 32,766 ?s
IDS_PER_STATEMENT = 500


def insert(conn: sqlite3.Connection, head: str, rows: Sequence[Sequence[Any]],
           tail: str = "") -> None:
    """``{head} VALUES (?, …), (?, …) {tail}`` over ``rows``, ``ROWS_PER_STATEMENT`` a
    statement. ``tail``: an ``ON CONFLICT`` clause, which SQLite applies row by row, so
    two rows with one key in a statement are both applied, as with ``executemany``."""
    for chunk in chunks(rows, ROWS_PER_STATEMENT):
        conn.execute(f"{head} VALUES {values(chunk)} {tail}", flat(chunk))


def values(rows: Sequence[Sequence[Any]]) -> str:
    """``(?, …), (?, …)``: marks for ``rows`` (as wide as the first), for ``VALUES``."""
    one = "(" + ", ".join("?" * len(rows[0])) + ")"
    return ", ".join([one] * len(rows))


def flat(rows: Sequence[Sequence[Any]]) -> list[Any]:
    """``rows``' values in order: the parameters for :func:`values`' marks."""
    return [v for row in rows for v in row]


def chunks(items: Sequence[Any], size: int = IDS_PER_STATEMENT) -> Iterator[Sequence[Any]]:
    """``items`` in slices of ``size``: one statement's ``IN`` list or ``VALUES`` each."""
    for at in range(0, len(items), size):
        yield items[at:at + size]


def marks(count: int) -> str:
    """``(?, ?, …)``: ``count`` marks for an ``IN`` list."""
    return "(" + ", ".join("?" * count) + ")"
