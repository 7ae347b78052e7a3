"""Inventory through real sshd and real agents: every way a node fails, and only that node."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest
from support import nodes
from support.plugin import SimClusterFactory

from llmgw.fleet.types import Fleet
from llmgw.spec import loading
from llmgw.spec.models import Cluster
from llmgw.transport import pools
from llmgw.transport.failures import reason_of
from llmgw.transport.transports import LocalTransport
from llmgw.transport.tunnels import SSHTransport


def reasons(fleet: Fleet) -> dict[str, str | None]:
    """Node → reason class of its failure, None when it reported."""
    return {name: None if r.reachable else reason_of(r.error) for name, r in fleet.nodes.items()}


def healthy(fleet: Fleet, *names: str) -> None:
    for name in names:
        report = fleet.nodes[name]
        assert report.reachable and report.error is None, (name, report.error)
        assert report.hostname and report.memory_total_bytes, name


def ssh(pool: pools.Pool, node: str) -> SSHTransport:
    transport = pool.transport(node)
    assert isinstance(transport, SSHTransport)
    return transport


async def test_inventory_of_three_nodes_through_sshd(sim_cluster: SimClusterFactory) -> None:
    sim = sim_cluster(3, hardware=["h100-ib", "l40s-nofabric", "cpu-only"])
    cluster = loading.load(sim.write_cluster())
    fleet = await pools.collect(cluster, sim.cluster_dir)
    assert reasons(fleet) == {"node-01": None, "node-02": None, "node-03": None}
    healthy(fleet, "node-01", "node-02", "node-03")
    h100, l40s, cpu = (fleet.nodes[f"node-0{i}"] for i in (1, 2, 3))
    assert [g.gpu_class for g in h100.gpus] == ["h100-80g"] * 8
    assert list(h100.advertised_fabrics) == ["ib-a"]  # declared by the cluster, checked there
    assert len(h100.advertised_fabrics["ib-a"].adapters) == 4
    assert {g.gpu_class for g in l40s.gpus} == {"l40s-45g"} and not l40s.fabrics
    assert cpu.is_cpu_only
    for name, node in sim.nodes.items():
        assert node.accepted_logins() == 1, name
    # Through the tunnel comes what the agent says on its own socket.
    direct = LocalTransport("node-01", str(sim.nodes["node-01"].agent_socket))
    async with pools.Pool(cluster, sim.cluster_dir, transports={"node-01": direct}) as pool:
        local = await pool.report("node-01")
    assert local.gpus == h100.gpus and local.fabrics == h100.fabrics


async def test_changed_host_key_is_refused_and_nothing_else_is_affected(
    sim_cluster: SimClusterFactory,
) -> None:
    sim = sim_cluster(3)
    cluster = loading.load(sim.write_cluster())
    victim = sim.nodes["node-02"]
    pinned = victim.host_fingerprint()
    victim.rotate_host_key()
    fleet = await pools.collect(cluster, sim.cluster_dir)
    assert reasons(fleet) == {"node-01": None, "node-02": "host key", "node-03": None}
    healthy(fleet, "node-01", "node-03")
    error = fleet.nodes["node-02"].error or ""
    assert error.startswith(f"host key: node-02 ([127.0.0.1]:{victim.port}) offered ssh-ed25519 ")
    assert nodes.fingerprints_in(error) == [victim.host_fingerprint(), pinned]
    assert str(sim.known_hosts) in error and "ssh-keygen -lf" in error
    assert victim.accepted_logins() == 0  # we never logged in to it


async def test_stopped_sshd_is_refused(sim_cluster: SimClusterFactory) -> None:
    sim = sim_cluster(3)
    cluster = loading.load(sim.write_cluster())
    sim.nodes["node-03"].stop_sshd()
    fleet = await pools.collect(cluster, sim.cluster_dir)
    assert reasons(fleet) == {"node-01": None, "node-02": None, "node-03": "refused"}
    assert "is sshd running there" in (fleet.nodes["node-03"].error or "")


async def test_silent_node_times_out_without_holding_up_the_others(
    sim_cluster: SimClusterFactory,
) -> None:
    sim = sim_cluster(2)
    sim.add_blackhole("silent")
    cluster = loading.load(sim.write_cluster(connect_timeout="2s"))
    fleet = await pools.collect(cluster, sim.cluster_dir)
    assert reasons(fleet) == {"node-01": None, "node-02": None, "silent": "timeout"}
    assert "within 2s (cluster.ssh.connect_timeout)" in (fleet.nodes["silent"].error or "")


async def test_key_not_authorised_is_auth(sim_cluster: SimClusterFactory) -> None:
    sim = sim_cluster(2)
    cluster = loading.load(sim.write_cluster(identity_file=str(sim.wrong_key)))
    fleet = await pools.collect(cluster, sim.cluster_dir)
    assert reasons(fleet) == {"node-01": "auth", "node-02": "auth"}
    assert "authorized_keys" in (fleet.nodes["node-01"].error or "")


async def test_relative_identity_file_and_known_hosts_resolve_in_the_cluster_dir(
    sim_cluster: SimClusterFactory,
) -> None:
    sim = sim_cluster(1)
    (sim.cluster_dir / "keys").mkdir()
    sim.client_key.rename(sim.cluster_dir / "keys" / "fleet")
    sim.known_hosts.rename(sim.cluster_dir / "pins")
    cluster = loading.load(sim.write_cluster(identity_file="keys/fleet", known_hosts="pins"))
    fleet = await pools.collect(cluster, sim.cluster_dir)
    assert reasons(fleet) == {"node-01": None}


async def test_agent_not_running_is_named_with_its_socket(sim_cluster: SimClusterFactory) -> None:
    sim = sim_cluster(2)
    cluster = loading.load(sim.write_cluster())
    sim.nodes["node-02"].stop_agent()
    fleet = await pools.collect(cluster, sim.cluster_dir)
    assert reasons(fleet) == {"node-01": None, "node-02": "agent not running"}
    error = fleet.nodes["node-02"].error or ""
    assert f"nothing accepts connections on {sim.nodes['node-02'].agent_socket}" in error
    assert "llmgw agent serve" in error


async def test_hung_agent_times_out(sim_cluster: SimClusterFactory) -> None:
    sim = sim_cluster(2)
    cluster = loading.load(sim.write_cluster())
    agent = sim.nodes["node-02"].agent
    assert agent is not None
    async with pools.Pool(cluster, sim.cluster_dir) as pool:
        healthy(await pool.fleet(), "node-01", "node-02")  # connected: only the agent is slow
        os.kill(agent.pid, signal.SIGSTOP)  # its socket still accepts; nobody answers
        try:
            fleet = await pool.fleet(timeout=1.0)
        finally:
            os.kill(agent.pid, signal.SIGCONT)
    assert reasons(fleet) == {"node-01": None, "node-02": "timeout"}
    assert fleet.nodes["node-02"].error == (
        "timeout: no answer within 1s while waiting for the agent"
    )


async def test_second_call_reuses_the_connection(sim_cluster: SimClusterFactory) -> None:
    sim = sim_cluster(2)
    cluster = loading.load(sim.write_cluster())
    async with pools.Pool(cluster, sim.cluster_dir) as pool:
        first = await pool.fleet()
        second = await pool.fleet()
        third = await pool.call("node-01", lambda agent: agent.report())
        assert [ssh(pool, n).connects for n in pool.nodes] == [1, 1]
    assert reasons(first) == reasons(second) == {"node-01": None, "node-02": None}
    assert third.gpus == second.nodes["node-01"].gpus
    # The servers agree: one login each, for three calls.
    assert [n.accepted_logins() for n in sim.nodes.values()] == [1, 1]


async def test_reconnects_after_sshd_restart(sim_cluster: SimClusterFactory) -> None:
    sim = sim_cluster(2)
    cluster = loading.load(sim.write_cluster())
    node = sim.nodes["node-01"]
    async with pools.Pool(cluster, sim.cluster_dir) as pool:
        healthy(await pool.fleet(), "node-01", "node-02")
        node.restart_sshd()  # the session is cut, as by a reboot or a network drop
        healthy(await pool.fleet(), "node-01", "node-02")
        assert ssh(pool, "node-01").connects == 2
        assert ssh(pool, "node-02").connects == 1
    assert node.accepted_logins() == 2


async def test_agent_restart_reuses_the_ssh_session(sim_cluster: SimClusterFactory) -> None:
    sim = sim_cluster(1)
    cluster = loading.load(sim.write_cluster())
    node = sim.nodes["node-01"]
    async with pools.Pool(cluster, sim.cluster_dir) as pool:
        healthy(await pool.fleet(), "node-01")
        node.stop_agent()
        assert reasons(await pool.fleet()) == {"node-01": "agent not running"}
        sim.start_agent(node)
        healthy(await pool.fleet(), "node-01")
        assert ssh(pool, "node-01").connects == 1
    assert node.accepted_logins() == 1


async def test_local_address_reaches_the_socket_directly(sim_cluster: SimClusterFactory) -> None:
    sim = sim_cluster(2)
    data = sim.cluster_data()
    data["nodes"]["node-02"] = {"address": "local",
                                "agent_socket": str(sim.nodes["node-02"].agent_socket)}
    cluster = Cluster.model_validate(data)
    async with pools.Pool(cluster, sim.cluster_dir) as pool:
        assert isinstance(pool.transport("node-02"), LocalTransport)
        healthy(await pool.fleet(), "node-01", "node-02")
    assert sim.nodes["node-02"].accepted_logins() == 0


async def test_the_local_node_without_an_agent_says_how_to_start_one(
    sim_cluster: SimClusterFactory,
) -> None:
    sim = sim_cluster(1, agents=False)
    data = sim.cluster_data()
    data["nodes"]["node-01"] = {"address": "local", "agent_socket": str(sim.root / "none.sock")}
    async with pools.Pool(Cluster.model_validate(data), sim.cluster_dir) as pool:
        error = (await pool.fleet()).nodes["node-01"].error or ""
    assert error.startswith("agent not running: nothing accepts connections on ")
    assert "`llmgw serve` starts this machine's agent itself" in error
    assert "`llmgw agent serve --config FILE`" in error


async def test_fan_out_never_exceeds_max_parallel(sim_cluster: SimClusterFactory) -> None:
    sim = sim_cluster(6, agents=False)  # the bound is the pool's: no agent needed
    cluster = loading.load(sim.write_cluster(max_parallel=2))
    running, most = 0, 0
    gate = asyncio.Event()

    async def nothing(agent: pools.AgentClient) -> int:
        return 0

    async def held(agent: pools.AgentClient) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await gate.wait()
        running -= 1
        return 1

    async with pools.Pool(cluster, sim.cluster_dir) as pool:
        # Connect all six first: from here on only the bound can hold a call back.
        assert set((await pool.each(pool.nodes, nothing)).values()) == {0}
        task = asyncio.create_task(pool.each(pool.nodes, held))
        while running < 2:
            await asyncio.sleep(0)
        for _ in range(100):  # every call the bound did not hold back would be in by now
            await asyncio.sleep(0)
        assert running == 2
        gate.set()
        results = await task
    assert results == {f"node-0{i}": 1 for i in range(1, 7)}
    assert most == 2


@pytest.fixture
def stopped_sshd(sim_cluster: SimClusterFactory) -> Iterator[nodes.SimCluster]:
    sim = sim_cluster(1)
    sim.nodes["node-01"].stop_sshd()
    yield sim


async def test_unreachable_node_never_raises_to_the_caller(
    stopped_sshd: nodes.SimCluster,
) -> None:
    cluster = loading.load(stopped_sshd.write_cluster())
    async with pools.Pool(cluster, stopped_sshd.cluster_dir) as pool:
        report = await pool.report("node-01")
        results = await pool.each(["node-01"], lambda agent: agent.report())
    assert not report.reachable and reason_of(report.error) == "refused"
    failure = results["node-01"]
    assert isinstance(failure, pools.NodeUnreachable) and failure.reason == "refused"


async def test_reconfigure_keeps_sessions_of_unchanged_nodes(
    sim_cluster: SimClusterFactory,
) -> None:
    sim = sim_cluster(3)
    data = sim.cluster_data()
    first = dict(data, nodes={k: v for k, v in data["nodes"].items() if k != "node-03"})
    second = dict(data, nodes={k: v for k, v in data["nodes"].items() if k != "node-02"})
    async with pools.Pool(Cluster.model_validate(first), sim.cluster_dir) as pool:
        healthy(await pool.fleet(), "node-01", "node-02")
        kept = pool.transport("node-01")
        await pool.reconfigure(Cluster.model_validate(second))
        assert pool.nodes == ["node-01", "node-03"]
        healthy(await pool.fleet(), "node-01", "node-03")
        assert pool.transport("node-01") is kept and kept.connects == 1
        # node-01 is reinstalled: refused under the old pins, fine once re-pinned.
        sim.nodes["node-01"].rotate_host_key()
        assert reasons(await pool.fleet()) == {"node-01": "host key", "node-03": None}
        sim.pin_host_keys()
        await pool.reconfigure(Cluster.model_validate(second))
        healthy(await pool.fleet(), "node-01", "node-03")
        assert pool.transport("node-01") is not kept
    assert [n.accepted_logins() for n in sim.nodes.values()] == [2, 1, 1]
