"""Execute a :class:`~llmgw.planning.types.Plan` through the agents.

Order, so that nothing is stopped before what replaces it serves:

1. **First call per node**: every unit to remove that frees capacity (destroyed
   replicas, and the old shards of destroy-before-create replaces), then every
   unit to start (creates, restarts, new shards of replaces) — one
   ``ApplyUnits`` call per node, removes first, nodes in parallel with a bound.
2. Then **each change settles on its own**, in a task of its own:

   a. **wait** for its started units to be Ready (Starting → Loading → Ready),
      or Failed, or its own readiness deadline, watching the agents' unit
      streams — one replica that never loads holds up no other change;
   b. **gate** (with ``gating``, for models with a ``rollout``): the new
      replica of a create-before-destroy replace is probed and baked on a
      share of live traffic (:mod:`llmgw.applying.bakes`). Promoted, it serves
      as any replica; rolled back, it is the one removed below;
   c. **second call**: the old shards of a create-before-destroy replace whose
      new replica became Ready and passed its gate — or the new shards if it
      failed its gate — first drained (out of the routes, in-flight requests
      let finish). A replacement that failed to become Ready leaves the old
      replica running.

A destroy the autoscaler asked for (``Change.drain``) makes no first call: it is
drained first (out of the routes, its requests in flight let finish, bounded),
then its units are removed, in a task of its own.

With ``gating``, replacements of a gated model run in waves of at most
``max_surge`` (create before destroy) and ``max_unavailable`` (destroy before
create) (:mod:`llmgw.planning.waves`); a model's next wave starts once its own
previous one settled. :class:`Execution` runs all this in the background
(:mod:`llmgw.applying.convergences` owns it); :func:`execute` waits for it.

Nothing here raises for a node that cannot be reached: its changes fail with
the reason, the rest go on, and the :class:`Outcome` says what changed and
what did not. Running the same plan again converges: agent calls are
idempotent.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from llmgw.applying import bakes, waits
from llmgw.applying.waits import LOG_LINES as LOG_LINES  # re-exported: the CLI's log tails
from llmgw.applying.waits import TERMINAL
from llmgw.applying.waits import Agents as Agents  # re-exported: what execution needs
from llmgw.applying.waits import Waiting as Waiting
from llmgw.planning import waves
from llmgw.planning.types import Change, Plan, Shard, UnitOp
from llmgw.rendering import units
from llmgw.spec.models import Cluster
from llmgw.spec.quantities import count
from llmgw.spec.rollouts import Rollout, effective
from llmgw.transport.agent_client import UnitChange
from llmgw.transport.failures import NodeUnreachable

DEFAULT_READY_TIMEOUT = 900.0
"""Seconds a started replica may take to load: large weights from a cold disk are slow."""



@dataclass(frozen=True)
class Step:
    """A progress event: one unit of one change reached a state."""

    change: Change
    node: str
    unit: str
    state: str  # writing, starting, loading, ready, failed, removing, removed
    elapsed: float
    detail: str = ""


@dataclass
class ChangeOutcome:
    change: Change
    ok: bool = True
    errors: list[str] = field(default_factory=list)
    logs: dict[str, list[str]] = field(default_factory=dict)  # unit → log tail
    kept_old: bool = False  # a failed create-before-destroy replace left the old replica
    elapsed: float = 0.0  # seconds from the apply's start to this change's last step
    gate: str | None = None  # "passed: …" / "failed: …" (gated rollouts)
    rolled_back: bool = False  # failed its gate: the new replica was removed
    rolled_back_at: float = 0.0  # seconds from the apply's start to the gate's verdict

    def fail(self, message: str) -> None:
        self.ok = False
        if message not in self.errors:
            self.errors.append(message)


@dataclass
class Outcome:
    changes: list[ChangeOutcome]
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.changes)

    @property
    def failed(self) -> list[ChangeOutcome]:
        return [c for c in self.changes if not c.ok]

    def summary(self) -> str:
        done = sum(1 for c in self.changes if c.ok)
        text = f"Apply: {done} of {count(len(self.changes), 'change')} done in {self.elapsed:.1f}s"
        if self.failed:
            text += f", {len(self.failed)} failed"
        return text + "."


Progress = Callable[[Step], None]


@dataclass
class Gating:
    """What execution needs for gated rollouts: each gated model's rollout and served
    name, and the routers' traffic (:class:`llmgw.applying.bakes.Traffic`)."""

    rollouts: dict[str, Rollout]
    served: dict[str, str]
    traffic: bakes.Traffic

    @classmethod
    def of(cls, cluster: Cluster, traffic: bakes.Traffic) -> Gating:
        rollouts = {name: gate for name, model in cluster.models.items()
                    if (gate := effective(cluster.cluster.rollout, model.rollout)) is not None}
        served = {name: model.served_name or name for name, model in cluster.models.items()}
        return cls(rollouts, served, traffic)


