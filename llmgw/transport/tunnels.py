"""SSH to a node, its agent's unix socket forwarded, gRPC through it.

One asyncssh connection per node, opened on first use and kept: every later
call rides the same session (the pool). The agent's socket on the node is
forwarded to a private local socket (``forward_local_path``: each gRPC
connection to it opens a ``direct-streamlocal`` channel to the agent), and a
``grpc.aio`` channel points at that local socket.

Host keys are pinned (:mod:`llmgw.transport.hostkeys`); a connection is tried
at most once per call, and after a failure not again until the node's
:class:`~llmgw.transport.backoffs.Backoff` allows — until then a call fails
at once with the last reason. A connection lost under us (sshd restarted,
keepalives unanswered) is not a failure of the node: the next call reconnects
straight away.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh
import grpc

from llmgw.transport import failures, hostkeys
from llmgw.transport.backoffs import Backoff
from llmgw.transport.failures import NodeUnreachable
from llmgw.transport.transports import CHANNEL_OPTIONS

# A dead peer (cable pulled, VM paused) is noticed within ~interval × count.
KEEPALIVE_INTERVAL = 15.0
KEEPALIVE_COUNT_MAX = 3


@dataclass(frozen=True)
class SSHTarget:
    """Everything needed to reach one node's agent over SSH."""

    node: str
    host: str
    port: int
    user: str
    agent_socket: str
    identity_file: Path | None = None
    connect_timeout: float = 10.0

    @property
    def where(self) -> str:
        return f"{self.user}@{hostkeys.entry(self.host, self.port)}"


class _Client(asyncssh.SSHClient):
    """Remembers the host key a server offered and whether the session ended."""

    def __init__(self) -> None:
        self.offered: asyncssh.SSHKey | None = None
        self.addr = ""
        self.lost = False

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        # Called by asyncssh only for a key that is *not* pinned: refuse it,
        # keeping it for the message.
        self.offered, self.addr = key, addr
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


