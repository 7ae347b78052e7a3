"""People who log in to the pages: name, argon2 password hash, role, projects.

A user is an admin (sees /admin, may call the admin API) or not; either way
they belong to zero or more projects of the cluster, whose usage and models
they see on /account and /chat. In each of their projects they are a
``member`` (sees and revokes the keys they made) or an ``admin`` of that
project (sees and revokes every key of it, those of ``llmgw keys`` too).
Passwords are hashed with Argon2id
(argon2-cffi's defaults, RFC 9106's second recommended profile): unlike API
keys (see :mod:`llmgw.store.keys`), passwords are chosen by people and need a
slow hash to survive a database leak.

Usage::

    await users.create(store, "alice", "s3cret-pw", admin=False, projects=["research"])
    await users.set_role(store, "alice", "research", "admin")  # or "member"
    user = await users.authenticate(store, "alice", "s3cret-pw")   # User, or None

Hashing and verifying run on a worker thread; the rows live in the
:class:`~llmgw.store.stores.Store` (SQLite or PostgreSQL).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

if TYPE_CHECKING:
    from llmgw.store.stores import Store

NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
MIN_PASSWORD = 8
MAX_PASSWORD = 1024  # argon2 hashes anything, but a megabyte "password" is an attack
_HASHER = PasswordHasher()
# Verified against when the user does not exist, so "no such user" costs what
# "wrong password" costs and timing does not reveal who has an account.
_DUMMY_HASH = _HASHER.hash("no such user, no such password")


ROLES = ("member", "admin")  # a user's role in one of their projects


@dataclass(frozen=True)
class User:
    name: str
    admin: bool
    projects: tuple[str, ...]
    created_at: float
    # "<issuer> <sub>" of a person who signs in by single sign-on; None: a local account.
    subject: str | None = None
    admin_of: tuple[str, ...] = ()  # projects (among ``projects``) they are an admin of

    def role(self, project: str) -> str | None:
        """``admin`` or ``member`` of ``project``; None when not in it."""
        if project not in self.projects:
            return None
        return "admin" if project in self.admin_of else "member"


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


async def create(
    store: Store, name: str, password: str, *, admin: bool = False,
    projects: Sequence[str] = (), now: float | None = None, admin_of: Sequence[str] = (),
) -> User:
    """A new user; UserError if the name is taken or the password unacceptable.

    ``admin_of``: the projects they are a project admin of (each joins ``projects``)."""
    check_name(name)
    check_password(password)
    user = User(name, admin, tuple(sorted({*projects, *admin_of})),
                time.time() if now is None else now, admin_of=tuple(sorted(set(admin_of))))
    if not await store.insert_user(user, await _hash(password)):
        raise UserError(f"user {name!r} already exists")
    return user


async def sign_on(store: Store, subject: str, name: str, *, admin: bool,
                  projects: Sequence[str], admin_of: Sequence[str] = (),
                  now: float | None = None) -> User | None:
    """The user of ``subject`` (single sign-on), its role, projects and project-admin
    roles (``admin_of``, each joined too) set to these.

    The row bound to ``subject`` is updated (it keeps its name); else a row named
    ``name`` is created, bound to ``subject``, without a password. None when there
    is no row of ``subject`` and ``name`` is taken (a local account, or another
    subject's): a provider's claim never takes over an account it did not create.
    """
    check_name(name)
    user = User(name, admin, tuple(sorted({*projects, *admin_of})),
                time.time() if now is None else now, subject,
                admin_of=tuple(sorted(set(admin_of))))
    return await store.sign_on_user(user)


async def get(store: Store, name: str) -> User | None:
    return await store.user(name)


async def list_all(store: Store) -> list[User]:
    return await store.list_users()


async def authenticate(store: Store, name: str, password: str) -> User | None:
    """The user when ``password`` is theirs; None otherwise (same cost either way)."""
    stored = None
    if NAME.match(name) and len(password) <= MAX_PASSWORD:
        stored = await store.password_hash(name)
    if not await asyncio.to_thread(_verify, stored or _DUMMY_HASH, password) or stored is None:
        return None
    if _HASHER.check_needs_rehash(stored):  # parameters raised since: upgrade on login
        await store.set_password_hash(name, await _hash(password))
    return await store.user(name)


async def set_password(store: Store, name: str, password: str) -> bool:
    """Replace the password and end the user's sessions; False when there is no such user.

    UserError for a user bound to a single sign-on subject: their password is the
    provider's, and a local one would be a second way in that outlives the provider
    removing them."""
    check_password(password)
    user = await store.user(name)
    if user is not None and user.subject is not None:
        raise UserError(
            f"{name} signs in through single sign-on ({user.subject.split(' ', 1)[0]}); "
            "their password is the provider's, and a local one would let them in after the "
            "provider removed them. `llmgw users delete` ends their access here")
    if not await store.set_password_hash(name, await _hash(password)):
        return False
    await store.delete_sessions_of(name)
    return True


async def set_role(store: Store, name: str, project: str, role: str) -> User:
    """Make ``name`` a ``member`` or an ``admin`` of ``project`` (joining it if need be);
    the user after. UserError for an unknown user or role."""
    if role not in ROLES:
        raise UserError(f"unknown role {role!r}: use member or admin")
    user = await store.user(name)
    if user is None:
        raise UserError(f"no user {name!r}; `llmgw users list` shows them")
    projects = tuple(sorted({*user.projects, project}))
    admin_of = set(user.admin_of) - {project} | ({project} if role == "admin" else set())
    if not await store.set_user_projects(name, projects, tuple(sorted(admin_of))):
        raise UserError(f"no user {name!r}; `llmgw users list` shows them")
    return User(user.name, user.admin, projects, user.created_at, user.subject,
                tuple(sorted(admin_of)))


async def delete(store: Store, name: str) -> bool:
    """Remove the user; their sessions go with them (see :mod:`llmgw.store.sessions`)."""
    return await store.delete_user(name)


async def _hash(password: str) -> str:
    # Argon2 takes tens of milliseconds on purpose: on a worker thread, never the loop.
    return await asyncio.to_thread(_HASHER.hash, password)


def _verify(stored: str, password: str) -> bool:
    try:
        return _HASHER.verify(stored, password)
    except (VerificationError, InvalidHashError):
        return False
