"""The pages' records on PostgreSQL: users, sessions, conversations and usage charts.

:class:`PostgresPages` is a mixin of :class:`~llmgw.store.postgresstores.PostgresStore`:
asyncpg on the event loop, through the store's pooled ``_conn`` (every failure a
:class:`~llmgw.store.stores.StoreError`). The contracts are on
:class:`~llmgw.store.stores.Store`.
"""

from __future__ import annotations

import abc
import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import asyncpg

from llmgw.store import notes
from llmgw.store.conversations import Conversation, Message
from llmgw.store.notes import Note
from llmgw.store.sessions import Session
from llmgw.store.usages import GROUPS, Bucket
from llmgw.store.users import User

_USER = "SELECT name, admin, projects, created_at, subject, admin_of FROM users"
_SESSION = "SELECT digest, user_name, csrf, created_at, expires_at FROM sessions"
# The conversation's last message, when it is an answer (Regenerate replaces it).
_DROP_ANSWER = ("DELETE FROM messages WHERE role = 'assistant' AND id = (SELECT max(id) "
                "FROM messages WHERE conversation = $1)")
_CONVERSATION = ("SELECT id, user_name, project, title, created_at, updated_at "
                 "FROM conversations")


class PostgresPages(abc.ABC):
    """The pages' tables on PostgreSQL; mixed into PostgresStore, whose pool serves them."""

    @abc.abstractmethod
    def _conn(self) -> contextlib.AbstractAsyncContextManager[
            asyncpg.pool.PoolConnectionProxy]:
        """A connection from the store's pool (PostgresStore's)."""

    # -- users --------------------------------------------------------------------------
    async def insert_user(self, user: User, password_hash: str) -> bool:
        async with self._conn() as conn:
            status = await conn.execute(
                "INSERT INTO users (name, password, admin, projects, created_at, admin_of) "
                "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (name) DO NOTHING", user.name,
                password_hash, user.admin, json.dumps(list(user.projects)), user.created_at,
                json.dumps(list(user.admin_of)))
        return bool(status.endswith(" 1"))

    async def sign_on_user(self, user: User) -> User | None:
        projects = json.dumps(list(user.projects))
        admin_of = json.dumps(list(user.admin_of))
        async with self._conn() as conn, conn.transaction():
            for _ in range(2):  # a first sign-on racing ours inserted the row: update it
                found = await conn.fetchrow(
                    "UPDATE users SET admin = $2, projects = $3, admin_of = $4 "
                    "WHERE subject = $1 "
                    "RETURNING name, admin, projects, created_at, subject, admin_of",
                    user.subject, user.admin, projects, admin_of)
                if found is not None:
                    return _user(found)
                found = await conn.fetchrow(
                    "INSERT INTO users (name, password, admin, projects, created_at, subject, "
                    "admin_of) VALUES ($1, '', $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING "
                    "RETURNING name, admin, projects, created_at, subject, admin_of",
                    user.name, user.admin, projects, user.created_at, user.subject, admin_of)
                if found is not None:
                    return _user(found)
                if await conn.fetchval("SELECT 1 FROM users WHERE name = $1 AND "
                                       "subject IS DISTINCT FROM $2", user.name, user.subject):
                    return None  # the name is another account's
        return None

    async def user(self, name: str) -> User | None:
        async with self._conn() as conn:
            found = await conn.fetchrow(f"{_USER} WHERE name = $1", name)
        return _user(found) if found else None

    async def list_users(self) -> list[User]:
        async with self._conn() as conn:
            rows = await conn.fetch(f"{_USER} ORDER BY name")
        return [_user(r) for r in rows]

    async def password_hash(self, name: str) -> str | None:
        async with self._conn() as conn:
            found = await conn.fetchval("SELECT password FROM users WHERE name = $1", name)
        return str(found) if found is not None else None

    async def set_password_hash(self, name: str, password_hash: str) -> bool:
        async with self._conn() as conn:
            status = await conn.execute("UPDATE users SET password = $2 WHERE name = $1",
                                        name, password_hash)
        return bool(status.endswith(" 1"))

    async def set_user_projects(self, name: str, projects: Sequence[str],
                                admin_of: Sequence[str]) -> bool:
        async with self._conn() as conn:
            status = await conn.execute(
                "UPDATE users SET projects = $2, admin_of = $3 WHERE name = $1", name,
                json.dumps(list(projects)), json.dumps(list(admin_of)))
        return bool(status.endswith(" 1"))

    async def delete_user(self, name: str) -> bool:
        async with self._conn() as conn, conn.transaction():
            status = await conn.execute("DELETE FROM users WHERE name = $1", name)
            await conn.execute("DELETE FROM sessions WHERE user_name = $1", name)
            # What they kept goes with them (messages by the conversations' cascade).
            await conn.execute("DELETE FROM conversations WHERE user_name = $1", name)
            await conn.execute("DELETE FROM notes WHERE user_name = $1", name)
        return bool(status.endswith(" 1"))

    # -- notes (SQL in llmgw.store.notes) ------------------------------------------------
    async def insert_note(self, note: Note, limit: int) -> bool:
        async with self._conn() as conn:
            return await notes.postgres_insert(conn, note, limit)

    async def update_note(self, note: Note) -> bool:
        async with self._conn() as conn:
            return await notes.postgres_update(conn, note)

    async def notes_of(self, user: str) -> list[Note]:
        async with self._conn() as conn:
            return await notes.postgres_notes(conn, user)

    async def delete_note(self, nid: str, user: str) -> bool:
        async with self._conn() as conn:
            return await notes.postgres_delete(conn, nid, user)

    # -- sessions -----------------------------------------------------------------------
    async def insert_session(self, session: Session) -> None:
        async with self._conn() as conn:
            await conn.execute(
                "INSERT INTO sessions (digest, user_name, csrf, created_at, expires_at) "
                "VALUES ($1, $2, $3, $4, $5)", session.digest, session.user, session.csrf,
                session.created_at, session.expires_at)

    async def session(self, digest: str) -> Session | None:
        async with self._conn() as conn:
            found = await conn.fetchrow(f"{_SESSION} WHERE digest = $1", digest)
        return Session(*found) if found else None

    async def delete_session(self, digest: str) -> None:
        async with self._conn() as conn:
            await conn.execute("DELETE FROM sessions WHERE digest = $1", digest)

    async def delete_sessions_of(self, user: str) -> int:
        async with self._conn() as conn:
            return _count(await conn.execute("DELETE FROM sessions WHERE user_name = $1",
                                             user))

    async def purge_sessions(self, now: float) -> int:
        async with self._conn() as conn:
            return _count(await conn.execute("DELETE FROM sessions WHERE expires_at <= $1",
                                             now))

    # -- conversations ------------------------------------------------------------------
    async def insert_conversation(self, conversation: Conversation) -> None:
        c = conversation
        async with self._conn() as conn:
            await conn.execute(
                "INSERT INTO conversations (id, user_name, project, title, created_at, "
                "updated_at) VALUES ($1, $2, $3, $4, $5, $6)",
                c.id, c.user, c.project, c.title, c.created_at, c.updated_at)

    async def conversation(self, cid: str, user: str) -> Conversation | None:
        async with self._conn() as conn:
            found = await conn.fetchrow(f"{_CONVERSATION} WHERE id = $1 AND user_name = $2",
                                        cid, user)
        return Conversation(*found) if found else None

    async def list_conversations(self, user: str, limit: int) -> list[Conversation]:
        async with self._conn() as conn:
            rows = await conn.fetch(f"{_CONVERSATION} WHERE user_name = $1 "
                                    "ORDER BY updated_at DESC LIMIT $2", user, limit)
        return [Conversation(*r) for r in rows]

    async def messages(self, cid: str) -> list[Message]:
        async with self._conn() as conn:
            rows = await conn.fetch("SELECT role, content, ts FROM messages "
                                    "WHERE conversation = $1 ORDER BY id", cid)
        return [Message(*r) for r in rows]

    async def append_messages(self, cid: str, user: str, turns: Sequence[tuple[str, str]],
                              when: float, *, replace_answer: bool = False) -> bool:
        async with self._conn() as conn, conn.transaction():
            status = await conn.execute("UPDATE conversations SET updated_at = $1 "
                                        "WHERE id = $2 AND user_name = $3", when, cid, user)
            if _count(status) != 1:
                return False
            if replace_answer:
                await conn.execute(_DROP_ANSWER, cid)
            if turns:
                await conn.executemany(
                    "INSERT INTO messages (conversation, role, content, ts) "
                    "VALUES ($1, $2, $3, $4)",
                    [(cid, role, content, when) for role, content in turns])
        return True

    async def delete_conversation(self, cid: str, user: str) -> bool:
        # The messages go with it: their foreign key cascades.
        async with self._conn() as conn:
            status = await conn.execute("DELETE FROM conversations WHERE id = $1 "
                                        "AND user_name = $2", cid, user)
        return _count(status) == 1

    async def purge_conversations(self, retention: Mapping[str, float], now: float) -> int:
        # One statement: a conversation is doomed when its project is not in the list of
        # (project, cutoff) pairs, or is older than its project's cutoff.
        projects = list(retention)
        cutoffs = [now - retention[p] for p in projects]
        async with self._conn() as conn:
            status = await conn.execute(
                "DELETE FROM conversations c WHERE NOT EXISTS (SELECT 1 FROM "
                "unnest($1::text[], $2::float8[]) AS r(project, cutoff) "
                "WHERE r.project = c.project AND c.updated_at >= r.cutoff)",
                projects, cutoffs)
        return _count(status)

    # -- usage charts -------------------------------------------------------------------
    async def usage_series(self, by: Literal["project", "key", "model"], since: float,
                           step: float, projects: Sequence[str] | None) -> list[Bucket]:
        column = GROUPS[by]
        where = f"ts >= $1 AND {column} IS NOT NULL"
        params: list[Any] = [since, step]
        if projects is not None:
            where += " AND project = ANY($3::text[])"
            params.append(list(projects))
        async with self._conn() as conn:
            rows = await conn.fetch(
                f"SELECT FLOOR((ts - $1) / $2)::bigint AS slot, {column} AS grp, COUNT(*), "
                "SUM(COALESCE(prompt_tokens, 0) + COALESCE(completion_tokens, 0)), "
                f"SUM(cost_usd) FROM usage WHERE {where} GROUP BY 1, 2 ORDER BY 1, 2",
                *params)
        return [Bucket(since + r[0] * step, r[1], int(r[2]), int(r[3] or 0),
                       float(r[4] or 0.0)) for r in rows]

    async def user_totals(self, user: str) -> tuple[int, int, float]:
        async with self._conn() as conn:
            row = await conn.fetchrow(
                "SELECT COUNT(*), SUM(COALESCE(prompt_tokens, 0) + "
                "COALESCE(completion_tokens, 0)), SUM(cost_usd) FROM usage "
                "WHERE user_name = $1", user)
        assert row is not None
        return int(row[0]), int(row[1] or 0), float(row[2] or 0.0)


def _user(row: asyncpg.Record) -> User:
    return User(row[0], bool(row[1]), tuple(json.loads(row[2])), float(row[3]), row[4],
                tuple(json.loads(row[5])))


def _count(status: str) -> int:
    """Rows touched, from asyncpg's command tag ("DELETE 3")."""
    return int(status.rsplit(" ", 1)[-1])



