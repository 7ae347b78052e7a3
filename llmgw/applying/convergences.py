"""The convergence service: observe, plan with holds, install, execute, wait, journal.

``llmgw serve``'s loop, ``llmgw apply`` and ``llmgw node remove`` all converge
the fleet through one :class:`Convergence`, built on what it is given — the
agents (:class:`Agents`: the pool interface), the store and the clock — so
its loop runs in-process against real agents in tests. A pass has two
steps, like ``terraform plan`` and ``apply``:

1. :meth:`Convergence.prepare` — observe every node, plan (with the router's
   demand), leave out held models' replacements (:mod:`llmgw.planning.holds`;
   holds a commit made stale are released) and what the caller scopes out,
   and settle the plan against the changes still in flight (below);
2. :meth:`Convergence.start` — install the engine versions the plan needs
   (when given an installer; a failed install changes nothing), plan again
   with them there, then start an :class:`~llmgw.applying.executions.Execution`
   and return at once. Each change waits for its own replica, in the
   background, within its own deadline; when the whole plan has settled, its
   outcome is journaled and the models whose gate failed are held
   (:meth:`Convergence.finish` waits for that: the CLI's one-shots do).

:meth:`Convergence.converge` is both steps, as the daemon runs them at every
iteration. While a replica loads the daemon goes on observing and repairing
everything else. A change still in flight is never planned twice: the plan's
changes to its replicas are *deferred* (as are changes that would land on
capacity a deferred destroy was to free) — unless the cluster changed the
model or a node it lands on since, which makes the wait *moot*: it is
superseded (cancelled), and the new plan takes over from what runs.

Usage::

    service = Convergence(pool, store=store, ready_timeout=900)
    prepared = await service.prepare(Request(cluster, revision="3f2a…"))
    started = await service.start(prepared)
    finished = await service.finish(started)   # a one-shot; the daemon does not wait
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from llmgw.applying import bakes, executions, records
from llmgw.applying.executions import (
    DEFAULT_READY_TIMEOUT,
    Execution,
    Gating,
    Outcome,
    Progress,
    Waiting,
)
from llmgw.fleet.types import Demand, Fleet
from llmgw.planning import holds, installs, planners, plans
from llmgw.planning.scaling import LoadSample, Policy
from llmgw.planning.types import Change, Plan
from llmgw.spec.models import Cluster
from llmgw.spec.rollouts import Hold
from llmgw.store.stores import Store, StoreError

log = logging.getLogger("llmgw.converge")

Key = tuple[str, int]  # (model, replica)
Installer = Callable[[Mapping[tuple[str, str], set[str]]], Awaitable[list[str]]]
"""Installs each (engine, version) on the nodes named; returns the failures, one line each."""


class Agents(executions.Agents, Protocol):
    """What the service needs of :class:`llmgw.transport.pools.Pool`: execution's calls,
    and every node's report."""

    async def fleet(self) -> Fleet: ...


@dataclass(frozen=True)
class Request:
    """What one pass converges to, and how the caller takes part."""

    cluster: Cluster
    revision: str | None = None
    demand: Demand = field(default_factory=Demand)
    # The plan as the caller wants it: a saved plan merged (apply), only the moves off a
    # node (node remove). Applied to every plan of the pass, the one after installs too.
    scope: Callable[[Plan], Plan] | None = None
    holds: Sequence[Hold] | None = None  # the holds in force; None: read from the store
    # After installs the plan is made again; the caller may show it.
    replanned: Callable[[Plan], None] | None = None
    # How the planner treats what it cannot see (``--force`` places beside unseen nodes).
    policy: Policy | None = None
    # Each model's load history for the autoscaler, given the fleet just observed and the
    # plan's time (the daemon records a sample in it); None: no history, the count holds.
    loads: Callable[[Fleet, float], Mapping[str, Sequence[LoadSample]]] | None = None


@dataclass(frozen=True)
class Prepared:
    """A plan made from an observation, settled against the changes in flight."""

    request: Request
    fleet: Fleet
    plan: Plan
    deferred: tuple[Change, ...] = ()  # left out: a change to the same replicas is in flight
    superseded: tuple[Change, ...] = ()  # in-flight changes this plan made moot (cancelled)


@dataclass(frozen=True)
class Started:
    """What :meth:`Convergence.start` did: an execution under way, or why none."""

    prepared: Prepared
    plan: Plan  # what runs (planned again after installs)
    execution: Execution | None = None
    install_failures: tuple[str, ...] = ()  # nothing was changed
    started_at: float = 0.0


@dataclass(frozen=True)
class Finished:
    """A plan that settled: its outcome, its journal entry, the holds it caused."""

    plan: Plan
    outcome: Outcome
    started_at: float
    journal_id: int | None  # None: not journaled (no store, or it refused: logged)
    held: tuple[Hold, ...] = ()
    hold_errors: tuple[str, ...] = ()  # holds the store refused to write


Finishing = Callable[[Finished], Awaitable[None] | None]


