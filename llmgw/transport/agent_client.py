"""The thin client of a node agent's gRPC API, over any ``grpc.aio`` channel.

The channel comes from a transport (an SSH-forwarded socket, or the local
socket for ``address: local``); this class only speaks the protocol and
returns llmgw's own types. gRPC errors (``grpc.aio.AioRpcError``) propagate
unchanged: :mod:`llmgw.transport.failures` classifies them in one place.

Usage::

    async with grpc.aio.insecure_channel("unix:/run/llmgw/agent.sock") as channel:
        agent = AgentClient(channel)
        report = await agent.report(declared)
        results = await agent.apply_units([UnitChange(name, text, env, {}, "start")])
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from llmgw.discovery.fabrics import Declaration
from llmgw.fleet.deltas import Delta
from llmgw.fleet.types import Fetch, NodeReport, Unit
from llmgw.proto import agent_pb2 as pb
from llmgw.proto import agent_pb2_grpc
from llmgw.proto import conversions as messages
from llmgw.proto.conversions import UnitChange, UnitResult

__all__ = ["AgentClient", "Declaration", "EngineProgress", "Logs", "UnitChange", "UnitResult",
           "declaration_to_message"]


def declaration_to_message(declared: Declaration) -> pb.ReportRequest:
    """The Report request carrying what the cluster declares for the node."""
    request = pb.ReportRequest(node=declared.node, weights_dirs=declared.weights_dirs)
    for fabric in declared.fabrics:
        item = request.fabrics.add(name=fabric.name, kind=fabric.kind, adapters=fabric.adapters)
        if fabric.gid_index is not None:
            item.gid_index = fabric.gid_index
    return request


@dataclass(frozen=True)
class Logs:
    """Lines of a unit's log, and where the agent read them ("journal", "supervise log")."""

    lines: tuple[str, ...]
    source: str


def _logs_request(name: str, lines: int, previous: bool,
                  since_seconds: float | None) -> pb.UnitLogsRequest:
    request = pb.UnitLogsRequest(name=name, lines=lines, previous=previous)
    if since_seconds is not None:
        request.since_seconds = since_seconds
    return request


@dataclass(frozen=True)
class Stopped:
    """A Shutdown's answer: what the agent did, deletes as it exits, and cannot remove."""

    detail: str
    removed: tuple[str, ...]
    left: tuple[str, ...]


@dataclass(frozen=True)
class EngineProgress:
    """One snapshot of an engine install: the Fetch, what it is doing, where it went."""

    fetch: Fetch
    step: str
    path: str


