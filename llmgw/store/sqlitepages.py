"""The pages' records on SQLite: users, sessions, conversations and usage charts.

:class:`SQLitePages` is a mixin of :class:`~llmgw.store.sqlitestores.SQLiteStore`:
every statement runs through the store's ``_run``, on the thread that owns the
connection, so a page never waits on the disk on the event loop. The contracts
are on :class:`~llmgw.store.stores.Store`.
"""

from __future__ import annotations

import abc
import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, TypeVar

from llmgw.store import notes
from llmgw.store.conversations import Conversation, Message
from llmgw.store.notes import Note
from llmgw.store.sessions import Session
from llmgw.store.usages import GROUPS, Bucket
from llmgw.store.users import User

T = TypeVar("T")
_USER = "SELECT name, admin, projects, created_at, subject, admin_of FROM users"
_SESSION = "SELECT digest, user_name, csrf, created_at, expires_at FROM sessions"
# The conversation's last message, when it is an answer (Regenerate replaces it).
_DROP_ANSWER = ("DELETE FROM messages WHERE role = 'assistant' AND id = (SELECT max(id) "
                "FROM messages WHERE conversation = ?)")
_CONVERSATION = ("SELECT id, user_name, project, title, created_at, updated_at "
                 "FROM conversations")


class SQLitePages(abc.ABC):
    """The pages' tables on SQLite; mixed into SQLiteStore, whose thread runs them."""

    @abc.abstractmethod
    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on the store's own thread (SQLiteStore's)."""

    # -- users --------------------------------------------------------------------------
    async def insert_user(self, user: User, password_hash: str) -> bool:
        def insert(conn: sqlite3.Connection) -> bool:
            try:
                conn.execute("INSERT INTO users (name, password, admin, projects, created_at, "
                             "admin_of) VALUES (?, ?, ?, ?, ?, ?)",
                             (user.name, password_hash, int(user.admin),
                              json.dumps(list(user.projects)), user.created_at,
                              json.dumps(list(user.admin_of))))
            except sqlite3.IntegrityError:
                return False
            return True
        return await self._run(insert)

    async def sign_on_user(self, user: User) -> User | None:
        def upsert(conn: sqlite3.Connection) -> User | None:
            projects = json.dumps(list(user.projects))
            admin_of = json.dumps(list(user.admin_of))
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("UPDATE users SET admin = ?, projects = ?, admin_of = ? "
                             "WHERE subject = ?",
                             (int(user.admin), projects, admin_of, user.subject))
                found = conn.execute(f"{_USER} WHERE subject = ?", (user.subject,)).fetchone()
                if found is None:
                    try:
                        conn.execute("INSERT INTO users (name, password, admin, projects, "
                                     "created_at, subject, admin_of) "
                                     "VALUES (?, '', ?, ?, ?, ?, ?)",
                                     (user.name, int(user.admin), projects, user.created_at,
                                      user.subject, admin_of))
                    except sqlite3.IntegrityError:
                        return None
                    found = conn.execute(f"{_USER} WHERE subject = ?",
                                         (user.subject,)).fetchone()
            return _user(found)
        return await self._run(upsert)

    async def user(self, name: str) -> User | None:
        def select(conn: sqlite3.Connection) -> User | None:
            found = conn.execute(f"{_USER} WHERE name = ?", (name,)).fetchone()
            return _user(found) if found else None
        return await self._run(select)

    async def list_users(self) -> list[User]:
        def select(conn: sqlite3.Connection) -> list[User]:
            return [_user(r) for r in conn.execute(f"{_USER} ORDER BY name").fetchall()]
        return await self._run(select)

    async def password_hash(self, name: str) -> str | None:
        def select(conn: sqlite3.Connection) -> str | None:
            found = conn.execute("SELECT password FROM users WHERE name = ?",
                                 (name,)).fetchone()
            return str(found[0]) if found else None
        return await self._run(select)

    async def set_password_hash(self, name: str, password_hash: str) -> bool:
        def update(conn: sqlite3.Connection) -> bool:
            return conn.execute("UPDATE users SET password = ? WHERE name = ?",
                                (password_hash, name)).rowcount == 1
        return await self._run(update)

    async def set_user_projects(self, name: str, projects: Sequence[str],
                                admin_of: Sequence[str]) -> bool:
        def update(conn: sqlite3.Connection) -> bool:
            return conn.execute("UPDATE users SET projects = ?, admin_of = ? WHERE name = ?",
                                (json.dumps(list(projects)), json.dumps(list(admin_of)),
                                 name)).rowcount == 1
        return await self._run(update)

    async def delete_user(self, name: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            with conn:
                conn.execute("BEGIN")
                gone = conn.execute("DELETE FROM users WHERE name = ?", (name,)).rowcount
                conn.execute("DELETE FROM sessions WHERE user_name = ?", (name,))
                # What they kept goes with them: their conversations, messages and notes.
                conn.execute("DELETE FROM messages WHERE conversation IN (SELECT id FROM "
                             "conversations WHERE user_name = ?)", (name,))
                conn.execute("DELETE FROM conversations WHERE user_name = ?", (name,))
                conn.execute("DELETE FROM notes WHERE user_name = ?", (name,))
            return gone == 1
        return await self._run(delete)

    # -- notes (SQL in llmgw.store.notes) ------------------------------------------------
    async def insert_note(self, note: Note, limit: int) -> bool:
        return await self._run(lambda conn: notes.sqlite_insert(conn, note, limit))

    async def update_note(self, note: Note) -> bool:
        return await self._run(lambda conn: notes.sqlite_update(conn, note))

    async def notes_of(self, user: str) -> list[Note]:
        return await self._run(lambda conn: notes.sqlite_notes(conn, user))

    async def delete_note(self, nid: str, user: str) -> bool:
        return await self._run(lambda conn: notes.sqlite_delete(conn, nid, user))

    # -- sessions -----------------------------------------------------------------------
    async def insert_session(self, session: Session) -> None:
        await self._run(lambda conn: conn.execute(
            "INSERT INTO sessions (digest, user_name, csrf, created_at, expires_at) "
            "VALUES (?, ?, ?, ?, ?)", (session.digest, session.user, session.csrf,
                                       session.created_at, session.expires_at)))

    async def session(self, digest: str) -> Session | None:
        def select(conn: sqlite3.Connection) -> Session | None:
            found = conn.execute(f"{_SESSION} WHERE digest = ?", (digest,)).fetchone()
            return Session(*found) if found else None
        return await self._run(select)

    async def delete_session(self, digest: str) -> None:
        await self._run(lambda conn: conn.execute("DELETE FROM sessions WHERE digest = ?",
                                                  (digest,)))

    async def delete_sessions_of(self, user: str) -> int:
        return await self._run(lambda conn: conn.execute(
            "DELETE FROM sessions WHERE user_name = ?", (user,)).rowcount)

    async def purge_sessions(self, now: float) -> int:
        return await self._run(lambda conn: conn.execute(
            "DELETE FROM sessions WHERE expires_at <= ?", (now,)).rowcount)

    # -- conversations ------------------------------------------------------------------
    async def insert_conversation(self, conversation: Conversation) -> None:
        c = conversation
        await self._run(lambda conn: conn.execute(
            "INSERT INTO conversations (id, user_name, project, title, created_at, "
            "updated_at) VALUES (?, ?, ?, ?, ?, ?)",
            (c.id, c.user, c.project, c.title, c.created_at, c.updated_at)))

    async def conversation(self, cid: str, user: str) -> Conversation | None:
        def select(conn: sqlite3.Connection) -> Conversation | None:
            found = conn.execute(f"{_CONVERSATION} WHERE id = ? AND user_name = ?",
                                 (cid, user)).fetchone()
            return Conversation(*found) if found else None
        return await self._run(select)

    async def list_conversations(self, user: str, limit: int) -> list[Conversation]:
        def select(conn: sqlite3.Connection) -> list[Conversation]:
            rows = conn.execute(f"{_CONVERSATION} WHERE user_name = ? "
                                "ORDER BY updated_at DESC LIMIT ?", (user, limit)).fetchall()
            return [Conversation(*r) for r in rows]
        return await self._run(select)

    async def messages(self, cid: str) -> list[Message]:
        def select(conn: sqlite3.Connection) -> list[Message]:
            rows = conn.execute("SELECT role, content, ts FROM messages "
                                "WHERE conversation = ? ORDER BY id", (cid,)).fetchall()
            return [Message(*r) for r in rows]
        return await self._run(select)

    async def append_messages(self, cid: str, user: str, turns: Sequence[tuple[str, str]],
                              when: float, *, replace_answer: bool = False) -> bool:
        def append(conn: sqlite3.Connection) -> bool:
            with conn:
                conn.execute("BEGIN")
                if conn.execute("UPDATE conversations SET updated_at = ? WHERE id = ? "
                                "AND user_name = ?", (when, cid, user)).rowcount != 1:
                    return False
                if replace_answer:
                    conn.execute(_DROP_ANSWER, (cid,))
                conn.executemany("INSERT INTO messages (conversation, role, content, ts) "
                                 "VALUES (?, ?, ?, ?)",
                                 [(cid, role, content, when) for role, content in turns])
            return True
        return await self._run(append)

    async def delete_conversation(self, cid: str, user: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            with conn:
                conn.execute("BEGIN")
                if conn.execute("DELETE FROM conversations WHERE id = ? AND user_name = ?",
                                (cid, user)).rowcount != 1:
                    return False
                conn.execute("DELETE FROM messages WHERE conversation = ?", (cid,))
            return True
        return await self._run(delete)

    async def purge_conversations(self, retention: Mapping[str, float], now: float) -> int:
        def purge(conn: sqlite3.Connection) -> int:
            rows = conn.execute("SELECT id, project, updated_at FROM conversations").fetchall()
            doomed = [(cid,) for cid, project, updated in rows
                      if project not in retention or updated < now - retention[project]]
            if not doomed:
                return 0
            with conn:
                conn.execute("BEGIN")
                conn.executemany("DELETE FROM messages WHERE conversation = ?", doomed)
                conn.executemany("DELETE FROM conversations WHERE id = ?", doomed)
            # Deleted text must not linger in the WAL, readable from the file (free pages
            # are overwritten: secure_delete is on).
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            return len(doomed)
        return await self._run(purge)

    # -- usage charts -------------------------------------------------------------------
    async def usage_series(self, by: Literal["project", "key", "model"], since: float,
                           step: float, projects: Sequence[str] | None) -> list[Bucket]:
        column = GROUPS[by]
        where = f"ts >= ? AND {column} IS NOT NULL"
        params: list[object] = [since]
        if projects is not None:
            where += f" AND project IN ({', '.join('?' * len(projects))})"
            params += list(projects)
        query = (f"SELECT CAST((ts - ?) / ? AS INTEGER), {column}, COUNT(*), "
                 "SUM(COALESCE(prompt_tokens, 0) + COALESCE(completion_tokens, 0)), "
                 f"SUM(cost_usd) FROM usage WHERE {where} GROUP BY 1, 2 ORDER BY 1, 2")

        def select(conn: sqlite3.Connection) -> list[Bucket]:
            rows = conn.execute(query, [since, step, *params]).fetchall()
            return [Bucket(since + slot * step, group, count, int(tokens or 0),
                           float(cost or 0.0)) for slot, group, count, tokens, cost in rows]
        return await self._run(select)

    async def user_totals(self, user: str) -> tuple[int, int, float]:
        def select(conn: sqlite3.Connection) -> tuple[int, int, float]:
            row = conn.execute(
                "SELECT COUNT(*), SUM(COALESCE(prompt_tokens, 0) + "
                "COALESCE(completion_tokens, 0)), SUM(cost_usd) FROM usage "
                "WHERE user_name = ?", (user,)).fetchone()
            return int(row[0]), int(row[1] or 0), float(row[2] or 0.0)
        return await self._run(select)


def _user(row: tuple[str, int, str, float, str | None, str]) -> User:
    return User(row[0], bool(row[1]), tuple(json.loads(row[2])), row[3], row[4],
                tuple(json.loads(row[5])))
