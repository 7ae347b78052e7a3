"""Back a whole store up to one file and restore it: ``llmgw store backup|restore``.

A backup is one consistent instant of every table, taken while routers keep
writing usage:

* **SQLite**: the online backup API (``sqlite3.Connection.backup``), copied a
  step of :data:`PAGES_PER_STEP` pages at a time. The source connection holds
  one read transaction across every step, so each step reads the same WAL
  snapshot: writers go on committing (WAL readers never block them), and the
  copy neither restarts nor mixes two instants. The file written is a plain
  SQLite database (journal mode DELETE: one self-contained file).
* **PostgreSQL**: ``pg_dump --format=custom`` under a snapshot exported by a
  ``REPEATABLE READ`` transaction of ours, in which the rows are counted too:
  the counts printed are the dump's own instant.

The file is written under a scratch name with mode 0600 (it holds key digests
and password hashes) and renamed into place once complete, so a backup that
failed half-way never lies under the name asked for.

A restore refuses a target that holds rows (unless ``force``), a target a
daemon or router is using (whatever ``force``: its lease or heartbeat is
current), a backup of the other kind of store, and a backup written by a newer
llmgw. SQLite is restored through the backup API in one write transaction of
the target; PostgreSQL by dropping llmgw's tables and functions, then
``pg_restore --single-transaction``: a failure leaves the target empty, never
half-restored. The restored store is then opened, which applies the
migrations a backup of an older llmgw lacks.

PostgreSQL's programs are the newest of ``/usr/lib/postgresql/*/bin`` (Debian),
else the ones on ``PATH``. The password reaches them through a ``PGPASSFILE``
written for the call in a private temporary directory, never on a command
line; their own messages are relayed, never the connection string with it.

Usage::

    snapshot = await backups.backup(target, Path("llmgw.backup"), progress=print)
    restored = await backups.restore(target, Path("llmgw.backup"), force=False)
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import re
import shutil
import sqlite3
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

import asyncpg

from llmgw.store import migrations, stores
from llmgw.store.stores import StoreError, Target

Kind = Literal["sqlite", "postgresql"]
Progress = Callable[[str], None]

PAGES_PER_STEP = 256  # 1 MiB of 4 KiB pages per step of the SQLite backup API
SQLITE_MAGIC = b"SQLite format 3\x00"
PGDUMP_MAGIC = b"PGDMP"
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_KIND_NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}


class BackupError(StoreError):
    """A backup or restore refused or failed; the message names the file or the store."""


@dataclass(frozen=True)
class Snapshot:
    """What a backup holds, or a store holds after a restore: rows per table."""

    kind: Kind
    schema: int
    # table: rows, every table but PostgreSQL's llmgw_schema (-1: in a pg_dump archive,
    # not counted before it is restored)
    counts: dict[str, int]
    size: int = 0  # bytes of the backup file


def known_tables() -> frozenset[str]:
    """Every table llmgw's migrations create (PostgreSQL's ``llmgw_schema`` too)."""
    made = re.findall(
        r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)",
        "\n".join(m.postgres + m.sqlite for m in migrations.MIGRATIONS),
    )
    return frozenset([*made, "llmgw_schema"])


# -- what a file is ---------------------------------------------------------------------


def kind_of(file: Path) -> Kind:
    """The kind of store ``file`` is a backup of, from its first bytes; BackupError when
    it is missing, unreadable or neither kind."""
    try:
        with file.open("rb") as handle:
            head = handle.read(len(SQLITE_MAGIC))
    except IsADirectoryError:
        raise BackupError(f"{file}: is a directory, not a backup file") from None
    except FileNotFoundError:
        raise BackupError(f"{file}: no such file") from None
    except OSError as exc:
        raise BackupError(f"{file}: cannot read it: {exc.strerror or exc}") from None
    if head == SQLITE_MAGIC:
        return "sqlite"
    if head.startswith(PGDUMP_MAGIC):
        return "postgresql"
    raise BackupError(
        f"{file}: not an llmgw backup (neither an SQLite database nor a pg_dump archive)"
    )


def _check_schema(file: Path, found: int | None) -> int:
    if found is None or found < 1:
        raise BackupError(f"{file}: not an llmgw backup (no llmgw schema version in it)")
    if found > migrations.LATEST:
        raise BackupError(
            f"{file}: written by a newer llmgw (schema version {found}; this "
            f"llmgw knows up to {migrations.LATEST}): restore it with that one"
        )
    return found


def _quoted(table: str) -> str:
    return '"' + table + '"'  # names are checked against _NAME first


# -- SQLite -----------------------------------------------------------------------------


@contextlib.contextmanager
def _sqlite(path: Path, *, readonly: bool) -> Iterator[sqlite3.Connection]:
    uri = f"{path.resolve().as_uri()}?mode=ro" if readonly else str(path)
    old_umask = os.umask(0o077)  # journal and WAL files of a copy are as private as it is
    try:
        conn = sqlite3.connect(uri, uri=readonly, isolation_level=None, check_same_thread=False)
    finally:
        os.umask(old_umask)
    try:
        conn.execute("PRAGMA busy_timeout = 5000")
        yield conn
    finally:
        conn.close()


def _sqlite_tables(conn: sqlite3.Connection, where: str) -> list[str]:
    names = [
        row[0]
        for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "ORDER BY name"
        )
    ]
    odd = [n for n in names if not _NAME.match(n)]
    if odd:
        raise BackupError(f"{where}: not an llmgw store (table {odd[0]!r})")
    return names


def _sqlite_counts(conn: sqlite3.Connection, where: str) -> dict[str, int]:
    return {
        t: int(conn.execute(f"SELECT count(*) FROM {_quoted(t)}").fetchone()[0])
        for t in _sqlite_tables(conn, where)
    }


def _sqlite_read(path: Path, where: str) -> tuple[int, dict[str, int]]:
    """The schema version and rows per table of the SQLite database at ``path``."""
    try:
        with _sqlite(path, readonly=True) as conn:
            counts = _sqlite_counts(conn, where)
            return int(conn.execute("PRAGMA user_version").fetchone()[0]), counts
    except sqlite3.DatabaseError as exc:
        raise BackupError(f"{where}: not a readable SQLite database ({exc})") from None


def _sqlite_snapshot(path: Path, where: str) -> Snapshot:
    """What the SQLite backup at ``path`` holds; BackupError when it is not llmgw's."""
    schema, counts = _sqlite_read(path, where)
    if "keys" not in counts or "usage" not in counts:
        raise BackupError(f"{where}: not an llmgw backup (no keys or usage table)")
    return Snapshot("sqlite", _check_schema(Path(where), schema), counts, path.stat().st_size)


