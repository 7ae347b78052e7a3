"""``llmgw audit [--since 1d|ISO] [--limit N] [--json]``: the audit log, oldest first.

One line per entry: when (UTC), who (a page user, ``cli:<unix user>``,
``admin-token``; ``-`` for a failed login), from where (the client's address,
or ``cli``), and what (``key.revoke key=3f2a9c01d4e5 project=research``).
``--json`` prints the entries newest first, as the admin API's
``GET /api/v1/audit`` serves them. What is recorded and what never is:
:mod:`llmgw.store.audits`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from llmgw.cli import clusters
from llmgw.cli.errors import UserError
from llmgw.spec.models import Cluster
from llmgw.store import audits, migrations, stores
from llmgw.store.audits import Entry
from llmgw.store.stores import StoreError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "audit", help="who changed keys, users and members, and who logged in",
        description="Read the audit log in the cluster's store: every change to keys, users "
        "and projects' members, every login (and failed login) on the pages, and every admin "
        "API call that changes something. Entries older than cluster.audit.retention (a year "
        "by default) are deleted by the daemon.",
    )
    clusters.add_cluster_flag(parser)
    parser.add_argument("--since", metavar="WHEN",
                        help="only entries since WHEN: a duration back from now (1d, 12h) or "
                        "an ISO date or time (2026-12-01, 2026-12-01T08:00; UTC unless it "
                        "has an offset)")
    parser.add_argument("--limit", type=int, default=100, metavar="N",
                        help=f"the newest N entries (default: 100, at most {audits.MAX_LIMIT})")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        since = audits.since_of(args.since, time.time()) if args.since is not None else None
    except ValueError as exc:
        raise UserError(f"--since {exc}") from None
    if not 1 <= args.limit <= audits.MAX_LIMIT:
        raise UserError(f"--limit must be between 1 and {audits.MAX_LIMIT}")
    cluster = clusters.load(args.cluster)
    try:
        entries = asyncio.run(_read(cluster, since, args.limit))
    except (StoreError, migrations.SchemaTooNew) as exc:
        raise UserError(str(exc)) from None
    if args.json:
        print(json.dumps([e.document() for e in entries], indent=2))
    else:
        sys.stdout.write(table(entries))
    return 0


async def _read(cluster: Cluster, since: float | None, limit: int) -> list[Entry]:
    store = await stores.open_store(cluster.cluster.store)
    try:
        return await store.audit_entries(since, limit)
    finally:
        await store.close()


HEADER = ("WHEN (UTC)", "WHO", "FROM", "WHAT")


def table(entries: list[Entry]) -> str:
    """The entries as aligned text, oldest first. Purely computational; anything that is
    not printable (an entry written around :func:`audits.record`) is shown as ``?``."""
    if not entries:
        return "No audit entries in this period.\n"
    rows = [HEADER] + [
        (time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e.at)), _shown(e.actor),
         _shown(e.source), _shown(e.line())) for e in reversed(entries)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER) - 1)]
    return "".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False))
                   + f"  {r[-1]}".rstrip() + "\n" for r in rows)


def _shown(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)
