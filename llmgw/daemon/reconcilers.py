"""The reconcile loop of ``llmgw serve``: observe, plan, apply, route — again and again.

One iteration: reload the cluster directory if a file changed (an invalid
edit is refused and the last valid cluster stays in force), collect every
node's report, hand the ready replicas to the router, plan with the router's
demand, and — under ``sync: auto`` — execute the plan. Iterations run one at
a time; what wakes the loop:

* a file in the cluster directory changed (watchfiles);
* the drift timer (``cluster.drift_interval``): units stopped by hand, or
  running without a plan that wants them, are found and fixed;
* a unit on some node changed state (the agents' WatchUnits streams), so a
  failed engine is restarted without waiting for the timer;
* a request is waiting for a model with no ready replica (on demand).

There is no state file: every iteration starts from what the nodes report,
so a restarted daemon adopts the running fleet and restarts nothing.

With a ``leadership`` (:mod:`llmgw.daemon.leaders`) iterations run only while
this reconciler holds the lease, each one fenced (cancelled if the lease is
lost mid-way); a standby waits, and its first iteration as leader adopts the
fleet like a restart does. With a ``store``, the leader publishes the routes
for routers in other processes and reads their demand
(:mod:`llmgw.daemon.routetables`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import stat
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import watchfiles

from llmgw.applying import executions, records
from llmgw.applying.convergences import Convergence, Finished, Request
from llmgw.applying.executions import Outcome, Step, Waiting
from llmgw.daemon import autoinstalls, loadhistories, routetables
from llmgw.daemon.canaries import RouterTraffic
from llmgw.daemon.leaders import LEASE, Leadership, NotLeader
from llmgw.daemon.loadhistories import LoadHistories
from llmgw.engines import profiles
from llmgw.fleet.types import Demand, Fleet, Unit
from llmgw.metrics.collectors import FleetCollector
from llmgw.planning import drifts, fits, outputs, planners
from llmgw.planning.types import Plan
from llmgw.router import catalogs
from llmgw.router.apps import Router
from llmgw.router.routes import Endpoint
from llmgw.spec import loading, upstreams
from llmgw.spec.models import Cluster
from llmgw.spec.quantities import count
from llmgw.spec.rollouts import Hold
from llmgw.store.stores import Store, StoreError
from llmgw.transport import pools
from llmgw.transport.failures import NodeUnreachable

log = logging.getLogger("llmgw.daemon")

RevisionOf = Callable[[Path], str | None]
WATCH_RECHECK = 1.0  # seconds between checks that the watched directory is still the one


@dataclass
class State:
    """What the daemon knows now; the admin API serves it."""

    cluster: Cluster
    directory: Path
    started_at: float
    revision: str | None = None  # of the directory as last loaded
    applied_revision: str | None = None  # the revision the fleet last converged to
    fleet: Fleet | None = None
    observed_at: float | None = None
    plan: Plan | None = None
    planned_at: float | None = None
    outcome: Outcome | None = None
    applied_at: float | None = None
    refused: list[str] = field(default_factory=list)  # errors of the last refused edit
    iterations: int = 0
    held: list[Hold] = field(default_factory=list)  # models held after a failed gate
    gates: dict[tuple[str, str], int] = field(default_factory=dict)  # (model, result) → count
    # engines.<engine>.install: auto, per node: installed, installing, or why not
    engine_installs: list[autoinstalls.NodeInstall] = field(default_factory=list)


class Daemon:
    """The loop; ``router`` and ``collector`` are optional so tests can run it bare."""

    def __init__(
        self,
        directory: Path,
        cluster: Cluster,
        *,
        router: Router | None = None,
        collector: FleetCollector | None = None,
        revision_of: RevisionOf = lambda _: None,
        ready_timeout: float = executions.DEFAULT_READY_TIMEOUT,
        clock: Callable[[], float] = time.time,
        leadership: Leadership | None = None,
        store: Store | None = None,
        router_id: str | None = None,
        agents: pools.Pool | None = None,
        reader: loading.Reader | None = None,
    ) -> None:
        self.state = State(cluster, directory, clock(), revision=revision_of(directory))
        self.router = router
        self.collector = collector
        self.revision_of = revision_of
        self.ready_timeout = ready_timeout
        self.clock = clock
        # The agents: SSH and local sockets by default; tests pass a pool of their own.
        self.pool = agents if agents is not None else pools.Pool(cluster, directory)
        # Reloads parse only the files that changed; pass the reader that loaded
        # ``cluster`` so the first edit does not parse every file again.
        self.reader = reader if reader is not None else loading.Reader()
        self._wake = asyncio.Event()
        self._reload = False
        self._reasons: set[str] = set()
        self._watchers: list[asyncio.Task[None]] = []
        self._pushing = False
        self._last_units: dict[str, tuple[list[Unit], float]] = {}  # node → (units, as of)
        self._held: set[tuple[str, int, str, tuple[str, ...]]] = set()  # logged already
        self.leadership = leadership
        self.store = store
        self.router_id = router_id  # our own router's id in the store's demand signals
        self._signals = Demand()  # other routers' demand, from the store
        self.loads = LoadHistories()  # each autoscaled model's load, sampled at each plan
        self.first_lead_iteration_at: float | None = None  # clock(), per leadership term
        self.traffic = RouterTraffic(lambda: self.cluster, self.observe, router, store,
                                     router_id)
        self.converging = Convergence(
            self.pool, store=store, clock=clock, ready_timeout=ready_timeout,
            started_by=records.DAEMON, progress=_log_step, traffic=lambda _: self.traffic,
            observed=self._observed, planner=planners.Planner())
        self.converging.on_finished.append(self._finished)
        self.installs = autoinstalls.AutoInstalls(self.pool, directory, clock=clock,
                                                  wake=self.wake)
        self._waits_logged: tuple[tuple[str, int, str], ...] = ()
        self._waits_logged_at = 0.0

    def leads(self) -> bool:
        return self.leadership is None or self.leadership.is_leader()

    @property
    def cluster(self) -> Cluster:
        return self.state.cluster

    def wake(self, reason: str) -> None:
        self._reasons.add(reason)
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Reconcile until ``stop`` is set; then close every connection."""
        helpers = [
            asyncio.create_task(self._watch_files(stop), name="watch-files"),
            asyncio.create_task(self._watch_demand(stop), name="watch-demand"),
        ]
        lease = None
        if self.leadership is not None:
            lease = asyncio.create_task(self.leadership.run(stop), name="lease")
            helpers.append(asyncio.create_task(self._watch_leadership(), name="watch-lease"))
        self._start_unit_watchers()
        self.wake("start")
        try:
            while not stop.is_set():
                await self._sleep(stop)
                if stop.is_set():
                    break
                if not self.leads():
                    self._wake.clear()  # a standby keeps its reasons for when it leads
                    continue
                reasons, self._reasons = self._reasons or {"drift timer"}, set()
                self._wake.clear()
                work = self.reconcile(reasons)
                if self.leadership is not None:
                    work = self.leadership.fenced(work)
                if not await self._until_stopped(work, stop):
                    break
        finally:
            if lease is not None:
                # The iteration is over (or cancelled): hand the lease over now, so a
                # standby leads at its next try instead of after lease_ttl.
                stop.set()
                try:
                    await asyncio.wait_for(asyncio.shield(lease), 10)
                except (TimeoutError, asyncio.CancelledError):
                    lease.cancel()
            for task in [*helpers, *self._watchers]:
                task.cancel()
            await asyncio.gather(*helpers, *self._watchers, return_exceptions=True)
            await self.converging.aclose()
            await self.installs.aclose()
            await self.pool.aclose()

    async def _until_stopped(self, work: Coroutine[Any, Any, Any], stop: asyncio.Event) -> bool:
        """Run one iteration; False when ``stop`` came first (the iteration is cancelled).

        This is the one place an iteration's failure is handled: an unexpected
        exception is a bug, logged with its traceback, and the loop goes on.
        """
        task = asyncio.ensure_future(work)
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return False
        error = task.exception()
        if isinstance(error, NotLeader):
            log.warning("iteration stopped: %s", error)
        elif error is not None:
            log.error("reconcile failed; retrying at the next tick", exc_info=error)
        return True

    async def _watch_leadership(self) -> None:
        assert self.leadership is not None
        while True:
            await self.leadership.changed.wait()
            self.leadership.changed.clear()
            if self.leadership.is_leader():
                self.first_lead_iteration_at = None
                self.wake(f"leading (epoch {self.leadership.epoch})")
            elif self.converging.busy:
                # A standby acts on nothing: the new leader takes over from what runs.
                log.warning("no longer leading: the changes in flight are left as they are")
                await self.converging.aclose()

    async def _sleep(self, stop: asyncio.Event) -> None:
        waiters = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
        try:
            # Autoscaled models are planned often enough to judge their windows.
            timeout = min(self.cluster.cluster.drift_interval,
                          loadhistories.tick(self.cluster) or math.inf)
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def reconcile(self, reasons: set[str] | None = None) -> Plan:
        """One iteration; returns the plan it made. Under ``sync: auto`` its changes start
        and settle in the background (:mod:`llmgw.applying.convergences`): the next
        iteration does not wait for a replica to load."""
        state = self.state
        state.iterations += 1
        # A commit changes no file in the directory itself: ask git every time.
        state.revision = await asyncio.to_thread(self.revision_of, state.directory)
        if self._reload:
            self._reload = False
            await self._load()
        log.debug("reconciling (%s)", ", ".join(sorted(reasons or {"request"})))
        if self.first_lead_iteration_at is None:
            self.first_lead_iteration_at = self.clock()
        demand = self._demand()
        prepared = await self.converging.prepare(Request(
            self.cluster, state.revision, demand,
            loads=lambda fleet, now: self.loads.record(self.cluster, fleet, demand, now)))
        plan = prepared.plan
        # In the background, as fetches are: a node's install never holds up the others'
        # replicas, and the next iteration sees what it installed.
        state.engine_installs = self.installs.consider(self.cluster, prepared.fleet)
        state.held = list(self.converging.held)
        state.plan, state.planned_at = plan, self.clock()
        if self.collector is not None:
            self.collector.observe_plan(plan)
        held = {(h.model, h.replica, h.drift, h.reasons) for h in plan.held}
        for model, replica, kind, why in sorted(held - self._held):  # once, not every tick
            log.warning("held %s r%d (%s): %s", model, replica, drifts.title(kind), "; ".join(why))
        self._held = held
        self._log_waits()
        if not plan.has_changes:
            if (state.applied_revision != state.revision and not (plan.unplaceable or plan.holds)
                    and not self.converging.busy):
                state.applied_revision = state.revision
            return plan
        log.info("%s", plan.summary())
        if self.cluster.cluster.sync != "auto":
            log.info("sync is manual: run `llmgw apply` to make these changes")
            return plan
        for line in outputs.text(plan).splitlines():
            if line.strip():
                log.info("  %s", line)
        await self.converging.start(prepared)
        return plan

    def waiting(self) -> list[Waiting]:
        """The replicas being waited for now."""
        return self.converging.waiting()

    def _log_waits(self) -> None:
        """Say what is being waited for: when that changes, and once a minute meanwhile."""
        waits = self.waiting()
        shown = tuple((w.change.model, w.replica, w.state) for w in waits)
        now = self.converging.now()
        if not waits or (shown == self._waits_logged and now - self._waits_logged_at < 60):
            self._waits_logged = shown
            return
        self._waits_logged, self._waits_logged_at = shown, now
        log.info("waiting for %s", "; ".join(w.line(now) for w in waits))

    async def _finished(self, done: Finished) -> None:
        """A plan settled: count its gates, say its outcome, hold what failed a gate."""
        state, outcome = self.state, done.outcome
        if not self.converging.busy:
            self.traffic.clear()  # what was drained is gone, what baked was decided
        for item in outcome.changes:
            if item.gate is not None:
                key = (item.change.model, "rolled_back" if item.rolled_back else "promoted")
                state.gates[key] = state.gates.get(key, 0) + 1
        for hold in done.held:
            log.warning("%s %s; the old replica serves on", hold.model, hold.line())
        for error in done.hold_errors:
            log.warning("cannot write the hold of %s (held until restart)", error)
        state.held = list(self.converging.held)
        state.outcome, state.applied_at = outcome, self.clock()
        log.info("%s", outcome.summary())
        for failed in outcome.failed:
            for error in failed.errors:
                log.warning("  %s r%d: %s", failed.change.model, failed.change.replica, error)
        if (outcome.ok and not done.plan.unplaceable and done.plan.revision == state.revision
                and not self.converging.busy):
            state.applied_revision = state.revision
        self.wake("an apply settled")

    async def observe(self) -> Fleet:
        """Collect every node's report; hand ready replicas to the router and metrics."""
        return await self.converging.observe()

    async def _observed(self, fleet: Fleet) -> Fleet:
        fleet = self._remember(fleet)
        self.state.fleet, self.state.observed_at = fleet, self.clock()
        for name, report in sorted(fleet.nodes.items()):
            if not report.reachable:
                log.warning("node %s unreachable: %s", name, report.error)
        table = self.traffic.adjust(endpoints(self.cluster, fleet))
        if self.router is not None:
            self.router.update_routes(table)
        await self._publish(table)
        if self.collector is not None:
            self.collector.observe(fleet, {name: f.rate_gbps for name, f in
                                           self.cluster.fabrics.items() if f.rate_gbps})
        return fleet

    def _remember(self, fleet: Fleet) -> Fleet:
        """An unreachable node keeps the units it last reported, so the planner sees its
        replicas as unknown instead of placing them a second time elsewhere."""
        nodes = dict(fleet.nodes)
        for name, report in fleet.nodes.items():
            if report.reachable:
                self._last_units[name] = (report.units, report.collected_at or self.clock())
            elif not report.units and name in self._last_units:
                # Remembered even when it ran nothing: then nothing is hidden there, and the
                # planner may place elsewhere what it would otherwise hold back (units_as_of).
                units, seen = self._last_units[name]
                nodes[name] = report.model_copy(update={"units": units, "units_as_of": seen})
        return fleet.model_copy(update={"nodes": nodes})

    async def _publish(self, table: dict[str, list[Endpoint]]) -> None:
        """Hand the routes to routers in other processes (fenced by the lease)."""
        if self.store is None or self.leadership is None or self.leadership.epoch is None:
            return
        try:
            done = await self.store.publish_routes(LEASE, self.leadership.holder,
                                                   self.leadership.epoch,
                                                   routetables.encode(
                                                       table, upstreams.summary(self.cluster)))
        except StoreError as exc:
            log.warning("cannot publish routes (routers keep their last ones): %s", exc)
            return
        if not done:
            raise NotLeader("the store refused the routes: the lease is no longer ours")

    def demand(self) -> Demand:
        """This process's router's demand merged with every other router's, as planned."""
        return self._demand()

    def _demand(self) -> Demand:
        own = self.router.demand() if self.router is not None else Demand()
        return routetables.merge([own, self._signals]) if self.store is not None else own

    async def _load(self) -> None:
        """Reload the directory; an invalid edit is refused and the last valid one stays."""
        try:
            cluster = await asyncio.to_thread(self.reader.load, self.state.directory,
                                              [profiles.check, fits.check])
        except loading.SpecErrors as exc:
            self.state.refused = [str(e) for e in exc.errors]
            log.error("cluster directory has %s; keeping the last valid cluster:",
                      count(len(exc.errors), "error"))
            for error in exc.errors:
                log.error("  %s", error)
            return
        self.state.refused = []
        await self.pool.reconfigure(cluster)  # also re-reads known_hosts; keeps good sessions
        if cluster == self.cluster:
            return
        log.info("cluster directory changed (revision %s)", self.state.revision or "-")
        nodes_changed = set(cluster.nodes) != set(self.cluster.nodes)
        self.state.cluster = cluster
        if nodes_changed:
            for task in self._watchers:
                task.cancel()
            self._start_unit_watchers()
        if self.router is not None:
            self.router.configure(catalogs.from_cluster(cluster))

    async def _watch_files(self, stop: asyncio.Event) -> None:
        """Wake the loop when a cluster file changes, whatever happens to the directory.

        Deploys replace the directory rather than edit it: ``rm -rf`` and a fresh
        copy, a rename swap, a new checkout behind a symlink swapped atomically
        (git-sync). A watch stays on the directory it started on, so the parent
        is watched too, for events on the directory's own name, and the path is
        checked once a second for naming another directory (device and inode,
        symlinks followed); either restarts the watch on what the path names
        now. While it names nothing, the last valid cluster stays in force.
        """
        directory = self.state.directory.absolute()
        reread = False  # after a replacement: reload once the new watch is up
        while not stop.is_set():
            watched = _identity(directory)
            if watched is None:
                await asyncio.sleep(WATCH_RECHECK)
                continue
            replaced = False
            async for changes in watchfiles.awatch(
                directory, directory.parent, stop_event=stop, recursive=False, debounce=300,
                step=100, rust_timeout=int(WATCH_RECHECK * 1000), yield_on_timeout=True,
            ):
                paths = {Path(path) for _, path in changes}
                names = sorted(p.name for p in paths if p.parent == directory)
                if reread:
                    # Files written before this watch began raised no event: read them all.
                    reread = False
                    self._reload = True
                    self.wake("cluster directory replaced")
                if any(n.endswith((".yaml", ".yml")) or n == "known_hosts" for n in names):
                    # known_hosts too: re-pinned keys take effect without a restart.
                    self._reload = True
                    self.wake(f"files changed: {', '.join(names)}")
                replaced = directory in paths or _identity(directory) != watched
                if replaced:
                    break
            if not replaced:
                return  # stopped
            log.info("the cluster directory %s was replaced; watching the new one", directory)
            reread = True

    async def _watch_demand(self, stop: asyncio.Event) -> None:
        """Requests waiting for a model no replica serves: plan now, not at the next tick."""
        seen: dict[str, int] = {}
        while not stop.is_set():
            if self.store is not None and self.leads():
                try:
                    self._signals = await routetables.read_signals(self.store, self.router_id)
                except StoreError as exc:
                    log.debug("cannot read routers' demand: %s", exc)
            waiting = self._demand().waiting
            fresh = {m: n for m, n in waiting.items() if n > seen.get(m, 0)}
            if fresh:
                self.wake(f"requests waiting for {', '.join(sorted(fresh))}")
            seen = dict(waiting)
            await asyncio.sleep(0.2 if self.store is None else 0.5)

    def _start_unit_watchers(self) -> None:
        if self.pool.pushes:
            # Each agent pushes what changed; the pool's view is the fleet, and it wakes
            # the loop for what needs a plan (a unit failed, a node lost or back, a fault).
            if not self._pushing:
                self._pushing = True
                self.pool.push(lambda node, why: self.wake(why))
            return
        self._watchers = [
            asyncio.create_task(self._watch_units(node), name=f"watch-units-{node}")
            for node in self.pool.nodes
        ]

    async def _watch_units(self, node: str) -> None:
        """A unit failing or stopping on ``node`` wakes the loop (reconnecting as needed)."""
        delay = 1.0
        while True:
            try:
                agent = await self.pool.client(node)
                async for unit in agent.watch_units():
                    delay = 1.0
                    if unit.state in ("failed", "stopped") and unit.detail != "removed":
                        self.wake(f"{unit.name} on {node} is {unit.state}")
            except (NodeUnreachable, grpc.aio.AioRpcError, OSError):
                pass
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)


