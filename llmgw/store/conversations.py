"""Conversations kept by /chat — only for projects that turn them on.

A conversation belongs to one user and one project; its messages are the
only place in llmgw where prompt or answer text is stored. The web layer
writes here only when the project declares ``conversations: {retention: …}``
(see :mod:`llmgw.web.chats`); :func:`purge` deletes conversations whose last
message is older than their project's retention, and the daemon calls it.

Usage::

    cid = await conversations.create(store, "alice", "research", "Haiku")
    await conversations.append(store, cid, "alice", [("user", "hi"), ("assistant", "hi")])
    await conversations.purge(store, {"research": 30 * 86400})
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmgw.store.stores import Store

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


async def create(store: Store, user: str, project: str, title: str,
                 now: float | None = None) -> str:
    when = time.time() if now is None else now
    cid = secrets.token_hex(8)
    await store.insert_conversation(Conversation(cid, user, project,
                                                 title[:MAX_TITLE] or "untitled", when, when))
    return cid


async def get(store: Store, cid: str, user: str) -> Conversation | None:
    """The conversation if it is ``user``'s; None otherwise (others' are invisible)."""
    return await store.conversation(cid, user)


async def list_for(store: Store, user: str, limit: int = 100) -> list[Conversation]:
    return await store.list_conversations(user, limit)


async def messages(store: Store, cid: str) -> list[Message]:
    return await store.messages(cid)


async def append(store: Store, cid: str, user: str, turns: Sequence[tuple[str, str]],
                 now: float | None = None, *, replace_answer: bool = False) -> bool:
    """Add messages to ``user``'s conversation ``cid``; False when it is not theirs.

    With ``replace_answer`` they take the place of its last message if that is an
    assistant's answer (Regenerate), in the same transaction.
    """
    return await store.append_messages(cid, user, turns, time.time() if now is None else now,
                                       replace_answer=replace_answer)


async def delete(store: Store, cid: str, user: str) -> bool:
    return await store.delete_conversation(cid, user)


async def purge(store: Store, retention: Mapping[str, float], now: float | None = None) -> int:
    """Delete conversations past their project's retention, and every conversation of a
    project that no longer keeps them (absent from ``retention``); how many went."""
    return await store.purge_conversations(retention, time.time() if now is None else now)
