"""``llmgw users``: people who log in to the pages (/chat, /account, /admin).

Users live in the cluster's store next to API keys (SQLite or PostgreSQL,
``store.url``). A password is read from
the terminal without echo (asked twice), or from the first line of stdin when
stdin is not a terminal (``printf '%s\\n' "$PW" | llmgw users create alice``);
never from the command line, where ``ps`` and shell history would show it.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from llmgw.cli import clusters
from llmgw.cli.errors import UserError
from llmgw.spec.models import Cluster
from llmgw.store import audits, migrations, stores, users

T = TypeVar("T")


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
    create.add_argument("--project", action="append", default=[], metavar="P[:ROLE]",
                        help="a project the user belongs to, as a member (sees and revokes "
                        "their own keys) or with :admin as that project's admin (all of its "
                        "keys); repeat for more")
    create.set_defaults(handler=run_create)

    role = commands.add_parser("set-role", help="make a user a member or an admin of a project",
                               description="A member of a project sees and revokes the keys "
                               "they made on /account; a project admin every key of it. A "
                               "user not yet in the project joins it.")
    clusters.add_cluster_flag(role)
    role.add_argument("name", metavar="NAME")
    role.add_argument("project", metavar="PROJECT")
    role.add_argument("role", metavar="ROLE", choices=users.ROLES, help="member or admin")
    role.set_defaults(handler=run_set_role)

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


async def _with_store(cluster: Cluster, action: Callable[[stores.Store], Awaitable[T]]) -> T:
    """Run ``action`` on the cluster's store (SQLite or PostgreSQL), closing it after;
    a store that cannot be opened or answer is a located UserError."""
    try:
        store = await stores.open_store(cluster.cluster.store)
    except (stores.StoreError, migrations.SchemaTooNew) as exc:
        raise UserError(str(exc)) from None
    try:
        return await action(store)
    except stores.StoreError as exc:
        raise UserError(str(exc)) from None
    finally:
        await store.close()


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
    roles = [_project_role(cluster, args.cluster, given) for given in args.project]
    password = read_password()
    try:
        user = asyncio.run(_with_store(cluster, lambda store: users.create(
            store, args.name, password, admin=args.admin, projects=[p for p, _ in roles],
            admin_of=[p for p, r in roles if r == "admin"])))
    except users.UserError as exc:
        raise UserError(str(exc)) from None
    role = "admin" if user.admin else "user"
    asyncio.run(_with_store(cluster, lambda store: audits.record_cli(
        store, "user.create", user=user.name, role=role, projects=user.projects,
        admin_of=user.admin_of or None)))
    projects = _projects(user) or "no project"
    print(f"created {role} {user.name} ({projects}); they log in at the router's /login")
    return 0


def run_set_role(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    project, role = _project_role(cluster, args.cluster, f"{args.project}:{args.role}")
    try:
        user = asyncio.run(_with_store(cluster, lambda store: users.set_role(
            store, args.name, project, role)))
    except users.UserError as exc:
        raise UserError(str(exc)) from None
    asyncio.run(_with_store(cluster, lambda store: audits.record_cli(
        store, "user.role", user=user.name, project=project, role=role)))
    print(f"{user.name} is now {'an admin' if role == 'admin' else 'a member'} of {project} "
          f"({_projects(user)})")
    return 0


def _project_role(cluster: Cluster, where: str, given: str) -> tuple[str, str]:
    """``research`` or ``research:admin`` as (project, role); a located UserError when the
    project is not the cluster's or the role unknown."""
    project, _, role = given.partition(":")
    role = role or "member"
    if role not in users.ROLES:
        raise UserError(f"--project {given!r}: unknown role {role!r}; use "
                        f"{project}:member or {project}:admin")
    if project not in cluster.projects:
        defined = ", ".join(sorted(cluster.projects)) or "none"
        raise UserError(f"project {project!r} is not defined in {where} "
                        f"(projects: {defined}); add it under `projects:` first")
    return project, role


def _projects(user: users.User) -> str:
    """``ops, research (admin)``: the user's projects, marking those they are an admin of."""
    return ", ".join(f"{p} (admin)" if user.role(p) == "admin" else p for p in user.projects)


def run_passwd(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    password = read_password("New password: ")
    try:
        changed = asyncio.run(_with_store(cluster, lambda store: users.set_password(
            store, args.name, password)))
    except users.UserError as exc:
        raise UserError(str(exc)) from None
    if not changed:
        raise UserError(f"no user {args.name!r}; `llmgw users list` shows them")
    asyncio.run(_with_store(cluster, lambda store: audits.record_cli(
        store, "user.password", user=args.name)))
    print(f"changed the password of {args.name}; their sessions ended")
    return 0


def run_list(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    listed = asyncio.run(_with_store(cluster, users.list_all))
    if args.json:
        print(json.dumps([{"name": u.name, "admin": u.admin, "projects": list(u.projects),
                           "admin_of": list(u.admin_of), "created_at": u.created_at}
                          for u in listed], indent=2))
        return 0
    if not listed:
        print("no users yet; create one with `llmgw users create NAME`", file=sys.stderr)
        return 0
    rows = [("NAME", "ROLE", "PROJECTS", "CREATED")]
    rows += [(u.name, "admin" if u.admin else "user", _projects(u) or "-",
              time.strftime("%Y-%m-%d %H:%M", time.localtime(u.created_at))) for u in listed]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def run_delete(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    if not asyncio.run(_with_store(cluster, lambda store: users.delete(store, args.name))):
        raise UserError(f"no user {args.name!r}; `llmgw users list` shows them")
    asyncio.run(_with_store(cluster, lambda store: audits.record_cli(
        store, "user.delete", user=args.name)))
    print(f"deleted user {args.name}; their sessions ended")
    return 0
