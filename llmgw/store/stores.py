"""The store interface: keys, usage, the leader lease and the pages' records, on SQLite
or PostgreSQL.

A :class:`Store` is async end to end, and no call blocks the event loop:
:class:`~llmgw.store.sqlitestores.SQLiteStore` runs every statement on one
dedicated thread that owns the connection; :class:`~llmgw.store.postgresstores.PostgresStore`
speaks asyncpg's native protocol on the loop. Both apply the same versioned
migrations (:mod:`llmgw.store.migrations`) when opened and refuse a newer schema.

The methods are storage primitives; policy lives in the modules that call
them (hashing and constant-time checks in :mod:`llmgw.store.keys`, row shapes
in :mod:`llmgw.store.usages`, renewals and fencing in the daemon's leader loop;
password hashing in :mod:`llmgw.store.users`, session tokens in
:mod:`llmgw.store.sessions`, retention in :mod:`llmgw.store.conversations`).
Every database failure surfaces as :class:`StoreError`, so callers handle one
exception type whichever database is behind.

Usage::

    store = await stores.open_store(cluster.cluster.store)
    info = await keys.verify(store, presented)
    await store.close()
"""

from __future__ import annotations

import abc
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import quote, urlsplit

from llmgw.store.adminsummaries import AdminSummaryMethods
from llmgw.store.audits import AuditMethods
from llmgw.store.exports import ExportMethods
from llmgw.store.holds import HoldMethods
from llmgw.store.journals import JournalMethods
from llmgw.store.notes import NoteMethods
from llmgw.store.outages import OutageMethods
from llmgw.store.ratelimits import RateLimitMethods
from llmgw.store.reservations import Owner, ReservationMethods
from llmgw.store.tableio import TableMethods

if TYPE_CHECKING:
    from llmgw.spec.models import StoreSettings
    from llmgw.store.conversations import Conversation, Message
    from llmgw.store.sessions import Session
    from llmgw.store.usages import Bucket, UsageRow
    from llmgw.store.users import User


class StoreError(RuntimeError):
    """The database refused or could not be reached; the message says which and why."""


@dataclass(frozen=True)
class KeyRow:
    """A key as stored: its digest, never the key."""

    id: str
    digest: str
    project: str
    name: str
    created_at: float
    revoked_at: float | None = None
    rpm: int | None = None  # the key's own requests per minute; None: its project's only
    tpm: int | None = None  # ... and tokens per minute
    owner: str | None = None  # the page user who made it on /account; None: `llmgw keys`


@dataclass(frozen=True)
class KeyListing:
    row: KeyRow
    last_used_at: float | None


@dataclass(frozen=True)
class Grant:
    """A lease held: by whom, under which fencing epoch, for how long from now.

    ``remaining`` is measured by the database's clock at the moment it answered; the
    holder turns it into a deadline on its own monotonic clock from the moment it *sent*
    the request, so its idea of the deadline is never later than the database's.
    """

    name: str
    holder: str
    epoch: int
    remaining: float


@dataclass(frozen=True)
class Admission:
    """The answer to a reservation: its id (None: refused) and the project's figures."""

    id: str | None
    spent: float
    reserved: float


@dataclass(frozen=True)
class Published:
    """A routing table as the leader published it: ``seq`` grows with every publication."""

    epoch: int
    seq: int
    doc: str


