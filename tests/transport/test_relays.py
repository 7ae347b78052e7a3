"""A relay between the daemon and many agents: real gRPC servers on unix sockets.

The nodes are the fleet simulator's (real agents, fixture hardware); its process serves
a relay for them (``SimulatedFleet(relay=True)``). What is checked: a call through the
relay is the agent's own answer; a node the relay does not serve, or cannot reach, is
refused and classified as a direct call would be; the merged push stream tells each node
apart, says when one is lost and starts it again with a full report; and the pool holds
one connection for all of them.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from llmgw.onboarding import fleetsims
from llmgw.proto import agent_pb2 as pb
from llmgw.proto import agent_pb2_grpc
from llmgw.spec import loading
from llmgw.transport import pools, relays
from llmgw.transport.agent_client import declaration_to_message
from llmgw.transport.failures import reason_of
from llmgw.transport.relays import RelayedTransport

NODES = 6
BOUND = 30.0  # a bound on every wait, not a measurement


@pytest.fixture
async def fleet() -> AsyncIterator[fleetsims.SimulatedFleet]:
    root = Path(tempfile.mkdtemp(prefix="llmgw-rl-", dir="/tmp"))  # short socket paths
    sim = fleetsims.SimulatedFleet(root, NODES, load_delay=0.1, relay=True)
    try:
        await sim.start()
        sim.write_cluster(fleetsims.models(2))
        yield sim
    finally:
        await sim.aclose()
        shutil.rmtree(root, ignore_errors=True)


def relayed_pool(sim: fleetsims.SimulatedFleet) -> pools.Pool:
    cluster = loading.load(sim.cluster_dir)
    return pools.Pool(cluster, sim.cluster_dir, simulated=sim.sockets, push=True,
                      relays=relays.advertised(sim.sockets))


async def until(check: object, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + BOUND
    while not check():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_the_simulator_advertises_its_relay_and_every_node_behind_it(
        fleet: fleetsims.SimulatedFleet) -> None:
    assert relays.advertised(fleet.sockets) == {str(fleet.relay_socket): sorted(fleet.nodes)}
    assert relays.advertised(fleet.sockets / "nowhere") == {}


async def test_a_report_through_the_relay_is_the_agents_own(
        fleet: fleetsims.SimulatedFleet) -> None:
    cluster = loading.load(fleet.cluster_dir)
    async with relayed_pool(fleet) as through, \
            pools.Pool(cluster, fleet.cluster_dir, simulated=fleet.sockets) as direct:
        for node in ("sim-0001", "sim-0002", "sim-0003"):  # h100-ib, l40s, cpu-only
            assert isinstance(through.transport(node), RelayedTransport)
            got, own = await through.report(node), await direct.report(node)
            assert got.reachable and got.node == node
            assert got.gpus == own.gpus and got.fabrics == own.fabrics
            assert got.hostname == own.hostname
        # Every node's calls went over one connection to the relay.
        assert {through.transport(n).connects for n in through.nodes} == {1}


async def test_a_node_the_relay_does_not_serve_is_not_found_and_not_echoed(
        fleet: fleetsims.SimulatedFleet) -> None:
    hostile = "../sockets/sim-0001"  # a path, not a name: never joined onto one
    async with grpc.aio.insecure_channel(f"unix:{fleet.relay_socket}") as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        for metadata in (((relays.NODE_KEY, hostile),), ()):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await stub.Report(pb.ReportRequest(), metadata=metadata, timeout=BOUND)
            assert raised.value.code() == grpc.StatusCode.NOT_FOUND
            assert "sim-0001" not in (raised.value.details() or "")


async def test_a_node_the_relay_cannot_reach_is_classified_by_the_relay(
        fleet: fleetsims.SimulatedFleet) -> None:
    async with relayed_pool(fleet) as pool:
        await fleet.lose(["sim-0004"])
        report = await pool.report("sim-0004")
        assert not report.reachable
        assert reason_of(report.error) == "agent not running"
        assert "sim-0004.sock" in (report.error or "")  # the relay's view of the node
        assert (await pool.report("sim-0005")).reachable  # the others are not held up


async def test_a_relay_that_is_gone_makes_its_nodes_unreachable(
        fleet: fleetsims.SimulatedFleet) -> None:
    async with relayed_pool(fleet) as pool:
        assert (await pool.report("sim-0001")).reachable
        assert fleet._relay is not None
        await fleet._relay[0].stop(None)  # the relay's process went away
        fleet.relay_socket.unlink(missing_ok=True)
        report = await pool.report("sim-0001")
        assert not report.reachable and reason_of(report.error) == "unreachable"
        assert "relay" in (report.error or "")


async def test_the_merged_stream_tells_nodes_apart_and_restarts_a_lost_one(
        fleet: fleetsims.SimulatedFleet) -> None:
    cluster = loading.load(fleet.cluster_dir)
    watches = [pb.WatchRequest(push=True, declared=declaration_to_message(
        pools.declared_for(cluster, n))) for n in ("sim-0001", "sim-0002")]
    watches.append(pb.WatchRequest(push=True, declared=pb.ReportRequest(node="unknown")))
    async with grpc.aio.insecure_channel(f"unix:{fleet.relay_socket}") as channel:
        call = agent_pb2_grpc.RelayStub(channel).Observe(pb.RelayObserveRequest(nodes=watches))
        first: dict[str, pb.UnitEvent] = {}
        async with asyncio.timeout(BOUND):
            while len(first) < 2:
                event = await call.read()
                assert event.node in ("sim-0001", "sim-0002")  # the unknown one is left out
                first.setdefault(event.node, pb.UnitEvent.FromString(event.event))
            assert all(e.HasField("report") and e.report.node == n for n, e in first.items())
            await fleet.lose(["sim-0002"])
            while True:
                event = await call.read()
                if event.lost:
                    break
            assert event.node == "sim-0002" and reason_of(event.lost) == "agent not running"
            await fleet.restore(["sim-0002"])
            while True:  # reopened: a full report again, for that node
                event = await call.read()
                if event.node == "sim-0002" and not event.lost:
                    again = pb.UnitEvent.FromString(event.event)
                    break
            assert again.HasField("report") and again.report.node == "sim-0002"
        call.cancel()


async def test_the_pool_streams_every_node_through_one_relay_stream(
        fleet: fleetsims.SimulatedFleet) -> None:
    changes: list[str] = []
    async with relayed_pool(fleet) as pool:
        pool.push(lambda node, why: changes.append(why))
        await until(lambda: pool.streaming == set(fleet.nodes), "every node streaming")
        polled = pool.polled
        fleet_now = await pool.fleet()
        assert pool.polled == polled  # read from the pushes: no node asked
        assert all(r.reachable for r in fleet_now.nodes.values())
        await fleet.lose(["sim-0003"])
        await until(lambda: "sim-0003" not in pool.streaming, "the lost node dropped")
        assert "sim-0003: its stream was lost" in changes
        assert not (await pool.fleet(["sim-0003"])).nodes["sim-0003"].reachable
        await fleet.restore(["sim-0003"])
        await until(lambda: pool.streaming == set(fleet.nodes), "the node streaming again")
        assert {pool.transport(n).connects for n in pool.nodes} == {1}
