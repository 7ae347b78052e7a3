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
import json
import logging
import signal
import sys
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

from llmgw.cli import clusters
from llmgw.cli.errors import UserError
from llmgw.cli.plan_cmd import revision_of
from llmgw.daemon import admin, housekeeping, localagents
from llmgw.daemon.reconcilers import Daemon
from llmgw.metrics import servers
from llmgw.metrics.collectors import FleetCollector
from llmgw.router import catalogs
from llmgw.router.apps import Router, Settings
from llmgw.spec.models import Cluster
from llmgw.spec.quantities import parse_duration
from llmgw.store import databases
from llmgw.web import Pages

log = logging.getLogger("llmgw.serve")


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
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
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
    try:
        return asyncio.run(_serve(cluster, args.cluster, ready_timeout, wait_timeout))
    except OSError as exc:
        raise UserError(f"cannot listen: {exc}") from None


def split(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


async def _serve(cluster: Cluster, directory: Path, ready_timeout: float,
                 wait_timeout: float) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        agent = await localagents.ensure(cluster)
    except RuntimeError as exc:
        raise UserError(str(exc)) from None
    registry = CollectorRegistry()
    collector = FleetCollector()
    registry.register(collector)
    store_path = Path(cluster.cluster.store.path)
    store_path.parent.mkdir(parents=True, exist_ok=True)
    store = databases.connect(store_path)
    router = Router(catalogs.from_cluster(cluster), store=store,
                    registry=registry, settings=Settings(wait_timeout=wait_timeout))
    daemon = Daemon(directory, cluster, router=router, collector=collector,
                    revision_of=revision_of, ready_timeout=ready_timeout)
    pages = Pages(store, router, cluster=lambda: daemon.cluster,
                  admin=lambda: admin.admin_view(daemon))
    token = admin.ensure_token(store_path.parent)
    listeners = cluster.cluster.listeners
    runners: list[web.AppRunner] = []
    try:
        runners.append(await router.start(*split(listeners.router), extend=pages.install))
        admin_runner = web.AppRunner(admin.create_app(daemon, token, pages.gate),
                                     access_log=None)
        await admin_runner.setup()
        await web.TCPSite(admin_runner, *split(listeners.admin)).start()
        runners.append(admin_runner)
        runners.append(await servers.start(registry, *split(listeners.metrics)))
        log.info("router on http://%s/v1, admin on http://%s/api/v1/status, metrics on "
                 "http://%s/metrics", listeners.router, listeners.admin, listeners.metrics)
        log.info("pages on http://%s/chat and /admin (`llmgw users create` adds logins); "
                 "admin API token in %s", listeners.router,
                 store_path.parent / admin.TOKEN_FILE)
        banner = asyncio.create_task(_announce(router, cluster))
        purger = asyncio.create_task(housekeeping.purge_forever(store, lambda: daemon.cluster))
        await daemon.run(stop)
        banner.cancel()
        purger.cancel()
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
