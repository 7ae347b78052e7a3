"""Relays: one connection from the daemon carries many nodes.

Without a relay the daemon holds, per node, a gRPC channel to its agent and that
agent's open push stream: about 115 KiB of the daemon's memory each
(``tests/bench/channels.py``), which puts a fleet of 10,000 nodes past a gigabyte
before a single report is kept. A relay sits near its nodes (a rack head, or the fleet
simulator's process) and holds those channels and streams instead:

* :class:`RelayServer` serves the ``Relay`` service (``agent.proto``): ``Observe``
  merges the named nodes' push streams into one stream of ``RelayEvent`` (each the
  agent's ``UnitEvent`` bytes as it sent them, tagged by node; ``lost`` when a node's
  own stream breaks, which the relay reopens with backoff). It also serves the
  ``Agent`` service itself: a call naming its node in the ``llmgw-node`` metadata is
  forwarded to that node's agent as bytes, unparsed. A node the relay cannot reach
  answers UNAVAILABLE with ``llmgw-unreachable: <reason>: <detail>`` in the trailing
  metadata, classified by the relay's own transport.
* :class:`Link` is the daemon's one channel to a relay; :class:`RelayedTransport` is
  one node's :class:`~llmgw.transport.transports.Transport` through it (its channel
  adds the node's name to every call, so :class:`AgentClient` works unchanged).

The relay reaches its nodes through any transport (SSH, a local or simulated socket);
:mod:`llmgw.onboarding.fleetsims` runs one per simulator process and advertises it in
``<sockets>/relays-<i>.json`` (:func:`advertised`), which ``llmgw serve --simulated``
and the convergence bench read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from llmgw.proto import agent_pb2 as pb
from llmgw.proto import agent_pb2_grpc
from llmgw.transport import failures
from llmgw.transport.failures import NodeUnreachable
from llmgw.transport.transports import CHANNEL_OPTIONS, Transport, refused

log = logging.getLogger(__name__)

NODE_KEY = "llmgw-node"  # metadata: the node a forwarded call is for
UNREACHABLE_KEY = "llmgw-unreachable"  # trailing metadata: why the relay could not reach it
AGENT_SERVICE = pb.DESCRIPTOR.services_by_name["Agent"]
WATCH = f"/{AGENT_SERVICE.full_name}/WatchUnits"
QUEUE = 4096  # events waiting for the daemon to read them, per Observe; then nodes wait
RETRY_MAX = 30.0  # seconds between tries to reopen one node's stream, at most
MAX_NODES = 100_000  # nodes one Observe may name
SERVER_OPTIONS = (  # what it forwards is bounded as the daemon's channels bound it
    ("grpc.max_receive_message_length", 32 * 1024 * 1024),
    ("grpc.max_send_message_length", 32 * 1024 * 1024),
)


# -- the relay --------------------------------------------------------------------


class RelayServer:
    """The ``Relay`` and forwarded ``Agent`` services over ``transports`` (node → its way
    in), on a grpc.aio server of the caller's (:meth:`add_to`)."""

    def __init__(self, transports: Mapping[str, Transport]) -> None:
        self.transports = dict(transports)
        self.observing = 0  # Observe calls open now

    def add_to(self, server: grpc.aio.Server) -> None:
        handlers: dict[str, grpc.RpcMethodHandler] = {}
        for method in AGENT_SERVICE.methods:
            path = f"/{AGENT_SERVICE.full_name}/{method.name}"
            if method.server_streaming:
                handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                    self._streamer(path))
            else:
                handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                    self._forwarder(path))
        server.add_generic_rpc_handlers((
            grpc.method_handlers_generic_handler(AGENT_SERVICE.full_name, handlers),))
        agent_pb2_grpc.add_RelayServicer_to_server(_Observer(self), server)

    async def _transport(self, context: grpc.aio.ServicerContext) -> Transport:
        named = dict(context.invocation_metadata() or ()).get(NODE_KEY)
        transport = self.transports.get(named) if isinstance(named, str) else None
        if transport is None:
            # The node's name is never echoed: it came from the caller.
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"this relay serves no such node (metadata {NODE_KEY})")
        assert transport is not None
        return transport

    async def _unreachable(self, context: grpc.aio.ServicerContext, transport: Transport,
                           exc: grpc.aio.AioRpcError | NodeUnreachable) -> None:
        """Answer a failed forward: the node's own classification when it cannot be
        reached, otherwise the agent's status as it was (a stale channel is reset first:
        the daemon retries once, as it does with a direct channel)."""
        failure = exc if isinstance(exc, NodeUnreachable) else None
        if isinstance(exc, grpc.aio.AioRpcError):
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                await context.abort(exc.code(), exc.details() or "")
            failure = await transport.diagnose()
            if failure is None:
                await transport.reset()
                await context.abort(grpc.StatusCode.UNAVAILABLE,
                                    exc.details() or "the agent's channel was stale")
        assert failure is not None
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(failure),
                            trailing_metadata=((UNREACHABLE_KEY, str(failure)),))

    def _forwarder(self, path: str) -> Any:
        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            transport = await self._transport(context)
            try:
                channel = await transport.channel()
                answer: bytes = await channel.unary_unary(path)(
                    request, timeout=context.time_remaining())
                return answer
            except (grpc.aio.AioRpcError, NodeUnreachable) as exc:
                await self._unreachable(context, transport, exc)
                raise  # _unreachable always aborts
        return forward

    def _streamer(self, path: str) -> Any:
        async def forward(request: bytes, context: grpc.aio.ServicerContext
                          ) -> AsyncIterator[bytes]:
            transport = await self._transport(context)
            call = None
            try:
                channel = await transport.channel()
                call = channel.unary_stream(path)(request)
                async for item in call:
                    yield item
            except (grpc.aio.AioRpcError, NodeUnreachable) as exc:
                await self._unreachable(context, transport, exc)
            finally:
                if call is not None:
                    call.cancel()
        return forward

    async def observe(self, request: pb.RelayObserveRequest) -> AsyncIterator[pb.RelayEvent]:
        """The named nodes' pushes, merged, until the caller leaves."""
        queue: asyncio.Queue[pb.RelayEvent] = asyncio.Queue(QUEUE)
        watches = {}
        for watch in request.nodes[:MAX_NODES]:
            if watch.declared.node in self.transports:
                watches[watch.declared.node] = watch.SerializeToString()
        tasks = [asyncio.create_task(self._follow(node, body, queue), name=f"relay-{node}")
                 for node, body in watches.items()]
        self.observing += 1
        try:
            while True:
                yield await queue.get()
        finally:
            self.observing -= 1
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _follow(self, node: str, body: bytes, queue: asyncio.Queue[pb.RelayEvent]
                      ) -> None:
        """One node's push stream, for good; each break told once, then reopened with
        backoff. The channel is not reset here (a forwarded call resets a stale one)."""
        transport = self.transports[node]
        delay = 1.0
        while True:
            why = "agent error: the agent ended its stream"
            try:
                channel = await transport.channel()
                async for event in channel.unary_stream(WATCH)(body):
                    delay = 1.0
                    await queue.put(pb.RelayEvent(node=node, event=event))
            except NodeUnreachable as failure:
                why = str(failure)
            except grpc.aio.AioRpcError as exc:
                found = await transport.diagnose() \
                    if exc.code() == grpc.StatusCode.UNAVAILABLE else None
                why = str(found or failures.from_rpc(node, exc))
            await queue.put(pb.RelayEvent(node=node, lost=why))
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)

    async def aclose(self) -> None:
        await asyncio.gather(*(t.aclose() for t in self.transports.values()),
                             return_exceptions=True)


