"""``llmgw serve``: the daemon — reconcile loop, router, admin API and metrics.

``--role all`` (the default) runs everything in one process, as on one
machine. ``--role reconciler`` runs the loop and the admin API: with a
PostgreSQL store, several may run and one leads (:mod:`llmgw.daemon.leaders`).
``--role router`` runs only the OpenAI-compatible router; it needs the
cluster directory and the store, takes routes from the leader through the
store and keeps routing on the last ones when no leader answers
(:mod:`llmgw.daemon.routetables`). ``--workers N`` runs N router processes
on one port (:mod:`llmgw.daemon.workers`). See docs/ha.md.

Ctrl-C (SIGINT) or SIGTERM stops it: a leader hands the lease over at once.
An agent the daemon started itself for the ``local`` node is stopped too,
with every engine it runs; agents that were already running are left alone,
and so are their engines: a restarted daemon adopts them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import watchfiles
from aiohttp import web
from prometheus_client import CollectorRegistry

from llmgw.cli import clusters
from llmgw.cli.errors import UserError
from llmgw.cli.plan_cmd import revision_of
from llmgw.daemon import admin, housekeeping, localagents, workers
from llmgw.daemon.leaders import Leadership, new_holder
from llmgw.daemon.reconcilers import Daemon
from llmgw.daemon.routetables import Follower
from llmgw.metrics import servers
from llmgw.metrics.collectors import FleetCollector, LeaseCollector
from llmgw.router import catalogs
from llmgw.router.apps import Router, Settings
from llmgw.spec import loading
from llmgw.spec.models import Cluster, Listeners
from llmgw.spec.quantities import parse_duration
from llmgw.store import databases, migrations, stores
from llmgw.store.stores import Store, StoreError
from llmgw.web import AdminView, Pages

log = logging.getLogger("llmgw.serve")
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
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    parser.add_argument("--worker-of", type=int, help=argparse.SUPPRESS)
    parser.set_defaults(handler=run)


@dataclass(frozen=True)
class Options:
    role: str
    workers: int
    listeners: Listeners
    ready_timeout: float
    wait_timeout: float
    worker_of: int | None


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
    cluster = clusters.load(args.cluster)
    overrides = {name: value for name in ("router", "admin", "metrics")
                 if (value := getattr(args, f"{name}_listen"))}
    try:
        listeners = cluster.cluster.listeners.model_validate(
            {**cluster.cluster.listeners.model_dump(), **overrides})
    except ValueError as exc:
        raise UserError(f"--*-listen: {str(exc).splitlines()[-1].strip()}") from None
    options = Options(args.role, args.workers, listeners, ready_timeout, wait_timeout,
                      args.worker_of)
    try:
        return asyncio.run(_serve(cluster, args.cluster, options, args))
    except OSError as exc:
        raise UserError(f"cannot listen: {exc}") from None


def split(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


async def _serve(cluster: Cluster, directory: Path, options: Options,
                 args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    reconciling = options.role in ("all", "reconciler")
    routing_here = options.role in ("all", "router") and options.workers == 1
    pool = None
    if options.workers > 1:
        metrics_path = workers.metrics_dir()
        registry = workers.registry_for_workers(metrics_path)
        pool = workers.Workers(options.workers, _worker_argv(args, os.getpid()), metrics_path)
    else:
        registry = CollectorRegistry()
    try:
        store = await stores.open_store(cluster.cluster.store)
    except (StoreError, migrations.SchemaTooNew) as exc:
        raise UserError(str(exc)) from None
    agent = None
    runners: list[web.AppRunner] = []
    tasks: list[asyncio.Task[None]] = []
    holder = new_holder()
    router: Router | None = None
    pages: Pages | None = None
    daemon: Daemon | None = None
    try:
        if reconciling:
            try:
                agent = await localagents.ensure(cluster)
            except RuntimeError as exc:
                raise UserError(str(exc)) from None
        leadership = Leadership(store, cluster.cluster.lease_ttl, holder=holder) \
            if reconciling else None
        if routing_here:
            router = Router(catalogs.from_cluster(cluster), store=store, registry=registry,
                            settings=Settings(wait_timeout=options.wait_timeout))
            pages = _pages(store, router, cluster, lambda: daemon)
            runners.append(await router.start(*split(options.listeners.router),
                                              reuse_port=options.worker_of is not None,
                                              extend=pages.install if pages else None))
            follower = Follower(store, router, holder,
                                leading=leadership.is_leader if leadership else lambda: False)
            tasks.append(asyncio.create_task(follower.run(stop), name="follow-routes"))
        if pool is not None:
            tasks.append(asyncio.create_task(pool.run(stop), name="workers"))
        if options.worker_of is not None:
            tasks.append(asyncio.create_task(_orphaned(options.worker_of, stop)))
        if options.worker_of is None:
            runners.append(await servers.start(registry, *split(options.listeners.metrics)))
        if reconciling:
            assert leadership is not None
            collector = FleetCollector()
            registry.register(collector)
            registry.register(LeaseCollector(
                lambda: (leadership.holder, leadership.epoch, leadership.is_leader())))
            daemon = Daemon(directory, cluster, router=router, collector=collector,
                            revision_of=revision_of, ready_timeout=options.ready_timeout,
                            leadership=leadership, store=store, router_id=holder)
            token = admin.ensure_token(Path(cluster.cluster.store.path).parent)
            admin_runner = web.AppRunner(
                admin.create_app(daemon, token, pages.gate if pages else None),
                access_log=None)
            await admin_runner.setup()
            await web.TCPSite(admin_runner, *split(options.listeners.admin)).start()
            runners.append(admin_runner)
        _log_listeners(options, holder, store)
        if router is not None and options.role == "all":
            tasks.append(asyncio.create_task(_announce(router, cluster, options.listeners)))
        if reconciling and pages is not None:
            tasks.append(asyncio.create_task(housekeeping.purge_forever(
                pages.store, lambda: daemon.cluster if daemon else cluster, stop=stop)))
        if reconciling:
            assert daemon is not None
            await daemon.run(stop)
        else:
            if router is not None:
                tasks.append(asyncio.create_task(_watch_files(directory, router, stop)))
            await stop.wait()
    finally:
        log.info("stopping")
        stop.set()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 10)
        for runner in reversed(runners):
            await runner.cleanup()
        if router is not None:
            await router.close()
        await store.close()
        if agent is not None:
            log.info("stopping the local agent and the engines it started")
            await agent.stop()
    return 0


def _pages(store: Store, router: Router, cluster: Cluster,
           daemon: Callable[[], Daemon | None]) -> Pages | None:
    """The pages for the router's listener; their users, sessions and conversations live
    in the SQLite store (not yet in PostgreSQL: then the pages are off, said in the log)."""
    if store.kind != "sqlite":
        log.warning("the pages (/chat, /account, /admin) need the SQLite store for now; "
                    "with store.url on PostgreSQL they are off")
        return None

    def current() -> Cluster:
        running = daemon()
        return running.cluster if running is not None else cluster

    def view() -> AdminView | None:
        running = daemon()
        return admin.admin_view(running) if running is not None else None

    db = databases.connect(Path(cluster.cluster.store.path))
    log.info("pages on http://%s/chat and /admin (`llmgw users create` adds logins)",
             cluster.cluster.listeners.router)
    return Pages(db, router, cluster=current, admin=view)


async def _orphaned(parent: int, stop: asyncio.Event) -> None:
    """A worker whose parent died (even by SIGKILL) stops instead of holding the port."""
    while not stop.is_set():
        if os.getppid() != parent:
            log.warning("parent %d is gone: stopping this worker", parent)
            stop.set()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


def _worker_argv(args: argparse.Namespace, parent: int) -> list[str]:
    argv = ["serve", "--cluster", str(args.cluster), "--role", "router",
            "--worker-of", str(parent), "--wait-timeout", args.wait_timeout,
            "--log-level", args.log_level]
    if args.router_listen:
        argv += ["--router-listen", args.router_listen]
    return argv


def _log_listeners(options: Options, holder: str, store: Store) -> None:
    listeners = options.listeners
    parts = []
    if options.role != "reconciler" and options.worker_of is None:
        parts.append(f"router on http://{listeners.router}/v1"
                     + (f" ({options.workers} workers)" if options.workers > 1 else ""))
    if options.role != "router":
        parts.append(f"admin on http://{listeners.admin}/api/v1/status")
    if options.worker_of is None:
        parts.append(f"metrics on http://{listeners.metrics}/metrics")
    if parts:
        log.info("%s", ", ".join(parts))
    log.info("role %s as %s; store %s (%s)", options.role, holder, store.where, store.kind)


async def _watch_files(directory: Path, router: Router, stop: asyncio.Event) -> None:
    """A router alone follows edits to models, prices, budgets and auth in the directory."""
    async for _ in watchfiles.awatch(directory, stop_event=stop, recursive=False,
                                     debounce=300, step=100):
        try:
            cluster = await asyncio.to_thread(loading.load, directory)
        except loading.SpecErrors as exc:
            log.error("cluster directory has %d errors; keeping the last valid cluster",
                      len(exc.errors))
            continue
        router.configure(catalogs.from_cluster(cluster))
        log.info("cluster directory changed: models, prices and budgets reloaded")


async def _announce(router: Router, cluster: Cluster, listeners: Listeners) -> None:
    """Once a model is ready: where to send requests, as a line that works when pasted."""
    while not router.routes.models():
        await asyncio.sleep(0.2)
    key = router.routes.models()[0]
    model = cluster.models.get(key)
    served = (model.served_name if model else None) or key
    body = json.dumps({"model": served, "prompt": "The capital of France is",
                       "max_tokens": 16})
    auth = "" if cluster.cluster.auth == "none" else " -H \"Authorization: Bearer $LLMGW_KEY\""
    host, port = split(listeners.router)
    if host in ("0.0.0.0", "::", ""):  # listening everywhere: this machine reaches it on loopback
        host = "127.0.0.1"
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    with contextlib.suppress(BrokenPipeError):
        print(f"\nllmgw is serving {served} at http://{where}/v1\n"
              f"Try:\n  curl -s http://{where}/v1/completions "
              f"-H 'Content-Type: application/json'{auth} -d '{body}'\n", flush=True)
