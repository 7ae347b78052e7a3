"""The SSH transport against real sshd processes: each way of failing, named."""

from __future__ import annotations

import asyncio
import getpass
from pathlib import Path

import pytest
from support import nodes
from support.plugin import SimClusterFactory

from llmgw.transport import hostkeys
from llmgw.transport.failures import NodeUnreachable
from llmgw.transport.tunnels import SSHTarget, SSHTransport


def transport_for(
    sim: nodes.SimCluster, name: str, *, key: Path | None = None, port: int | None = None,
    timeout: float = 5.0,
) -> SSHTransport:
    node = sim.nodes.get(name)
    target = SSHTarget(
        node=name, host="127.0.0.1", port=port or (node.port if node else 0),
        user=getpass.getuser(), agent_socket=str(sim.root / f"{name}.sock"),
        identity_file=key or sim.client_key, connect_timeout=timeout,
    )
    forwards = sim.root / "fwd"
    forwards.mkdir(exist_ok=True)
    return SSHTransport(target, hostkeys.load(sim.known_hosts), forwards)


async def failure_of(transport: SSHTransport) -> NodeUnreachable:
    with pytest.raises(NodeUnreachable) as caught:
        await transport.channel()
    await transport.aclose()
    return caught.value


async def test_pinned_key_connects_and_the_connection_is_reused(
    sim_cluster: SimClusterFactory,
) -> None:
    sim = sim_cluster(1, agents=False)
    node = sim.nodes["node-01"]
    transport = transport_for(sim, "node-01")
    first = await transport.channel()
    second = await transport.channel()
    assert first is second
    assert transport.connects == 1
    assert node.accepted_logins() == 1
    await transport.aclose()


async def test_changed_host_key_is_refused_with_the_offered_fingerprint(
    sim_cluster: SimClusterFactory,
) -> None:
    sim = sim_cluster(1, agents=False)
    node = sim.nodes["node-01"]
    pinned = node.host_fingerprint()
    node.rotate_host_key()
    offered = node.host_fingerprint()
    failure = await failure_of(transport_for(sim, "node-01"))
    assert failure.reason == "host key"
    assert "node-01" in failure.detail
    assert nodes.fingerprints_in(failure.detail) == [offered, pinned]
    assert "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub" in failure.detail
    assert node.accepted_logins() == 0  # no login was attempted with the fleet's key


async def test_unknown_host_is_refused_with_how_to_pin_it(sim_cluster: SimClusterFactory) -> None:
    sim = sim_cluster(2, agents=False)
    sim.pin_host_keys([sim.nodes["node-01"]])
    failure = await failure_of(transport_for(sim, "node-02"))
    assert failure.reason == "host key"
    assert nodes.fingerprints_in(failure.detail) == [sim.nodes["node-02"].host_fingerprint()]
    assert f"ssh-keyscan -p {sim.nodes['node-02'].port} 127.0.0.1 >>" in failure.detail


async def test_missing_known_hosts_is_a_host_key_failure(sim_cluster: SimClusterFactory) -> None:
    sim = sim_cluster(1, agents=False)
    sim.known_hosts.unlink()
    failure = await failure_of(transport_for(sim, "node-01"))
    assert failure.reason == "host key"
    assert "does not exist" in failure.detail


async def test_stopped_sshd_is_refused(sim_cluster: SimClusterFactory) -> None:
    sim = sim_cluster(1, agents=False)
    sim.nodes["node-01"].stop_sshd()
    failure = await failure_of(transport_for(sim, "node-01"))
    assert failure.reason == "refused"


async def test_silent_port_times_out(sim_cluster: SimClusterFactory) -> None:
    sim = sim_cluster(0, agents=False)
    port = sim.add_blackhole("silent")
    failure = await failure_of(transport_for(sim, "silent", port=port, timeout=0.5))
    assert failure.reason == "timeout"
    assert "0.5s" in failure.detail


async def test_key_not_authorised_is_auth(sim_cluster: SimClusterFactory) -> None:
    sim = sim_cluster(1, agents=False)
    failure = await failure_of(transport_for(sim, "node-01", key=sim.wrong_key))
    assert failure.reason == "auth"


async def test_no_agent_behind_sshd_is_diagnosed(sim_cluster: SimClusterFactory) -> None:
    sim = sim_cluster(1, agents=False)
    transport = transport_for(sim, "node-01")
    await transport.channel()  # SSH itself works
    failure = await transport.diagnose()
    assert failure is not None and failure.reason == "agent not running"
    assert str(sim.root / "node-01.sock") in failure.detail
    await transport.aclose()


async def test_backoff_fails_fast_until_the_next_attempt_is_due(
    sim_cluster: SimClusterFactory,
) -> None:
    sim = sim_cluster(1, agents=False)
    sim.nodes["node-01"].stop_sshd()
    transport = transport_for(sim, "node-01")
    clock = [100.0]
    transport.backoff.clock = lambda: clock[0]
    assert (await failure_of(transport)).reason == "refused"
    sim.nodes["node-01"].start_sshd()
    again = await failure_of(transport)  # within the backoff window: not tried
    assert again.reason == "refused" and "next attempt in" in again.detail
    assert transport.attempts == 1
    clock[0] += transport.backoff.cap
    await transport.channel()
    assert transport.attempts == 2 and transport.connects == 1
    await transport.aclose()


async def test_reconnects_after_sshd_restart(sim_cluster: SimClusterFactory) -> None:
    sim = sim_cluster(1, agents=False)
    node = sim.nodes["node-01"]
    transport = transport_for(sim, "node-01")
    await transport.channel()
    node.restart_sshd()  # sessions dropped, as when a node reboots
    for _ in range(200):  # until asyncssh has read the EOF
        if not transport.connected:
            break
        await asyncio.sleep(0.01)
    await transport.channel()
    assert transport.connects == 2
    assert node.accepted_logins() == 2
    await transport.aclose()


async def test_a_missing_identity_file_is_named(sim_cluster: SimClusterFactory) -> None:
    sim = sim_cluster(1, agents=False)
    missing = sim.root / "keys" / "llmgw_ed25519"
    failure = await failure_of(transport_for(sim, "node-01", key=missing))
    assert failure.reason == "auth"
    assert failure.detail.startswith(
        f"the SSH key {missing} (cluster.ssh.identity_file) does not exist; create it "
        f"(ssh-keygen -t ed25519 -f {missing})")
    assert sim.nodes["node-01"].accepted_logins() == 0
