"""Whole tables in and out of a store, for ``llmgw store migrate`` (:mod:`llmgw.store.copies`).

:class:`TableMethods` is that part of :class:`~llmgw.store.stores.Store`: the live
schema (:meth:`~TableMethods.shapes`: every table, its columns' kinds and its
primary key), a **reader** over one consistent snapshot (SQLite: one read
transaction, which WAL keeps stable while a daemon writes; PostgreSQL: one
``REPEATABLE READ`` read-only transaction), and a **writer** that is one
transaction: everything it wrote is committed when its block ends, and nothing
when the block raises.

Rows come in key order, compared byte by byte on both databases (PostgreSQL's
text keys ``COLLATE "C"``), so a checksum over them is the same on both.
Table and column names come from the store's own schema and are checked
against :data:`_NAME` all the same before they reach SQL.

This module holds the interface and the SQL of both databases.
"""

from __future__ import annotations

import abc
import json
import re
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import asyncpg

from llmgw.store import spends, tables
from llmgw.store.tables import Kind
from llmgw.store.usages import Record

T = TypeVar("T")
BATCH = 5000
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class Column:
    name: str
    kind: Kind


@dataclass(frozen=True)
class Shape:
    """A table as its store declares it."""

    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]  # the primary key's columns, in order

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)


def _checked(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"table or column name {name[:70]!r} is not an identifier")
    return f'"{name}"'


class TableReader(abc.ABC):
    flavour: Literal["sqlite", "postgresql"]

    @abc.abstractmethod
    def rows(self, shape: Shape, after: tuple[str, int] | None = None,
             batch: int = BATCH) -> AsyncIterator[list[tuple[Any, ...]]]:
        """Batches of ``shape``'s rows in key order, its columns in ``shape`` order;
        ``after=(column, n)``: only rows whose ``column`` is above ``n``."""

    @abc.abstractmethod
    async def count(self, table: str) -> int: ...

    @abc.abstractmethod
    async def largest(self, table: str, column: str) -> int | None:
        """The largest value of an integer column; None when the table is empty."""


class TableWriter(TableReader):
    @abc.abstractmethod
    async def insert(self, shape: Shape, columns: Sequence[str],
                     rows: Sequence[Sequence[Any]], *, missing_only: bool = False,
                     sticky: Sequence[str] = (), returning: str | None = None) -> list[int]:
        """Insert ``rows`` (values for ``columns``). ``missing_only``: rows whose key (or
        another unique column) is taken are skipped, but their ``sticky`` columns are set
        where NULL. ``returning``: one row at a time, the new values of that column."""

    @abc.abstractmethod
    async def clear(self, table: str) -> None: ...

    @abc.abstractmethod
    async def add_spend(self, records: Sequence[Record]) -> None:
        """Add usage records' cost to the running totals (:mod:`llmgw.store.spends`)."""

    @abc.abstractmethod
    async def advance_sequences(self, shapes: Sequence[Shape]) -> None:
        """PostgreSQL: move every serial/identity column's sequence past the largest id,
        so the target's next row does not collide with a copied one (SQLite: nothing to do,
        a rowid is always past the largest)."""

    @abc.abstractmethod
    async def mark(self, source: str, marks: dict[str, int], now: float) -> None:
        """Record in ``store_copies`` how far ``source`` has been copied."""


class TableMethods(abc.ABC):
    """Whole tables, for copies between stores; see the module."""

    @abc.abstractmethod
    async def shapes(self) -> dict[str, Shape]:
        """Every table of the live schema."""

    @abc.abstractmethod
    def reading(self) -> AbstractAsyncContextManager[TableReader]:
        """A reader over one snapshot of the whole store."""

    @abc.abstractmethod
    def writing(self) -> AbstractAsyncContextManager[TableWriter]:
        """A writer: one transaction, committed when the block ends without raising."""

    @abc.abstractmethod
    async def copy_marks(self, source: str) -> dict[str, int] | None:
        """How far ``source`` was copied into this store, per appended table; None: never."""


def _marks(last_usage_id: int, doc: str) -> dict[str, int]:
    marks = {str(k): int(v) for k, v in json.loads(doc or "{}").items()}
    marks.setdefault("usage", int(last_usage_id))  # markers from before migration 16
    return marks


def _insert_sql(shape: Shape, columns: Sequence[str], marks: Sequence[str],
                missing_only: bool, sticky: Sequence[str], returning: str | None) -> str:
    sql = (f"INSERT INTO {_checked(shape.name)} ({', '.join(_checked(c) for c in columns)}) "
           f"VALUES ({', '.join(marks)})")
    if sticky:
        sets = ", ".join(f"{_checked(c)} = COALESCE({_checked(shape.name)}.{_checked(c)}, "
                         f"excluded.{_checked(c)})" for c in sticky)
        sql += f" ON CONFLICT ({', '.join(_checked(k) for k in shape.key)}) DO UPDATE SET {sets}"
    elif missing_only:
        sql += " ON CONFLICT DO NOTHING"
    if returning:
        sql += f" RETURNING {_checked(returning)}"
    return sql


