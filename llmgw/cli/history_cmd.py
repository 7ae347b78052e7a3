"""``llmgw history [--model M] [--limit N] [--json]``: the apply journal, newest first.

One line per change: when its apply started, the cluster revision, who started
it (``daemon`` or ``user@host``), the change, its outcome (with the reason when
it failed) and how long it took. ``--json`` prints the entries as the admin
API's ``GET /api/v1/history`` serves them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time

from llmgw.applying import records
from llmgw.cli import clusters
from llmgw.cli.errors import UserError
from llmgw.spec import secrets
from llmgw.spec.models import NAME_PATTERN, Cluster
from llmgw.store import journals, migrations, stores
from llmgw.store.journals import ApplyEntry
from llmgw.store.stores import StoreError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "history", help="what every apply changed, newest first",
        description="Read the apply journal in the cluster's store: every apply by the daemon "
        "or `llmgw apply`, its revision, who started it, each change and its outcome.",
    )
    clusters.add_cluster_flag(parser)
    parser.add_argument("--model", metavar="M", help="only applies that changed model M")
    parser.add_argument("--limit", type=int, default=20, metavar="N",
                        help=f"the newest N applies (default: 20, at most {journals.MAX_LIMIT})")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.model is not None and not re.fullmatch(NAME_PATTERN, args.model):
        raise UserError(f"--model {args.model!r} is not a model name")
    if not 1 <= args.limit <= journals.MAX_LIMIT:
        raise UserError(f"--limit must be between 1 and {journals.MAX_LIMIT}")
    cluster = clusters.load(args.cluster)
    try:
        entries = asyncio.run(_read(cluster, args.model, args.limit))
    except (StoreError, migrations.SchemaTooNew) as exc:
        raise UserError(str(exc)) from None
    if args.json:
        print(json.dumps([records.document(e) for e in entries], indent=2))
    else:
        sys.stdout.write(table(entries))
    return 0


async def _read(cluster: Cluster, model: str | None, limit: int) -> list[ApplyEntry]:
    store = await stores.open_store(cluster.cluster.store)
    try:
        return await store.history(model, limit)
    finally:
        await store.close()


HEADER = ("WHEN (UTC)", "REVISION", "BY", "CHANGE", "OUTCOME", "DURATION")


def table(entries: list[ApplyEntry]) -> str:
    """The journal as aligned text, oldest first so it reads as a story. Purely computational."""
    if not entries:
        return "No applies recorded yet.\n"
    rows: list[tuple[str, ...]] = []
    for item in reversed(entries):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(item.started_at))
        revision = item.revision or "-"
        if not item.changes:
            rows.append((when, revision, item.started_by, "(no change)",
                         _outcome(item.ok, None), f"{item.duration:.1f}s"))
        for change in item.changes:
            label = f"{change.action} {change.model} r{change.replica}"
            if change.new_replica is not None and change.new_replica != change.replica:
                label += f" → r{change.new_replica}"
            if change.nodes:
                label += f" on {','.join(change.nodes)}"
            if item.rollback_of is not None:
                label = f"rollback of #{item.rollback_of}: {label}"
            duration = "-" if change.duration is None else f"{change.duration:.1f}s"
            outcome = _outcome(change.ok, change.error)
            if change.gate is not None and item.rollback_of is None:
                outcome = (f"rolled back: gate {change.gate}" if change.rolled_back
                           else f"{outcome}, gate {change.gate}")
            rows.append((when, revision, item.started_by, label, outcome, duration))
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER) - 2)]
    lines = []
    for row in [HEADER, *rows]:
        head = "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False))
        lines.append(f"{head}  {row[-1].rjust(8)}  {row[-2]}".rstrip())
    return "\n".join(lines) + "\n"


def _outcome(ok: bool, error: str | None) -> str:
    return "ok" if ok else f"failed: {secrets.scrub(error or 'no reason given')}"
