"""Why a node could not be reached: the one place transport errors are classified.

Every way of failing to talk to an agent — TCP refused, no SSH banner, key
rejected, host key not pinned, nothing on the agent's socket, a gRPC error —
ends here as a :class:`NodeUnreachable` with a *reason class* and a sentence
for the operator. Callers above the transport never see asyncssh, OSError or
gRPC exceptions; they see this, and turn it into
``NodeReport(reachable=False, error=str(failure))``.

``str(failure)`` always starts with the reason class followed by a colon
(``"refused: …"``), so the class survives the trip through a fleet snapshot
where only the string is kept; :func:`reason_of` reads it back.
"""

from __future__ import annotations

import asyncio
from typing import Literal, get_args

import asyncssh
import grpc

Reason = Literal[
    "refused",  # TCP connection refused: nothing listens on the SSH port
    "timeout",  # no answer in time: connect, SSH handshake, or the agent call
    "auth",  # the SSH server rejected our key (or we have none it accepts)
    "host key",  # the node's host key is not the one pinned in known_hosts
    "agent not running",  # SSH works, nothing accepts on the agent's socket
    "unreachable",  # name does not resolve, no route, network down
    "ssh",  # the SSH session failed some other way (protocol, disconnect)
    "agent error",  # the agent answered, with an error
]
REASONS: tuple[str, ...] = get_args(Reason)


class NodeUnreachable(Exception):
    """A node's agent could not be used; ``reason`` says which way it failed."""

    def __init__(self, node: str, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.node = node
        self.reason: Reason = reason
        self.detail = detail


def reason_of(error: str | None) -> str | None:
    """The reason class at the start of a ``NodeReport.error`` string, if any."""
    if not error:
        return None
    head, sep, _ = error.partition(":")
    return head if sep and head in REASONS else None


def from_connect(
    node: str, where: str, exc: BaseException, connect_timeout: float
) -> NodeUnreachable:
    """Classify an exception raised while opening an SSH connection to ``where``."""
    if isinstance(exc, NodeUnreachable):
        return exc
    if isinstance(exc, ConnectionRefusedError):
        return NodeUnreachable(
            node, "refused",
            f"{where} refused the connection; is sshd running there and listening on that port?",
        )
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return NodeUnreachable(
            node, "timeout",
            f"{where} did not complete the SSH handshake within {connect_timeout:g}s "
            "(cluster.ssh.connect_timeout); the host may be down, firewalled, or overloaded",
        )
    if isinstance(exc, asyncssh.PermissionDenied):
        return NodeUnreachable(
            node, "auth",
            f"{where} rejected our SSH key ({exc.reason}); check cluster.ssh.user and "
            "identity_file, and that the public key is in the user's authorized_keys on the node",
        )
    if isinstance(exc, asyncssh.KeyImportError | asyncssh.KeyEncryptionError):
        return NodeUnreachable(node, "auth", f"cannot use the SSH private key: {exc}")
    if isinstance(exc, asyncssh.DisconnectError):
        return NodeUnreachable(node, "ssh", f"{where} closed the SSH session: {exc.reason}")
    if isinstance(exc, OSError):
        # No route, network down, a name that does not resolve (socket.gaierror)…
        return NodeUnreachable(node, "unreachable", f"cannot reach {where}: {_oserror(exc)}")
    return NodeUnreachable(node, "ssh", f"connecting to {where} failed: {exc!r}")


def from_rpc(node: str, exc: grpc.aio.AioRpcError) -> NodeUnreachable:
    """Classify a gRPC error from the agent (an UNAVAILABLE one is diagnosed first)."""
    code = exc.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return NodeUnreachable(node, "timeout", "the agent did not answer in time")
    name = code.name if code is not None else "UNKNOWN"
    return NodeUnreachable(node, "agent error", f"{name}: {exc.details() or 'no details'}")


def agent_not_running(node: str, socket: str, how: str, *, local: bool = False
                      ) -> NodeUnreachable:
    """Nothing answers on the agent's socket; ``local``: the node at ``address: local``."""
    start = (
        "`llmgw serve` starts this machine's agent itself when nothing answers there; "
        "for `llmgw plan`/`apply` alone, run `llmgw agent serve --config FILE` with an "
        "agent settings file whose socket.path is this agent_socket (docs/agent.md)"
        if local else
        "start the agent there (`llmgw agent serve --config /etc/llmgw/agent.yaml`, or its "
        "systemd unit, docs/agent.md)"
    )
    return NodeUnreachable(
        node, "agent not running",
        f"nothing accepts connections on {socket} ({how}); {start}; check the node's "
        "agent_socket, and that the user may open the socket (group of the socket, mode 0660)",
    )


def simulated_agent_gone(node: str, socket: str, how: str) -> NodeUnreachable:
    """A node of the fleet simulator (``llmgw lab simulate``) whose agent does not answer."""
    return NodeUnreachable(
        node, "agent not running",
        f"the simulated node's agent does not answer on {socket} ({how}); is `llmgw lab "
        "simulate` still running, and is this node one it lost on purpose?",
    )


def missing_key(node: str, path: str, exc: OSError) -> NodeUnreachable:
    """The SSH private key named by ``cluster.ssh.identity_file`` cannot be read here."""
    what = "does not exist" if isinstance(exc, FileNotFoundError) else \
        f"cannot be read ({_oserror(exc)})"
    return NodeUnreachable(
        node, "auth",
        f"the SSH key {path} (cluster.ssh.identity_file) {what}; create it "
        f"(ssh-keygen -t ed25519 -f {path}) and add its .pub to the nodes' authorized_keys, "
        "or point identity_file at the key you use",
    )


def call_timeout(node: str, seconds: float, phase: str) -> NodeUnreachable:
    return NodeUnreachable(node, "timeout", f"no answer within {seconds:g}s while {phase}")


def _oserror(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__