def _identity(directory: Path) -> tuple[int, int] | None:
    """The directory a path names now (device, inode; symlinks followed), None if none."""
    try:
        info = directory.stat()
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISDIR(info.st_mode) else None


def endpoints(cluster: Cluster, fleet: Fleet) -> dict[str, list[Endpoint]]:
    """Ready replicas by model key: the head shard (rank 0) serves HTTP."""
    table: dict[str, list[Endpoint]] = {}
    for name, report in sorted(fleet.nodes.items()):
        node = cluster.nodes.get(name)
        if node is None or not report.reachable:
            continue
        host = "127.0.0.1" if node.is_local else node.address
        for unit in report.units:
            if unit.state == "ready" and unit.rank == 0 and unit.port is not None:
                if unit.model in cluster.models:
                    load = unit.load
                    running, waiting = (load.requests_running, load.requests_waiting) if (
                        load is not None) else (None, None)
                    table.setdefault(unit.model, []).append(Endpoint(
                        f"http://{host}:{unit.port}", node=name, replica=unit.replica,
                        # The engine's own load, where it said both; else the router counts.
                        load=running + waiting if running is not None and waiting is not None
                        else None, load_at=load.scraped_at if load is not None else None))
    return table


def _log_step(step: Step) -> None:
    change = step.change
    shown = step.state in ("failed", "gating", "promoted", "rolled back")
    detail = f" ({step.detail})" if step.detail and shown else ""
    log.info("  %s r%d %s %s: %s after %.1fs%s", change.model, change.replica, step.node,
             step.unit, step.state, step.elapsed, detail)