class Store(JournalMethods, HoldMethods, ReservationMethods, AdminSummaryMethods,
            RateLimitMethods, AuditMethods, ExportMethods, NoteMethods, TableMethods,
            OutageMethods, abc.ABC):
    """The storage interface; the apply journal's methods are in :class:`JournalMethods`,
    held revisions' in :class:`HoldMethods`, reservations' owners in
    :class:`ReservationMethods`, the leader's published admin summary in
    :class:`AdminSummaryMethods`, rate-limit counters in :class:`RateLimitMethods`, the
    audit log's in :class:`AuditMethods`, the usage export's in :class:`ExportMethods`,
    people's notes in :class:`NoteMethods`, whole tables for ``llmgw store migrate`` in
    :class:`TableMethods`, key re-reads and change notices (store outages) in
    :class:`OutageMethods`."""

    kind: Literal["sqlite", "postgresql"]
    where: str  # for messages: a path, or the URL without a password

    # -- keys ---------------------------------------------------------------------------
    @abc.abstractmethod
    async def insert_key(self, row: KeyRow) -> bool:
        """Insert ``row``; False (and nothing written) when its id is taken."""

    @abc.abstractmethod
    async def key_row(self, key_id: str) -> KeyRow | None: ...

    @abc.abstractmethod
    async def list_keys(self) -> list[KeyListing]:
        """Every key, oldest first, with the time of its last usage row."""

    @abc.abstractmethod
    async def revoke_key(self, key_id: str, when: float) -> KeyRow | None:
        """Set ``revoked_at`` unless already set; the row after, or None when unknown."""

    @abc.abstractmethod
    async def set_key_limits(self, key_id: str, rpm: int | None,
                             tpm: int | None) -> KeyRow | None:
        """Set the key's own ``rpm`` and ``tpm`` (None: none); the row after, or None
        when unknown. Routers see it as they see a revocation (its change notice, or
        their next re-read of the cached keys)."""

    # -- usage --------------------------------------------------------------------------
    @abc.abstractmethod
    async def insert_usage(self, rows: Sequence[UsageRow],
                           settled: Sequence[str | None] = ()) -> None:
        """Append ``rows`` and add their cost to the projects' spend, and drop the
        reservations ``settled`` (``settled[i]`` is ``rows[i]``'s, None for none): one
        transaction, so a request's cost is always counted once, as reserved or as spent.
        A row whose reservation was released meanwhile (its router stopped beating, then
        came back) bills only what the release did not."""

    @abc.abstractmethod
    async def spend_by_project(
        self, starts: Mapping[str, float | None] | None = None,
    ) -> dict[str, float]:
        """USD each project has spent for ever, except the projects in ``starts``: what
        they spent since ``starts[p]`` (Unix time; usage rows with ``ts`` at or after it),
        their budget period's start (:mod:`llmgw.store.spends`)."""

    # -- budgets ------------------------------------------------------------------------
    @abc.abstractmethod
    async def reserve(self, project: str, budget: float, amount: float,
                      hold: float, owner: Owner | None = None,
                      since: float | None = None) -> Admission:
        """Reserve ``amount`` USD for a request of ``project`` unless what it has spent
        plus what requests in flight on every router have reserved reaches ``budget``.
        Atomic across routers. ``since``: the start of the budget's period (None: a
        lifetime budget): what was spent is the usage rows with ``ts`` at or after it, and
        what is reserved counts only reservations taken in it (``owner.ts`` at or after
        it; one without a time counts in every period). ``owner``: the router that holds
        it, whose heartbeat keeps it (see :mod:`llmgw.store.reservations`); a released
        reservation bills what its owner recorded. ``hold`` seconds is a backstop: past
        it, the reservation is stale whatever its router."""

    @abc.abstractmethod
    async def last_use_by_model(self) -> dict[str, float]:
        """Unix time each model's latest request ended, by model key: a row's ``ts`` is its
        request's arrival (the budget period it is billed to), plus its latency."""

    @abc.abstractmethod
    async def recent_usage(self, limit: int) -> list[UsageRow]:
        """The newest ``limit`` rows, newest first."""

    @abc.abstractmethod
    async def usage_after(self, after_id: int, limit: int) -> list[tuple[int, UsageRow]]:
        """Rows with id above ``after_id`` in id order: a cursor for copying everything."""

    @abc.abstractmethod
    async def settle_reservation(self, reservation: str, cost: float) -> None:
        """The request behind ``reservation`` ended costing ``cost``: hold that much, not
        the estimate, until its usage row is written (which drops the reservation)."""

    async def settle_reservations(self, settled: Sequence[tuple[str, float]]) -> None:
        """:meth:`settle_reservation` for each ``(reservation, cost)``, in one round trip
        where the store can (:mod:`llmgw.router.settlements`)."""
        for reservation, cost in settled:
            await self.settle_reservation(reservation, cost)

    # -- lease --------------------------------------------------------------------------
    @abc.abstractmethod
    async def acquire_lease(self, name: str, holder: str, ttl: float) -> Grant | None:
        """Take or renew lease ``name`` for ``ttl`` seconds of the database's clock.

        Granted when the lease is free, expired, or already ``holder``'s. The epoch goes
        up by one whenever the holder changes (a fencing token), and stays when the
        same holder renews. None when someone else holds it.
        """

    @abc.abstractmethod
    async def release_lease(self, name: str, holder: str) -> None:
        """Expire ``holder``'s lease now so a standby takes over at once (clean stop)."""

    @abc.abstractmethod
    async def lease(self, name: str) -> Grant | None:
        """The current unexpired holder of ``name``, or None."""

    @abc.abstractmethod
    async def publish_routes(self, name: str, holder: str, epoch: int, doc: str) -> bool:
        """Replace the routing table, fenced: written only while ``holder`` holds lease
        ``name`` at ``epoch``, checked in the same statement. False when fenced out."""

    @abc.abstractmethod
    async def published_routes(self, name: str) -> Published | None:
        """The last routing table published under lease ``name``."""

    # -- router signals -----------------------------------------------------------------
    @abc.abstractmethod
    async def put_signals(self, router: str, doc: str) -> None:
        """Record what router ``router`` has seen now (replacing its last record)."""

    @abc.abstractmethod
    async def signals(self, max_age: float) -> list[str]:
        """Records of routers heard from within ``max_age`` seconds (database clock)."""

    @abc.abstractmethod
    async def drop_signals(self, router: str) -> None: ...

    # -- the whole store ----------------------------------------------------------------
    @abc.abstractmethod
    async def schema_version(self) -> int: ...

    @abc.abstractmethod
    async def is_empty(self) -> bool:
        """True when no key and no usage row exists (`llmgw store migrate` checks every
        table it copies instead: llmgw.store.copies)."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    # -- the pages: users, sessions, conversations, usage charts ------------------------
    # Implemented in llmgw.store.sqlitepages and llmgw.store.postgrespages.
    @abc.abstractmethod
    async def insert_user(self, user: User, password_hash: str) -> bool:
        """Insert ``user``; False (and nothing written) when the name is taken."""

    @abc.abstractmethod
    async def sign_on_user(self, user: User) -> User | None:
        """In one transaction: the row whose subject is ``user.subject`` gets ``user``'s
        admin and projects (its name and creation time stay), or, when there is none, ``user``
        is inserted with an empty password; None (nothing written) when there is none and
        ``user.name`` is taken. Returns the row as stored."""

    @abc.abstractmethod
    async def user(self, name: str) -> User | None: ...

    @abc.abstractmethod
    async def list_users(self) -> list[User]:
        """Every user, by name."""

    @abc.abstractmethod
    async def password_hash(self, name: str) -> str | None:
        """The stored (encoded Argon2) hash of ``name``'s password; None: no such user."""

    @abc.abstractmethod
    async def set_password_hash(self, name: str, password_hash: str) -> bool:
        """Replace the hash; False when there is no such user."""

    @abc.abstractmethod
    async def set_user_projects(self, name: str, projects: Sequence[str],
                                admin_of: Sequence[str]) -> bool:
        """Replace the user's projects and those they are a project admin of (a subset);
        False when there is no such user."""

    @abc.abstractmethod
    async def delete_user(self, name: str) -> bool:
        """Remove the user and their sessions in one transaction; False when unknown."""

    @abc.abstractmethod
    async def insert_session(self, session: Session) -> None: ...

    @abc.abstractmethod
    async def session(self, digest: str) -> Session | None:
        """The session stored under ``digest``, expired or not (callers check)."""

    @abc.abstractmethod
    async def delete_session(self, digest: str) -> None: ...

    @abc.abstractmethod
    async def delete_sessions_of(self, user: str) -> int:
        """End every session of ``user``; how many."""

    @abc.abstractmethod
    async def purge_sessions(self, now: float) -> int:
        """Delete sessions with ``expires_at <= now``; how many."""

    @abc.abstractmethod
    async def insert_conversation(self, conversation: Conversation) -> None: ...

    @abc.abstractmethod
    async def conversation(self, cid: str, user: str) -> Conversation | None:
        """Conversation ``cid`` if it is ``user``'s; None otherwise."""

    @abc.abstractmethod
    async def list_conversations(self, user: str, limit: int) -> list[Conversation]:
        """``user``'s conversations, most recently updated first."""

    @abc.abstractmethod
    async def messages(self, cid: str) -> list[Message]:
        """The messages of conversation ``cid`` in the order they were added."""

    @abc.abstractmethod
    async def append_messages(self, cid: str, user: str, turns: Sequence[tuple[str, str]],
                              when: float, *, replace_answer: bool = False) -> bool:
        """Add ``turns`` (role, content) to ``user``'s conversation ``cid`` and mark it
        updated at ``when``, in one transaction; False (nothing written) when not theirs.
        With ``replace_answer``, first delete its last message if that is an assistant's
        (/chat's Regenerate: the new answer takes the old one's place)."""

    @abc.abstractmethod
    async def delete_conversation(self, cid: str, user: str) -> bool:
        """Delete ``user``'s conversation ``cid`` and its messages; False when not theirs."""

    @abc.abstractmethod
    async def purge_conversations(self, retention: Mapping[str, float], now: float) -> int:
        """Delete, with their messages, conversations last updated more than
        ``retention[project]`` seconds before ``now``, and every conversation of a project
        absent from ``retention``; how many. The text must not stay readable in the
        database's files (SQLite: checkpoint the WAL after deleting)."""

    @abc.abstractmethod
    async def usage_series(self, by: Literal["project", "key", "model"], since: float,
                           step: float, projects: Sequence[str] | None) -> list[Bucket]:
        """Usage rows from ``since`` on in slots of ``step`` seconds, summed per slot and
        group (project, key id or model), ordered by slot then group; rows without the
        group are left out, and only rows of ``projects`` are counted when given."""

    @abc.abstractmethod
    async def user_totals(self, user: str) -> tuple[int, int, float]:
        """(requests, tokens, USD) of the usage rows that name page user ``user``."""