# -- SQLite ------------------------------------------------------------------------------
Runner = Callable[[Callable[[sqlite3.Connection], T]], Awaitable[T]]


async def sqlite_shapes(run: Runner[Any]) -> dict[str, Shape]:
    def read(conn: sqlite3.Connection) -> dict[str, Shape]:
        found = {}
        names = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        for name in names:
            if name.startswith("sqlite_"):
                continue
            info = conn.execute(f"PRAGMA table_info({_checked(name)})").fetchall()
            columns = tuple(Column(r[1], tables.sqlite_kind(r[2])) for r in info)
            key = tuple(r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5]))
            found[name] = Shape(name, columns, key or tuple(c.name for c in columns))
        return found
    result: dict[str, Shape] = await run(read)
    return result


async def sqlite_marks(run: Runner[Any], source: str) -> dict[str, int] | None:
    found = await run(lambda conn: conn.execute(
        "SELECT last_usage_id, marks FROM store_copies WHERE source = ?", (source,)).fetchone())
    return _marks(found[0], found[1]) if found else None


class SQLiteTables(TableWriter):
    """Reads and, inside the transaction the store opened, writes."""

    flavour: Literal["sqlite", "postgresql"] = "sqlite"

    def __init__(self, run: Runner[Any]) -> None:
        self._run = run

    async def rows(self, shape: Shape, after: tuple[str, int] | None = None,
                   batch: int = BATCH) -> AsyncIterator[list[tuple[Any, ...]]]:
        sql = (f"SELECT {', '.join(_checked(c.name) for c in shape.columns)} "
               f"FROM {_checked(shape.name)}")
        args: tuple[Any, ...] = ()
        if after is not None:
            sql += f" WHERE {_checked(after[0])} > ?"
            args = (after[1],)
        sql += f" ORDER BY {', '.join(_checked(k) for k in shape.key)}"
        cursor: sqlite3.Cursor = await self._run(lambda conn: conn.execute(sql, args))
        try:
            while True:
                page: list[tuple[Any, ...]] = await self._run(lambda _: cursor.fetchmany(batch))
                if not page:
                    return
                yield page
        finally:
            await self._run(lambda _: cursor.close())

    async def count(self, table: str) -> int:
        return int(await self._run(lambda conn: conn.execute(
            f"SELECT COUNT(*) FROM {_checked(table)}").fetchone()[0]))

    async def largest(self, table: str, column: str) -> int | None:
        found = await self._run(lambda conn: conn.execute(
            f"SELECT MAX({_checked(column)}) FROM {_checked(table)}").fetchone()[0])
        return None if found is None else int(found)

    async def insert(self, shape: Shape, columns: Sequence[str],
                     rows: Sequence[Sequence[Any]], *, missing_only: bool = False,
                     sticky: Sequence[str] = (), returning: str | None = None) -> list[int]:
        sql = _insert_sql(shape, columns, ["?"] * len(columns), missing_only, sticky, returning)
        if returning is None:
            await self._run(lambda conn: conn.executemany(sql, rows))
            return []

        def one_by_one(conn: sqlite3.Connection) -> list[int]:
            return [int(conn.execute(sql, row).fetchone()[0]) for row in rows]
        made: list[int] = await self._run(one_by_one)
        return made

    async def clear(self, table: str) -> None:
        await self._run(lambda conn: conn.execute(f"DELETE FROM {_checked(table)}"))

    async def add_spend(self, records: Sequence[Record]) -> None:
        await self._run(lambda conn: spends.sqlite_add(conn, records))

    async def advance_sequences(self, shapes: Sequence[Shape]) -> None:
        return None

    async def mark(self, source: str, marks: dict[str, int], now: float) -> None:
        await self._run(lambda conn: conn.execute(
            "INSERT INTO store_copies (source, last_usage_id, copied_at, marks) "
            "VALUES (?, ?, ?, ?) ON CONFLICT (source) DO UPDATE SET last_usage_id = "
            "excluded.last_usage_id, copied_at = excluded.copied_at, marks = excluded.marks",
            (source, marks.get("usage", 0), now, json.dumps(marks, sort_keys=True))))


# -- PostgreSQL --------------------------------------------------------------------------
Connection = asyncpg.pool.PoolConnectionProxy