async def execute(
    plan: Plan,
    agents: Agents,
    *,
    progress: Progress | None = None,
    ready_timeout: float = DEFAULT_READY_TIMEOUT,
    clock: Callable[[], float] = time.monotonic,
    gating: Gating | None = None,
) -> Outcome:
    """Carry out ``plan`` and wait for every change; never raises for a node or an engine
    that fails. (:class:`Execution` is the same without the wait.)"""
    run = Execution(plan, agents, progress=progress, ready_timeout=ready_timeout, clock=clock,
                    gating=gating)
    run.start()
    try:
        return await run.finished()
    finally:
        await run.aclose()


class Execution:
    """One plan being carried out, each change settling on its own.

    :meth:`start` makes the first call per node (in the background) and then,
    for each change, a task that waits for that change's new shards to be Ready
    within its own deadline, gates it, and makes its second calls: one replica
    that never loads holds up nothing but itself. :meth:`finished` waits for
    them all; :meth:`supersede` cancels the wait of changes a newer plan made
    moot (their old replicas are left as they are, for that plan to take over);
    :meth:`aclose` cancels everything. Usage::

        run = Execution(plan, pool, ready_timeout=900)
        run.start()
        ...                      # run.pending(), run.waiting() meanwhile
        outcome = await run.finished()
    """

    def __init__(
        self,
        plan: Plan,
        agents: Agents,
        *,
        progress: Progress | None = None,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
        gating: Gating | None = None,
    ) -> None:
        self.plan = plan
        self.agents = agents
        self.ready_timeout = ready_timeout
        self.clock = clock
        self.gating = gating
        self._report: Progress = progress or (lambda step: None)
        self.outcomes = {id(change): ChangeOutcome(change) for change in plan.changes}
        self._pending = {id(change): change for change in plan.changes}
        self._waits: dict[int, Waiting] = {}
        self._settling: dict[int, asyncio.Task[None]] = {}
        self._superseded: dict[int, str] = {}
        self._driver: asyncio.Task[None] | None = None
        self._started = clock()
        self.elapsed = 0.0

    # -- the public side -----------------------------------------------------

    def start(self) -> None:
        """Begin in the background; returns at once."""
        if self._driver is None:
            self._started = self.clock()
            self._driver = asyncio.create_task(self._run(), name="execute")

    async def finished(self) -> Outcome:
        """Wait for every change to settle; the outcome."""
        self.start()
        assert self._driver is not None
        await asyncio.shield(self._driver)
        return self.outcome()

    def outcome(self) -> Outcome:
        return Outcome(list(self.outcomes.values()), self.elapsed)

    @property
    def done(self) -> bool:
        return self._driver is not None and self._driver.done()

    def pending(self) -> list[Change]:
        """The changes not settled yet (waiting, gating, not started: a later wave)."""
        return list(self._pending.values())

    def waiting(self) -> list[Waiting]:
        """What is being waited for now, in plan order."""
        return [self._waits[key] for key in self._pending if key in self._waits]

    def supersede(self, changes: Iterable[Change], why: str) -> list[Change]:
        """Stop waiting for ``changes`` (moot under a newer plan); those it stopped.

        A change whose wait is over (its old replica being removed) is left to finish.
        """
        stopped = []
        for change in changes:
            key = id(change)
            if key not in self._pending or key in self._superseded:
                continue
            task = self._settling.get(key)
            if task is not None and key not in self._waits:
                continue  # past its wait: removing what it replaces
            self._superseded[key] = why
            if task is not None:
                task.cancel()
            stopped.append(change)
        return stopped

    async def aclose(self) -> None:
        """Cancel whatever still runs (the daemon stops, or lost its lease)."""
        tasks = [t for t in [self._driver, *self._settling.values()]
                 if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- the work --------------------------------------------------------------

    def _emit(self, change: Change, node: str, unit: str, state: str, detail: str = "") -> None:
        elapsed = self.clock() - self._started
        self.outcomes[id(change)].elapsed = elapsed
        wait = self._waits.get(id(change))
        if wait is not None and state not in TERMINAL:
            if state == "fetching" and wait.state == "fetching" and detail != wait.detail:
                wait.progressed = self.clock()
            wait.state, wait.node, wait.detail = state, node, detail
        self._report(Step(change, node, unit, state, elapsed, detail))

    async def _run(self) -> None:
        try:
            rollouts = self.gating.rollouts if self.gating is not None else {}
            split = waves.split(self.plan.changes, rollouts)
            first, later = (split[0] if split else ()), split[1:]
            await self._begin(first)
            # A gated model's later waves wait for its own earlier ones, not for other models.
            by_model: dict[str, list[list[Change]]] = defaultdict(list)
            for wave in later:
                for model in dict.fromkeys(c.model for c in wave):
                    by_model[model].append([c for c in wave if c.model == model])
            await asyncio.gather(*self._settling.values(),
                                 *(self._waves(model, rest) for model, rest in by_model.items()))
        finally:
            self.elapsed = self.clock() - self._started

    async def _waves(self, model: str, rest: list[list[Change]]) -> None:
        for wave in rest:
            before = [t for key, t in self._settling.items()
                      if self.outcomes[key].change.model == model]
            await asyncio.gather(*before)
            await self._begin(wave)
            await asyncio.gather(*(self._settling[id(c)] for c in wave if id(c) in self._settling))

    async def _begin(self, changes: Sequence[Change]) -> None:
        """The first call per node for ``changes``, then a settling task for each."""
        live = []
        for change in changes:
            why = self._superseded.get(id(change))
            if why is not None:
                self._drop(change, why)
            else:
                live.append(change)
        drained = [c for c in live if c.drain]
        live = [c for c in live if not c.drain]
        for change in drained:  # no first call: drained first, then removed, on its own
            self._settling[id(change)] = asyncio.create_task(
                self._drain_remove(change), name=f"drain-{change.model}-r{change.replica}")
        await _call_all(self.agents, _first_calls(live), self.outcomes, self._emit)
        for change in live:
            if id(change) in self._superseded:
                self._drop(change, self._superseded[id(change)])
                continue
            self._settling[id(change)] = asyncio.create_task(
                self._settle(change), name=f"settle-{change.model}-r{change.replica}")

    async def _drain_remove(self, change: Change) -> None:
        """A scale-down: out of every router's routes, its requests in flight finished
        (bounded by the traffic's drain timeout), then its units removed."""
        try:
            if self.gating is not None:
                urls = bakes.head_urls(change, self.gating.traffic)[1]
                head = change.removes[0]
                self._emit(change, head.node, head.unit, "draining", ", ".join(urls))
                await self.gating.traffic.drain(urls)
            await _call_all(self.agents, _first_calls([change]), self.outcomes, self._emit)
        finally:
            self._pending.pop(id(change), None)

    def _drop(self, change: Change, why: str) -> None:
        outcome = self.outcomes[id(change)]
        outcome.fail(f"superseded: {why}")
        outcome.kept_old = bool(_later(change))
        self._pending.pop(id(change), None)

    async def _settle(self, change: Change) -> None:
        """Wait for ``change``'s new shards, gate it, then its second calls."""
        outcome = self.outcomes[id(change)]
        try:
            try:
                if outcome.ok and change.shards:
                    self._waits[id(change)] = Waiting(change, self.clock(), self.ready_timeout)
                    await self._wait(change, outcome)
                if (self.gating is not None and _waits(change) and outcome.ok
                        and change.model in self.gating.rollouts):
                    await _gate(change, outcome, self.gating, self._emit)
            except asyncio.CancelledError:
                why = self._superseded.get(id(change))
                if why is None:
                    raise
                current = asyncio.current_task()
                if current is not None:
                    current.uncancel()
                self._drop(change, why)
                return
            finally:
                self._waits.pop(id(change), None)
            await self._second(change, outcome)
        finally:
            self._pending.pop(id(change), None)

    async def _wait(self, change: Change, outcome: ChangeOutcome) -> None:
        waiting = [(change, shard) for shard in change.shards]
        states = await waits.wait_ready(self.agents, waiting, self.ready_timeout, self._emit)
        no_logs: list[Shard] = []
        for _, shard in waiting:
            state, detail, tail = states.get((shard.node, shard.unit), ("failed", "no answer", []))
            if state == "ready":
                continue
            outcome.fail(f"{shard.unit} on {shard.node}: {state}"
                         + (f" ({detail})" if detail else ""))
            outcome.elapsed = self.clock() - self._started  # a timeout emits no step
            if tail:
                outcome.logs[f"{shard.node}/{shard.unit}"] = tail
            else:
                no_logs.append(shard)
        outcome.logs.update(await waits.fetch_logs(self.agents, no_logs))

    async def _second(self, change: Change, outcome: ChangeOutcome) -> None:
        """The old shards of a create-before-destroy replace whose new replica is Ready and
        passed its gate, or its new shards when it failed the gate; drained first."""
        second: dict[str, list[tuple[Change, UnitChange]]] = defaultdict(list)
        drained: list[str] = []
        gating = self.gating
        if outcome.rolled_back:
            # Failed its gate: the new replica goes, the old one was never touched.
            outcome.kept_old = True
            for shard in change.shards:
                second[shard.node].append((change, UnitChange(shard.unit, "", action="remove")))
            if gating is not None:
                drained.extend(u for u in [bakes.head_urls(change, gating.traffic)[0]] if u)
        else:
            for op in _later(change):
                if not outcome.ok:
                    outcome.kept_old = True  # the replacement failed: the old replica serves on
                    break
                second[op.node].append((change, _unit_change(op)))
            if gating is not None and outcome.ok and _later(change):
                drained.extend(bakes.head_urls(change, gating.traffic)[1])
        if gating is not None and drained:
            await gating.traffic.drain(drained)
        await _call_all(self.agents, second, self.outcomes, self._emit)


async def _gate(change: Change, outcome: ChangeOutcome, gating: Gating,
                emit: Callable[[Change, str, str, str, str], None]) -> None:
    """Probe and bake the new replica of ``change``; record the verdict on ``outcome``."""
    head = next((s for s in change.shards if s.rank == 0), change.shards[0])
    rollout = gating.rollouts[change.model]
    emit(change, head.node, head.unit, "gating", "probe" + (
        f", then {rollout.share:.0%} of traffic for {rollout.bake:g} s" if rollout.bake else ""))
    verdict = await bakes.run(change, rollout, gating.traffic,
                              gating.served.get(change.model, change.model))
    if verdict.passed:
        outcome.gate = f"passed: {verdict.reason}"
        new = bakes.head_urls(change, gating.traffic)[0]
        if new is not None:
            await gating.traffic.share(new, None)  # promoted: a replica like any other
        emit(change, head.node, head.unit, "promoted", verdict.reason)
        return
    outcome.gate = f"failed: {verdict.reason}"
    outcome.rolled_back = True
    outcome.fail(f"failed its gate: {verdict.reason}")
    emit(change, head.node, head.unit, "rolled back", verdict.reason)
    outcome.rolled_back_at = outcome.elapsed


_VERBS = {"remove": "removing", "stop": "stopping"}


def _first_calls(changes: Sequence[Change]) -> dict[str, list[tuple[Change, UnitChange]]]:
    """Per node: every operation that can run now, removes (which free capacity) first.

    That is each change's every phase, except for create-before-destroy replaces,
    whose removes wait for their new shards to be Ready (:func:`_later`).
    """
    calls: dict[str, list[tuple[Change, UnitChange]]] = defaultdict(list)
    for change in changes:
        phases = change.phases()
        for phase in phases[:1] if _waits(change) else phases:
            for op in phase:
                calls[op.node].append((change, _unit_change(op)))
    return {node: sorted(items, key=lambda item: item[1].action != "remove")
            for node, items in sorted(calls.items())}


def _later(change: Change) -> list[UnitOp]:
    """The operations of ``change`` that wait for its new shards to be Ready."""
    return [op for phase in change.phases()[1:] for op in phase] if _waits(change) else []


def _waits(change: Change) -> bool:
    return change.action == "replace" and change.strategy == "create-before-destroy"


def _unit_change(op: UnitOp) -> UnitChange:
    if op.action == "remove":
        return UnitChange(op.unit, "", action="remove")
    if op.action == "stop":  # a hold: the agent stops the unit and keeps its files
        return UnitChange(op.unit, "", action="stop")
    if op.files is None:
        raise ValueError(f"unit {op.unit} on {op.node} has no rendered files to start")
    files = op.files
    return UnitChange(files.name, files.unit_text, files.env_text, dict(files.secret_env),
                      "start")


async def _call_all(
    agents: Agents,
    calls: dict[str, list[tuple[Change, UnitChange]]],
    outcomes: dict[int, ChangeOutcome],
    emit: Callable[[Change, str, str, str, str], None],
) -> None:
    limit = asyncio.Semaphore(max(1, agents.max_parallel))

    async def one(node: str, items: list[tuple[Change, UnitChange]]) -> None:
        for change, unit in items:
            emit(change, node, unit.name, _VERBS.get(unit.action, "writing"), "")
        # The agent answers once every stop is done, and an engine may drain for up to its
        # TimeoutStopSec before SIGKILL: a remove is not failed for taking that long.
        stops = sum(1 for _, unit in items if unit.action in ("remove", "stop"))
        timeout = agents.call_timeout + stops * units.STOP_TIMEOUT_SECONDS
        async with limit:
            try:
                results = await agents.call(
                    node, lambda agent: agent.apply_units([u for _, u in items]),
                    timeout=timeout,
                )
            except NodeUnreachable as failure:
                for change, unit in items:
                    outcomes[id(change)].fail(f"{node}: {failure}")
                    emit(change, node, unit.name, "failed", str(failure))
                return
        for (change, unit), result in zip(items, results, strict=False):
            if result.ok:
                state = {"remove": "removed", "stop": "stopped"}.get(unit.action, "starting")
                emit(change, node, unit.name, state, "")
            else:
                outcomes[id(change)].fail(f"{unit.name} on {node}: {result.error}")
                emit(change, node, unit.name, "failed", result.error)

    await asyncio.gather(*(one(node, items) for node, items in calls.items() if items))
