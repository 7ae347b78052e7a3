"""A change's readiness wait: the agents' unit streams, its deadline, a line for people.

:func:`wait_ready` watches each node's ``WatchUnits`` stream until every
started unit of a change is Ready or Failed, or its deadline passes (fetch
progress restarts the clock); :class:`Waiting` is what the status and the log
say meanwhile ("gemma r3: loading 3m12s of 15m"); :func:`fetch_logs` asks for
the log tails a failure's event did not carry.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import grpc

from llmgw.fleet.types import Unit
from llmgw.planning.types import Change, Shard
from llmgw.transport.agent_client import AgentClient
from llmgw.transport.failures import NodeUnreachable

T = TypeVar("T")

TERMINAL = frozenset({"ready", "failed"})
LOG_LINES = 30
Emit = Callable[[Change, str, str, str, str], None]


class Agents(Protocol):
    """What execution needs of :class:`llmgw.transport.pools.Pool`."""

    max_parallel: int
    call_timeout: float  # seconds an agent call may take, stops aside (see _call_all)

    async def call(
        self, node: str, fn: Callable[[AgentClient], Awaitable[T]],
        *, timeout: float | None = None,
    ) -> T: ...

    async def client(self, node: str) -> AgentClient: ...


@dataclass
class Waiting:
    """A change whose new shards are being waited for: what the status and the log show."""

    change: Change
    started: float  # clock() when the wait began
    timeout: float
    state: str = "starting"
    node: str = ""
    detail: str = ""
    progressed: float | None = None  # clock() of the last fetch progress (it restarts the clock)

    @property
    def replica(self) -> int:
        """The replica waited for: the new one of a replace."""
        change = self.change
        return change.new_replica if change.new_replica is not None else change.replica

    def line(self, now: float) -> str:
        """``gemma r3: loading 3m12s of 15m``."""
        text = (f"{self.change.model} r{self.replica}: {self.state} {span(now - self.started)} "
                f"of {span(self.timeout)}")
        if self.progressed is not None:
            text += f" ({span(now - self.progressed)} since the last progress)"
        return text


def span(seconds: float) -> str:
    """``42s``, ``3m12s``, ``15m``, ``1h05m``: a duration for people."""
    total = max(0, int(seconds))
    if total < 60:
        return f"{total}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s" if secs else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


async def wait_ready(
    agents: Agents,
    waiting: Iterable[tuple[Change, Shard]],
    timeout: float,
    emit: Emit,
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


async def fetch_logs(agents: Agents, shards: Sequence[Shard]) -> dict[str, list[str]]:
    """The log tails of failed shards whose events carried none, asked of their agents:
    ``node/unit`` → lines (a node that does not answer gives none)."""
    found: dict[str, list[str]] = {}

    async def fetch(shard: Shard) -> None:
        try:
            lines = await agents.call(shard.node,
                                      lambda agent: agent.unit_logs(shard.unit, LOG_LINES))
        except NodeUnreachable:
            return
        if lines:
            found[f"{shard.node}/{shard.unit}"] = lines

    await asyncio.gather(*(fetch(s) for s in shards))
    return found
