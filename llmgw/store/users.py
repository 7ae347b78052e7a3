"""People who log in to the pages: name, argon2 password hash, role, projects.

A user is an admin (sees /admin, may call the admin API) or not; either way
they belong to zero or more projects of the cluster, whose keys, usage and
models they see on /account and /chat. Passwords are hashed with Argon2id
(argon2-cffi's defaults, RFC 9106's second recommended profile): unlike API
keys (see :mod:`llmgw.store.keys`), passwords are chosen by people and need a
slow hash to survive a database leak.

Usage::

    users.create(conn, "alice", "s3cret", admin=False, projects=["research"])
    user = users.authenticate(conn, "alice", "s3cret")   # User, or None
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
MIN_PASSWORD = 8
MAX_PASSWORD = 1024  # argon2 hashes anything, but a megabyte "password" is an attack
_HASHER = PasswordHasher()
# Verified against when the user does not exist, so "no such user" costs what
# "wrong password" costs and timing does not reveal who has an account.
_DUMMY_HASH = _HASHER.hash("no such user, no such password")


@dataclass(frozen=True)
class User:
    name: str
    admin: bool
    projects: tuple[str, ...]
    created_at: float


class UserError(ValueError):
    """A name or password that cannot be accepted; the message says why."""


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise UserError(f"invalid user name {name!r}: lowercase letters, digits, '.', '_' "
                        "and '-', 1 to 63 characters, starting and ending with a letter or digit")
    return name


def check_password(password: str) -> str:
    if len(password) < MIN_PASSWORD:
        raise UserError(f"password too short: at least {MIN_PASSWORD} characters")
    if len(password) > MAX_PASSWORD:
        raise UserError(f"password too long: at most {MAX_PASSWORD} characters")
    return password


def create(
    conn: sqlite3.Connection, name: str, password: str, *, admin: bool = False,
    projects: Sequence[str] = (), now: float | None = None,
) -> User:
    """A new user; UserError if the name is taken or the password unacceptable."""
    check_name(name)
    check_password(password)
    created_at = time.time() if now is None else now
    listed = tuple(sorted(set(projects)))
    try:
        conn.execute(
            "INSERT INTO users (name, password, admin, projects, created_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (name, _HASHER.hash(password), int(admin), json.dumps(list(listed)), created_at),
        )
    except sqlite3.IntegrityError:
        raise UserError(f"user {name!r} already exists") from None
    return User(name, admin, listed, created_at)


def get(conn: sqlite3.Connection, name: str) -> User | None:
    row = conn.execute(
        "SELECT name, admin, projects, created_at FROM users WHERE name = ?", (name,)
    ).fetchone()
    return _user(row) if row else None


def list_all(conn: sqlite3.Connection) -> list[User]:
    rows = conn.execute("SELECT name, admin, projects, created_at FROM users ORDER BY name")
    return [_user(row) for row in rows.fetchall()]


def authenticate(conn: sqlite3.Connection, name: str, password: str) -> User | None:
    """The user when ``password`` is theirs; None otherwise (same cost either way)."""
    row = None
    if NAME.match(name) and len(password) <= MAX_PASSWORD:
        row = conn.execute("SELECT password FROM users WHERE name = ?", (name,)).fetchone()
    try:
        _HASHER.verify(row[0] if row else _DUMMY_HASH, password)
    except (VerificationError, InvalidHashError):
        return None
    if row is None:
        return None
    if _HASHER.check_needs_rehash(row[0]):  # parameters raised since: upgrade on login
        conn.execute("UPDATE users SET password = ? WHERE name = ?",
                     (_HASHER.hash(password), name))
    return get(conn, name)


def set_password(conn: sqlite3.Connection, name: str, password: str) -> bool:
    """Replace the password; False when there is no such user."""
    check_password(password)
    cursor = conn.execute("UPDATE users SET password = ? WHERE name = ?",
                          (_HASHER.hash(password), name))
    return cursor.rowcount == 1


def delete(conn: sqlite3.Connection, name: str) -> bool:
    """Remove the user; their sessions go with them (see :mod:`llmgw.store.sessions`)."""
    cursor = conn.execute("DELETE FROM users WHERE name = ?", (name,))
    conn.execute("DELETE FROM sessions WHERE user_name = ?", (name,))
    return cursor.rowcount == 1


def _user(row: tuple[str, int, str, float]) -> User:
    return User(row[0], bool(row[1]), tuple(json.loads(row[2])), row[3])