class AgentClient:
    """Report, ApplyUnits, UnitLogs and WatchUnits of one agent.

    ``timeout`` (seconds) bounds each unary call; None leaves it to the
    caller (an ``asyncio.timeout`` around the call, as the pool does).
    """

    def __init__(self, channel: Any, timeout: float | None = None) -> None:
        self._stub = agent_pb2_grpc.AgentStub(channel)
        self.timeout = timeout

    async def report(self, declared: Declaration | None = None) -> NodeReport:
        """The node's report, checked against ``declared`` (None: the agent's own settings)."""
        request = (
            declaration_to_message(declared) if declared is not None
            else pb.ReportRequest()
        )
        reply = await self._stub.Report(request, timeout=self.timeout)
        return messages.report_from_message(cast(pb.NodeReport, reply))

    async def apply_units(self, units: Sequence[UnitChange]) -> list[UnitResult]:
        """Write/start/stop/remove units; one result per unit, in order. Idempotent."""
        request = pb.ApplyRequest(units=[messages.change_to_message(u) for u in units])
        reply = cast(pb.ApplyResponse, await self._stub.ApplyUnits(request, timeout=self.timeout))
        return [messages.result_from_message(r) for r in reply.results]

    async def reclaim_weights(
        self, weights_dirs: Sequence[str], remove: bool
    ) -> list[dict[str, Any]]:
        """What the node's agent removed (or, with ``remove`` false, would remove)."""
        request = pb.ReclaimRequest(weights_dirs=list(weights_dirs), remove=remove)
        reply = cast(pb.ReclaimResponse,
                     await self._stub.ReclaimWeights(request, timeout=self.timeout))
        return [
            {"source": i.source, "path": i.path, "size_bytes": i.size_bytes,
             "removed": i.removed, "kept_because": i.kept_because}
            for i in reply.items
        ]

    async def unit_logs(self, name: str, lines: int = 100) -> list[str]:
        """The last ``lines`` lines of a unit's log (the agent caps the count)."""
        return list((await self.logs(name, lines)).lines)

    async def logs(self, name: str, lines: int = 100, *, previous: bool = False,
                   since_seconds: float | None = None) -> Logs:
        """A unit's latest lines, or (``previous``) the run before the latest; only the
        last ``since_seconds`` by the node's clock. NOT_FOUND for a unit it lacks."""
        request = _logs_request(name, lines, previous, since_seconds)
        reply = cast(pb.UnitLogsResponse, await self._stub.UnitLogs(request, timeout=self.timeout))
        return Logs(tuple(reply.lines), reply.source)

    async def follow_logs(self, name: str, lines: int = 100, *,
                          since_seconds: float | None = None) -> AsyncGenerator[Logs, None]:
        """The latest lines, then each new one as the engine writes it; the call is
        cancelled (the agent stops following) when the caller stops iterating."""
        call = self._stub.FollowUnitLogs(_logs_request(name, lines, False, since_seconds))
        try:
            async for item in call:
                yield Logs(tuple(item.lines), item.source)
        finally:
            call.cancel()

    async def install_engine(
        self, engine: str, version: str, *, binary: str = "", requirements: str = "",
        index_url: str = "", extra_index_urls: Sequence[str] = (),
    ) -> AsyncIterator[EngineProgress]:
        """Start (or join) an engine install on the node; its progress until it ends."""
        request = pb.EngineInstallRequest(engine=engine, version=version, binary=binary,
                                          requirements=requirements, index_url=index_url,
                                          extra_index_urls=list(extra_index_urls))
        call = self._stub.InstallEngine(request)
        try:
            async for item in call:
                yield EngineProgress(fetch=messages.from_message(item.fetch, Fetch),
                                     step=item.step, path=item.path)
        finally:
            call.cancel()

    async def shutdown(self, *, uninstall: bool, dry_run: bool) -> Stopped:
        """Stop the agent for good (with ``uninstall``, delete node add's install as it
        exits); ``dry_run``: what it would do. FAILED_PRECONDITION when it refuses."""
        request = pb.ShutdownRequest(uninstall=uninstall, dry_run=dry_run)
        reply = cast(pb.ShutdownResponse, await self._stub.Shutdown(request,
                                                                    timeout=self.timeout))
        return Stopped(reply.detail, tuple(reply.removed), tuple(reply.left))

    async def watch_units(self) -> AsyncIterator[Unit]:
        """Every unit now, then each change. A removed unit comes as ``stopped``, "removed"."""
        call = self._stub.WatchUnits(pb.WatchRequest())
        try:
            async for event in call:
                unit = messages.unit_from_message(event.unit)
                if event.removed:
                    unit = unit.model_copy(update={"state": "stopped", "detail": "removed"})
                yield unit
        finally:
            call.cancel()

    async def observe(self, declared: Declaration,
                      backstop: float = 0.0) -> AsyncIterator[Delta]:
        """The node's pushed observations: a full report first, then deltas (and a full
        report at the backstop, 0: the agent's default). An agent older than push answers
        with unit events, which carry no report: the first item is then not ``full``."""
        request = pb.WatchRequest(push=True, declared=declaration_to_message(declared),
                                  backstop_seconds=backstop)
        call = self._stub.WatchUnits(request)
        try:
            async for event in call:
                yield messages.delta_from_message(cast(pb.UnitEvent, event))
        finally:
            call.cancel()