def _pages(what: str, progress: Progress) -> Callable[[int, int, int], None]:
    """The backup API's progress callback: a line each tenth of the pages, and the last."""
    shown = [-1]

    def report(_status: int, remaining: int, total: int) -> None:
        done = total - remaining
        tenth = 10 * done // total if total else 10
        if tenth > shown[0]:
            shown[0] = tenth
            progress(f"{what}: {100 * done // max(total, 1)}% ({done} of {total} pages)")

    return report


def _sqlite_backup(source: Path, partial: Path, shown: str, progress: Progress) -> None:
    if not source.is_file():
        raise BackupError(f"{shown}: no store there: nothing to back up")
    try:
        with _sqlite(source, readonly=True) as conn, _sqlite(partial, readonly=False) as copy:
            # One read transaction across every step: the same snapshot throughout, while
            # writers append to the WAL behind it (SQLite restarts a backup whose source
            # changed between steps only when each step opens a transaction of its own).
            conn.execute("BEGIN")
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            conn.backup(
                copy, pages=PAGES_PER_STEP, progress=_pages(f"backing up {shown}", progress)
            )
            conn.execute("COMMIT")
            copy.execute("PRAGMA journal_mode = DELETE")  # one file, no -wal beside it
    except sqlite3.DatabaseError as exc:
        raise BackupError(f"{shown}: cannot back it up: {exc}") from None


def _sqlite_restore(file: Path, target: Path, shown: str, progress: Progress) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with _sqlite(file, readonly=True) as backup, _sqlite(target, readonly=False) as conn:
            # The target is written in one transaction held across every step: an
            # interrupted restore leaves it as it was.
            backup.backup(
                conn, pages=PAGES_PER_STEP, progress=_pages(f"restoring into {shown}", progress)
            )
            conn.execute("PRAGMA journal_mode = WAL")
    except sqlite3.DatabaseError as exc:
        raise BackupError(f"{shown}: cannot restore into it: {exc}") from None
    target.chmod(0o600)


