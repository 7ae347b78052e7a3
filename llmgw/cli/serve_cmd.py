"""``llmgw serve``: the daemon — reconcile loop, router, admin API and metrics.

Ctrl-C (SIGINT) or SIGTERM stops it. An agent the daemon started itself for
the ``local`` node is stopped too, with every engine it runs; agents that
were already running are left alone, and so are their engines: a restarted
daemon adopts them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import logging
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client import CollectorRegistry

from llmgw.cli import clusters
from llmgw.cli.errors import UserError
from llmgw.cli.plan_cmd import revision_of
from llmgw.daemon import admin, localagents
from llmgw.daemon.reconcilers import Daemon
from llmgw.metrics import servers
from llmgw.metrics.collectors import FleetCollector
from llmgw.router import catalogs
from llmgw.router.apps import Router, Settings
from llmgw.spec import loading
from llmgw.spec.models import Cluster
from llmgw.spec.quantities import parse_duration
from llmgw.store import databases

log = logging.getLogger("llmgw.serve")
T = TypeVar("T")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the daemon: converge the fleet and route requests",
        description="Watch the cluster directory, observe the nodes, plan and (with "
        "`sync: auto`) apply; serve the OpenAI-compatible router, the admin API and metrics "
        "on the cluster's listeners. Starts the local node's agent if none is running.",
    )
    clusters.add_cluster_flag(parser)
    parser.add_argument("--ready-timeout", default="15m", metavar="DURATION",
                        help="how long a replica may take to become Ready (default: 15m)")
    parser.add_argument("--wait-timeout", default="10s", metavar="DURATION",
                        help="how long a request waits for an on-demand model (default: 10s)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"],
                        help="how much the daemon logs to stderr: debug adds every "
                        "reconcile's reasons and each agent call (default: info)")
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
    cluster = clusters.load(args.cluster)
    return asyncio.run(_serve(cluster, args.cluster, ready_timeout, wait_timeout))


def split(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


class _ListenerError(Exception):
    def __init__(self, key: str, error: OSError) -> None:
        super().__init__(key)
        self.key, self.error = key, error


async def _listen(key: str, start: Coroutine[Any, Any, T]) -> T:
    """Await a listener's start; a refusal to bind becomes a _ListenerError naming ``key``."""
    try:
        return await start
    except OSError as exc:
        raise _ListenerError(key, exc) from None


def _listener_problem(cluster: Cluster, directory: Path, problem: _ListenerError) -> str:
    """``cannot listen on …`` with the key and the file (and line) to change."""
    address = getattr(cluster.cluster.listeners, problem.key)
    dotted = f"cluster.listeners.{problem.key}"
    try:
        _, sources = loading.load_with_sources(directory)
        declared = sources.keys.get(("cluster", "listeners", problem.key))
        section = sources.locate(("cluster",), prefer_key=True)
    except loading.SpecErrors:
        declared = section = None
    where = (f"change {dotted} at {declared}" if declared is not None else
             f"{address} is the default; set {dotted} in the `cluster:` section"
             + (f" at {section}" if section is not None else f" of a file in {directory}"))
    reason = problem.error.strerror or str(problem.error)
    if problem.error.errno == errno.EADDRINUSE:
        reason = "the port is in use (another llmgw serve, or another program)"
    return f"cannot listen on {address} ({dotted}): {reason}; {where}"


async def _serve(cluster: Cluster, directory: Path, ready_timeout: float,
                 wait_timeout: float) -> int:
    """Open the store, bind every listener, then start the local agent and the loop.

    Everything that can refuse (a damaged store, a port in use) is tried
    before the local agent starts, so a refusal leaves nothing running.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        store = databases.connect(Path(cluster.cluster.store.path))
    except databases.StoreError as exc:
        raise UserError(f"{exc} (cluster.store.path)") from None
    registry = CollectorRegistry()
    collector = FleetCollector()
    registry.register(collector)
    router = Router(catalogs.from_cluster(cluster), store=store,
                    registry=registry, settings=Settings(wait_timeout=wait_timeout))
    daemon = Daemon(directory, cluster, router=router, collector=collector,
                    revision_of=revision_of, ready_timeout=ready_timeout)
    listeners = cluster.cluster.listeners
    runners: list[web.AppRunner] = []
    agent: localagents.LocalAgent | None = None
    try:
        runners.append(await _listen("router", router.start(*split(listeners.router))))
        admin_runner = web.AppRunner(admin.create_app(daemon), access_log=None)
        await admin_runner.setup()
        runners.append(admin_runner)
        await _listen("admin", web.TCPSite(admin_runner, *split(listeners.admin)).start())
        runners.append(await _listen("metrics",
                                     servers.start(registry, *split(listeners.metrics))))
        agent = await localagents.ensure(cluster)
        log.info("router on http://%s/v1, admin on http://%s/api/v1/status, metrics on "
                 "http://%s/metrics", listeners.router, listeners.admin, listeners.metrics)
        banner = asyncio.create_task(_announce(router, cluster))
        await daemon.run(stop)
        banner.cancel()
    except _ListenerError as exc:
        raise UserError(_listener_problem(cluster, directory, exc)) from None
    except localagents.LocalAgentError as exc:
        raise UserError(str(exc)) from None
    finally:
        log.info("stopping")
        for runner in reversed(runners):
            await runner.cleanup()
        await router.close()
        if agent is not None:
            log.info("stopping the local agent and the engines it started")
            await agent.stop()
    return 0


async def _announce(router: Router, cluster: Cluster) -> None:
    """Once a model is ready: where to send requests, as a line that works when pasted."""
    while not router.routes.models():
        await asyncio.sleep(0.2)
    key = router.routes.models()[0]
    model = cluster.models.get(key)
    served = (model.served_name if model else None) or key
    body = json.dumps({"model": served, "prompt": "The capital of France is",
                       "max_tokens": 16})
    auth = "" if cluster.cluster.auth == "none" else " -H \"Authorization: Bearer $LLMGW_KEY\""
    host, port = split(cluster.cluster.listeners.router)
    if host in ("0.0.0.0", "::", ""):  # listening everywhere: this machine reaches it on loopback
        host = "127.0.0.1"
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    with contextlib.suppress(BrokenPipeError):
        print(f"\nllmgw is serving {served} at http://{where}/v1\n"
              f"Try:\n  curl -s http://{where}/v1/completions "
              f"-H 'Content-Type: application/json'{auth} -d '{body}'\n", flush=True)
