"""Every node of a cluster, reached through pooled transports, in parallel, with a bound.

A :class:`Pool` holds one transport per node (SSH, or the local socket for
``address: local``), opened on first use and reused by every later call
until :meth:`Pool.aclose`. Each call is bounded by a timeout that covers
connecting as well as the agent's answer. Whatever goes wrong becomes a
:class:`~llmgw.transport.failures.NodeUnreachable`; :meth:`Pool.report` and
:meth:`Pool.fleet` go one step further and never raise for a node at all — an
unreachable node is ``NodeReport(reachable=False, error="<reason>: …")``.

Usage::

    async with pools.Pool(cluster, cluster_dir) as pool:
        fleet = await pool.fleet()
        results = await pool.each(["gpu-a-01"], lambda agent: agent.apply_units(units))
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import grpc

from llmgw.discovery.fabrics import Declaration, DeclaredFabric
from llmgw.fleet import deltas
from llmgw.fleet.deltas import Delta
from llmgw.fleet.types import Fleet, NodeReport
from llmgw.hub import catalogs
from llmgw.proto import agent_pb2 as pb
from llmgw.proto import conversions as messages
from llmgw.spec.models import Cluster
from llmgw.transport import failures, hostkeys
from llmgw.transport.agent_client import AgentClient, declaration_to_message
from llmgw.transport.failures import NodeUnreachable
from llmgw.transport.relays import Link, RelayedTransport, relayed_failure
from llmgw.transport.transports import LocalTransport, SimulatedTransport, Transport
from llmgw.transport.tunnels import SSHTarget, SSHTransport

T = TypeVar("T")


@dataclass(frozen=True)
class LocalRoute:
    node: str
    socket: str


@dataclass(frozen=True)
class SimulatedRoute:
    node: str
    socket: str


@dataclass(frozen=True)
class RelayedRoute:
    node: str
    relay: str  # the relay's socket


Route = SSHTarget | LocalRoute | SimulatedRoute | RelayedRoute
"""How one node is reached; a transport is kept while its route stays the same."""

DEFAULT_CALL_TIMEOUT = 30.0
"""Seconds one call may take, connecting included, unless the caller says otherwise."""
PUSH_RETRY_MAX = 30.0  # seconds between tries to reopen a node's stream, at most

Changed = Callable[[str, str], None]
"""Told (node, why) of a push worth a new plan: a stream lost or (re)opened, a fault that
appeared or cleared, a unit that failed or stopped. Other pushes only update the view."""


class Pool:
    """Transports to every node of ``cluster``; ``transports`` replaces them (tests, tools).

    ``simulated`` names the directory of a fleet simulator's sockets (``llmgw lab
    simulate``): every node is then reached on ``<simulated>/<node>.sock`` through a
    :class:`SimulatedTransport` instead of SSH. With ``push``, :meth:`fleet` does not ask
    every node: once :meth:`push` runs, each node's agent streams its observations (a full
    report, then what changed) and :meth:`fleet` reads them, asking only the nodes whose
    stream is not up (an unreachable node, an agent older than push).

    ``relays`` (relay socket → the nodes behind it, as
    :func:`llmgw.transport.relays.advertised` reads the simulator's) reaches those nodes
    through their relay instead: one channel and one merged push stream per relay, not
    one of each per node.
    """

    def __init__(
        self,
        cluster: Cluster,
        cluster_dir: str | Path,
        *,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        transports: Mapping[str, Transport] | None = None,
        simulated: str | Path | None = None,
        push: bool = False,
        backstop: float = 0.0,
        relays: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        self.simulated = Path(simulated) if simulated is not None else None
        self._behind = {node: socket for socket, nodes in (relays or {}).items()
                        for node in nodes}  # node → its relay's socket
        self._links: dict[str, Link] = {}
        self._relayed: dict[str, dict[str, Declaration]] = {}  # relay → nodes it streams
        self._relay_streams: dict[str, asyncio.Task[None]] = {}
        self.pushes = push
        self.backstop = backstop
        self._view: dict[str, NodeReport] = {}  # node → its report as pushed, while streaming
        self._streams: dict[str, asyncio.Task[None]] = {}
        self._declared: dict[str, Declaration] = {}  # what each stream was opened with
        self._unpushed: set[str] = set()  # agents that answered push with unit events
        self._changed: Changed | None = None
        self.pushed = 0  # deltas applied so far (the bench counts them)
        self.polled = 0  # reports asked for so far
        self.cluster = cluster
        self.cluster_dir = Path(cluster_dir)
        self.call_timeout = call_timeout
        self.max_parallel = cluster.cluster.ssh.max_parallel
        self._forward_dir: Path | None = None
        self.catalog = catalogs.Catalog()
        self._pinned: hostkeys.Pinned | None = None
        self._routes: dict[str, Route] = {}
        self._transports: dict[str, Transport] = {}
        if transports is not None:
            self._transports = dict(transports)
        else:
            self._routes = self._plan_routes(cluster)
            self._transports = {name: self._open(route) for name, route in self._routes.items()}

    async def __aenter__(self) -> Pool:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @property
    def nodes(self) -> list[str]:
        return sorted(self._transports)

    def transport(self, node: str) -> Transport:
        return self._transports[node]

    async def client(self, node: str) -> AgentClient:
        """An agent client on the node's pooled channel, for long calls (``watch_units``).

        Raises :class:`NodeUnreachable` if the node cannot be reached within the
        pool's call timeout. The stream itself has no timeout and no retry: the
        caller owns its lifetime.
        """
        try:
            async with asyncio.timeout(self.call_timeout):
                return AgentClient(await self._transports[node].channel())
        except TimeoutError:
            raise failures.call_timeout(node, self.call_timeout, "connecting") from None

    async def call(
        self,
        node: str,
        fn: Callable[[AgentClient], Awaitable[T]],
        *,
        timeout: float | None = None,
    ) -> T:
        """Run ``fn(agent)`` against the node's agent; raises only :class:`NodeUnreachable`.

        A call that fails as UNAVAILABLE is diagnosed: a stale channel (the
        agent or sshd restarted since the last call) is reopened and ``fn`` runs
        once more — agent calls are idempotent — while a real failure (nothing
        on the socket) is reported as such.
        """
        transport = self._transports[node]
        limit = self.call_timeout if timeout is None else timeout
        phase = "connecting"
        try:
            async with asyncio.timeout(limit):
                for _ in range(2):
                    phase = "connecting"
                    channel = await transport.channel()
                    phase = "waiting for the agent"
                    try:
                        return await fn(AgentClient(channel))
                    except grpc.aio.AioRpcError as exc:
                        if exc.code() != grpc.StatusCode.UNAVAILABLE:
                            raise failures.from_rpc(node, exc) from None
                        relayed = relayed_failure(node, exc)
                        if relayed is not None:
                            raise relayed from None
                        phase = "checking the agent's socket"
                        failure = await transport.diagnose()
                        if failure is not None:
                            raise failure from None
                        await transport.reset()
                        last = exc
                raise NodeUnreachable(
                    node, "agent error", f"UNAVAILABLE twice: {last.details() or 'no details'}"
                )
        except TimeoutError:
            raise failures.call_timeout(node, limit, phase) from None

    async def each(
        self,
        nodes: Iterable[str],
        fn: Callable[[AgentClient], Awaitable[T]],
        *,
        timeout: float | None = None,
    ) -> dict[str, T | NodeUnreachable]:
        """``fn`` on every node, at most ``cluster.ssh.max_parallel`` at once; never raises."""

        async def one(node: str) -> T | NodeUnreachable:
            try:
                return await self.call(node, fn, timeout=timeout)
            except NodeUnreachable as failure:
                return failure

        return await fan_out(nodes, one, self.max_parallel)

    async def report(self, node: str, *, timeout: float | None = None) -> NodeReport:
        """The node's report, or ``NodeReport(reachable=False, error=…)``; never raises."""
        self.polled += 1
        declared = declared_for(self.cluster, node)
        try:
            report = await self.call(node, lambda agent: agent.report(declared), timeout=timeout)
        except NodeUnreachable as failure:
            return unreachable(node, failure)
        # The node is known by its key in the cluster, whatever it calls itself.
        return report if report.node == node else report.model_copy(update={"node": node})

    async def fleet(
        self, nodes: Iterable[str] | None = None, *, timeout: float | None = None
    ) -> Fleet:
        """Every node's report (or the given nodes'), collected in parallel with the bound."""
        names = self.nodes if nodes is None else sorted(nodes)
        # Pushed: a node streaming is read from its last push, only the others are asked.
        pushed = {name: self._view[name] for name in names if name in self._view}
        asked = [name for name in names if name not in pushed]

        async def one(node: str) -> NodeReport:
            return await self.report(node, timeout=timeout)

        polled, facts = await asyncio.gather(
            fan_out(asked, one, self.max_parallel),
            asyncio.to_thread(
                self.catalog.lookup, catalogs.fetched_sources(self.cluster),
                self.cluster.cluster.weights.endpoint, self.cluster.cluster.weights.allowed_hosts,
            ),
        )
        reports = {**pushed, **polled}
        return Fleet(nodes={name: reports[name] for name in names}, sources=facts)

    # -- pushed observations ---------------------------------------------------

    @property
    def streaming(self) -> set[str]:
        """The nodes whose observations arrive pushed now (read from their streams)."""
        return set(self._view)

    def push(self, changed: Changed) -> None:
        """Open every node's stream of observations (and keep it open: reconnecting with
        backoff, each reconnect starting with a full report); ``changed`` hears of each
        push. Until :meth:`aclose`; :meth:`reconfigure` follows the nodes."""
        self._changed = changed
        for node in self.nodes:
            self._stream(node)
        self._restream_relays()

    def _stream(self, node: str) -> None:
        if node in self._unpushed or isinstance(self._transports[node],
                                                RelayedTransport):
            return
        self._declared[node] = declared_for(self.cluster, node)
        self._streams[node] = asyncio.create_task(self._follow(node), name=f"push-{node}")

    async def _stop_streams(self, nodes: Iterable[str]) -> None:
        tasks = [self._streams.pop(n) for n in nodes if n in self._streams]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for node in nodes:
            self._view.pop(node, None)
            for streamed in self._relayed.values():
                streamed.pop(node, None)  # its relay's events for it are ignored from now

    def _restream_relays(self) -> None:
        """Each relay's merged stream (re)opened when the nodes behind it, or what the
        cluster declares for them, differ from what it was opened with."""
        wanted: dict[str, dict[str, Declaration]] = {}
        for node, transport in sorted(self._transports.items()):
            if isinstance(transport, RelayedTransport) and node not in self._unpushed:
                wanted.setdefault(transport.link.socket, {})[node] = \
                    declared_for(self.cluster, node)
        for socket in set(self._relay_streams) | set(wanted):
            if self._relayed.get(socket) == wanted.get(socket) and socket in self._relay_streams:
                continue
            task = self._relay_streams.pop(socket, None)
            if task is not None:
                task.cancel()  # its finally drops the views of its nodes
            self._relayed.pop(socket, None)
            if socket in wanted:
                self._relayed[socket] = wanted[socket]
                self._relay_streams[socket] = asyncio.create_task(
                    self._follow_relay(socket, wanted[socket], task), name=f"relay-{socket}")

    async def _follow_relay(self, socket: str, nodes: dict[str, Declaration],
                            before: asyncio.Task[None] | None) -> None:
        """A relay's merged stream, for good (reopened with backoff): each node's pushes
        applied to its view as :meth:`_follow` applies a node's own; a node the relay
        lost, or every node when the relay's stream breaks, is dropped from the view."""
        if before is not None:
            await asyncio.gather(before, return_exceptions=True)
        link = self._links[socket]
        delay = 1.0
        try:
            while True:
                watches = [pb.WatchRequest(push=True, declared=declaration_to_message(d),
                                           backstop_seconds=self.backstop)
                           for d in nodes.values()]
                call = None
                try:
                    call = link.observe(watches)
                    async for event in call:
                        delay = 1.0
                        self._relayed_event(nodes, event)
                except (grpc.aio.AioRpcError, OSError):
                    pass
                finally:
                    if call is not None:
                        call.cancel()
                self._drop(list(nodes), "its relay's stream was lost")
                if link.broken():
                    await link.reset()
                await asyncio.sleep(delay)
                delay = min(delay * 2, PUSH_RETRY_MAX)
        finally:
            for node in nodes:
                self._view.pop(node, None)

    def _relayed_event(self, nodes: dict[str, Declaration], event: pb.RelayEvent) -> None:
        node = event.node
        if node not in nodes:
            return  # not asked for, or stopped since
        if event.lost:
            self._drop([node], "its stream was lost")
            return
        delta = messages.delta_from_message(pb.UnitEvent.FromString(event.event))
        if node not in self._view and not delta.full:  # an agent older than push: poll it
            self._unpushed.add(node)
            nodes.pop(node, None)
            return
        self._apply(node, delta)

    def _drop(self, nodes: Iterable[str], why: str) -> None:
        for node in nodes:
            if self._view.pop(node, None) is not None and self._changed is not None:
                self._changed(node, f"{node}: {why}")

    async def _follow(self, node: str) -> None:
        """One node's stream, for good: each push applied to its view; when the stream
        breaks the view is dropped (:meth:`fleet` asks the node, and says why it cannot be
        reached), and the stream is reopened with backoff."""
        delay = 1.0
        while True:
            try:
                agent = await self.client(node)
                first = True
                async for delta in agent.observe(self._declared[node], self.backstop):
                    if first and not delta.full:  # an agent older than push: poll it
                        self._unpushed.add(node)
                        return
                    first = False
                    delay = 1.0
                    self._apply(node, delta)
            except (NodeUnreachable, grpc.aio.AioRpcError, OSError):
                # The channel is not reset here: the node is asked at every round while
                # its stream is down, and that call resets a stale channel (a reset here
                # would close the channel under a call in flight).
                pass
            if self._view.pop(node, None) is not None and self._changed is not None:
                self._changed(node, f"{node}: its stream was lost")
            await asyncio.sleep(delay)
            delay = min(delay * 2, PUSH_RETRY_MAX)

    def _apply(self, node: str, delta: Delta) -> None:
        before = self._view.get(node)
        why = None
        if delta.report is not None:
            report = delta.report  # the node is known by its key, whatever it calls itself
            if report.node != node:
                report = report.model_copy(update={"node": node})
            self._view[node] = report
            if before is None:
                why = f"{node}: reporting"
            elif deltas.faults(before) != deltas.faults(report):
                why = f"{node}: its faults changed"
        elif before is not None:
            self._view[node] = deltas.apply(before, delta)
            for unit in delta.units:
                if unit.state in ("failed", "stopped"):
                    why = f"{unit.name} on {node} is {unit.state}"
        else:
            return  # a delta before any report: cannot happen on one stream
        self.pushed += 1
        if why is not None and self._changed is not None:
            self._changed(node, why)

    async def aclose(self) -> None:
        """Close every connection (in parallel: a hung node does not hold up the others)."""
        await self._stop_streams(list(self._streams))
        streams = list(self._relay_streams.values())
        self._relay_streams.clear()
        for task in streams:
            task.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
        await asyncio.gather(*(t.aclose() for t in self._transports.values()),
                             *(link.reset() for link in self._links.values()))
        if self._forward_dir is not None:
            shutil.rmtree(self._forward_dir, ignore_errors=True)
            self._forward_dir = None

    async def reconfigure(self, cluster: Cluster) -> None:
        """Follow an edited cluster directory, keeping every session still valid.

        New nodes get a transport; removed nodes' connections are closed; a node
        whose address, port, user, key or socket changed starts afresh, and so
        does one whose pinned host keys changed in known_hosts. (A pool built
        with injected ``transports`` only takes the new settings.)
        """
        self.cluster = cluster
        self.max_parallel = cluster.cluster.ssh.max_parallel
        await self._reroute(cluster)
        await self._restream(cluster)

    async def _reroute(self, cluster: Cluster) -> None:
        if not self._routes:
            return
        before = self._pinned
        self._pinned = None
        routes = self._plan_routes(cluster)
        stale = [
            name for name, route in self._routes.items()
            if routes.get(name) != route
            or (isinstance(route, SSHTarget) and _pins(before, route) != _pins(self._pinned, route))
        ]
        await self._stop_streams(stale)  # reopened on the new transport by _restream
        await asyncio.gather(*(self._transports.pop(name).aclose() for name in stale))
        for name in stale:
            del self._routes[name]
        for name, route in routes.items():
            transport = self._transports.get(name)
            if transport is None:
                self._transports[name] = self._open(route)
                self._routes[name] = route
            elif isinstance(transport, SSHTransport) and self._pinned is not None:
                transport.pinned = self._pinned  # same pins for it; the file is newer

    async def _restream(self, cluster: Cluster) -> None:
        """After an edit: streams of removed nodes closed, of nodes whose declaration
        changed reopened (their next push is a full report against it), new ones opened."""
        if self._changed is None:
            return
        gone = [n for n in self._streams if n not in cluster.nodes
                or declared_for(cluster, n) != self._declared.get(n)]
        await self._stop_streams(gone)
        self._unpushed &= set(cluster.nodes)
        for node in sorted(cluster.nodes):
            if node not in self._streams and node in self._transports:
                self._stream(node)
        self._restream_relays()

    def _plan_routes(self, cluster: Cluster) -> dict[str, Route]:
        settings = cluster.cluster
        routes: dict[str, Route] = {}
        for name, node in cluster.nodes.items():
            socket = node.agent_socket or settings.agent_socket
            if name in self._behind:
                routes[name] = RelayedRoute(name, self._behind[name])
                continue
            if self.simulated is not None:
                routes[name] = SimulatedRoute(name, str(self.simulated / f"{name}.sock"))
                continue
            if node.is_local:
                routes[name] = LocalRoute(name, socket)
                continue
            identity = settings.ssh.identity_file
            routes[name] = SSHTarget(
                node=name,
                host=node.address,
                port=node.ssh_port or settings.ssh.port,
                user=settings.ssh.user,
                agent_socket=socket,
                identity_file=self._resolve(identity) if identity else None,
                connect_timeout=settings.ssh.connect_timeout,
            )
            if self._pinned is None:
                self._pinned = hostkeys.load(self._resolve(settings.ssh.known_hosts))
        return routes

    def _open(self, route: Route) -> Transport:
        if isinstance(route, RelayedRoute):
            link = self._links.get(route.relay)
            if link is None:
                link = self._links[route.relay] = Link(route.relay)
            return RelayedTransport(route.node, link)
        if isinstance(route, SimulatedRoute):
            return SimulatedTransport(route.node, route.socket)
        if isinstance(route, LocalRoute):
            return LocalTransport(route.node, route.socket)
        assert self._pinned is not None
        return SSHTransport(route, self._pinned, self._forwards())

    def _resolve(self, path: str) -> Path:
        expanded = Path(path).expanduser()
        return expanded if expanded.is_absolute() else self.cluster_dir / expanded

    def _forwards(self) -> Path:
        # Local ends of the forwarded agent sockets: private to this user, and
        # short — a unix socket path must fit in 108 bytes.
        if self._forward_dir is None:
            base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
            self._forward_dir = Path(tempfile.mkdtemp(prefix="llmgw-", dir=base))
        return self._forward_dir


async def fan_out(
    keys: Iterable[str], fn: Callable[[str], Awaitable[T]], limit: int
) -> dict[str, T]:
    """``fn(key)`` for every key, at most ``limit`` running at once; results by key, in order.

    ``fn`` is expected not to raise (wrap failures into values); if it does,
    the first exception propagates after the others were cancelled.
    """
    gate = asyncio.Semaphore(limit)
    names = list(keys)

    async def bounded(key: str) -> T:
        async with gate:
            return await fn(key)

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(bounded(key)) for key in names]
    return {key: task.result() for key, task in zip(names, tasks, strict=True)}


