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

    created = await keys.create(store, project="research", name="ci")
    print(created.secret)                            # once
    info = await keys.verify(store, "llmgw_...")     # KeyInfo, or None
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from llmgw.store.stores import KeyRow, Store

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
    rpm: int | None = None  # the key's own limits, beside its project's; None: none
    tpm: int | None = None
    owner: str | None = None  # the page user who made it on /account; None: `llmgw keys`

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


async def create(
    store: Store, project: str, name: str = "", now: float | None = None, *,
    rpm: int | None = None, tpm: int | None = None, owner: str | None = None,
) -> CreatedKey:
    """A new key for ``project``; the returned ``secret`` is the only copy. ``rpm`` and
    ``tpm``: the key's own requests and tokens per minute, on top of its project's.
    ``owner``: the page user who made it (/account); None for ``llmgw keys create``."""
    created_at = time.time() if now is None else now
    while True:
        key_id = secrets.token_hex(_ID_HEX // 2)
        key = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
        row = KeyRow(key_id, digest(key), project, name, created_at, rpm=rpm, tpm=tpm,
                     owner=owner)
        if await store.insert_key(row):
            return CreatedKey(_info(row), key)
        # the 48-bit id collided: draw again


def key_id_of(key: str) -> str | None:
    """The public id inside a presented key, or None when it is not shaped like one."""
    if len(key) != _KEY_LENGTH or not key.startswith(PREFIX) or key[len(PREFIX) + _ID_HEX] != "_":
        return None
    return key[len(PREFIX) : len(PREFIX) + _ID_HEX]


async def verify(store: Store, key: str) -> KeyInfo | None:
    """The active key matching ``key``, or None (unknown, malformed, wrong or revoked)."""
    key_id = key_id_of(key)
    row = await store.key_row(key_id) if key_id is not None else None
    return check(key, row)


def check(key: str, row: KeyRow | None) -> KeyInfo | None:
    """Compare a presented key with its stored row in constant time; a pure function."""
    stored = row.digest if row else _DUMMY_DIGEST
    matches = hmac.compare_digest(digest(key), stored)
    if row is None or not matches or row.revoked_at is not None:
        return None
    return KeyInfo(row.id, row.project, row.name, row.created_at, rpm=row.rpm, tpm=row.tpm,
                   owner=row.owner)


async def list_all(store: Store) -> list[KeyInfo]:
    """Every key, oldest first, with the time of its last recorded request."""
    return [_info(listing.row, listing.last_used_at) for listing in await store.list_keys()]


async def revoke(store: Store, key_id: str, now: float | None = None) -> KeyInfo | None:
    """Revoke ``key_id`` (idempotent); None when there is no such key."""
    row = await store.revoke_key(key_id, time.time() if now is None else now)
    return _info(row) if row else None


async def set_limits(store: Store, key_id: str, rpm: int | None,
                     tpm: int | None) -> KeyInfo | None:
    """Set ``key_id``'s own limits (None: none); None when there is no such key."""
    row = await store.set_key_limits(key_id, rpm, tpm)
    return _info(row) if row else None


def _info(row: KeyRow, last_used_at: float | None = None) -> KeyInfo:
    return KeyInfo(row.id, row.project, row.name, row.created_at, row.revoked_at, last_used_at,
                   row.rpm, row.tpm, row.owner)
