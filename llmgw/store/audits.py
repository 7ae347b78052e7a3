"""The audit log: who changed keys, users and projects' members, who logged in, and when.

One row per event, written once and never updated: when (Unix time), who
(``actor``: a page user's name, ``cli:<unix user>``, ``key:<id>`` or
``admin-token``), from where (``source``: the client's address for HTTP, as
the login limits see it, or ``cli``), and what (``action`` and ``target``,
``key.revoke key=3f2a9c01d4e5 project=research``). ``llmgw audit``, the admin
API and /admin read it back newest first; the daemon deletes rows older than
``cluster.audit.retention`` (:mod:`llmgw.daemon.housekeeping`).

**Nothing secret, no client text.** :func:`record` is the one way in, and it
takes identifiers only: every target value must match :data:`VALUE` (a key
id, a project, user or model name), and one that does not — an attempted user
name on a failed login, say — is written as ``?``. The actor and the source
are checked the same way. No password, key secret, key label, prompt or
header ever reaches it, so none can be read back, shown or exported.

Actions (the vocabulary callers use; a reader matches on them):

=================  ================================================================
``key.create``     ``key=ID project=P``
``key.revoke``     ``key=ID project=P``
``key.limits``     ``key=ID project=P rpm=N|none tpm=N|none`` (the key's own limits set)
``reservation.release``  ``reservation=ID project=P``
``user.create``    ``user=U role=admin|user projects=P,Q``
``user.delete``    ``user=U``
``user.password``  ``user=U``
``user.role``      ``user=U role=admin|user`` (a role change)
``user.projects``  ``user=U projects=P,Q`` (a change of the projects a user is member of)
``user.export``    ``user=U`` (a person downloaded their data, ``/account/data``)
``login.ok``       ``user=U method=password|oidc``
``login.failed``   ``user=U|? method=… reason=password|throttled``
``logout``         ``user=U``
``admin.post`` …   ``route=/api/v1/…`` (any admin API call that is not a read)
=================  ================================================================

Recording never undoes nor fails what it records: a store that refuses the
write is logged (``llmgw.audit``) and the change stands.

This module holds the rows, :func:`record`, the :class:`AuditMethods` part of
the store interface and the SQL of both databases.
"""

from __future__ import annotations

import abc
import datetime as dt
import getpass
import ipaddress
import logging
import re
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import asyncpg

from llmgw.spec.quantities import parse_duration

if TYPE_CHECKING:
    from llmgw.store.stores import Store

log = logging.getLogger("llmgw.audit")
MAX_LIMIT = 10_000
"""The most entries one read returns."""
DEFAULT_RETENTION = 365 * 86400.0
"""``cluster.audit.retention`` when unset: a year."""

VALUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$")
"""A target value: an identifier (key id, project, user, model, reservation id)."""
ROUTE = re.compile(r"^/[A-Za-z0-9/_.{}-]{0,200}$")  # an admin API route's canonical path
ACTION = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
_UNIX_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?$")
_ACTOR = re.compile(r"^(admin-token|-|cli:[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?|key:[0-9a-f]{12}"
                    r"|[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?)$")
UNKNOWN = "?"  # what a value that is not an identifier is written as
CLI = "cli"  # the source of a change made by a command


@dataclass(frozen=True)
class Entry:
    """One audited event."""

    at: float  # Unix time
    actor: str
    source: str  # a client address, or "cli"
    action: str
    target: str  # "key=3f2a9c01d4e5 project=research"
    id: int | None = None  # set by the store

    def line(self) -> str:
        """``action target``, as people read it."""
        return f"{self.action} {self.target}".rstrip()

    def document(self) -> dict[str, Any]:
        """As ``llmgw audit --json`` and ``GET /api/v1/audit`` show it."""
        return {"id": self.id, "at": self.at,
                "when": dt.datetime.fromtimestamp(self.at, dt.UTC).isoformat(),
                "actor": self.actor, "source": self.source, "action": self.action,
                "target": self.target}


class AuditMethods(abc.ABC):
    """The audit log's part of :class:`~llmgw.store.stores.Store`."""

    @abc.abstractmethod
    async def insert_audit(self, entry: Entry) -> int:
        """Append ``entry`` as it is (callers go through :func:`record`); its id."""

    @abc.abstractmethod
    async def audit_entries(self, since: float | None = None,
                            limit: int = 100) -> list[Entry]:
        """The newest ``limit`` entries (at most :data:`MAX_LIMIT`) at or after ``since``,
        newest first."""

    @abc.abstractmethod
    async def purge_audits(self, before: float) -> int:
        """Delete the entries older than ``before``; how many."""


def value(text: object) -> str:
    """``text`` when it is an identifier, else :data:`UNKNOWN`. Purely computational."""
    return text if isinstance(text, str) and VALUE.fullmatch(text) else UNKNOWN


def target_of(fields: dict[str, str | Sequence[str] | None]) -> str:
    """``k=v`` pairs in the order given; a list is comma-joined, each item checked, and a
    None is left out. Purely computational."""
    parts = []
    for name, given in fields.items():
        if given is None:
            continue
        if name == "route":
            shown = given if isinstance(given, str) and ROUTE.fullmatch(given) else UNKNOWN
        elif isinstance(given, str):
            shown = value(given)
        else:
            shown = ",".join(value(item) for item in given) or "-"
        parts.append(f"{name}={shown}")
    return " ".join(parts)