class _Observer(agent_pb2_grpc.RelayServicer):
    def __init__(self, relay: RelayServer) -> None:
        self.relay = relay

    async def Observe(self, request: pb.RelayObserveRequest,  # noqa: N802 (gRPC's name)
                      context: grpc.aio.ServicerContext) -> AsyncIterator[pb.RelayEvent]:
        async for event in self.relay.observe(request):
            yield event


def advertise(sockets: Path, index: int, socket: Path, nodes: Sequence[str]) -> Path:
    """Write ``<sockets>/relays-<index>.json``: the relay's socket and the nodes behind it."""
    path = sockets / f"relays-{index}.json"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"socket": str(socket), "nodes": list(nodes)}))
    os.replace(tmp, path)
    return path


def advertised(sockets: Path) -> dict[str, list[str]]:
    """Every relay advertised in ``sockets`` (relay socket → its nodes); {} for none."""
    found: dict[str, list[str]] = {}
    for path in sorted(sockets.glob("relays-*.json")):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            data = json.loads(path.read_text())
            found[str(data["socket"])] = [str(n) for n in data["nodes"]]
    return found


# -- the daemon's side --------------------------------------------------------------


class Link:
    """The daemon's one channel to a relay, shared by every node behind it."""

    def __init__(self, socket: str) -> None:
        self.socket = socket
        self._channel: grpc.aio.Channel | None = None
        self.connects = 0

    def channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(f"unix:{self.socket}",
                                                      options=CHANNEL_OPTIONS)
            self.connects += 1
        return self._channel

    def broken(self) -> bool:
        channel = self._channel
        return channel is not None and channel.get_state() in (
            grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN)

    async def diagnose(self, node: str) -> NodeUnreachable | None:
        how = await refused(self.socket)
        return None if how is None else NodeUnreachable(
            node, "unreachable", f"its relay does not answer on {self.socket} ({how})")

    def observe(self, watches: Sequence[pb.WatchRequest]) -> Any:
        """The relay's merged stream for these nodes (a grpc.aio call: iterate, cancel)."""
        return agent_pb2_grpc.RelayStub(self.channel()).Observe(
            pb.RelayObserveRequest(nodes=list(watches)))

    async def reset(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()


class RelayedTransport:
    """One node reached through its relay's :class:`Link`."""

    def __init__(self, node: str, link: Link) -> None:
        self.node = node
        self.link = link

    @property
    def connects(self) -> int:
        return self.link.connects

    async def channel(self) -> Any:
        return NodeChannel(self.link.channel(), self.node)

    async def diagnose(self) -> NodeUnreachable | None:
        return await self.link.diagnose(self.node)

    async def reset(self) -> None:
        # Shared by every node behind the relay: dropped only when it is itself broken
        # (an UNAVAILABLE that the relay passed on is the relay's channel to the agent).
        if self.link.broken():
            await self.link.reset()

    async def aclose(self) -> None:
        return None  # the pool closes its links


def relayed_failure(node: str, exc: grpc.aio.AioRpcError) -> NodeUnreachable | None:
    """The relay's own classification of a node it could not reach, if it sent one."""
    for key, value in exc.trailing_metadata() or ():
        if key == UNREACHABLE_KEY and isinstance(value, str):
            reason = failures.reason_of(value)
            if reason is not None:
                return NodeUnreachable(node, reason,  # type: ignore[arg-type]
                                       value.partition(": ")[2])
    return None


class NodeChannel:
    """A channel to a relay that names one node in every call's metadata."""

    def __init__(self, channel: grpc.aio.Channel, node: str) -> None:
        self._channel = channel
        self._metadata = ((NODE_KEY, node),)

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> _Named:
        return _Named(self._channel.unary_unary(method, *args, **kwargs), self._metadata)

    def unary_stream(self, method: str, *args: Any, **kwargs: Any) -> _Named:
        return _Named(self._channel.unary_stream(method, *args, **kwargs), self._metadata)

    def stream_unary(self, method: str, *args: Any, **kwargs: Any) -> _Named:
        return _Named(self._channel.stream_unary(method, *args, **kwargs), self._metadata)

    def stream_stream(self, method: str, *args: Any, **kwargs: Any) -> _Named:
        return _Named(self._channel.stream_stream(method, *args, **kwargs), self._metadata)


class _Named:
    def __init__(self, call: Any, metadata: tuple[tuple[str, str], ...]) -> None:
        self._call = call
        self._metadata = metadata

    def __call__(self, *args: Any, metadata: Sequence[tuple[str, str]] | None = None,
                 **kwargs: Any) -> Any:
        return self._call(*args, metadata=(*(metadata or ()), *self._metadata), **kwargs)
