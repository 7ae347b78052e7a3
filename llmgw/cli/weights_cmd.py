"""``llmgw weights list|reclaim``: what nodes hold, and giving disk back.

``list`` shows, per node, the weights llmgw fetched (source, size, who
fetched them, which units use them) and every fetch under way with its
progress. ``reclaim`` removes fetched weights that no unit on the node
names: a dry run unless ``--yes``. Files llmgw did not fetch are never
candidates.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from llmgw.cli import clusters
from llmgw.cli.errors import UserError
from llmgw.cli.inventory_cmd import add_timeout_flag, collect
from llmgw.fleet.types import Fleet
from llmgw.planning.nodes import human_bytes
from llmgw.spec.models import Cluster
from llmgw.transport import pools
from llmgw.transport.agent_client import AgentClient
from llmgw.transport.failures import NodeUnreachable


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "weights", help="fetched weights per node; reclaim what nothing uses",
        description="Weights llmgw fetched onto nodes (hub repos, URLs), fetches in progress, "
        "and removing what no unit uses.",
    )
    commands = parser.add_subparsers(dest="weights_command", metavar="COMMAND", required=True)
    listing = commands.add_parser("list", help="per node: what is cached, its size, who "
                                  "fetched it, which units use it; fetches under way")
    clusters.add_cluster_flag(listing)
    add_timeout_flag(listing)
    listing.set_defaults(handler=run_list)
    reclaim = commands.add_parser("reclaim", help="remove fetched weights no unit uses "
                                  "(dry run unless --yes)")
    clusters.add_cluster_flag(reclaim)
    reclaim.add_argument("--node", action="append", metavar="NAME",
                         help="only this node (repeatable; default: every node)")
    reclaim.add_argument("--yes", action="store_true", help="remove them (default: dry run)")
    add_timeout_flag(reclaim)
    reclaim.set_defaults(handler=run_reclaim)


def render_list(fleet: Fleet) -> str:
    lines = []
    for name, report in sorted(fleet.nodes.items()):
        if not report.reachable:
            lines.append(f"{name}: unreachable: {report.error or 'no answer'}")
            continue
        if not report.cached_weights and not report.fetches:
            lines.append(f"{name}: nothing fetched")
            continue
        lines.append(f"{name}:")
        for cached in report.cached_weights:
            users = ", ".join(cached.used_by) or "unused"
            lines.append(f"  {cached.source}  {human_bytes(cached.size_bytes)}  "
                         f"{cached.fetched_by}  used by: {users}")
            lines.append(f"      {cached.path}")
        for fetch in report.fetches:
            if fetch.state == "done" or fetch.kind != "weights":  # engines: `llmgw engine list`
                continue
            total = human_bytes(fetch.bytes_total) if fetch.bytes_total is not None else "?"
            rate = f" at {human_bytes(int(fetch.rate_bps))}/s" if fetch.rate_bps else ""
            lines.append(f"  fetching {fetch.target}: {fetch.state}, "
                         f"{human_bytes(fetch.bytes_done)} of {total}{rate}"
                         + (f": {fetch.error}" if fetch.error else ""))
    return "\n".join(lines) + "\n"


def run_list(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    sys.stdout.write(render_list(collect(cluster, args.cluster, args.timeout)))
    return 0


async def _reclaim(cluster: Cluster, args: argparse.Namespace,
                   nodes: list[str]) -> dict[str, list[dict[str, Any]] | str]:
    results: dict[str, list[dict[str, Any]] | str] = {}
    async with pools.Pool(cluster, args.cluster, call_timeout=args.timeout) as pool:
        for node in nodes:
            dirs = cluster.nodes[node].weights_dirs

            async def ask(agent: AgentClient, dirs: list[str] = dirs) -> list[dict[str, Any]]:
                return await agent.reclaim_weights(dirs, args.yes)

            try:
                results[node] = await pool.call(node, ask)
            except NodeUnreachable as exc:
                results[node] = f"unreachable: {exc}"
    return results


def run_reclaim(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    nodes = args.node or sorted(cluster.nodes)
    unknown = [n for n in nodes if n not in cluster.nodes]
    if unknown:
        raise UserError(f"no node {', '.join(unknown)} in the cluster")
    results = asyncio.run(_reclaim(cluster, args, nodes))
    freed = 0
    verb = "removed" if args.yes else "would remove"
    for node, items in results.items():
        if isinstance(items, str):
            print(f"{node}: {items}")
            continue
        for item in items:
            if item["kept_because"]:
                print(f"{node}: keep {item['source']} ({item['kept_because']})")
            else:
                freed += item["size_bytes"]
                print(f"{node}: {verb} {item['source']}  {human_bytes(item['size_bytes'])}")
    print(f"{'Freed' if args.yes else 'Would free'} {human_bytes(freed)}"
          + ("" if args.yes else " (dry run; --yes removes)"))
    return 0