def source_of(address: str | None) -> str:
    """An IP address (or an IPv6 /64, as the login limits count a source) as it is,
    ``cli``, else :data:`UNKNOWN`."""
    if address == CLI:
        return CLI
    try:
        if "/" in (address or ""):
            return str(ipaddress.ip_network(address or "", strict=True))
        return str(ipaddress.ip_address(address or ""))
    except ValueError:
        return UNKNOWN


def cli_actor() -> str:
    """``cli:<unix user>`` of this process."""
    try:
        name = getpass.getuser()
    except (OSError, KeyError):
        name = ""
    return f"cli:{name}" if _UNIX_USER.fullmatch(name) else "cli:?"


async def record(store: Store | None, actor: str, source: str | None, action: str,
                 /, **target: str | Sequence[str] | None) -> None:
    """Write one entry: ``actor`` did ``action`` on ``target`` from ``source``, now.

    Every part is checked (see the module's docstring): what is not an identifier is
    written as ``?``. A failing store is logged, never raised.
    """
    from llmgw.store.stores import StoreError

    if store is None:
        return
    if not ACTION.fullmatch(action):
        raise ValueError(f"not an audit action: {action!r}")  # a programming error
    entry = Entry(time.time(), actor if _ACTOR.fullmatch(actor) else UNKNOWN,
                  source_of(source), action, target_of(target))
    try:
        await store.insert_audit(entry)
    except StoreError as exc:
        log.error("could not write the audit entry %s: %s", entry.line(), exc)


async def record_cli(store: Store, action: str, /, **target: str | Sequence[str] | None) -> None:
    """:func:`record` for a command: actor ``cli:<unix user>``, source ``cli``."""
    await record(store, cli_actor(), CLI, action, **target)


def since_of(text: str, now: float) -> float:
    """The start of ``--since``: a duration back from ``now`` (``1d``, ``12h``) or an ISO
    date or date and time (UTC unless it has an offset). ValueError says what it takes.
    Purely computational."""
    try:
        if len(text) > 40:
            raise ValueError
        if text[:1].isdigit() and not text[4:5] == "-":
            return now - parse_duration(text)
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text[:40]!r} is neither a duration (1d, 12h, 30m) nor a date "
                         "(2026-12-01, 2026-12-01T08:00, 2026-12-01T08:00+01:00)") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)).timestamp()


async def purge(store: Store, retention: float, now: float) -> int:
    """Delete the entries older than ``retention`` seconds before ``now``; how many."""
    return await store.purge_audits(now - retention)


_COLUMNS = "at, actor, source, action, target"


def _entry(row: Sequence[Any]) -> Entry:
    entry_id, at, actor, source, action, target = row
    return Entry(float(at), str(actor), str(source), str(action), str(target), int(entry_id))


def _values(entry: Entry) -> tuple[Any, ...]:
    return (entry.at, entry.actor, entry.source, entry.action, entry.target)


def _bounded(limit: int) -> int:
    return max(0, min(limit, MAX_LIMIT))


# -- SQLite (runs on the store's own thread) ----------------------------------------------
def sqlite_insert(conn: sqlite3.Connection, entry: Entry) -> int:
    with conn:
        cursor = conn.execute(f"INSERT INTO audit_log ({_COLUMNS}) VALUES (?, ?, ?, ?, ?)",
                              _values(entry))
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def sqlite_audits(conn: sqlite3.Connection, since: float | None, limit: int) -> list[Entry]:
    rows = conn.execute(f"SELECT id, {_COLUMNS} FROM audit_log WHERE ? IS NULL OR at >= ? "
                        "ORDER BY at DESC, id DESC LIMIT ?", (since, since, _bounded(limit)))
    return [_entry(r) for r in rows]


def sqlite_purge(conn: sqlite3.Connection, before: float) -> int:
    with conn:
        return conn.execute("DELETE FROM audit_log WHERE at < ?", (before,)).rowcount


# -- PostgreSQL (on a pooled asyncpg connection) ------------------------------------------
async def postgres_insert(conn: asyncpg.pool.PoolConnectionProxy, entry: Entry) -> int:
    found: int = await conn.fetchval(
        f"INSERT INTO audit_log ({_COLUMNS}) VALUES ($1, $2, $3, $4, $5) RETURNING id",
        *_values(entry))
    return found


async def postgres_audits(conn: asyncpg.pool.PoolConnectionProxy, since: float | None,
                          limit: int) -> list[Entry]:
    rows = await conn.fetch(
        f"SELECT id, {_COLUMNS} FROM audit_log WHERE $1::float8 IS NULL OR at >= $1 "
        "ORDER BY at DESC, id DESC LIMIT $2", since, _bounded(limit))
    return [_entry(tuple(r)) for r in rows]


async def postgres_purge(conn: asyncpg.pool.PoolConnectionProxy, before: float) -> int:
    status: str = await conn.execute("DELETE FROM audit_log WHERE at < $1", before)
    return int(status.rsplit(" ", 1)[-1])
