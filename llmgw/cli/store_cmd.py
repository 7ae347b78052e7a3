"""``llmgw store``: the store behind keys, usage and the lease.

``llmgw store migrate --to URL`` copies every table of the cluster's store
(normally the SQLite file) into another one (normally PostgreSQL) or back, in one
transaction, then checks each table on both sides; see :mod:`llmgw.store.copies`
for when a target is refused and :mod:`llmgw.store.tables` for what travels.
``llmgw store version`` prints the schema version of the cluster's store.
``llmgw store backup FILE`` and ``llmgw store restore FILE`` write the whole store
to one file and back (:mod:`llmgw.store.backups`; docs/backup.md).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from pydantic import ValidationError

from llmgw.cli import clusters
from llmgw.cli.errors import UserError
from llmgw.spec.models import StoreSettings
from llmgw.spec.quantities import count
from llmgw.store import backups, copies, migrations, stores
from llmgw.store.stores import StoreError, Target


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "store", help="move the whole store to PostgreSQL or back; show its schema",
        description="The store holds API keys (hashed), usage rows and the leader lease: "
        "SQLite by default, PostgreSQL for several routers and a standby (docs/ha.md).",
    )
    commands = parser.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    migrate = commands.add_parser(
        "migrate", help="copy the whole store into another one (an empty one)",
        description="Copy every table of the cluster's store into the store at --to "
        "(SQLite to PostgreSQL or back): keys, usage, users, sessions, conversations, the "
        "apply journal, holds, the audit log, rate-limit counters and spend totals, in one "
        "transaction of the target, then compare row counts and a SHA-256 per table on "
        "both sides (exit 1 when they differ). Not copied: the leader lease, published "
        "routes and summaries, router signals and heartbeats, reservations in flight. "
        "The target must be empty, or have been filled from this same store before (a "
        "top-up: the rows written since). Keys and logins keep working: they travel "
        "hashed, as stored. Then set cluster.store.url to the target.",
    )
    clusters.add_cluster_flag(migrate)
    migrate.add_argument("--to", required=True, metavar="URL",
                         help="postgresql://user@host:5432/database (no password in it), or "
                         "sqlite:PATH")
    migrate.add_argument("--password-file", metavar="FILE",
                         help="file holding the target's password")
    migrate.add_argument("--from", dest="source", metavar="URL",
                         help="copy from this store instead of the cluster's (sqlite:PATH: "
                         "after switching cluster.store.url, to copy what the old store got "
                         "meanwhile)")
    migrate.add_argument("--from-password-file", metavar="FILE",
                         help="file holding the --from store's password (PostgreSQL)")
    migrate.set_defaults(handler=run_migrate)
    version = commands.add_parser("version", help="schema version of the cluster's store")
    clusters.add_cluster_flag(version)
    version.set_defaults(handler=run_version)
    register_backups(commands)


def _target(url: str, password_file: str | None, flag: str = "--to") -> Target:
    try:
        StoreSettings(url=url)  # the same checks as in a cluster file
    except ValidationError as exc:
        raise UserError(f"{flag}: {exc.errors()[0]['msg']}") from None
    try:
        return stores.target_of(url, "", password_file)
    except ValueError as exc:
        raise UserError(f"{flag}: {exc}") from None


def run_migrate(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    target = _target(args.to, args.password_file)
    settings = cluster.cluster.store
    try:
        source_target = (stores.target_of(settings.url, settings.path, settings.password_file)
                         if args.source is None else _target(args.source, args.from_password_file,
                                                               "--from"))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if args.source and source_target.path is not None and not source_target.path.is_file():
        raise UserError(f"no store at {source_target.display}: nothing to copy (opening it "
                        "would make an empty one)")
    source_name = (f"sqlite:{source_target.path.resolve()}" if source_target.path
                   else source_target.display)
    if (target.path and source_target.path and target.path.resolve() ==
            source_target.path.resolve()) or (target.display == source_target.display):
        raise UserError("--to names the store copied from; give another database")

    async def migrate() -> copies.CopyReport:
        source = await stores.open_target(source_target)
        try:
            destination = await stores.open_target(target)
            try:
                return await copies.copy(source, destination, source_name,
                                         progress=lambda line: print(line, file=sys.stderr,
                                                                     flush=True))
            finally:
                await destination.close()
        finally:
            await source.close()

    try:
        report = asyncio.run(migrate())
    except copies.CopyMismatch as exc:
        print("\n".join(copies.lines(exc.report)))
        raise UserError(f"{exc}; do not switch to it") from None
    except (StoreError, migrations.SchemaTooNew) as exc:
        raise UserError(str(exc)) from None
    print("\n".join(copies.lines(report)))
    what = "topped up" if report.top_up else "copied"
    other = sum(c.copied for c in report.checks if c.name not in ("keys", "usage"))
    print(f"{what} {count(report.copied('keys'), 'key')}, "
          f"{count(report.copied('usage'), 'usage row')} and {count(other, 'other row')} "
          f"from {source_target.display} to {target.display}")
    print("every source row is on the target" if report.top_up else
          "every table checks the same on both sides")
    if not report.top_up:
        setting = ("set `store: {url: " + target.display + ", password_file: ...}`"
                   if target.kind == "postgresql" else
                   f"point `store.path` at {target.display} (and drop store.url)")
        print(f"next: {setting} in the cluster file; run this again afterwards to copy rows "
              "written meanwhile")
    return 0


def run_version(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)

    async def version() -> tuple[str, int]:
        store = await stores.open_store(cluster.cluster.store)
        try:
            return store.where, await store.schema_version()
        finally:
            await store.close()

    try:
        where, found = asyncio.run(version())
    except (StoreError, migrations.SchemaTooNew) as exc:
        raise UserError(str(exc)) from None
    print(f"{where}: schema version {found} (this llmgw: {migrations.LATEST})")
    return 0


# -- backup and restore (llmgw.store.backups) --------------------------------------------


def register_backups(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    backup = commands.add_parser(
        "backup", help="write the whole store to one file, while routers keep writing",
        description="Write every table of the cluster's store, as of one instant, to FILE "
        "(mode 0600: it holds key digests and password hashes). SQLite: the online backup "
        "API; PostgreSQL: pg_dump --format=custom. Routers and the daemon may keep running.",
    )
    clusters.add_cluster_flag(backup)
    backup.add_argument("file", metavar="FILE", type=Path, help="the backup to write (new)")
    backup.set_defaults(handler=run_backup)
    restore = commands.add_parser(
        "restore", help="replace the store with a backup (stop the daemon first)",
        description="Restore FILE, written by `llmgw store backup`, into the cluster's store: "
        "a store of the same kind, empty unless --force, and used by no daemon or router. "
        "Prints the rows of each table restored.",
    )
    clusters.add_cluster_flag(restore)
    restore.add_argument("file", metavar="FILE", type=Path, help="a backup of this store's kind")
    restore.add_argument("--force", action="store_true",
                         help="replace whatever the store holds")
    restore.set_defaults(handler=run_restore)


def _cluster_target(args: argparse.Namespace) -> Target:
    settings = clusters.load(args.cluster).cluster.store
    try:
        return stores.target_of(settings.url, settings.path, settings.password_file)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _table(snapshot: backups.Snapshot) -> list[str]:
    width = max([len("table"), *map(len, snapshot.counts)])
    return [f"  {'table':<{width}}  rows",
            *(f"  {name:<{width}}  {rows}" for name, rows in sorted(snapshot.counts.items()))]


def _size(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 2**10:.1f} KiB"


def run_backup(args: argparse.Namespace) -> int:
    target = _cluster_target(args)
    try:
        snapshot = asyncio.run(backups.backup(target, args.file, progress=_progress))
    except (StoreError, migrations.SchemaTooNew) as exc:
        raise UserError(str(exc)) from None
    print(f"backed up {target.display} to {args.file} ({_size(snapshot.size)}, mode 0600, "
          f"schema version {snapshot.schema}):")
    print("\n".join(_table(snapshot)))
    return 0


def run_restore(args: argparse.Namespace) -> int:
    target = _cluster_target(args)
    try:
        snapshot = asyncio.run(backups.restore(target, args.file, force=args.force,
                                               progress=_progress))
    except (StoreError, migrations.SchemaTooNew) as exc:
        raise UserError(str(exc)) from None
    print(f"restored {args.file} into {target.display} (schema version {snapshot.schema}):")
    print("\n".join(_table(snapshot)))
    print("next: start the daemon; keys work as before (they are restored hashed, as stored)")
    return 0
