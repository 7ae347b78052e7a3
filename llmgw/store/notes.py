"""A person's notes, kept beside /chat: private, bounded, deleted with their user.

A note belongs to one user. Every query names that user, so another person's
note is never found, changed or deleted (the page answers as if it did not
exist). Notes are text the person typed: shown escaped, never logged, in the
person's data export (:mod:`llmgw.web.accounts`), and deleted when the user is
(:meth:`~llmgw.store.stores.Store.delete_user`).

Bounds: :data:`MAX_NOTES` notes of at most :data:`MAX_BODY` characters each.

This module holds the :class:`NoteMethods` part of the store interface, the SQL
of both databases and the rules (:func:`save`).

Usage::

    note = await notes.save(store, "alice", "Prompts", "Ask for JSON.")
    await notes.save(store, "alice", "Prompts", "Ask for YAML.", nid=note.id)
    await notes.list_of(store, "alice")
"""

from __future__ import annotations

import abc
import secrets
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import asyncpg

if TYPE_CHECKING:
    from llmgw.store.stores import Store

MAX_NOTES = 500
MAX_BODY = 32 * 1024  # characters
MAX_TITLE = 120
_COLUMNS = "id, user_name, title, body, created_at, updated_at"


class NoteError(ValueError):
    """A note that cannot be kept as asked (too long, too many, not found)."""


@dataclass(frozen=True)
class Note:
    id: str
    user: str
    title: str
    body: str
    created_at: float
    updated_at: float


class NoteMethods(abc.ABC):
    """The notes' part of :class:`~llmgw.store.stores.Store`."""

    @abc.abstractmethod
    async def insert_note(self, note: Note, limit: int) -> bool:
        """Insert ``note`` unless its user has ``limit`` notes already (False then)."""

    @abc.abstractmethod
    async def update_note(self, note: Note) -> bool:
        """Replace the title and body of ``note.user``'s note ``note.id``; False when
        that user has no such note."""

    @abc.abstractmethod
    async def notes_of(self, user: str) -> list[Note]:
        """``user``'s notes, most recently changed first."""

    @abc.abstractmethod
    async def delete_note(self, nid: str, user: str) -> bool:
        """Delete ``user``'s note ``nid``; False when that user has no such note."""


async def save(store: Store, user: str, title: str, body: str, nid: str | None = None,
               now: float | None = None) -> Note:
    """Keep a new note (``nid`` None) or change ``user``'s note ``nid``; NoteError when
    the text is too long, the user has :data:`MAX_NOTES` already, or ``nid`` is not theirs."""
    title = " ".join(title.split())[:MAX_TITLE] or "untitled"
    if len(body) > MAX_BODY:
        raise NoteError(f"a note holds at most {MAX_BODY} characters; this one has "
                        f"{len(body)}")
    when = time.time() if now is None else now
    if nid is None:
        note = Note(secrets.token_hex(8), user, title, body, when, when)
        if not await store.insert_note(note, MAX_NOTES):
            raise NoteError(f"you have {MAX_NOTES} notes, as many as are kept: delete one "
                            "first")
        return note
    note = Note(nid, user, title, body, when, when)
    if not await store.update_note(note):
        raise NoteError("no such note of yours")
    return note


async def list_of(store: Store, user: str) -> list[Note]:
    return await store.notes_of(user)


async def delete(store: Store, nid: str, user: str) -> bool:
    return await store.delete_note(nid, user)


def _note(row: Sequence[Any]) -> Note:
    nid, user, title, body, created, updated = row
    return Note(str(nid), str(user), str(title), str(body), float(created), float(updated))


# -- SQLite (runs on the store's own thread) ----------------------------------------------
def sqlite_insert(conn: sqlite3.Connection, note: Note, limit: int) -> bool:
    with conn:
        conn.execute("BEGIN IMMEDIATE")  # the count and the insert as one step
        (held,) = conn.execute("SELECT COUNT(*) FROM notes WHERE user_name = ?",
                               (note.user,)).fetchone()
        if held >= limit:
            return False
        conn.execute(f"INSERT INTO notes ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                     (note.id, note.user, note.title, note.body, note.created_at,
                      note.updated_at))
    return True


def sqlite_update(conn: sqlite3.Connection, note: Note) -> bool:
    with conn:
        changed = conn.execute(
            "UPDATE notes SET title = ?, body = ?, updated_at = ? WHERE id = ? AND "
            "user_name = ?", (note.title, note.body, note.updated_at, note.id, note.user))
    return changed.rowcount == 1


def sqlite_notes(conn: sqlite3.Connection, user: str) -> list[Note]:
    return [_note(r) for r in conn.execute(
        f"SELECT {_COLUMNS} FROM notes WHERE user_name = ? ORDER BY updated_at DESC, id",
        (user,))]


def sqlite_delete(conn: sqlite3.Connection, nid: str, user: str) -> bool:
    with conn:
        gone = conn.execute("DELETE FROM notes WHERE id = ? AND user_name = ?", (nid, user))
    return gone.rowcount == 1


# -- PostgreSQL (on a pooled asyncpg connection) ------------------------------------------
async def postgres_insert(conn: asyncpg.pool.PoolConnectionProxy, note: Note,
                          limit: int) -> bool:
    async with conn.transaction():
        # One user's inserts in turn, so two at once cannot both pass the count.
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('notes:' || $1))",
                           note.user)
        held = await conn.fetchval("SELECT COUNT(*) FROM notes WHERE user_name = $1",
                                   note.user)
        if held >= limit:
            return False
        await conn.execute(f"INSERT INTO notes ({_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)",
                           note.id, note.user, note.title, note.body, note.created_at,
                           note.updated_at)
    return True


async def postgres_update(conn: asyncpg.pool.PoolConnectionProxy, note: Note) -> bool:
    status = await conn.execute(
        "UPDATE notes SET title = $1, body = $2, updated_at = $3 WHERE id = $4 AND "
        "user_name = $5", note.title, note.body, note.updated_at, note.id, note.user)
    return bool(status.endswith(" 1"))


async def postgres_notes(conn: asyncpg.pool.PoolConnectionProxy, user: str) -> list[Note]:
    return [_note(tuple(r)) for r in await conn.fetch(
        f"SELECT {_COLUMNS} FROM notes WHERE user_name = $1 ORDER BY updated_at DESC, id",
        user)]


async def postgres_delete(conn: asyncpg.pool.PoolConnectionProxy, nid: str,
                          user: str) -> bool:
    status = await conn.execute("DELETE FROM notes WHERE id = $1 AND user_name = $2",
                                nid, user)
    return bool(status.endswith(" 1"))
