"""``llmgw status``: one line per node and per replica.

Until the daemon serves its admin API, this asks the agents directly (the
same collection as ``llmgw inventory``) and prints the compact view.
"""

from __future__ import annotations

import argparse
import sys
import time

from llmgw.cli import clusters, inventories, inventory_cmd


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "status", help="nodes and replicas, one line each",
        description="Compact state of the fleet: each node (up, or why it is unreachable) and "
        "each replica with its shards' states.",
    )
    clusters.add_cluster_flag(parser)
    inventory_cmd.add_timeout_flag(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    fleet = inventory_cmd.collect(cluster, args.cluster, args.timeout)
    sys.stdout.write(inventories.render_status(cluster, fleet, time.time()))
    return 0