def _sqlite_writers(path: Path, now: float) -> list[str]:
    try:
        with _sqlite(path, readonly=True) as conn:
            tables = set(_sqlite_tables(conn, str(path)))
            found = []
            if "leases" in tables:
                found += [
                    f"{holder} holds the {name} lease for {until - now:.0f} s more"
                    for name, holder, until in conn.execute(
                        "SELECT name, holder, expires_at FROM leases WHERE expires_at > ?", (now,)
                    )
                ]
            if "router_heartbeats" in tables:
                found += [
                    f"router {router} beat {until - now:.0f} s ahead"
                    for router, until in conn.execute(
                        "SELECT router, expires_at FROM router_heartbeats WHERE expires_at > ?",
                        (now,),
                    )
                ]
            return found
    except sqlite3.DatabaseError as exc:
        raise BackupError(f"{path}: not a readable SQLite database ({exc})") from None


# -- PostgreSQL -------------------------------------------------------------------------


def program(name: str) -> str:
    """The path of PostgreSQL's ``name`` (pg_dump, pg_restore): the newest Debian one,
    else the one on PATH."""

    def major(path: str) -> int:
        version = Path(path).parent.parent.name
        return int(version) if version.isdigit() else 0

    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=major)
    if found:
        return found[-1]
    on_path = shutil.which(name)
    if on_path:
        return on_path
    raise BackupError(
        f"{name} not found (in /usr/lib/postgresql/*/bin or on PATH): install "
        "PostgreSQL's client programs (Debian: apt install postgresql-client)"
    )


@contextlib.contextmanager
def _client_env(target: Target) -> Iterator[dict[str, str]]:
    """The environment for pg_dump/pg_restore: the password in a PGPASSFILE of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("PGPASSWORD", "PGPASSFILE")}
    env["PGCONNECT_TIMEOUT"] = "10"
    password = unquote(urlsplit(target.dsn or "").password or "")
    with tempfile.TemporaryDirectory(prefix="llmgw-pgpass-") as private:
        if password:
            escaped = password.replace("\\", "\\\\").replace(":", "\\:")
            passfile = Path(private) / "pgpass"
            fd = os.open(passfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(f"*:*:*:*:{escaped}\n")
            env["PGPASSFILE"] = str(passfile)
        yield env


async def _client(
    argv: list[str], env: dict[str, str], progress: Progress, lines: Callable[[str], str | None]
) -> None:
    """Run a PostgreSQL client program, turning its ``--verbose`` lines into progress;
    BackupError with its last messages when it fails."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    said: list[str] = []
    try:
        assert proc.stderr is not None
        async for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            shown = lines(line)
            if shown:
                progress(shown)
            elif line:
                said = [*said[-4:], line]
        code = await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if code != 0:
        errors = [s for s in said if "error" in s.lower()] or said
        raise BackupError(
            f"{Path(argv[0]).name} failed (exit {code}): "
            + (" / ".join(errors[-2:]) or "no message")
        )


@contextlib.asynccontextmanager
async def _pg(target: Target) -> AsyncIterator[asyncpg.Connection]:
    try:
        conn = await asyncpg.connect(target.dsn, timeout=10)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise BackupError(f"cannot connect to the store {target.display}: {exc}") from None
    try:
        yield conn
    except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise BackupError(f"{target.display}: {exc}") from None
    finally:
        await conn.close()


async def _pg_tables(conn: asyncpg.Connection, where: str) -> list[str]:
    names = [
        r[0]
        for r in await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1"
        )
    ]
    odd = [n for n in names if not _NAME.match(n)]
    if odd:
        raise BackupError(f"{where}: holds a table llmgw does not make ({odd[0]!r})")
    return names


async def _pg_counts(conn: asyncpg.Connection, where: str) -> tuple[int, dict[str, int]]:
    tables = await _pg_tables(conn, where)
    counts = {
        t: int(await conn.fetchval(f"SELECT count(*) FROM {_quoted(t)}"))
        for t in tables
        if t != "llmgw_schema"
    }
    schema = (
        await conn.fetchval("SELECT version FROM llmgw_schema") if "llmgw_schema" in tables else 0
    )
    return int(schema or 0), counts


def _dumping(total: int) -> Callable[[str], str | None]:
    done = [0]

    def line(text: str) -> str | None:
        found = re.search(r'dumping contents of table "(?:[^"]*\.)?([^"]+)"', text)
        if not found:
            return None
        done[0] += 1
        return f"dumping table {found.group(1)} ({done[0]} of {total})"

    return line


def _restoring(total: int) -> Callable[[str], str | None]:
    done = [0]

    def line(text: str) -> str | None:
        found = re.search(r'processing data for table "(?:[^"]*\.)?([^"]+)"', text)
        if not found:
            return None
        done[0] += 1
        return f"restoring table {found.group(1)} ({done[0]} of {total})"

    return line


