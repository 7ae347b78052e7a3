"""Login sessions: a random token in an HttpOnly cookie, its SHA-256 in the store.

The cookie carries ``<32 random bytes, URL-safe base64>``; the store keeps
only its SHA-256 (as for API keys, the token has 256 bits of entropy, so a
fast hash suffices and a leaked database yields no usable session). Each
session has its own CSRF token, which forms and the chat's fetch requests
echo back. A session ends at ``expires_at`` (absolute) or at logout.

Usage::

    created = await sessions.create(store, "alice", ttl=43200)  # created.token → cookie
    session = await sessions.lookup(store, token)                # Session, or None
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmgw.store.stores import Store

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


async def create(store: Store, user: str, ttl: float,
                 now: float | None = None) -> CreatedSession:
    created_at = time.time() if now is None else now
    token = secrets.token_urlsafe(32)
    session = Session(digest(token), user, secrets.token_urlsafe(32), created_at,
                      created_at + ttl)
    await store.insert_session(session)
    return CreatedSession(session, token)


async def lookup(store: Store, token: str, now: float | None = None) -> Session | None:
    """The live session of ``token``; None when unknown, malformed or expired."""
    if len(token) != _TOKEN_LENGTH:
        return None
    session = await store.session(digest(token))
    when = time.time() if now is None else now
    if session is None or session.expires_at <= when:
        return None
    return session


async def delete(store: Store, token: str) -> None:
    await store.delete_session(digest(token))


async def purge_expired(store: Store, now: float | None = None) -> int:
    """Delete ended sessions; how many."""
    return await store.purge_sessions(time.time() if now is None else now)
