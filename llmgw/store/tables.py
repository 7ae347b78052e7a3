"""Every table of the store, and what ``llmgw store migrate`` does with it.

:data:`COPIED` lists the tables that hold the cluster's state, in the order a
copy writes them (a parent before its children), each with what a **top-up**
(a second run from the same source) does:

* ``append`` — append-only tables with an integer id: the rows past the last id
  copied from this source are appended (with their own ids when the target wrote
  none of its own meanwhile, else with the target's next ones);
* ``child`` — rows that belong to an appended parent (``apply_changes`` to
  ``applies``): they follow their parent, renumbered with it;
* ``missing`` — tables keyed by a name or digest: rows the target lacks are
  inserted; a row the target has stays as the target has it, except ``sticky``
  columns, which take the source's value where the target's is NULL (a key
  revoked on either side stays revoked);
* ``derived`` — running totals kept with usage rows (:mod:`llmgw.store.spends`):
  copied as they are the first time, then kept by the usage rows a top-up
  appends, through the same code that keeps them on every insert.

A top-up checks that every source row is on the target: by key for ``missing``
tables, by count for tables whose rows are ``never_deleted`` (usage, the journal);
the audit log and messages are deleted by retention, so there it cannot.

:data:`NOT_COPIED` lists every other table with the reason. A table in a
freshly migrated store that is in neither is refused by a copy and fails
``tests/store/test_copies_guard.py``: a migration that adds a table must say
here what becomes of it.

The rest is pure: the column kinds both databases map to, the values a row
takes on the target, and a checksum per table that reads the same on SQLite
and PostgreSQL (:class:`Checksum`).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

Policy = Literal["append", "child", "missing", "derived"]
Kind = Literal["int", "float", "bool", "text", "time", "bytes", "json"]


@dataclass(frozen=True)
class Copied:
    name: str
    policy: Policy
    id: str | None = None  # append: the integer id the marks count
    parent: tuple[str, str, str] | None = None  # (column, table, its key): a child's parent
    sticky: tuple[str, ...] = ()  # missing: columns a top-up fills where the target's is NULL
    # No code path deletes its rows: after a top-up the target holds at least the source's.
    never_deleted: bool = False


COPIED: tuple[Copied, ...] = (
    Copied("keys", "missing", sticky=("revoked_at",)),
    Copied("users", "missing"),
    Copied("sessions", "missing"),
    Copied("conversations", "missing"),
    Copied("messages", "append", id="id", parent=("conversation", "conversations", "id")),
    Copied("applies", "append", id="id", never_deleted=True),
    Copied("apply_changes", "child", parent=("apply_id", "applies", "id"), never_deleted=True),
    Copied("holds", "missing"),
    Copied("notes", "missing"),
    Copied("audit_log", "append", id="id"),
    Copied("rate_counts", "missing"),
    Copied("usage", "append", id="id", never_deleted=True),
    Copied("project_spend", "derived"),
    Copied("spend_buckets", "derived"),
)

NOT_COPIED: dict[str, str] = {
    "leases": "the leader lease: each store elects its own leader, from epoch 1",
    "published_routes": "the routing table: the target's leader publishes its own",
    "published_summaries": "the admin summary: the target's leader publishes its own",
    "router_signals": "what live routers saw in the last seconds: they rewrite it",
    "reservations": "requests in flight on the source's routers: they settle there and "
                    "their usage rows come with a top-up; copied, they would be billed twice",
    "router_heartbeats": "the source's live routers, which own those reservations",
    "store_copies": "markers of copies into this store, not the source's",
    "llmgw_schema": "the schema version (PostgreSQL): each store keeps its own",
}

BY_NAME = {t.name: t for t in COPIED}


def unlisted(live: set[str]) -> list[str]:
    """Tables of a live schema that are neither copied nor listed as not copied."""
    return sorted(t for t in live - set(BY_NAME) - set(NOT_COPIED) if not t.startswith("sqlite_"))


# -- column kinds ------------------------------------------------------------------------
_SQLITE_KINDS: dict[str, Kind] = {"INTEGER": "int", "REAL": "float", "TEXT": "text",
                                  "BOOLEAN": "bool", "BLOB": "bytes"}
_POSTGRES_KINDS: dict[str, Kind] = {
    "integer": "int", "bigint": "int", "smallint": "int", "double precision": "float",
    "real": "float", "numeric": "float", "boolean": "bool", "text": "text",
    "character varying": "text", "timestamp with time zone": "time",
    "timestamp without time zone": "time", "bytea": "bytes", "json": "json", "jsonb": "json",
}
# A column stored one way on SQLite and a richer way on PostgreSQL takes the richer kind.
_RICHER: dict[frozenset[str], Kind] = {frozenset({"int", "bool"}): "bool",
                                       frozenset({"float", "time"}): "time",
                                       frozenset({"text", "json"}): "json"}


def sqlite_kind(declared: str) -> Kind:
    return _SQLITE_KINDS.get(declared.upper(), "text")


def postgres_kind(data_type: str) -> Kind:
    return _POSTGRES_KINDS.get(data_type, "text")


def merged_kind(table: str, column: str, a: Kind, b: Kind) -> Kind:
    """The kind of a column whose two stores declare ``a`` and ``b``; ValueError if they
    cannot hold the same values."""
    if a == b:
        return a
    richer = _RICHER.get(frozenset({a, b}))
    if richer is None:
        raise ValueError(f"column {table}.{column} is {a} on one store and {b} on the other")
    return richer


# -- values ------------------------------------------------------------------------------
class BadValue(ValueError):
    """A source value the target's column cannot hold (SQLite stores anything anywhere)."""