class Convergence:
    """Converges a fleet to its cluster; one per process (the changes in flight are its)."""

    def __init__(
        self,
        agents: Agents,
        *,
        store: Store | None = None,
        clock: Callable[[], float] = time.time,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        started_by: str = records.DAEMON,
        progress: Progress | None = None,
        traffic: Callable[[Cluster], bakes.Traffic] | None = None,
        install: Installer | None = None,
        observed: Callable[[Fleet], Awaitable[Fleet]] | None = None,
        planner: planners.Planner | None = None,
    ) -> None:
        self.agents = agents
        self.store = store
        self.clock = clock
        self.ready_timeout = ready_timeout
        self.started_by = started_by
        self.progress = progress
        self.traffic = traffic or bakes.ProbeOnly
        self.install = install
        self.observed = observed  # the daemon's: remember unreachable nodes, publish routes
        # The daemon's loop plans incrementally (the same plans, from what the last plan
        # read of unchanged nodes); a one-shot plans in full.
        self.planner = planner
        self.held: list[Hold] = []  # the holds in force, as last read or made
        self.on_finished: list[Finishing] = []
        self._running: dict[Execution, asyncio.Task[Finished]] = {}
        self._bases: dict[Execution, Cluster] = {}

    # -- a pass --------------------------------------------------------------

    async def converge(self, request: Request) -> Started:
        """:meth:`prepare` and :meth:`start`: what the daemon does at each iteration."""
        return await self.start(await self.prepare(request))

    async def observe(self) -> Fleet:
        """Every node's report (passed through the ``observed`` hook)."""
        fleet = await self.agents.fleet()
        return await self.observed(fleet) if self.observed is not None else fleet

    async def prepare(self, request: Request) -> Prepared:
        """Observe, plan, hold, scope; then settle against what is in flight."""
        # Changes in flight while the fleet is observed count even if they finish before
        # the plan is made: the observation predates their effects.
        before = {id(c): c for c in self.pending()}
        fleet = await self.observe()
        cluster = request.cluster
        now = self.clock()
        loads = request.loads(fleet, now) if request.loads is not None else None
        planning = self.planner.plan if self.planner is not None else plans.plan
        plan = planning(cluster, fleet, now, request.demand,
                        revision=request.revision, policy=request.policy, loads=loads)
        plan = await self._hold(plan, cluster, request.holds)
        if request.scope is not None:
            plan = request.scope(plan)
        superseded = self._supersede(cluster, request.revision)
        busy = {**before, **{id(c): c for c in self.pending()}}
        for change in superseded:
            busy.pop(id(change), None)
        plan, deferred = defer(plan, busy.values())
        return Prepared(request, fleet, plan, tuple(deferred), tuple(superseded))

    async def start(self, prepared: Prepared) -> Started:
        """Install what the plan needs, then start executing it; returns at once."""
        plan, request = prepared.plan, prepared.request
        if not plan.has_changes and not plan.awaiting_install:
            return Started(prepared, plan)
        needs = installs.needed(plan, prepared.fleet.nodes) if self.install else {}
        if needs:
            assert self.install is not None
            failures = await self.install(needs)
            if failures:
                return Started(prepared, plan, install_failures=tuple(failures))
            prepared = await self.prepare(request)
            plan = prepared.plan
            if request.replanned is not None:
                request.replanned(plan)
        if not plan.has_changes:
            return Started(prepared, plan)
        started_at = time.time()
        gating = Gating.of(request.cluster, self.traffic(request.cluster))
        run = Execution(plan, self.agents, progress=self.progress,
                        ready_timeout=self.ready_timeout, gating=gating)
        run.start()
        self._bases[run] = request.cluster
        self._running[run] = asyncio.create_task(self._conclude(run, started_at),
                                                 name="conclude")
        return Started(prepared, plan, run, started_at=started_at)

    async def finish(self, started: Started) -> Finished | None:
        """Wait until ``started``'s plan settled and was journaled (None: nothing ran)."""
        if started.execution is None:
            return None
        return await asyncio.shield(self._running[started.execution])

    # -- what is in flight -------------------------------------------------------

    def pending(self) -> list[Change]:
        """Every change not settled yet, of every plan under way."""
        return [change for run in self._running for change in run.pending()]

    def waiting(self) -> list[Waiting]:
        """What is being waited for now (:meth:`Waiting.line` says it for people)."""
        return [wait for run in self._running for wait in run.waiting()]

    def now(self) -> float:
        """The executions' clock, for :meth:`Waiting.line`."""
        return time.monotonic()

    @property
    def busy(self) -> bool:
        return bool(self._running)

    async def aclose(self) -> None:
        """Cancel every execution and wait (stopping, or no longer leading)."""
        runs, tasks = list(self._running), list(self._running.values())
        await asyncio.gather(*(run.aclose() for run in runs), return_exceptions=True)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _supersede(self, cluster: Cluster, revision: str | None) -> list[Change]:
        """Cancel the waits a changed cluster made moot: their model or a node they land
        on is not what it was when they were planned."""
        stopped = []
        for run, basis in self._bases.items():
            moot = [c for c in run.pending() if _moot(c, basis, cluster)]
            if moot:
                why = f"the cluster changed (revision {revision or '-'})"
                for change in run.supersede(moot, why):
                    log.info("%s r%d: no longer waited for: %s", change.model, change.replica,
                             why)
                    stopped.append(change)
        return stopped

    async def _conclude(self, run: Execution, started_at: float) -> Finished:
        try:
            outcome = await run.finished()
            journal = await records.record(self.store, run.plan, outcome, started_at,
                                           self.started_by)
            made, errors = await self._held_after(run.plan, outcome, self._bases[run])
            done = Finished(run.plan, outcome, started_at, journal, tuple(made), tuple(errors))
        finally:
            self._running.pop(run, None)
            self._bases.pop(run, None)
        for hook in self.on_finished:
            result = hook(done)
            if result is not None:
                await result
        return done

    # -- holds ---------------------------------------------------------------

    async def _hold(self, plan: Plan, cluster: Cluster, given: Sequence[Hold] | None) -> Plan:
        """``plan`` without the replacements of held models; stale holds released."""
        known = list(given) if given is not None else self.held
        if given is None and self.store is not None:
            try:
                known = await self.store.holds()
            except StoreError as exc:
                log.warning("cannot read held revisions (keeping the last known): %s", exc)
        plan, stale = holds.apply(plan, dict(cluster.models), known)
        if stale:
            log.info("released holds the cluster changed since: %s",
                     ", ".join(h.model for h in stale))
            if self.store is not None:
                try:
                    await self.store.release_holds([h.model for h in stale])
                except StoreError as exc:
                    log.warning("cannot release stale holds: %s", exc)
        if [h.model for h in plan.holds] != [h.model for h in self.held]:
            for hold in plan.holds:  # said once, not at every iteration
                log.warning("%s %s", hold.model, hold.line())
        self.held = list(plan.holds)
        return plan

    async def _held_after(self, plan: Plan, outcome: Outcome,
                          cluster: Cluster) -> tuple[list[Hold], list[str]]:
        """Hold each model whose replacement was rolled back: it is not replaced again
        until its spec changes or ``llmgw apply --retry``."""
        made, errors = [], []
        for hold in records.held(plan, outcome, cluster.models, time.time()):
            self.held = [h for h in self.held if h.model != hold.model] + [hold]
            if self.store is not None:
                try:
                    await self.store.put_hold(hold)
                except StoreError as exc:
                    errors.append(f"{hold.model}: {exc}")
                    continue
            made.append(hold)
        return made, errors


