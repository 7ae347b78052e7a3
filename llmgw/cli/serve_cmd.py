"""``llmgw serve``: the daemon — reconcile loop, router, admin API and metrics.

``--role all`` (the default) runs everything in one process, as on one
machine. ``--role reconciler`` runs the loop and the admin API: with a
PostgreSQL store, several may run and one leads (:mod:`llmgw.daemon.leaders`).
``--role router`` runs only the OpenAI-compatible router; it needs the
cluster directory and the store, takes routes from the leader through the
store and keeps routing on the last ones when no leader answers
(:mod:`llmgw.daemon.routetables`). ``--workers N`` runs N router processes
on one port (:mod:`llmgw.daemon.workers`). See docs/ha.md.

This module only reads the flags and reports errors; the process itself —
what starts in which order, what a signal stops, the exit status — is
:mod:`llmgw.daemon.lifetimes`. Ctrl-C (SIGINT) or SIGTERM stops it in order
(exit 0), a second one at once (exit 130 or 143). An agent the daemon
started itself for the ``local`` node is stopped too, with every engine it
runs; agents that were already running are left alone, and so are their
engines: a restarted daemon adopts them.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import sys
from pathlib import Path

from llmgw.cli import clusters
from llmgw.cli.errors import UserError
from llmgw.cli.plan_cmd import revision_of
from llmgw.daemon import lifetimes
from llmgw.daemon.lifetimes import ListenerRefused, Options, Refused
from llmgw.spec import loading
from llmgw.spec.quantities import parse_duration

ROLES = ("all", "router", "reconciler")
MAX_WORKERS = 64


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the daemon: converge the fleet and route requests",
        description="Watch the cluster directory, observe the nodes, plan and (with "
        "`sync: auto`) apply; serve the OpenAI-compatible router, the admin API and metrics "
        "on the cluster's listeners. Starts the local node's agent if none is running.",
    )
    clusters.add_cluster_flag(parser)
    parser.add_argument("--role", choices=ROLES, default="all",
                        help="all (default): everything in one process; reconciler: the loop "
                        "and admin API (one leads, through the store's lease); router: only "
                        "the router, routes from the leader via the store")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="router processes on the router port (SO_REUSEPORT); default 1")
    for name, what in (("router", "the router"), ("admin", "the admin API"),
                       ("metrics", "metrics")):
        parser.add_argument(f"--{name}-listen", metavar="HOST:PORT",
                            help=f"where {what} listens (default: cluster.listeners.{name})")
    parser.add_argument("--ready-timeout", default="15m", metavar="DURATION",
                        help="how long a replica may take to become Ready (default: 15m)")
    parser.add_argument("--wait-timeout", default="10s", metavar="DURATION",
                        help="how long a request waits for an on-demand model (default: 10s)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"],
                        help="how much the daemon logs to stderr: debug adds every "
                        "reconcile's reasons and each agent call (default: info)")
    parser.add_argument("--simulated", metavar="DIR", type=Path,
                        help="reach every node through the fleet simulator's sockets in DIR "
                        "(`llmgw lab simulate` prints it), never SSH; each agent pushes what "
                        "changed, through the simulator's relay when it serves one "
                        "(`llmgw lab simulate --relay`)")
    parser.add_argument("--worker-of", type=int, help=argparse.SUPPRESS)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)-7s %(message)s", datefmt="%H:%M:%S")
    for noisy in ("asyncssh", "aiohttp.access", "watchfiles", "grpc"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        ready_timeout = parse_duration(args.ready_timeout)
        wait_timeout = parse_duration(args.wait_timeout)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if not 1 <= args.workers <= MAX_WORKERS:
        raise UserError(f"--workers must be between 1 and {MAX_WORKERS}; got {args.workers}")
    if args.workers > 1 and args.role == "reconciler":
        raise UserError("--workers runs router processes: use it with --role router or all")
    reader = loading.Reader()  # the daemon's reloads parse only the files that changed
    cluster = clusters.load(args.cluster, reader)
    overrides = {name: value for name in ("router", "admin", "metrics")
                 if (value := getattr(args, f"{name}_listen"))}
    try:
        listeners = cluster.cluster.listeners.model_validate(
            {**cluster.cluster.listeners.model_dump(), **overrides})
    except ValueError as exc:
        raise UserError(f"--*-listen: {str(exc).splitlines()[-1].strip()}") from None
    if args.simulated is not None and not args.simulated.is_dir():
        raise UserError(f"--simulated {args.simulated}: no such directory (start the "
                        "simulator with `llmgw lab simulate` first; it prints the path)")
    options = Options(args.role, args.workers, listeners, ready_timeout, wait_timeout,
                      args.worker_of, tuple(_worker_argv(args, os.getpid())),
                      simulated=args.simulated.absolute() if args.simulated else None,
                      reader=reader)
    try:
        return asyncio.run(lifetimes.serve(cluster, args.cluster, options, revision_of))
    except ListenerRefused as exc:
        raise UserError(_listener_problem(args, options, exc)) from None
    except Refused as exc:
        raise UserError(str(exc)) from None


def _listener_problem(args: argparse.Namespace, options: Options, problem: ListenerRefused,
                      ) -> str:
    """``cannot listen on …`` with the key and the file (and line), or flag, to change."""
    address = getattr(options.listeners, problem.key)
    dotted = f"cluster.listeners.{problem.key}"
    reason = problem.error.strerror or str(problem.error)
    if problem.error.errno == errno.EADDRINUSE:
        reason = "the port is in use (another llmgw serve, or another program)"
    if getattr(args, f"{problem.key}_listen", None):
        return f"cannot listen on {address} (--{problem.key}-listen): {reason}"
    try:
        _, sources = loading.load_with_sources(args.cluster)
        declared = sources.keys.get(("cluster", "listeners", problem.key))
        section = sources.locate(("cluster",), prefer_key=True)
    except loading.SpecErrors:
        declared = section = None
    where = (f"change {dotted} at {declared}" if declared is not None else
             f"{address} is the default; set {dotted} in the `cluster:` section"
             + (f" at {section}" if section is not None else f" of a file in {args.cluster}"))
    return f"cannot listen on {address} ({dotted}): {reason}; {where}"


def _worker_argv(args: argparse.Namespace, parent: int) -> list[str]:
    """A router worker's command line. Workers run in ``/``: the cluster path is absolute."""
    argv = ["serve", "--cluster", str(args.cluster.absolute()), "--role", "router",
            "--worker-of", str(parent), "--wait-timeout", args.wait_timeout,
            "--log-level", args.log_level]
    if args.router_listen:
        argv += ["--router-listen", args.router_listen]
    return argv
