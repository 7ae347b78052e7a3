"""One ``llmgw serve`` process: what it starts, in which order, and how all of it stops.

:func:`serve` wires the process on one :class:`contextlib.AsyncExitStack`.
Each resource registers its own cleanup the moment it exists, so unwinding
the stack — after a signal, a refusal or a bug — stops exactly what was
started, newest first: the reconcile loop and the other tasks, the local
agent with its engines, the admin, metrics and router listeners, the router
workers, the router, the store.

Signals (:class:`Signals`): the first SIGINT or SIGTERM asks for an orderly
stop, at whatever point the process is — opening the store, starting the
local agent, waiting for the first model to load, in the middle of an apply.
The start is cancelled where it stands; a task gets :data:`GRACE` seconds
to end on its own, then is cancelled. A second signal stops at once: tasks
are cancelled without their grace, the local agent is asked to SIGKILL its
engines and is SIGKILLed itself moments later (:meth:`LocalAgent.stop`),
router workers are SIGKILLed.

What stops: everything this process started — its router workers, and the
local agent it started for ``address: local`` together with that agent's
engines (``make run`` leaves nothing behind). An agent it found already
running, and the engines on other nodes, keep running: engines outlive the
daemon and its agents by design, and a restarted daemon adopts them.

Exit status (:meth:`Signals.exit_status`): 0 after an orderly stop, 128 + the
signal's number after a stop at once (130 for SIGINT, 143 for SIGTERM), 1 when
a task failed (a bug, logged with its traceback). A refusal to start
(:class:`Refused`: the store, a port, the local agent) is raised before
anything is left running; the command line turns it into one message.

Usage::

    status = asyncio.run(lifetimes.serve(cluster, directory, options, revision_of))
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import watchfiles
from aiohttp import web
from prometheus_client import CollectorRegistry

from llmgw.daemon import admin, housekeeping, localagents, logsources, publications, workers
from llmgw.daemon.leaders import Leadership, new_holder
from llmgw.daemon.reconcilers import Daemon, RevisionOf
from llmgw.daemon.routetables import Follower
from llmgw.metrics import servers
from llmgw.metrics.collectors import FleetCollector, LeaseCollector, RolloutCollector
from llmgw.router import catalogs, connections
from llmgw.router.apps import Router, Settings
from llmgw.spec import loading, statedirs
from llmgw.spec.models import Cluster, Listeners
from llmgw.spec.quantities import count
from llmgw.store import migrations, stores
from llmgw.store.stores import Store, StoreError
from llmgw.transport import pools, relays
from llmgw.web import NOT_OBSERVED, AdminView, Pages

log = logging.getLogger("llmgw.serve")
T = TypeVar("T")
SIGNALS = (signal.SIGINT, signal.SIGTERM)
GRACE = 10.0  # seconds a task gets to end on its own once the process stops
FAILED = 1  # the exit status when a task failed


@dataclass(frozen=True)
class Options:
    """How to run, from the command line."""

    role: str  # all | router | reconciler
    workers: int
    listeners: Listeners
    ready_timeout: float
    wait_timeout: float
    worker_of: int | None  # this process is a router worker of that parent pid
    worker_argv: tuple[str, ...] = ()  # ``llmgw …`` for each router worker
    # ``--simulated DIR``: every node is a fleet simulator's (``llmgw lab simulate``), on
    # ``DIR/<node>.sock``, its observations pushed; never SSH.
    simulated: Path | None = None
    # What loaded the cluster: the daemon reloads through it (:class:`.loading.Reader`).
    reader: loading.Reader | None = None


class Refused(Exception):
    """The process cannot start; the message says what to fix. Nothing is left running."""


class ListenerRefused(Refused):
    """A listener cannot bind: ``key`` (router, admin, metrics) and the error."""

    def __init__(self, key: str, error: OSError) -> None:
        super().__init__(key)
        self.key, self.error = key, error


class Signals:
    """SIGINT and SIGTERM: the first asks for an orderly stop, the second for one at once."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.hurry = asyncio.Event()
        self.received: list[signal.Signals] = []
        self._hurry_callbacks: list[Callable[[], None]] = []

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        for signum in SIGNALS:
            loop.add_signal_handler(signum, self.received_signal, signum)

    def remove(self, loop: asyncio.AbstractEventLoop) -> None:
        for signum in SIGNALS:
            loop.remove_signal_handler(signum)

    def on_hurry(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (it must not block) when a second signal arrives."""
        self._hurry_callbacks.append(callback)

    def received_signal(self, signum: signal.Signals) -> None:
        if self.hurry.is_set():
            return  # stopping at once already: a third changes nothing
        self.received.append(signum)
        if not self.stop.is_set():
            log.info("%s: stopping (%s again to stop at once)", signum.name,
                     "Ctrl-C" if signum == signal.SIGINT else signum.name)
            self.stop.set()
            return
        log.warning("%s again: stopping at once", signum.name)
        self.hurry.set()
        for callback in self._hurry_callbacks:
            callback()

    def exit_status(self) -> int:
        """0 after an orderly stop; 128 + the signal's number after a stop at once."""
        return 128 + int(self.received[-1]) if self.hurry.is_set() else 0


async def serve(cluster: Cluster, directory: Path, options: Options,
                revision_of: RevisionOf) -> int:
    """Run ``llmgw serve`` until a signal; the exit status. Raises :class:`Refused`."""
    loop = asyncio.get_running_loop()
    signals = Signals()
    signals.install(loop)
    process = _Process(signals)
    try:
        async with contextlib.AsyncExitStack() as stack:
            process.stack = stack
            starting = asyncio.create_task(
                process.start(cluster, directory, options, revision_of), name="start")
            await _first(starting, signals.stop)
            if not starting.done():  # stopped while starting: what started is unwound
                starting.cancel()
                await asyncio.gather(starting, return_exceptions=True)
            else:
                starting.result()  # a refusal unwinds the stack, then reaches the caller
                await signals.stop.wait()
            log.info("stopping")
        log.info("stopped")
    finally:
        signals.remove(loop)
    return FAILED if process.failed else signals.exit_status()


async def _first(task: asyncio.Future[Any], event: asyncio.Event,
                 timeout: float | None = None) -> None:
    """Wait until ``task`` is done or ``event`` is set (or ``timeout`` passed)."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({task, waiter}, timeout=timeout,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


class _Process:
    """The resources of one process, each registered on the exit stack as it is made."""

    def __init__(self, signals: Signals) -> None:
        self.signals = signals
        self.stack = contextlib.AsyncExitStack()
        self.failed = False

    @property
    def stop(self) -> asyncio.Event:
        return self.signals.stop

    def task(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``work`` until the process stops; a failure (a bug) stops the process."""
        task = asyncio.create_task(work, name=name)
        task.add_done_callback(self._ended)
        self.stack.push_async_callback(self._end, task)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        log.error("%s failed; stopping", task.get_name(), exc_info=task.exception())
        self.failed = True
        self.stop.set()

    async def _end(self, task: asyncio.Task[None]) -> None:
        """Stop ``task``: it sees ``stop`` and ends, or is cancelled after the grace."""
        self.stop.set()
        if not task.done() and not self.signals.hurry.is_set():
            await _first(task, self.signals.hurry, GRACE)
        if not task.done():
            log.debug("%s did not end within the grace: cancelled", task.get_name())
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def listen(self, key: str, start: Coroutine[Any, Any, T]) -> T:
        """Await a listener's start; a refusal to bind becomes :class:`ListenerRefused`."""
        try:
            return await start
        except OSError as exc:
            raise ListenerRefused(key, exc) from None

    async def start(self, cluster: Cluster, directory: Path, options: Options,
                    revision_of: RevisionOf) -> None:
        """Open the store, bind every listener, then start the local agent and the loop.

        Everything that can refuse (a damaged store, a port in use) is tried
        before the local agent starts, so a refusal leaves nothing running.
        """
        stack, stop = self.stack, self.stop
        reconciling = options.role in ("all", "reconciler")
        routing_here = options.role in ("all", "router") and options.workers == 1
        # Every client connection is a descriptor: take what the hard limit allows (workers
        # inherit it), and keep the router's connection limit below it, so a flood gets 503s
        # instead of accept() failing for everyone.
        open_files = connections.raise_open_files_limit()
        pool = None
        if options.workers > 1:
            metrics_path = workers.metrics_dir()
            stack.callback(shutil.rmtree, metrics_path, ignore_errors=True)
            registry = workers.registry_for_workers(metrics_path)
            pool = workers.Workers(options.workers, options.worker_argv, metrics_path)
        else:
            registry = CollectorRegistry()
        try:
            store = await stores.open_store(cluster.cluster.store)
        except (StoreError, migrations.SchemaTooNew) as exc:
            raise Refused(str(exc)) from None
        stack.push_async_callback(store.close)
        holder = new_holder()
        router: Router | None = None
        pages: Pages | None = None
        daemon: Daemon | None = None
        leadership = Leadership(store, cluster.cluster.lease_ttl, holder=holder) \
            if reconciling else None
        if routing_here:
            settings = Settings(wait_timeout=options.wait_timeout,
                                heartbeat_interval=cluster.cluster.router_heartbeat,
                                # next to the SQLite database (also where a PostgreSQL
                                # cluster's file would be): usage rows of an outage
                                state_dir=Path(cluster.cluster.store.path).parent)
            settings = dataclasses.replace(settings, max_connections=connections.connection_limit(
                settings.max_connections, open_files))
            router = Router(catalogs.from_cluster(cluster), store=store, registry=registry,
                            settings=settings, router_id=holder)
            stack.push_async_callback(router.close)
            # A router with no reconcile loop beside it shows the leader's published summary.
            reader = publications.Reader(store) \
                if options.role == "router" or store.kind == "postgresql" else None
            pages = _pages(store, router, cluster, lambda: daemon, reader)
            if reader is not None:
                self.task(reader.run(stop), "read-summary")
            runner = await self.listen("router", router.start(
                *split(options.listeners.router), reuse_port=options.worker_of is not None,
                extend=pages.install))
            stack.push_async_callback(runner.cleanup)
            follower = Follower(store, router, holder,
                                leading=leadership.is_leader if leadership else lambda: False)
            self.task(follower.run(stop), "follow-routes")
        if pool is not None:
            self.signals.on_hurry(pool.kill)
            self.task(pool.run(stop), "workers")
        if options.worker_of is not None:
            self.task(_orphaned(options.worker_of, stop), "orphaned")
        else:
            runner = await self.listen(
                "metrics", servers.start(registry, *split(options.listeners.metrics)))
            stack.push_async_callback(runner.cleanup)
        if reconciling:
            assert leadership is not None
            collector = FleetCollector()
            registry.register(collector)
            registry.register(LeaseCollector(
                lambda: (leadership.holder, leadership.epoch, leadership.is_leader())))
            daemon = Daemon(directory, cluster, router=router, collector=collector,
                            revision_of=revision_of, ready_timeout=options.ready_timeout,
                            leadership=leadership, store=store, router_id=holder,
                            reader=options.reader,
                            agents=pools.Pool(cluster, directory, simulated=options.simulated,
                                              push=True,
                                              relays=relays.advertised(options.simulated))
                            if options.simulated is not None else None)
            running: Daemon = daemon
            registry.register(RolloutCollector(
                lambda: ([h.model for h in running.state.held], dict(running.state.gates))))
            token = admin.ensure_token(statedirs.admin_token(cluster.cluster),
                                       old=Path(cluster.cluster.store.path).parent
                                       / admin.TOKEN_FILE)
            log.info("admin token in %s", statedirs.admin_token(cluster.cluster))
            admin_runner = web.AppRunner(
                admin.create_app(daemon, token, pages.gate if pages else None),
                access_log=None)
            await admin_runner.setup()
            stack.push_async_callback(admin_runner.cleanup)
            await self.listen("admin",
                              web.TCPSite(admin_runner, *split(options.listeners.admin)).start())
            # Last, once nothing else can refuse: a refusal then leaves no agent behind.
            await self._local_agent(cluster)
        _log_listeners(options, holder, store)
        if router is not None and options.role == "all":
            self.task(_announce(router, cluster, options.listeners, stop), "announce")
        if daemon is not None:
            looping: Daemon = daemon
            self.task(housekeeping.purge_forever(
                store, lambda: looping.cluster, stop=stop), "housekeeping")
            self.task(daemon.run(stop), "reconcile")
            if not routing_here or store.kind == "postgresql":  # routers elsewhere read it
                assert leadership is not None
                self.task(publications.Publisher(daemon, store, leadership).run(stop),
                          "publish-summary")
        elif router is not None:
            self.task(_watch_files(directory, router, stop), "watch-files")

    async def _local_agent(self, cluster: Cluster) -> None:
        """Start the ``address: local`` node's agent unless one answers; its stop is
        registered before it starts, so a signal during the start stops it too."""
        try:
            agent = await localagents.prepare(cluster)
            if agent is None:
                return
            self.stack.push_async_callback(self._stop_agent, agent)
            await localagents.launch(agent)
        except localagents.LocalAgentError as exc:
            raise Refused(str(exc)) from None

    async def _stop_agent(self, agent: localagents.LocalAgent) -> None:
        log.info("stopping the local agent and the engines it started")
        await agent.stop(hurry=self.signals.hurry)


def split(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


def _pages(store: Store, router: Router, cluster: Cluster,
           daemon: Callable[[], Daemon | None],
           reader: publications.Reader | None = None) -> Pages:
    """The pages for the router's listener; their users, sessions and conversations live
    in the cluster's store beside the keys (SQLite or PostgreSQL). /admin shows this
    process's own loop while it leads, else the leader's summary from ``reader``."""

    def current() -> Cluster:
        running = daemon()
        return running.cluster if running is not None else cluster

    def view() -> AdminView | None:
        running = daemon()
        if running is not None and (reader is None or running.leads()):
            return admin.admin_view(running)
        return reader.view(current(), time.time()) if reader is not None else None

    def absent() -> str:
        running = daemon()
        if reader is not None and (running is None or not running.leads()):
            return reader.absent()
        return NOT_OBSERVED

    log.info("pages on http://%s/chat and /admin (`llmgw users create` adds logins)",
             cluster.cluster.listeners.router)
    return Pages(store, router, cluster=current, admin=view, absent=absent,
                 logs=logsources.DaemonLogs(daemon))


async def _orphaned(parent: int, stop: asyncio.Event) -> None:
    """A worker whose parent died (even by SIGKILL) stops instead of holding the port."""
    while not stop.is_set():
        if os.getppid() != parent:
            log.warning("parent %d is gone: stopping this worker", parent)
            stop.set()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


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


async def _announce(router: Router, cluster: Cluster, listeners: Listeners,
                    stop: asyncio.Event) -> None:
    """Once a model is ready: where to send requests, as a line that works when pasted."""
    while not router.routes.models():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)
        if stop.is_set():
            return
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
