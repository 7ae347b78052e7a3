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
import dataclasses
import errno
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

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
from llmgw.metrics.collectors import FleetCollector, LeaseCollector, RolloutCollector
from llmgw.router import catalogs, connections
from llmgw.router.apps import Router, Settings
from llmgw.spec import loading
from llmgw.spec.models import Cluster, Listeners
from llmgw.spec.quantities import count, parse_duration
from llmgw.store import migrations, stores
from llmgw.store.stores import Store, StoreError
from llmgw.web import AdminView, Pages

log = logging.getLogger("llmgw.serve")
ROLES = ("all", "router", "reconciler")
MAX_WORKERS = 64
T = TypeVar("T")


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
    except _ListenerError as exc:
        raise UserError(_listener_problem(args, options, exc)) from None


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


def _listener_problem(args: argparse.Namespace, options: Options, problem: _ListenerError,
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


async def _serve(cluster: Cluster, directory: Path, options: Options,
                 args: argparse.Namespace) -> int:
    """Open the store, bind every listener, then start the local agent and the loop.

    Everything that can refuse (a damaged store, a port in use) is tried
    before the local agent starts, so a refusal leaves nothing running.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    reconciling = options.role in ("all", "reconciler")
    routing_here = options.role in ("all", "router") and options.workers == 1
    # Every client connection is a descriptor: take what the hard limit allows (workers
    # inherit it), and keep the router's connection limit below it, so a flood gets 503s
    # instead of accept() failing for everyone.
    open_files = connections.raise_open_files_limit()
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
        leadership = Leadership(store, cluster.cluster.lease_ttl, holder=holder) \
            if reconciling else None
        if routing_here:
            settings = Settings(wait_timeout=options.wait_timeout)
            settings = dataclasses.replace(settings, max_connections=connections.connection_limit(
                settings.max_connections, open_files))
            router = Router(catalogs.from_cluster(cluster), store=store, registry=registry,
                            settings=settings)
            pages = _pages(store, router, cluster, lambda: daemon)
            runners.append(await _listen("router", router.start(
                *split(options.listeners.router), reuse_port=options.worker_of is not None,
                extend=pages.install if pages else None)))
            follower = Follower(store, router, holder,
                                leading=leadership.is_leader if leadership else lambda: False)
            tasks.append(asyncio.create_task(follower.run(stop), name="follow-routes"))
        if pool is not None:
            tasks.append(asyncio.create_task(pool.run(stop), name="workers"))
        if options.worker_of is not None:
            tasks.append(asyncio.create_task(_orphaned(options.worker_of, stop)))
        if options.worker_of is None:
            runners.append(await _listen(
                "metrics", servers.start(registry, *split(options.listeners.metrics))))
        if reconciling:
            assert leadership is not None
            collector = FleetCollector()
            registry.register(collector)
            registry.register(LeaseCollector(
                lambda: (leadership.holder, leadership.epoch, leadership.is_leader())))
            daemon = Daemon(directory, cluster, router=router, collector=collector,
                            revision_of=revision_of, ready_timeout=options.ready_timeout,
                            leadership=leadership, store=store, router_id=holder)
            registry.register(RolloutCollector(
                lambda: ([h.model for h in daemon.state.held], dict(daemon.state.gates))))
            token = admin.ensure_token(Path(cluster.cluster.store.path).parent)
            admin_runner = web.AppRunner(
                admin.create_app(daemon, token, pages.gate if pages else None),
                access_log=None)
            await admin_runner.setup()
            runners.append(admin_runner)
            await _listen("admin",
                          web.TCPSite(admin_runner, *split(options.listeners.admin)).start())
            # Last, once nothing else can refuse: a refusal then leaves no agent behind.
            try:
                agent = await localagents.ensure(cluster)
            except localagents.LocalAgentError as exc:
                raise UserError(str(exc)) from None
        _log_listeners(options, holder, store)
        if router is not None and options.role == "all":
            tasks.append(asyncio.create_task(_announce(router, cluster, options.listeners)))
        if reconciling:
            tasks.append(asyncio.create_task(housekeeping.purge_forever(
                store, lambda: daemon.cluster if daemon else cluster, stop=stop)))
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
           daemon: Callable[[], Daemon | None]) -> Pages:
    """The pages for the router's listener; their users, sessions and conversations live
    in the cluster's store beside the keys (SQLite or PostgreSQL)."""

    def current() -> Cluster:
        running = daemon()
        return running.cluster if running is not None else cluster

    def view() -> AdminView | None:
        running = daemon()
        return admin.admin_view(running) if running is not None else None

    log.info("pages on http://%s/chat and /admin (`llmgw users create` adds logins)",
             cluster.cluster.listeners.router)
    return Pages(store, router, cluster=current, admin=view)


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
    async for changes in watchfiles.awatch(directory, stop_event=stop, recursive=False,
                                           debounce=300, step=100):
        if not any(Path(path).name.endswith((".yaml", ".yml")) for _, path in changes):
            continue  # the SQLite store and its journal live here too, and change all the time
        try:
            cluster = await asyncio.to_thread(loading.load, directory)
        except loading.SpecErrors as exc:
            log.error("cluster directory has %s; keeping the last valid cluster",
                      count(len(exc.errors), "error"))
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
