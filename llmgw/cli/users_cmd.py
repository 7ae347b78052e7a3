"""``llmgw users``: people who log in to the pages (/chat, /account, /admin).

Users live in the cluster's store next to API keys. A password is read from
the terminal without echo (asked twice), or from the first line of stdin when
stdin is not a terminal (``printf '%s\\n' "$PW" | llmgw users create alice``);
never from the command line, where ``ps`` and shell history would show it.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import sqlite3
import sys
import time
from pathlib import Path

from llmgw.cli import clusters
from llmgw.cli.errors import UserError
from llmgw.spec.models import Cluster
from llmgw.store import databases, migrations, stores, users


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "users", help="create, list and delete logins for the pages",
        description="People who log in to /chat, /account and /admin. Passwords are stored "
        "as Argon2id hashes. Admins see /admin and may use the admin API.",
    )
    commands = parser.add_subparsers(dest="users_command", metavar="ACTION", required=True)

    create = commands.add_parser("create", help="create a user (password from a prompt or stdin)")
    clusters.add_cluster_flag(create)
    create.add_argument("name", metavar="NAME")
    create.add_argument("--admin", action="store_true", help="may see /admin and the admin API")
    create.add_argument("--project", action="append", default=[], metavar="P",
                        help="a project the user belongs to (repeat for more)")
    create.set_defaults(handler=run_create)

    passwd = commands.add_parser("passwd", help="set a user's password; ends their sessions")
    clusters.add_cluster_flag(passwd)
    passwd.add_argument("name", metavar="NAME")
    passwd.set_defaults(handler=run_passwd)

    listing = commands.add_parser("list", help="list users")
    clusters.add_cluster_flag(listing)
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(handler=run_list)

    delete = commands.add_parser("delete", help="delete a user and end their sessions")
    clusters.add_cluster_flag(delete)
    delete.add_argument("name", metavar="NAME")
    delete.set_defaults(handler=run_delete)


def _open(cluster: Cluster, directory: Path) -> sqlite3.Connection:
    """The SQLite store; users are not on PostgreSQL yet (the pages need SQLite)."""
    settings = cluster.cluster.store
    try:
        target = stores.target_of(settings.url, settings.path, settings.password_file)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if target.kind != "sqlite" or target.path is None:
        raise UserError("users live in the SQLite store for now; with store.url on "
                        "PostgreSQL the pages are off")
    try:
        return databases.connect(target.path)
    except (sqlite3.Error, OSError, migrations.SchemaTooNew) as exc:
        raise UserError(f"cannot open the store {target.path}: {exc}") from None


def read_password(prompt: str = "Password: ") -> str:
    """From the terminal (twice, no echo) or the first line of stdin."""
    if not sys.stdin.isatty():
        line = sys.stdin.readline(users.MAX_PASSWORD + 2)
        return line.rstrip("\r\n")
    first = getpass.getpass(prompt)
    if getpass.getpass("Again: ") != first:
        raise UserError("the passwords differ; nothing changed")
    return first


def run_create(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    try:
        users.check_name(args.name)
    except users.UserError as exc:
        raise UserError(str(exc)) from None
    unknown = [p for p in args.project if p not in cluster.projects]
    if unknown:
        defined = ", ".join(sorted(cluster.projects)) or "none"
        raise UserError(f"project {unknown[0]!r} is not defined in {args.cluster} "
                        f"(projects: {defined}); add it under `projects:` first")
    password = read_password()
    with contextlib.closing(_open(cluster, args.cluster)) as conn:
        try:
            user = users.create(conn, args.name, password, admin=args.admin,
                                projects=args.project)
        except users.UserError as exc:
            raise UserError(str(exc)) from None
    role = "admin" if user.admin else "user"
    projects = ", ".join(user.projects) or "no project"
    print(f"created {role} {user.name} ({projects}); they log in at the router's /login")
    return 0


def run_passwd(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    password = read_password("New password: ")
    with contextlib.closing(_open(cluster, args.cluster)) as conn:
        try:
            changed = users.set_password(conn, args.name, password)
        except users.UserError as exc:
            raise UserError(str(exc)) from None
        if not changed:
            raise UserError(f"no user {args.name!r}; `llmgw users list` shows them")
        conn.execute("DELETE FROM sessions WHERE user_name = ?", (args.name,))
    print(f"changed the password of {args.name}; their sessions ended")
    return 0


def run_list(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    with contextlib.closing(_open(cluster, args.cluster)) as conn:
        listed = users.list_all(conn)
    if args.json:
        print(json.dumps([{"name": u.name, "admin": u.admin, "projects": list(u.projects),
                           "created_at": u.created_at} for u in listed], indent=2))
        return 0
    if not listed:
        print("no users yet; create one with `llmgw users create NAME`", file=sys.stderr)
        return 0
    rows = [("NAME", "ROLE", "PROJECTS", "CREATED")]
    rows += [(u.name, "admin" if u.admin else "user", ", ".join(u.projects) or "-",
              time.strftime("%Y-%m-%d %H:%M", time.localtime(u.created_at))) for u in listed]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def run_delete(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    with contextlib.closing(_open(cluster, args.cluster)) as conn:
        if not users.delete(conn, args.name):
            raise UserError(f"no user {args.name!r}; `llmgw users list` shows them")
    print(f"deleted user {args.name}; their sessions ended")
    return 0
