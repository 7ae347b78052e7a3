"""``llmgw usage export``: usage summed per project, key, model and day, as CSV or JSON.

From the usage rows in the cluster's store (SQLite or PostgreSQL), which hold
no text; the same figures /admin charts and ``GET /api/v1/usage`` serves. The
window is ``[--from, --to)``; days are calendar days in ``--tz`` (UTC by
default). Every rule: :mod:`llmgw.store.exports`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from llmgw.cli import clusters
from llmgw.cli.errors import UserError
from llmgw.spec.models import Cluster
from llmgw.store import exports, migrations, stores
from llmgw.store.stores import StoreError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "usage", help="export usage and spend for billing",
        description="Usage from the cluster's store, summed for billing.")
    commands = parser.add_subparsers(dest="usage_command", metavar="ACTION", required=True)
    export = commands.add_parser(
        "export", help="usage per project, key, model and day, as CSV or JSON",
        description="Sum the usage rows of the window [--from, --to) per group. Columns: the "
        "groups, requests, prompt_tokens, completion_tokens, cost_usd, errors (requests "
        "answered 400 or above). CSV cells that would start a spreadsheet formula (= + - @) "
        "are prefixed with '.")
    clusters.add_cluster_flag(export)
    export.add_argument("--from", dest="start", metavar="DATE", required=True,
                        help="the first moment counted: 2026-11-01 (midnight in --tz) or "
                        "2026-11-01T08:00 (in --tz unless it has an offset)")
    export.add_argument("--to", dest="end", metavar="DATE", required=True,
                        help="the first moment not counted: --from 2026-11-01 --to 2026-12-01 "
                        "is November")
    export.add_argument("--group-by", default="project", metavar="GROUPS",
                        help="comma-separated, any of project,key,model,day (default: "
                        "project; empty: one row of totals)")
    export.add_argument("--format", default="csv", metavar="FORMAT",
                        help="csv (default) or json")
    export.add_argument("--tz", default="UTC", metavar="ZONE",
                        help="time zone of days and of dates without an offset (default: UTC; "
                        "an IANA name such as Europe/Berlin)")
    export.set_defaults(handler=run_export)


def run_export(args: argparse.Namespace) -> int:
    try:
        query = exports.parse(args.start, args.end, args.group_by, args.format, args.tz)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    cluster = clusters.load(args.cluster)
    try:
        lines = asyncio.run(_read(cluster, query))
    except (StoreError, migrations.SchemaTooNew) as exc:
        raise UserError(str(exc)) from None
    sys.stdout.write(exports.render(lines, query))
    return 0


async def _read(cluster: Cluster, query: exports.Query) -> list[exports.Line]:
    store = await stores.open_store(cluster.cluster.store)
    try:
        return await exports.export(store, query)
    finally:
        await store.close()
