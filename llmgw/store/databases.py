"""The embedded SQLite database file: open it and bring its schema up to date.

``connect(path)`` opens (creating if needed) the database, applies pending
migrations (:mod:`llmgw.store.migrations`) and refuses a newer schema. The
connection is synchronous: :class:`llmgw.store.sqlitestores.SQLiteStore` owns
one on a dedicated thread so the event loop never waits on it.

Usage::

    conn = databases.connect("cluster/llmgw.db")
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from llmgw.store import migrations


def connect(path: str | Path) -> sqlite3.Connection:
    """An open connection to the database at ``path``, schema migrated.

    WAL mode lets ``llmgw keys`` write while the daemon's router reads, and
    ``synchronous=NORMAL`` keeps a usage flush from waiting on fsync each time
    (WAL stays consistent; the last instant of rows can be lost on power loss).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Key hashes and spend are nobody else's business: owner-only, WAL files included.
    path.touch(mode=0o600, exist_ok=True)
    old_umask = os.umask(0o077)
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode = WAL")
    finally:
        os.umask(old_umask)
    conn.execute("PRAGMA busy_timeout = 5000")
    conn.execute("PRAGMA synchronous = NORMAL")
    # Deleted rows (purged conversations) are overwritten, not left readable in free pages.
    conn.execute("PRAGMA secure_delete = ON")
    try:
        _migrate(conn, str(path))
    except BaseException:
        conn.close()
        raise
    return conn


def version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _migrate(conn: sqlite3.Connection, where: str) -> None:
    # BEGIN IMMEDIATE takes the write lock before reading the version, so two processes
    # opening a fresh file together run each step once.
    conn.execute("BEGIN IMMEDIATE")
    try:
        steps = migrations.pending(version(conn), where)
        for step in steps:
            for statement in step.sqlite.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {int(step.version)}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