_PG_SCHEMES = ("postgresql", "postgres")
_URL_CHARS = re.compile(r"^[A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=%-]+$")


@dataclass(frozen=True)
class Target:
    """Where a store lives: a SQLite path or a PostgreSQL DSN (password from a file)."""

    kind: Literal["sqlite", "postgresql"]
    path: Path | None = None
    dsn: str | None = None  # with the password, when there is one: never print it
    display: str = ""


def target_of(url: str | None, path: str, password_file: str | None = None) -> Target:
    """Parse ``store.url`` (or fall back to the SQLite ``path``); ValueError says why not.

    A PostgreSQL URL must not carry a password: it is read from ``password_file``
    (mode 0600, kept out of git) and added here.
    """
    if not url:
        return Target("sqlite", path=Path(path), display=shown_path(Path(path)))
    if not _URL_CHARS.match(url):
        raise ValueError("store.url has characters a URL cannot hold")
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        where = parts.path if not parts.netloc else f"/{parts.netloc}{parts.path}"
        if not where:
            raise ValueError(f"store.url {url!r} names no file: use sqlite:path/to/llmgw.db")
        return Target("sqlite", path=Path(where), display=shown_path(Path(where)))
    if parts.scheme not in _PG_SCHEMES:
        raise ValueError(f"store.url scheme {parts.scheme!r} is not supported: use "
                         "postgresql://user@host:5432/database or sqlite:///path")
    if parts.password is not None:
        raise ValueError("store.url must not hold a password (it would land in git): put it "
                         "in a file named by store.password_file")
    display = url
    dsn = url
    if password_file:
        try:
            password = Path(password_file).read_text().strip()
        except OSError as exc:
            raise ValueError(f"cannot read store.password_file {password_file}: "
                             f"{exc.strerror}") from None
        userinfo = quote(parts.username or "", safe="") + ":" + quote(password, safe="")
        host = parts.netloc.rpartition("@")[2]
        dsn = parts._replace(netloc=f"{userinfo}@{host}").geturl()
    return Target("postgresql", dsn=dsn, display=display)


def shown_path(path: Path) -> str:
    """A SQLite path for messages: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except (ValueError, OSError):
        return str(path)


async def open_target(target: Target) -> Store:
    """Open (migrating as needed) the store at ``target``; StoreError when it cannot."""
    if target.kind == "sqlite":
        from llmgw.store import sqlitestores

        assert target.path is not None
        return await sqlitestores.SQLiteStore.open(target.path)
    from llmgw.store import postgresstores

    assert target.dsn is not None
    return await postgresstores.PostgresStore.open(target.dsn, target.display)


async def open_store(settings: StoreSettings) -> Store:
    """The cluster's store, from ``cluster.store`` (paths already anchored by loading)."""
    try:
        target = target_of(settings.url, settings.path, settings.password_file)
    except ValueError as exc:
        raise StoreError(str(exc)) from None
    return await open_target(target)
