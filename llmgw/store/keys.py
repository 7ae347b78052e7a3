"""API keys: create, list, revoke, verify.

A key looks like ``llmgw_<id>_<secret>``: ``id`` is 12 hex characters, public,
shown by ``llmgw keys list`` and stored in usage rows; ``secret`` is 32 random
bytes from :mod:`secrets` (URL-safe base64, 43 characters). The key is
printed once, at creation, and never stored.

**Which hash, and why.** The database keeps SHA-256 of the whole key. Slow
password hashes (bcrypt, scrypt, Argon2) exist to make guessing *low-entropy
human passwords* expensive after a database leak. A key here carries 256 bits
from the OS's CSPRNG: no dictionary applies and 2**256 guesses stay out of
reach at any hash speed, so a slow hash would buy nothing while adding tens of
milliseconds to every request (or forcing a cache of plaintext keys in
memory). SHA-256 costs about a microsecond, keeps the router's added latency
under a millisecond, and a stolen database still yields no usable key.

**Constant time.** Lookup is by the public ``id`` (an index probe that reveals
nothing about the secret); the digest of the presented key is then compared
with :func:`hmac.compare_digest`, whose time does not depend on where the
digests differ. An unknown id still does a comparison against a dummy digest
so "no such key" and "wrong secret" take the same path.

Usage::

    created = keys.create(conn, project="research", name="ci")
    print(created.secret)                     # once
    info = keys.verify(conn, "llmgw_...")     # KeyInfo, or None
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import sqlite3
import time
from dataclasses import dataclass

PREFIX = "llmgw_"
_ID_HEX = 12
_KEY_LENGTH = len(PREFIX) + _ID_HEX + 1 + 43
_DUMMY_DIGEST = hashlib.sha256(b"no such key").hexdigest()


@dataclass(frozen=True)
class KeyInfo:
    id: str
    project: str
    name: str
    created_at: float
    revoked_at: float | None = None
    last_used_at: float | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True)
class CreatedKey:
    info: KeyInfo
    secret: str  # the whole key, shown once


def digest(key: str) -> str:
    """The stored form of a key: SHA-256, hex."""
    return hashlib.sha256(key.encode()).hexdigest()


def create(
    conn: sqlite3.Connection, project: str, name: str = "", now: float | None = None
) -> CreatedKey:
    """A new key for ``project``; the returned ``secret`` is the only copy."""
    created_at = time.time() if now is None else now
    while True:
        key_id = secrets.token_hex(_ID_HEX // 2)
        key = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
        try:
            conn.execute(
                "INSERT INTO keys (id, digest, project, name, created_at) VALUES (?, ?, ?, ?, ?)",
                (key_id, digest(key), project, name, created_at),
            )
        except sqlite3.IntegrityError:  # 48-bit id collided: draw again
            continue
        return CreatedKey(KeyInfo(key_id, project, name, created_at), key)


def key_id_of(key: str) -> str | None:
    """The public id inside a presented key, or None when it is not shaped like one."""
    if len(key) != _KEY_LENGTH or not key.startswith(PREFIX) or key[len(PREFIX) + _ID_HEX] != "_":
        return None
    return key[len(PREFIX) : len(PREFIX) + _ID_HEX]


def verify(conn: sqlite3.Connection, key: str) -> KeyInfo | None:
    """The active key matching ``key``, or None (unknown, malformed, wrong or revoked)."""
    key_id = key_id_of(key)
    row = None
    if key_id is not None:
        row = conn.execute(
            "SELECT digest, project, name, created_at, revoked_at FROM keys WHERE id = ?",
            (key_id,),
        ).fetchone()
    stored = row[0] if row else _DUMMY_DIGEST
    matches = hmac.compare_digest(digest(key), stored)
    if row is None or not matches or row[4] is not None:
        return None
    assert key_id is not None
    return KeyInfo(key_id, row[1], row[2], row[3])


def list_all(conn: sqlite3.Connection) -> list[KeyInfo]:
    """Every key, oldest first, with the time of its last recorded request."""
    rows = conn.execute(
        "SELECT k.id, k.project, k.name, k.created_at, k.revoked_at, "
        "(SELECT MAX(ts) FROM usage u WHERE u.key_id = k.id) "
        "FROM keys k ORDER BY k.created_at, k.id"
    ).fetchall()
    return [KeyInfo(*row) for row in rows]


def revoke(conn: sqlite3.Connection, key_id: str, now: float | None = None) -> KeyInfo | None:
    """Revoke ``key_id`` (idempotent); None when there is no such key."""
    when = time.time() if now is None else now
    conn.execute(
        "UPDATE keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (when, key_id)
    )
    row = conn.execute(
        "SELECT id, project, name, created_at, revoked_at FROM keys WHERE id = ?", (key_id,)
    ).fetchone()
    return KeyInfo(*row) if row else None