async def _pg_backup(target: Target, partial: Path, progress: Progress) -> Snapshot:
    async with _pg(target) as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        # pg_dump reads under this very snapshot, so the counts are the dump's.
        snapshot = await conn.fetchval("SELECT pg_export_snapshot()")
        schema, counts = await _pg_counts(conn, target.display)
        if "keys" not in counts:
            raise BackupError(f"{target.display}: not an llmgw store (no keys table)")
        progress(f"backing up {target.display}: {len(counts)} tables as of one snapshot")
        with _client_env(target) as env:
            await _client(
                [
                    program("pg_dump"),
                    "--format=custom",
                    f"--snapshot={snapshot}",
                    f"--file={partial}",
                    "--verbose",
                    "--no-password",
                    f"--dbname={target.display}",
                ],
                env,
                progress,
                _dumping(len(counts) + 1),
            )
    return Snapshot("postgresql", schema, counts)


async def _pg_restore_output(file: Path, *options: str) -> str:
    """What ``pg_restore OPTIONS FILE`` prints without a database (--list, a table's data);
    BackupError when the archive cannot be read."""
    with _client_env(Target("postgresql")) as env:
        proc = await asyncio.create_subprocess_exec(
            program("pg_restore"),
            *options,
            str(file),
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
    if proc.returncode != 0:
        said = err.decode(errors="replace").strip().splitlines()
        raise BackupError(
            f"{file}: not a readable pg_dump archive" + (f" ({said[-1]})" if said else "")
        )
    return out.decode(errors="replace")


async def _pg_archive(file: Path) -> tuple[int, list[str]]:
    """The llmgw schema version a pg_dump archive holds and its tables with data;
    BackupError when it is not llmgw's."""
    listing = await _pg_restore_output(file, "--list")
    tables = re.findall(r"^\d+; \d+ \d+ TABLE DATA \S+ (\S+) ", listing, flags=re.M)
    if "keys" not in tables or "llmgw_schema" not in tables:
        raise BackupError(
            f"{file}: a pg_dump archive, but not of an llmgw store (no keys or llmgw_schema table)"
        )
    data = await _pg_restore_output(file, "--data-only", "--table=llmgw_schema", "--file=-")
    copied = re.search(r"^COPY \S*llmgw_schema \(version\) FROM stdin;\n(\d+)\n", data, flags=re.M)
    return _check_schema(file, int(copied.group(1)) if copied else None), tables


async def _pg_writers(conn: asyncpg.Connection, tables: set[str]) -> list[str]:
    found = []
    if "leases" in tables:
        found += [
            f"{r['holder']} holds the {r['name']} lease for {r['left']:.0f} s more"
            for r in await conn.fetch(
                "SELECT name, holder, EXTRACT(EPOCH FROM expires_at - now())::float8 "
                "AS left FROM leases WHERE expires_at > now()"
            )
        ]
    if "router_heartbeats" in tables:
        found += [
            f"router {r['router']} beat {r['left']:.0f} s ahead"
            for r in await conn.fetch(
                "SELECT router, EXTRACT(EPOCH FROM expires_at - now())::float8 "
                "AS left FROM router_heartbeats WHERE expires_at > now()"
            )
        ]
    return found


async def _pg_prepare(target: Target, force: bool) -> None:
    """Refuse a target in use or holding rows (unless ``force``); then drop llmgw's
    tables and functions in one transaction, so pg_restore creates them afresh."""
    async with _pg(target) as conn:
        tables = set(await _pg_tables(conn, target.display))
        _refuse(
            target.display,
            await _pg_writers(conn, tables),
            (await _pg_counts(conn, target.display))[1],
            force,
        )
        async with conn.transaction():
            for table in sorted(tables):
                await conn.execute(f"DROP TABLE IF EXISTS {_quoted(table)} CASCADE")
            for (function,) in await conn.fetch(
                "SELECT p.oid::regprocedure::text FROM pg_proc p "
                "WHERE p.pronamespace = current_schema()::regnamespace "
                "AND p.proname LIKE 'llmgw\\_%'"
            ):
                await conn.execute(f"DROP FUNCTION IF EXISTS {function}")


# -- both -------------------------------------------------------------------------------


def _refuse(where: str, writers: list[str], counts: dict[str, int], force: bool) -> None:
    foreign = sorted(set(counts) - known_tables())
    if foreign:
        raise BackupError(
            f"{where}: holds tables llmgw does not make "
            f"({', '.join(foreign)}): restore into llmgw's own database"
        )
    if writers:
        raise BackupError(
            f"{where} is in use ({'; '.join(writers)}): stop the daemon and "
            "routers before restoring (--force does not override this)"
        )
    held = {t: n for t, n in counts.items() if n}
    if held and not force:
        rows = ", ".join(f"{t} {n}" for t, n in sorted(held.items()))
        raise BackupError(
            f"{where} is not empty ({rows}): restore into an empty store, "
            "or pass --force to replace everything in it"
        )


def _scratch(file: Path) -> Path:
    """A private scratch file beside ``file`` to write the backup into (mode 0600)."""
    if file.exists() or file.is_symlink():
        raise BackupError(f"{file}: exists; remove it or name another file")
    if not file.parent.is_dir():
        raise BackupError(f"{file}: no directory {file.parent} to write it in")
    partial = file.with_name(f".{file.name}.partial")
    partial.unlink(missing_ok=True)  # an interrupted run's leftover, by its name ours
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise BackupError(f"{file}: cannot write it: {exc.strerror or exc}") from None
    os.fchmod(fd, 0o600)
    os.close(fd)
    return partial


async def backup(target: Target, file: Path, progress: Progress = lambda _: None) -> Snapshot:
    """Write the store at ``target`` to ``file`` (which must not exist); see the module's
    contract. Returns the rows per table the file holds."""
    partial = _scratch(file)
    try:
        if target.kind == "sqlite":
            assert target.path is not None
            await asyncio.to_thread(_sqlite_backup, target.path, partial, target.display, progress)
            snapshot = _sqlite_snapshot(partial, str(file))
        else:
            snapshot = await _pg_backup(target, partial, progress)
        with partial.open("rb") as handle:
            os.fsync(handle.fileno())
        os.replace(partial, file)
    finally:
        partial.unlink(missing_ok=True)
    return Snapshot(snapshot.kind, snapshot.schema, snapshot.counts, file.stat().st_size)


async def inspect(file: Path) -> Snapshot:
    """What kind of backup ``file`` is and its schema version (SQLite: its rows too);
    BackupError when it is not one llmgw can restore."""
    kind = kind_of(file)
    if kind == "sqlite":
        return _sqlite_snapshot(file, str(file))
    schema, tables = await _pg_archive(file)
    return Snapshot("postgresql", schema, dict.fromkeys(tables, -1), file.stat().st_size)


async def counts(target: Target) -> Snapshot:
    """Rows per table of the store at ``target``."""
    if target.kind == "sqlite":
        assert target.path is not None
        return _sqlite_snapshot(target.path, target.display)
    async with _pg(target) as conn:
        schema, found = await _pg_counts(conn, target.display)
    return Snapshot("postgresql", schema, found)


async def restore(
    target: Target, file: Path, force: bool = False, progress: Progress = lambda _: None
) -> Snapshot:
    """Replace the store at ``target`` with backup ``file``; see the module's contract.
    Returns the rows per table of the restored store, migrated to this llmgw's schema."""
    found = await inspect(file)
    if found.kind != target.kind:
        raise BackupError(
            f"{file}: a backup of a {_KIND_NAMES[found.kind]} store, but the cluster's store "
            f"is {_KIND_NAMES[target.kind]} ({target.display}): restore it into a "
            f"{_KIND_NAMES[found.kind]} store, then move it with `llmgw store migrate`"
        )
    progress(f"{file}: a {_KIND_NAMES[found.kind]} backup, schema version {found.schema}")
    if target.kind == "sqlite":
        assert target.path is not None
        if target.path.exists():
            if target.path.resolve() == file.resolve():
                raise BackupError(f"{file}: is the cluster's store itself")
            _, existing = _sqlite_read(target.path, target.display)
            _refuse(target.display, _sqlite_writers(target.path, time.time()), existing, force)
        await asyncio.to_thread(_sqlite_restore, file, target.path, target.display, progress)
    else:
        await _pg_prepare(target, force)
        with _client_env(target) as env:
            await _client(
                [
                    program("pg_restore"),
                    "--single-transaction",
                    "--exit-on-error",
                    "--no-owner",
                    "--no-privileges",
                    "--verbose",
                    "--no-password",
                    f"--dbname={target.display}",
                    str(file),
                ],
                env,
                progress,
                _restoring(len(found.counts)),
            )
    store = await stores.open_target(target)  # the migrations an older backup lacks
    await store.close()
    return await counts(target)