async def postgres_shapes(conn: Connection) -> dict[str, Shape]:
    columns = await conn.fetch(
        "SELECT c.table_name, c.column_name, c.data_type FROM information_schema.columns c "
        "JOIN information_schema.tables t ON t.table_schema = c.table_schema AND "
        "t.table_name = c.table_name AND t.table_type = 'BASE TABLE' "
        "WHERE c.table_schema = current_schema() ORDER BY c.table_name, c.ordinal_position")
    keys = await conn.fetch(
        "SELECT k.table_name, k.column_name FROM information_schema.table_constraints t "
        "JOIN information_schema.key_column_usage k ON k.constraint_schema = "
        "t.constraint_schema AND k.constraint_name = t.constraint_name "
        "WHERE t.constraint_type = 'PRIMARY KEY' AND t.table_schema = current_schema() "
        "ORDER BY k.table_name, k.ordinal_position")
    by_table: dict[str, list[Column]] = {}
    for r in columns:
        by_table.setdefault(r[0], []).append(Column(r[1], tables.postgres_kind(r[2])))
    key_of: dict[str, list[str]] = {}
    for r in keys:
        key_of.setdefault(r[0], []).append(r[1])
    return {name: Shape(name, tuple(cols), tuple(key_of.get(name) or (c.name for c in cols)))
            for name, cols in by_table.items()}


async def postgres_marks(conn: Connection, source: str) -> dict[str, int] | None:
    found = await conn.fetchrow("SELECT last_usage_id, marks FROM store_copies "
                                "WHERE source = $1", source)
    return _marks(found[0], found[1]) if found else None


class PostgresTables(TableWriter):
    """Reads and writes on one connection, inside the transaction the store opened."""

    flavour: Literal["sqlite", "postgresql"] = "postgresql"

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    async def rows(self, shape: Shape, after: tuple[str, int] | None = None,
                   batch: int = BATCH) -> AsyncIterator[list[tuple[Any, ...]]]:
        order = ", ".join(_checked(k) + (' COLLATE "C"' if shape.column(k).kind == "text"
                                         else "") for k in shape.key)
        sql = (f"SELECT {', '.join(_checked(c.name) for c in shape.columns)} "
               f"FROM {_checked(shape.name)}")
        args: tuple[Any, ...] = ()
        if after is not None:
            sql += f" WHERE {_checked(after[0])} > $1"
            args = (after[1],)
        cursor = await self._conn.cursor(f"{sql} ORDER BY {order}", *args)
        while True:
            page = await cursor.fetch(batch)
            if not page:
                return
            yield [tuple(r) for r in page]

    async def count(self, table: str) -> int:
        return int(await self._conn.fetchval(f"SELECT COUNT(*) FROM {_checked(table)}"))

    async def largest(self, table: str, column: str) -> int | None:
        found = await self._conn.fetchval(
            f"SELECT MAX({_checked(column)}) FROM {_checked(table)}")
        return None if found is None else int(found)

    async def insert(self, shape: Shape, columns: Sequence[str],
                     rows: Sequence[Sequence[Any]], *, missing_only: bool = False,
                     sticky: Sequence[str] = (), returning: str | None = None) -> list[int]:
        if not rows:
            return []
        if not (missing_only or sticky or returning):  # binary COPY: the fast way in
            await self._conn.copy_records_to_table(shape.name, records=rows,
                                                   columns=list(columns))
            return []
        sql = _insert_sql(shape, columns, [f"${i + 1}" for i in range(len(columns))],
                          missing_only, sticky, returning)
        if returning is None:
            await self._conn.executemany(sql, rows)
            return []
        return [int(await self._conn.fetchval(sql, *row)) for row in rows]

    async def clear(self, table: str) -> None:
        await self._conn.execute(f"DELETE FROM {_checked(table)}")

    async def add_spend(self, records: Sequence[Record]) -> None:
        await spends.postgres_add(self._conn, records)

    async def advance_sequences(self, shapes: Sequence[Shape]) -> None:
        for shape in shapes:
            for column in shape.columns:
                sequence = await self._conn.fetchval(
                    "SELECT pg_get_serial_sequence($1, $2)", _checked(shape.name), column.name)
                if sequence is None:
                    continue
                await self._conn.execute(
                    f"SELECT setval($1, COALESCE((SELECT MAX({_checked(column.name)}) FROM "
                    f"{_checked(shape.name)}), 0) + 1, false)", sequence)

    async def mark(self, source: str, marks: dict[str, int], now: float) -> None:
        await self._conn.execute(
            "INSERT INTO store_copies (source, last_usage_id, copied_at, marks) "
            "VALUES ($1, $2, $3, $4) ON CONFLICT (source) DO UPDATE SET last_usage_id = "
            "EXCLUDED.last_usage_id, copied_at = EXCLUDED.copied_at, marks = EXCLUDED.marks",
            source, marks.get("usage", 0), now, json.dumps(marks, sort_keys=True))