def _pins(pinned: hostkeys.Pinned | None, target: SSHTarget) -> tuple[str | None, set[str]]:
    """What known_hosts says about one target: its problem, or its keys' fingerprints."""
    if pinned is None:
        return None, set()
    keys = pinned.keys_for(target.host, target.host, target.port)
    return pinned.problem, {hostkeys.fingerprint(k) for k in keys}


def unreachable(node: str, failure: NodeUnreachable) -> NodeReport:
    return NodeReport(node=node, reachable=False, error=str(failure))


def declared_for(cluster: Cluster, node: str) -> Declaration:
    """What the cluster declares for the node: its fabrics (with kind) and weights dirs.

    Sent with every Report, so the agent checks the node against the cluster
    as it is now and needs no copy of the cluster directory.
    """
    spec = cluster.nodes[node]
    fabrics = []
    for name, adapters in sorted(spec.fabrics.items()):
        fabric = cluster.fabrics.get(name)
        if fabric is None:  # the loader refuses this; a hand-built Cluster may not
            continue
        fabrics.append(DeclaredFabric(name, fabric.kind, tuple(adapters), fabric.gid_index))
    return Declaration(node=node, fabrics=tuple(fabrics), weights_dirs=tuple(spec.weights_dirs))


async def collect(
    cluster: Cluster, cluster_dir: str | Path, *, call_timeout: float = DEFAULT_CALL_TIMEOUT
) -> Fleet:
    """Inventory of every node, in parallel: one pool, opened and closed for this."""
    async with Pool(cluster, cluster_dir, call_timeout=call_timeout) as pool:
        return await pool.fleet()
