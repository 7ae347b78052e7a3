"""How the daemon reaches one node's agent: the interface, and the local socket.

Like httpx's injected transports, everything above this layer talks to a
:class:`Transport` and does not care whether it is an SSH tunnel
(:class:`llmgw.transport.tunnels.SSHTransport`) or the agent's socket on this
machine (:class:`LocalTransport`, for ``address: local``). A transport hands
out one gRPC channel, reused for every call until it breaks, and answers
"why did that call fail?" (:meth:`Transport.diagnose`) in terms of
:class:`~llmgw.transport.failures.NodeUnreachable`.

The retry-once-then-classify logic that uses it lives in
:mod:`llmgw.transport.pools`, so both transports share it.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import grpc

from llmgw.transport import failures
from llmgw.transport.failures import NodeUnreachable

CHANNEL_OPTIONS = (
    # Reports with log tails can exceed gRPC's 4 MiB default; nothing
    # legitimate comes near this.
    ("grpc.max_receive_message_length", 32 * 1024 * 1024),
    ("grpc.max_send_message_length", 32 * 1024 * 1024),
    ("grpc.enable_http_proxy", 0),
    # By default channels to the same target share subchannels process-wide,
    # so a channel reopened after an agent restart would inherit the old
    # one's reconnect backoff and fail on. Each channel gets its own.
    ("grpc.use_local_subchannel_pool", 1),
)


class Transport(Protocol):
    """One node's way in. Implementations: :class:`LocalTransport`, ``SSHTransport``."""

    node: str

    @property
    def connects(self) -> int:
        """Connections opened so far (SSH sessions, or channels for a local socket)."""

    async def channel(self) -> grpc.aio.Channel:
        """The pooled channel to the agent, opened if needed.

        Raises :class:`NodeUnreachable` when the node cannot be reached.
        """

    async def diagnose(self) -> NodeUnreachable | None:
        """After a call failed as UNAVAILABLE: why, or ``None`` if the path works now

        (the channel was stale: an agent or sshd restart) and a retry may succeed.
        """

    async def reset(self) -> None:
        """Drop the channel (and a dead connection) so the next call opens fresh ones."""

    async def aclose(self) -> None:
        """Close everything this transport holds; it may not be used afterwards."""


class LocalTransport:
    """The agent's unix socket on this machine (``address: local``)."""

    def __init__(self, node: str, socket_path: str) -> None:
        self.node = node
        self.socket_path = socket_path
        self._channel: grpc.aio.Channel | None = None
        self._connects = 0

    @property
    def connects(self) -> int:
        return self._connects

    async def channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(
                f"unix:{self.socket_path}", options=CHANNEL_OPTIONS
            )
            self._connects += 1
        return self._channel

    async def diagnose(self) -> NodeUnreachable | None:
        how = await refused(self.socket_path)
        if how is None:
            return None
        return failures.agent_not_running(self.node, self.socket_path, how, local=True)

    async def reset(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()

    async def aclose(self) -> None:
        await self.reset()


class SimulatedTransport(LocalTransport):
    """A node of the fleet simulator (``llmgw lab simulate``): its agent's own unix socket,
    in place of an SSH tunnel to it. The daemon takes this path only when told to
    (``llmgw serve --simulated DIR``, ``Pool(simulated=DIR)``); the SSH path keeps its
    own tests and bench."""

    async def diagnose(self) -> NodeUnreachable | None:
        how = await refused(self.socket_path)
        return None if how is None else failures.simulated_agent_gone(
            self.node, self.socket_path, how)


async def refused(socket_path: str) -> str | None:
    """Why nothing accepts on the unix socket (``"No such file or directory"``), or None
    when something does (the connection is closed again at once)."""
    try:
        _, writer = await asyncio.open_unix_connection(socket_path)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    writer.close()
    await writer.wait_closed()
    return None
