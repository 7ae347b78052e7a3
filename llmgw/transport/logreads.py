"""A replica's engine log, read through its node's agent (``llmgw logs``, /admin).

Two halves: :func:`locate` finds the unit in an observed fleet (pure: which
node runs ``gemma`` r0 s0, or a sentence saying what runs instead), then
:func:`read` and :func:`follow` ask that node's agent over the pool. The
agent bounds what it sends and masks the unit's secret values
(:mod:`llmgw.agent.unitlogs`); every failure on the way is a
:class:`~llmgw.transport.failures.NodeUnreachable` or a :class:`NotFound`.

Usage::

    target = logreads.locate(fleet, "gemma", replica=0)
    logs = await logreads.read(pool, target, 100, previous=True)
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import grpc

from llmgw.fleet.types import Fleet, Unit
from llmgw.transport import failures
from llmgw.transport.agent_client import Logs
from llmgw.transport.pools import Pool

__all__ = ["Logs", "NotFound", "Target", "follow", "locate", "read"]

MODEL = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
"""What a model name in a unit name may be (``llmgw-<model>-r<replica>-s<rank>.service``)."""


class NotFound(Exception):
    """No such model, replica or shard in the fleet; the message says what there is."""


@dataclass(frozen=True)
class Target:
    """One unit to read: a shard of a replica, on the node that runs it."""

    model: str
    replica: int
    rank: int
    node: str
    unit: str

    def label(self) -> str:
        return f"{self.model} r{self.replica} s{self.rank} on {self.node}"


def locate(fleet: Fleet, model: str, replica: int | None = None,
           shard: int | None = None) -> Target:
    """The unit of ``model``'s ``replica`` (None: the lowest that runs), shard ``shard``
    (None: rank 0, where the leader's engine logs), from the units the agents reported.

    Raises :class:`NotFound` naming what does run, and the nodes that did not
    answer (the unit may be there). A purely computational function.
    """
    if not MODEL.match(model):
        raise NotFound(f"{model!r} is not a model name (lower-case letters, digits, '.', "
                       "'_' and '-')")
    for what, value in (("--replica", replica), ("--shard", shard)):
        if value is not None and value < 0:
            raise NotFound(f"{what} must be 0 or more, not {value}")
    silent = sorted(name for name, report in fleet.nodes.items() if not report.reachable)
    unknown = (f"; not answering: {', '.join(silent)} (its units may be there)"
               if silent else "")
    found: list[tuple[str, Unit]] = [
        (name, unit) for name, report in sorted(fleet.nodes.items())
        for unit in report.units if unit.model == model
    ]
    if not found:
        models = sorted({u.model for r in fleet.nodes.values() for u in r.units})
        running = f"models running: {', '.join(models)}" if models else "no models run"
        raise NotFound(f"{model}: no replica of it runs on any node ({running}){unknown}")
    replicas = sorted({u.replica for _, u in found})
    chosen = replicas[0] if replica is None else replica
    if chosen not in replicas:
        raise NotFound(f"{model} r{chosen}: no such replica (running: "
                       f"{', '.join(f'r{r}' for r in replicas)}){unknown}")
    shards = {u.rank: (node, u) for node, u in found if u.replica == chosen}
    rank = 0 if shard is None else shard
    if rank not in shards:
        raise NotFound(f"{model} r{chosen} s{rank}: no such shard (its shards: "
                       f"{', '.join(f's{s}' for s in sorted(shards))})")
    node, unit = shards[rank]
    return Target(model, chosen, rank, node, unit.name)


def _refused(target: Target, exc: failures.NodeUnreachable) -> Exception:
    """An agent's NOT_FOUND (the unit went away since the fleet was observed) as NotFound."""
    if exc.reason == "agent error" and exc.detail.startswith(grpc.StatusCode.NOT_FOUND.name):
        return NotFound(f"{target.label()}: the node no longer has {target.unit} "
                        "(removed since the fleet was observed)")
    return exc


async def read(pool: Pool, target: Target, lines: int, *, previous: bool = False,
               since_seconds: float | None = None) -> Logs:
    """The unit's latest lines, or (``previous``) the run before the latest; raises
    :class:`NotFound` or :class:`~llmgw.transport.failures.NodeUnreachable`."""
    try:
        return await pool.call(target.node, lambda agent: agent.logs(
            target.unit, lines, previous=previous, since_seconds=since_seconds))
    except failures.NodeUnreachable as exc:
        raise _refused(target, exc) from None


async def follow(pool: Pool, target: Target, lines: int, *,
                 since_seconds: float | None = None) -> AsyncGenerator[Logs, None]:
    """The latest lines, then each new one, until the caller stops iterating (the
    agent's stream is cancelled then); raises as :func:`read` does."""
    agent = await pool.client(target.node)
    stream = agent.follow_logs(target.unit, lines, since_seconds=since_seconds)
    try:
        async for logs in stream:
            yield logs
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.CANCELLED:
            return
        raise _refused(target, failures.from_rpc(target.node, exc)) from None
    finally:
        await stream.aclose()
