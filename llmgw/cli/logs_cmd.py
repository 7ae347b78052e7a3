"""``llmgw logs MODEL``: a replica's engine log, through its node's agent.

The agents are asked for their units (as ``llmgw status`` does), the replica
is found among them (:func:`llmgw.transport.logreads.locate`), and its node's
agent answers from the journal (systemd nodes) or the supervise log. The
lines go to stdout as they are; which unit and where they came from goes to
stderr, so ``llmgw logs gemma | grep`` sees only the engine's lines.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from llmgw.cli import clusters, inventory_cmd
from llmgw.cli.errors import UserError
from llmgw.fleet.types import Fleet
from llmgw.spec import quantities
from llmgw.spec.models import Cluster
from llmgw.transport import logreads, pools
from llmgw.transport.failures import NodeUnreachable

DEFAULT_LINES = 100
MAX_LINES = 100_000  # the agent caps it further (log_lines_max)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "logs", help="a replica's engine log, from its node",
        description="The engine log of one replica's shard, read through its node's agent: "
        "the journal on systemd nodes, the supervise log elsewhere. The values of the "
        "unit's secret env are masked by the agent.",
    )
    parser.add_argument("model", metavar="MODEL", help="the model, as the cluster names it")
    parser.add_argument("--replica", metavar="N", type=int,
                        help="which replica (default: the lowest that runs)")
    parser.add_argument("--shard", metavar="S", type=int,
                        help="which shard of a multi-node replica (default: 0, the leader)")
    parser.add_argument("--previous", action="store_true",
                        help="the run before the latest: what a crash or a restart ended")
    parser.add_argument("--since", metavar="DURATION",
                        help="only what was written in the last DURATION (30s, 10m, 2h)")
    parser.add_argument("-f", "--follow", action="store_true",
                        help="go on printing lines as the engine writes them (Ctrl-C ends)")
    parser.add_argument("-n", "--lines", metavar="N", type=int, default=DEFAULT_LINES,
                        help=f"at most N lines (default {DEFAULT_LINES}; the agent caps it)")
    clusters.add_cluster_flag(parser)
    inventory_cmd.add_timeout_flag(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.lines <= MAX_LINES:
        raise UserError(f"--lines must be between 1 and {MAX_LINES}; got {args.lines}")
    if args.previous and args.follow:
        raise UserError("--previous and --follow do not go together: the run before the "
                        "latest has ended")
    if args.timeout <= 0:
        raise UserError(f"--timeout must be positive; got {args.timeout:g}")
    since = None
    if args.since is not None:
        try:
            since = quantities.parse_duration(args.since)
        except ValueError as exc:
            raise UserError(f"--since {args.since!r}: {exc}") from None
    cluster = clusters.load(args.cluster)
    return asyncio.run(_logs(cluster, args.cluster, args, since))


async def _logs(cluster: Cluster, directory: Path, args: argparse.Namespace,
                since: float | None) -> int:
    async with pools.Pool(cluster, directory, call_timeout=args.timeout) as pool:
        reports = await pools.fan_out(pool.nodes, pool.report, pool.max_parallel)
        try:
            target = logreads.locate(Fleet(nodes=reports), args.model, args.replica,
                                     args.shard)
            if args.follow:
                await _follow(pool, target, args.lines, since)
                return 0
            logs = await logreads.read(pool, target, args.lines, previous=args.previous,
                                       since_seconds=since)
        except logreads.NotFound as exc:
            raise UserError(str(exc)) from None
        except NodeUnreachable as exc:
            raise UserError(f"{exc.node}: {exc}") from None
    which = "the run before the latest" if args.previous else "latest lines"
    print(f"==> {target.label()} ({logs.source}, {which})", file=sys.stderr)
    for line in logs.lines:
        sys.stdout.write(line + "\n")
    if not logs.lines:
        print("(no earlier run is kept: the unit has not restarted since it was started)"
              if args.previous else "(no lines)", file=sys.stderr)
    return 0


async def _follow(pool: pools.Pool, target: logreads.Target, lines: int,
                  since: float | None) -> None:
    said = False
    async for logs in logreads.follow(pool, target, lines, since_seconds=since):
        if not said:
            print(f"==> {target.label()} ({logs.source}, following)", file=sys.stderr)
            said = True
        for line in logs.lines:
            sys.stdout.write(line + "\n")
        sys.stdout.flush()