def _seconds(value: Any) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadValue("not a time")
    return float(value)


def stored(value: Any, kind: Kind, flavour: Literal["sqlite", "postgresql"]) -> Any:
    """``value`` as the target's column of ``kind`` takes it; BadValue when it cannot.

    The message names the kind only, never the value: it may be client text.
    """
    if value is None:
        return None
    if kind == "int":
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if not isinstance(value, int):
            raise BadValue("not an integer")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BadValue("not a number")
        return float(value)
    if kind == "bool":
        if isinstance(value, bool):
            truth = value
        elif isinstance(value, int) and value in (0, 1):
            truth = bool(value)
        else:
            raise BadValue("not a boolean")
        return truth if flavour == "postgresql" else int(truth)
    if kind == "time":
        seconds = _seconds(value)
        return datetime.fromtimestamp(seconds, UTC) if flavour == "postgresql" else seconds
    if kind == "bytes":
        if not isinstance(value, bytes | bytearray | memoryview):
            raise BadValue("not bytes")
        return bytes(value)
    if not isinstance(value, str):  # text, json
        raise BadValue("not text")
    return value


def canonical(value: Any, kind: Kind) -> Any:
    """``value`` as the checksum sees it: the same on SQLite and on PostgreSQL."""
    if value is None:
        return None
    try:
        if kind == "bool":
            return bool(value)
        if kind == "int":
            return int(value)
        if kind == "float":
            number = float(value)
            return repr(number) if not math.isfinite(number) else number
        if kind == "time":  # PostgreSQL keeps microseconds
            return round(_seconds(value) * 1_000_000)
        if kind == "bytes":
            return bytes(value).hex()
        if kind == "json":
            return json.dumps(json.loads(value), sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        pass  # what SQLite let in that the kind does not allow: compared as its text
    return value if isinstance(value, str) else f"{type(value).__name__}:{value!r}"


class Checksum:
    """SHA-256 over a table's rows in key order, each row its columns in name order,
    canonical (:func:`canonical`), one JSON array a line."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self.rows = 0

    def add(self, values: list[Any]) -> None:
        self._hash.update(json.dumps(values, separators=(",", ":"), ensure_ascii=False)
                          .encode())
        self._hash.update(b"\n")
        self.rows += 1

    def hexdigest(self) -> str:
        return self._hash.hexdigest()