def keys(change: Change) -> set[Key]:
    """The replicas a change acts on: its own, and a replace's new one."""
    found = {(change.model, change.replica)}
    if change.new_replica is not None:
        found.add((change.model, change.new_replica))
    return found


def defer(plan: Plan, busy: Iterable[Change]) -> tuple[Plan, list[Change]]:
    """``plan`` without the changes to replicas that ``busy`` changes are acting on, nor
    those landing on a node where a deferred change was to free room. Purely computational.

    The planner sees an in-flight replace as two replicas (the old one serving, the new
    one loading) and would scale one down; a create in flight it sees as loading. Either
    way the change in flight decides, and the next plan sees what it left. So too a
    scale-down draining a replica: the planner still counts it, and would drain another
    of the model's replicas for the same decision.
    """
    taken = {key for change in busy for key in keys(change)}
    if not taken:
        return plan, []
    draining = {c.model for c in busy if c.action == "destroy" and c.drain}
    kept: list[Change] = []
    deferred: list[Change] = []
    wheres: list[str] = []
    freed: set[str] = set()  # nodes where a deferred change was to free capacity
    for change in plan.changes:
        scaled = change.action == "destroy" and change.drain and change.model in draining
        if keys(change) & taken or scaled:
            deferred.append(change)
            wheres.append("its replica" if keys(change) & taken else "its model's replicas")
            if change.action == "destroy" or change.strategy == "destroy-before-create":
                freed |= {r.node for r in change.removes}
        else:
            kept.append(change)
    # A restart keeps the room its replica holds; a create or a replace takes more.
    later = [c for c in kept if c.action in ("create", "replace")
             and {s.node for s in c.shards} & freed]
    kept = [c for c in kept if all(c is not d for d in later)]
    deferred += later
    wheres += ["its node"] * len(later)
    notes = tuple(f"{c.model} r{c.replica}: {c.action} deferred until the change in flight on "
                  f"{where} settles" for c, where in zip(deferred, wheres, strict=True))
    return replace(plan, changes=tuple(kept), warnings=plan.warnings + notes), deferred


def _moot(change: Change, basis: Cluster, cluster: Cluster) -> bool:
    """Whether ``cluster`` changed what ``change`` was planned from (``basis``)."""
    if cluster.models.get(change.model) != basis.models.get(change.model):
        return True
    nodes = {s.node for s in change.shards} | {r.node for r in change.removes}
    return any(cluster.nodes.get(n) != basis.nodes.get(n) for n in nodes)
