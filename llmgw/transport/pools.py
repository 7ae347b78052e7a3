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
from llmgw.fleet.types import Fleet, NodeReport
from llmgw.hub import catalogs
from llmgw.spec.models import Cluster
from llmgw.transport import failures, hostkeys
from llmgw.transport.agent_client import AgentClient
from llmgw.transport.failures import NodeUnreachable
from llmgw.transport.transports import LocalTransport, Transport
from llmgw.transport.tunnels import SSHTarget, SSHTransport

T = TypeVar("T")


@dataclass(frozen=True)
class LocalRoute:
    node: str
    socket: str


Route = SSHTarget | LocalRoute
"""How one node is reached; a transport is kept while its route stays the same."""

DEFAULT_CALL_TIMEOUT = 30.0
"""Seconds one call may take, connecting included, unless the caller says otherwise."""


class Pool:
    """Transports to every node of ``cluster``; ``transports`` replaces them (tests, tools)."""

    def __init__(
        self,
        cluster: Cluster,
        cluster_dir: str | Path,
        *,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        transports: Mapping[str, Transport] | None = None,
    ) -> None:
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

        async def one(node: str) -> NodeReport:
            return await self.report(node, timeout=timeout)

        reports, facts = await asyncio.gather(
            fan_out(names, one, self.max_parallel),
            asyncio.to_thread(
                self.catalog.lookup, catalogs.fetched_sources(self.cluster),
                self.cluster.cluster.weights.endpoint, self.cluster.cluster.weights.allowed_hosts,
            ),
        )
        return Fleet(nodes=reports, sources=facts)

    async def aclose(self) -> None:
        """Close every connection (in parallel: a hung node does not hold up the others)."""
        await asyncio.gather(*(t.aclose() for t in self._transports.values()))
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

    def _plan_routes(self, cluster: Cluster) -> dict[str, Route]:
        settings = cluster.cluster
        routes: dict[str, Route] = {}
        for name, node in cluster.nodes.items():
            socket = node.agent_socket or settings.agent_socket
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