class SSHTransport:
    """A node reached over SSH. ``forward_dir`` is a private (0700) directory for the socket."""

    def __init__(
        self,
        target: SSHTarget,
        pinned: hostkeys.Pinned,
        forward_dir: Path,
        backoff: Backoff | None = None,
    ) -> None:
        self.node = target.node
        self.target = target
        self.pinned = pinned
        self.backoff = backoff or Backoff()
        self.local_socket = forward_dir / f"{target.node}.sock"
        self.attempts = 0
        self._connects = 0
        self._lock = asyncio.Lock()
        self._conn: asyncssh.SSHClientConnection | None = None
        self._client: _Client | None = None
        self._listener: asyncssh.SSHListener | None = None
        self._channel: grpc.aio.Channel | None = None
        self._last_failure: NodeUnreachable | None = None

    @property
    def connects(self) -> int:
        return self._connects

    @property
    def connected(self) -> bool:
        """Whether an SSH session is open and not known to be lost."""
        return self._client is not None and not self._client.lost

    async def channel(self) -> grpc.aio.Channel:
        async with self._lock:
            if self._client is not None and self._client.lost:
                await self._drop_connection()
            if self._conn is None:
                await self._connect()
            if self._channel is None:
                self._channel = grpc.aio.insecure_channel(
                    f"unix:{self.local_socket}", options=CHANNEL_OPTIONS
                )
            return self._channel

    async def diagnose(self) -> NodeUnreachable | None:
        conn = self._conn
        if conn is None or (self._client is not None and self._client.lost):
            return None
        try:
            async with asyncio.timeout(self.target.connect_timeout):
                _, writer = await conn.open_unix_connection(self.target.agent_socket)
        except asyncssh.ChannelOpenError as exc:
            if exc.code == asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED:
                return NodeUnreachable(
                    self.node, "ssh",
                    f"sshd on {self.target.where} refuses to forward unix sockets; set "
                    "AllowStreamLocalForwarding yes (and AllowTcpForwarding not 'no') there",
                )
            # OpenSSH answers a forwarding it refuses by configuration with the same
            # "open failed" as a socket nobody listens on: name both causes.
            return failures.agent_not_running(
                self.node, self.target.agent_socket,
                f"sshd on the node: {exc.reason}; if the agent does run, sshd there may not "
                "allow socket forwarding: AllowStreamLocalForwarding yes, AllowTcpForwarding "
                "not 'no'",
            )
        except TimeoutError:
            return failures.call_timeout(
                self.node, self.target.connect_timeout, "opening the agent's socket over SSH"
            )
        except (asyncssh.Error, OSError):
            return None  # the session died under us; reconnecting is the diagnosis
        writer.close()
        return None

    async def reset(self) -> None:
        async with self._lock:
            await self._close_channel()
            if self._client is not None and self._client.lost:
                await self._drop_connection()

    async def aclose(self) -> None:
        async with self._lock:
            await self._drop_connection()

    async def upload(self, local: Path, remote: str,
                     progress: Callable[[int, int], None] | None = None) -> None:
        """Copy ``local`` to ``remote`` on the node over SFTP, on the pooled connection.

        The remote directory is made if it is missing.

        ``progress(done, total)`` is called as bytes go. Raises
        :class:`NodeUnreachable` when the node cannot be reached, ``OSError``
        (or ``asyncssh.SFTPError``) when the copy itself fails.
        """
        await self.channel()  # connects, as every call does
        assert self._conn is not None
        handler = (lambda _src, _dst, done, total: progress(done, total)) if progress else None
        async with self._conn.start_sftp_client() as sftp:
            await sftp.makedirs(os.path.dirname(remote), exist_ok=True)
            await sftp.put(str(local), remote, progress_handler=handler)

    async def _connect(self) -> None:
        wait = self.backoff.wait()
        if wait > 0 and self._last_failure is not None:
            last = self._last_failure
            raise NodeUnreachable(
                self.node, last.reason, f"{last.detail} (next attempt in {wait:.1f}s)"
            )
        self.attempts += 1
        try:
            conn, client = await self._open()
            try:
                listener = await self._forward(conn)
            except BaseException:
                conn.close()  # also when the caller's timeout cancels us here
                raise
        except NodeUnreachable as failure:
            self.backoff.failed()
            self._last_failure = failure
            raise
        self.backoff.succeeded()
        self._last_failure = None
        self._conn, self._client, self._listener = conn, client, listener
        self._connects += 1

    async def _open(self) -> tuple[asyncssh.SSHClientConnection, _Client]:
        target = self.target
        if self.pinned.problem:
            raise hostkeys.refusal(
                self.node, target.host, target.host, target.port, self.pinned, None
            )
        client = _Client()
        keys: dict[str, Any] = {}
        if target.identity_file is not None:
            # An explicit key means exactly that key: not whatever an ssh-agent
            # of the operator's session happens to hold.
            try:
                with open(target.identity_file, "rb"):
                    pass
            except OSError as exc:
                raise failures.missing_key(self.node, str(target.identity_file), exc) from None
            keys = {"client_keys": [str(target.identity_file)], "agent_path": None}
        try:
            conn, _ = await asyncssh.create_connection(
                lambda: client,
                target.host,
                target.port,
                username=target.user,
                known_hosts=self.pinned.known,
                connect_timeout=target.connect_timeout,
                keepalive_interval=KEEPALIVE_INTERVAL,
                keepalive_count_max=KEEPALIVE_COUNT_MAX,
                config=None,  # ~/.ssh/config must not silently change where we go
                **keys,
            )
        except asyncssh.HostKeyNotVerifiable as exc:
            raise hostkeys.refusal(
                self.node, target.host, client.addr or target.host, target.port,
                self.pinned, client.offered, revoked="revoked" in str(exc),
            ) from None
        except asyncssh.KeyExchangeFailed as exc:
            if "host key" in str(exc).lower():
                raise hostkeys.refusal(
                    self.node, target.host, target.host, target.port, self.pinned, None
                ) from None
            raise failures.from_connect(
                self.node, target.where, exc, target.connect_timeout
            ) from None
        except (OSError, asyncssh.Error, TimeoutError, ValueError) as exc:
            raise failures.from_connect(
                self.node, target.where, exc, target.connect_timeout
            ) from None
        return conn, client

    async def _forward(self, conn: asyncssh.SSHClientConnection) -> asyncssh.SSHListener:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.local_socket)
        try:
            return await conn.forward_local_path(
                str(self.local_socket), self.target.agent_socket
            )
        except (OSError, asyncssh.Error) as exc:
            raise NodeUnreachable(
                self.node, "ssh", f"cannot forward the agent socket locally: {exc}"
            ) from None

    async def _close_channel(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()

    async def _drop_connection(self) -> None:
        await self._close_channel()
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
            await listener.wait_closed()
        conn, self._conn, self._client = self._conn, None, None
        if conn is not None:
            conn.close()
            await conn.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.local_socket)
