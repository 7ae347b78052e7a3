"""Reaching node agents: SSH tunnels or the local socket, pooled, bounded, classified.

The public API, re-exported here (modules stay importable on their own)::

    from llmgw import transport

    fleet = await transport.collect(cluster, cluster_dir)      # one-shot inventory

    async with transport.Pool(cluster, cluster_dir) as pool:    # the daemon's pool
        report = await pool.report("gpu-a-01")                  # never raises
        results = await pool.each(nodes, lambda agent: agent.apply_units(changes))

Every failure to reach a node is a :class:`NodeUnreachable` whose ``reason``
is one of :data:`REASONS` (refused, timeout, auth, host key, agent not
running, …); reports of unreachable nodes carry ``error="<reason>: <detail>"``.
"""

from llmgw.transport.agent_client import AgentClient
from llmgw.transport.failures import REASONS, NodeUnreachable, Reason, reason_of
from llmgw.transport.pools import DEFAULT_CALL_TIMEOUT, Pool, collect, declared_for, fan_out
from llmgw.transport.transports import LocalTransport, Transport
from llmgw.transport.tunnels import SSHTarget, SSHTransport

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "REASONS",
    "AgentClient",
    "LocalTransport",
    "NodeUnreachable",
    "Pool",
    "Reason",
    "SSHTarget",
    "SSHTransport",
    "Transport",
    "collect",
    "declared_for",
    "fan_out",
    "reason_of",
]
