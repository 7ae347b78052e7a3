"""Conversations kept by /chat — only for projects that turn them on.

A conversation belongs to one user and one project; its messages are the
only place in llmgw where prompt or answer text is stored. The web layer
writes here only when the project declares ``conversations: {retention: …}``
(see :mod:`llmgw.web.chats`); :func:`purge` deletes conversations whose last
message is older than their project's retention, and the daemon calls it.

Usage::

    cid = conversations.create(conn, "alice", "research", "Haiku")
    conversations.append(conn, cid, "alice", [("user", "hi"), ("assistant", "hello")])
    conversations.purge(conn, {"research": 30 * 86400})
"""

from __future__ import annotations

import secrets
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ROLES = ("system", "user", "assistant")
MAX_MESSAGE = 256 * 1024  # characters; a turn longer than this is refused
MAX_TITLE = 80


@dataclass(frozen=True)
class Conversation:
    id: str
    user: str
    project: str
    title: str
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    ts: float


def create(conn: sqlite3.Connection, user: str, project: str, title: str,
           now: float | None = None) -> str:
    when = time.time() if now is None else now
    cid = secrets.token_hex(8)
    conn.execute(
        "INSERT INTO conversations (id, user_name, project, title, created_at, updated_at) "
        "VALUES (?, ?, ?, ?, ?, ?)", (cid, user, project, title[:MAX_TITLE] or "untitled",
                                      when, when),
    )
    return cid


def get(conn: sqlite3.Connection, cid: str, user: str) -> Conversation | None:
    """The conversation if it is ``user``'s; None otherwise (others' are invisible)."""
    row = conn.execute(
        "SELECT id, user_name, project, title, created_at, updated_at FROM conversations "
        "WHERE id = ? AND user_name = ?", (cid, user),
    ).fetchone()
    return Conversation(*row) if row else None


def list_for(conn: sqlite3.Connection, user: str, limit: int = 100) -> list[Conversation]:
    rows = conn.execute(
        "SELECT id, user_name, project, title, created_at, updated_at FROM conversations "
        "WHERE user_name = ? ORDER BY updated_at DESC LIMIT ?", (user, limit),
    ).fetchall()
    return [Conversation(*row) for row in rows]


def messages(conn: sqlite3.Connection, cid: str) -> list[Message]:
    rows = conn.execute(
        "SELECT role, content, ts FROM messages WHERE conversation = ? ORDER BY id", (cid,)
    ).fetchall()
    return [Message(*row) for row in rows]


def append(conn: sqlite3.Connection, cid: str, user: str,
           turns: Sequence[tuple[str, str]], now: float | None = None) -> bool:
    """Add messages to ``user``'s conversation ``cid``; False when it is not theirs."""
    when = time.time() if now is None else now
    with conn:
        conn.execute("BEGIN")
        cursor = conn.execute(
            "UPDATE conversations SET updated_at = ? WHERE id = ? AND user_name = ?",
            (when, cid, user),
        )
        if cursor.rowcount != 1:
            return False
        conn.executemany(
            "INSERT INTO messages (conversation, role, content, ts) VALUES (?, ?, ?, ?)",
            [(cid, role, content, when) for role, content in turns],
        )
    return True


def delete(conn: sqlite3.Connection, cid: str, user: str) -> bool:
    with conn:
        conn.execute("BEGIN")
        cursor = conn.execute("DELETE FROM conversations WHERE id = ? AND user_name = ?",
                              (cid, user))
        conn.execute("DELETE FROM messages WHERE conversation = ? AND NOT EXISTS "
                     "(SELECT 1 FROM conversations WHERE id = ?)", (cid, cid))
    return cursor.rowcount == 1


def purge(conn: sqlite3.Connection, retention: Mapping[str, float],
          now: float | None = None) -> int:
    """Delete conversations past their project's retention, and every conversation of a
    project that no longer keeps them (absent from ``retention``); how many went."""
    when = time.time() if now is None else now
    rows = conn.execute("SELECT id, project, updated_at FROM conversations").fetchall()
    doomed = [cid for cid, project, updated in rows
              if project not in retention or updated < when - retention[project]]
    with conn:
        conn.execute("BEGIN")
        for cid in doomed:
            conn.execute("DELETE FROM messages WHERE conversation = ?", (cid,))
            conn.execute("DELETE FROM conversations WHERE id = ?", (cid,))
    if doomed:
        # Deleted text must not linger in free pages or the WAL, readable from the file.
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return len(doomed)
