"""``llmgw inventory``: ask every node's agent what it has, in parallel, and show it.

Nodes, GPUs by class (used, free, faulty), fabrics, replicas and their
states, and every unreachable node with the reason. ``--json`` prints the
fleet snapshot that ``llmgw plan --observed FILE`` reads; ``--out FILE``
writes that snapshot to a file (alongside the text, unless ``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from llmgw.cli import clusters, inventories
from llmgw.cli.errors import UserError
from llmgw.fleet import redactions
from llmgw.fleet.types import Fleet
from llmgw.spec.models import Cluster
from llmgw.transport import pools


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "inventory", help="what every node has and runs, collected now",
        description="Reach every node's agent (over SSH, or its local socket) in parallel and "
        "show nodes, GPUs by class, fabrics, replicas, and unreachable nodes with the reason. "
        "Exits 0 when the collection ran, even if some nodes were unreachable.",
    )
    clusters.add_cluster_flag(parser)
    parser.add_argument("--json", action="store_true",
                        help="print the fleet snapshot (JSON) instead of the text view")
    parser.add_argument("--out", metavar="FILE", type=Path,
                        help="also write the fleet snapshot to FILE (for `llmgw plan --observed`)")
    add_timeout_flag(parser)
    parser.set_defaults(handler=run)


def add_timeout_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout", metavar="SECONDS", type=float, default=pools.DEFAULT_CALL_TIMEOUT,
        help=f"give up on a node after this long (default {pools.DEFAULT_CALL_TIMEOUT:g})",
    )


def collect(cluster: Cluster, directory: Path, timeout: float) -> Fleet:
    if timeout <= 0:
        raise UserError(f"--timeout must be positive; got {timeout:g}")
    return asyncio.run(pools.collect(cluster, directory, call_timeout=timeout))


def run(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    # What nodes report (log tails, details) may carry a token, and inventories are
    # pasted into tickets: print and save the snapshot scrubbed, as /api/v1/fleet serves it.
    fleet = redactions.public(collect(cluster, args.cluster, args.timeout))
    snapshot = fleet.model_dump_json(indent=2) + "\n"
    if args.out is not None:
        try:
            args.out.write_text(snapshot)
        except OSError as exc:
            raise UserError(f"cannot write {args.out}: {exc.strerror}") from None
    if args.json:
        sys.stdout.write(snapshot)
    else:
        sys.stdout.write(inventories.render_inventory(cluster, fleet, time.time()))
        if args.out is not None:
            print(f"\nFleet snapshot written to {args.out}")
    return 0
