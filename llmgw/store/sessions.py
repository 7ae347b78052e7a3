"""Login sessions: a random token in an HttpOnly cookie, its SHA-256 in the store.

The cookie carries ``<32 random bytes, URL-safe base64>``; the store keeps
only its SHA-256 (as for API keys, the token has 256 bits of entropy, so a
fast hash suffices and a leaked database yields no usable session). Each
session has its own CSRF token, which forms and the chat's fetch requests
echo back. A session ends at ``expires_at`` (absolute) or at logout.

Usage::

    created = sessions.create(conn, "alice", ttl=43200)   # created.token → the cookie
    session = sessions.lookup(conn, token)                 # Session, or None
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
import time
from dataclasses import dataclass

_TOKEN_LENGTH = 43  # secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Session:
    digest: str
    user: str
    csrf: str
    created_at: float
    expires_at: float


@dataclass(frozen=True)
class CreatedSession:
    session: Session
    token: str  # for the cookie; not stored


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create(
    conn: sqlite3.Connection, user: str, ttl: float, now: float | None = None
) -> CreatedSession:
    created_at = time.time() if now is None else now
    token = secrets.token_urlsafe(32)
    session = Session(digest(token), user, secrets.token_urlsafe(32), created_at,
                      created_at + ttl)
    conn.execute(
        "INSERT INTO sessions (digest, user_name, csrf, created_at, expires_at) "
        "VALUES (?, ?, ?, ?, ?)",
        (session.digest, user, session.csrf, session.created_at, session.expires_at),
    )
    return CreatedSession(session, token)


def lookup(conn: sqlite3.Connection, token: str, now: float | None = None) -> Session | None:
    """The live session of ``token``; None when unknown, malformed or expired."""
    if len(token) != _TOKEN_LENGTH:
        return None
    row = conn.execute(
        "SELECT digest, user_name, csrf, created_at, expires_at FROM sessions WHERE digest = ?",
        (digest(token),),
    ).fetchone()
    when = time.time() if now is None else now
    if row is None or row[4] <= when:
        return None
    return Session(*row)


def delete(conn: sqlite3.Connection, token: str) -> None:
    conn.execute("DELETE FROM sessions WHERE digest = ?", (digest(token),))


def purge_expired(conn: sqlite3.Connection, now: float | None = None) -> int:
    """Delete ended sessions; how many."""
    when = time.time() if now is None else now
    return conn.execute("DELETE FROM sessions WHERE expires_at <= ?", (when,)).rowcount
