"""The embedded SQLite database: one file holding API keys and usage rows.

``connect(path)`` opens (creating if needed) the database and brings its
schema up to date. The connection is meant for one thread: the router uses it
from its event loop, where each statement is a primary-key lookup or a batched
insert that takes microseconds, so no thread pool is needed.

Usage::

    conn = databases.connect("cluster/llmgw.db")
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    id          TEXT PRIMARY KEY,      -- public part of the key, printed by `keys list`
    digest      TEXT NOT NULL,         -- SHA-256 of the whole key, hex (see store.keys)
    project     TEXT NOT NULL,
    name        TEXT NOT NULL DEFAULT '',
    created_at  REAL NOT NULL,
    revoked_at  REAL
);
CREATE TABLE IF NOT EXISTS usage (
    id                INTEGER PRIMARY KEY,
    ts                REAL NOT NULL,
    project           TEXT,            -- NULL under `auth: none`
    key_id            TEXT,
    model             TEXT NOT NULL,
    endpoint          TEXT NOT NULL,   -- /v1/chat/completions, ...
    status            INTEGER NOT NULL,
    prompt_tokens     INTEGER,         -- NULL when the engine reported no usage
    completion_tokens INTEGER,
    latency_ms        REAL NOT NULL,
    cost_usd          REAL NOT NULL DEFAULT 0,
    stream            INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS usage_project ON usage (project);
CREATE INDEX IF NOT EXISTS usage_key ON usage (key_id, ts);
"""


class StoreError(RuntimeError):
    """The store cannot be used; the message names the file and what is wrong with it."""


def connect(path: str | Path) -> sqlite3.Connection:
    """An open connection to the database at ``path``, schema created.

    A file that is not an SQLite database, is damaged, cannot be opened or
    has a newer schema raises :class:`StoreError` naming it, so a command
    refuses before it starts anything.

    WAL mode lets ``llmgw keys`` write while the daemon's router reads, and
    ``synchronous=NORMAL`` keeps a usage flush from waiting on fsync each time
    (WAL stays consistent; the last instant of rows can be lost on power loss).
    """
    path = Path(path)
    if path.is_dir():
        raise StoreError(f"{path}: cannot open the store: it is a directory")
    try:
        return _connect(path)
    except sqlite3.OperationalError as exc:
        raise StoreError(f"{path}: cannot open the store: {exc}") from None
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path}: the store is damaged or not an llmgw database ({exc}); "
                         "restore it from a backup, or move it aside to start an empty one"
                         ) from None
    except OSError as exc:
        raise StoreError(f"{path}: cannot open the store: {exc.strerror or exc}") from None


def _connect(path: Path) -> sqlite3.Connection:
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
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        conn.close()
        raise StoreError(
            f"{path} has schema version {version}, newer than this llmgw understands "
            f"({SCHEMA_VERSION}); upgrade llmgw"
        )
    conn.executescript(_SCHEMA)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    return conn
