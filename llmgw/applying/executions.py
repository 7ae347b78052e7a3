"""Execute a :class:`~llmgw.planning.types.Plan` through the agents.

Order, so that nothing is stopped before what replaces it serves:

1. **First call per node**: every unit to remove that frees capacity (destroyed
   replicas, and the old shards of destroy-before-create replaces), then every
   unit to start (creates, restarts, new shards of replaces) — one
   ``ApplyUnits`` call per node, removes first, nodes in parallel with a bound.
2. **Wait** for each started unit to be Ready (Starting → Loading → Ready), or
   Failed, or the readiness timeout — watching the agents' unit streams.
3. **Gate** (with ``gating``, for models with a ``rollout``): each new replica
   of a create-before-destroy replace is probed and baked on a share of live
   traffic (:mod:`llmgw.applying.bakes`). Promoted, it serves as any replica;
   rolled back, it is the one removed below, and the old one was never touched.
4. **Second call per node**: the old shards of create-before-destroy replaces
   whose new replica became Ready and passed its gate — or the new shards of
   those that failed their gate. Either is first drained: taken out of the
   routes, in-flight requests let finish. A replacement that failed to become
   Ready leaves the old replica running.

With ``gating``, replacements of a gated model run in waves of at most
``max_surge`` (create before destroy) and ``max_unavailable`` (destroy before
create) (:mod:`llmgw.planning.waves`); each wave is steps 1–4.

Nothing here raises for a node that cannot be reached: its changes fail with
the reason, the rest go on, and the :class:`Outcome` says what changed and
what did not. Running the same plan again converges: agent calls are
idempotent.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import grpc

from llmgw.applying import bakes
from llmgw.fleet.types import Unit
from llmgw.planning import waves
from llmgw.planning.types import Change, Plan, Shard, UnitOp
from llmgw.rendering import units
from llmgw.spec.models import Cluster
from llmgw.spec.quantities import count
from llmgw.spec.rollouts import Rollout, effective
from llmgw.transport.agent_client import AgentClient, UnitChange
from llmgw.transport.failures import NodeUnreachable

T = TypeVar("T")

DEFAULT_READY_TIMEOUT = 900.0
"""Seconds a started replica may take to load: large weights from a cold disk are slow."""

TERMINAL = frozenset({"ready", "failed"})
LOG_LINES = 30


class Agents(Protocol):
    """What execution needs of :class:`llmgw.transport.pools.Pool`."""

    max_parallel: int
    call_timeout: float  # seconds an agent call may take, stops aside (see _call_all)

    async def call(
        self, node: str, fn: Callable[[AgentClient], Awaitable[T]],
        *, timeout: float | None = None,
    ) -> T: ...

    async def client(self, node: str) -> AgentClient: ...


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
    """Carry out ``plan``; never raises for a node or an engine that fails."""
    started = clock()
    report: Progress = progress or (lambda step: None)
    outcomes = {id(change): ChangeOutcome(change) for change in plan.changes}

    def emit(change: Change, node: str, unit: str, state: str, detail: str = "") -> None:
        elapsed = clock() - started
        outcomes[id(change)].elapsed = elapsed
        report(Step(change, node, unit, state, elapsed, detail))

    for wave in waves.split(plan.changes, gating.rollouts if gating is not None else {}):
        await _wave(wave, agents, outcomes, emit, ready_timeout, gating,
                    lambda: clock() - started)
    return Outcome(list(outcomes.values()), clock() - started)


async def _wave(
    changes: Sequence[Change],
    agents: Agents,
    outcomes: dict[int, ChangeOutcome],
    emit: Callable[[Change, str, str, str, str], None],
    ready_timeout: float,
    gating: Gating | None,
    elapsed: Callable[[], float],
) -> None:
    first = _first_calls(changes)
    await _call_all(agents, first, outcomes, emit)

    waiting = [(c, s) for c in changes for s in c.shards if outcomes[id(c)].ok]
    states = await _wait_ready(agents, waiting, ready_timeout, emit)
    no_logs: list[tuple[ChangeOutcome, Shard]] = []
    for change, shard in waiting:
        state, detail, tail = states.get((shard.node, shard.unit), ("failed", "no answer", []))
        if state == "ready":
            continue
        outcome = outcomes[id(change)]
        outcome.fail(f"{shard.unit} on {shard.node}: {state}" + (f" ({detail})" if detail else ""))
        outcome.elapsed = elapsed()  # a timeout emits no step: it ended now
        if tail:
            outcome.logs[f"{shard.node}/{shard.unit}"] = tail
        else:
            no_logs.append((outcome, shard))
    await _fetch_logs(agents, no_logs)

    if gating is not None:
        await asyncio.gather(*(_gate(change, outcomes[id(change)], gating, emit)
                               for change in changes if _waits(change)
                               and outcomes[id(change)].ok and change.model in gating.rollouts))

    second: dict[str, list[tuple[Change, UnitChange]]] = defaultdict(list)
    drained: list[str] = []
    for change in changes:
        outcome = outcomes[id(change)]
        if outcome.rolled_back:
            # Failed its gate: the new replica goes, the old one was never touched.
            outcome.kept_old = True
            for shard in change.shards:
                second[shard.node].append((change, UnitChange(shard.unit, "", action="remove")))
            if gating is not None:
                drained.extend(u for u in [bakes.head_urls(change, gating.traffic)[0]] if u)
            continue
        for op in _later(change):
            if not outcome.ok:
                outcome.kept_old = True  # the replacement failed: the old replica serves on
                break
            second[op.node].append((change, _unit_change(op)))
        if gating is not None and outcome.ok and _later(change):
            drained.extend(bakes.head_urls(change, gating.traffic)[1])
    if gating is not None and drained:
        await gating.traffic.drain(drained)
    await _call_all(agents, second, outcomes, emit)


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


async def _wait_ready(
    agents: Agents,
    waiting: Iterable[tuple[Change, Shard]],
    timeout: float,
    emit: Callable[[Change, str, str, str, str], None],
) -> dict[tuple[str, str], tuple[str, str, list[str]]]:
    """Final (state, detail, log tail) of every started unit, watching each node's stream.

    While a unit fetches its weights, each progress report restarts the clock:
    a 140 GB download that moves is not a timeout; one that stops moving is.
    """
    deadline = asyncio.timeout(timeout)
    by_node: dict[str, dict[str, tuple[Change, str]]] = defaultdict(dict)
    for change, shard in waiting:
        by_node[shard.node][shard.unit] = (change, shard.digest)
    final: dict[tuple[str, str], tuple[str, str, list[str]]] = {}

    async def watch(node: str, units: dict[str, tuple[Change, str]]) -> None:
        last = dict.fromkeys(units, "starting")  # said when the agent took the unit
        pending = set(units)
        try:
            agent = await agents.client(node)
            async for unit in agent.watch_units():
                # The unit's old instance (same name, old digest) may still be
                # reported as ready: only the new spec's states count.
                if unit.name not in pending or unit.digest != units[unit.name][1]:
                    continue
                moved = unit.state == "fetching" and unit.detail != last.get(unit.name + "/")
                if moved:
                    deadline.reschedule(asyncio.get_running_loop().time() + timeout)
                if last.get(unit.name) != unit.state or moved:
                    last[unit.name] = unit.state
                    last[unit.name + "/"] = unit.detail
                    emit(units[unit.name][0], node, unit.name, unit.state, unit.detail)
                if unit.state in TERMINAL:
                    final[(node, unit.name)] = _final(unit)
                    pending.discard(unit.name)
                    if not pending:
                        return
        except NodeUnreachable as failure:
            for name in pending:
                final[(node, name)] = ("failed", str(failure), [])
        except (grpc.aio.AioRpcError, OSError) as exc:
            for name in pending:
                final[(node, name)] = ("failed", f"{node}: lost the agent's unit stream "
                                       f"({type(exc).__name__})", [])

    async def bounded() -> None:
        await asyncio.gather(*(watch(node, units) for node, units in by_node.items()))

    try:
        async with deadline:
            await bounded()
    except TimeoutError:
        for node, units in by_node.items():
            for name in units:
                final.setdefault((node, name), ("failed", f"not ready after {timeout:.0f}s", []))
    return final


def _final(unit: Unit) -> tuple[str, str, list[str]]:
    return unit.state, unit.detail, list(unit.log_tail)


async def _fetch_logs(agents: Agents, wanted: list[tuple[ChangeOutcome, Shard]]) -> None:
    """Failed shards whose event carried no log tail: ask their agents for one."""

    async def fetch(outcome: ChangeOutcome, shard: Shard) -> None:
        try:
            lines = await agents.call(shard.node,
                                      lambda agent: agent.unit_logs(shard.unit, LOG_LINES))
        except NodeUnreachable:
            return
        if lines:
            outcome.logs[f"{shard.node}/{shard.unit}"] = lines

    await asyncio.gather(*(fetch(o, s) for o, s in wanted))
