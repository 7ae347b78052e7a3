"""The fleet simulator at a few hundred nodes, through the real daemon loop.

Every node is the real agent (fixture hardware, its own gRPC server on its own unix
socket, stand-in engines that load for a moment); the daemon reaches them through the
simulated transport with pushed observations (:mod:`llmgw.onboarding.fleetsims`). What
is checked is behaviour, never time: the fleet converges, an edit replaces only what it
touched, lost nodes are unknown (their replicas neither placed twice nor forgotten) and
come back by their streams' full reports, and in steady state the daemon asks no node for
a report. It runs twice: each node reached on its own socket, and every node through the
simulator's relay (one connection and one merged stream for all of them).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from llmgw.daemon.reconcilers import Daemon
from llmgw.onboarding import fleetsims
from llmgw.spec import loading
from llmgw.transport import pools, relays
from llmgw.transport.relays import RelayedTransport

pytestmark = pytest.mark.fleetsim

NODES = 300
MODELS = 30
REPLICAS = 2
LOAD_DELAY = 0.5
BOUND = 90.0  # a bound on every wait below, not a measurement


class Loop:
    def __init__(self, sim: fleetsims.SimulatedFleet, daemon: Daemon, pool: pools.Pool) -> None:
        self.sim, self.daemon, self.pool = sim, daemon, pool

    def units(self) -> list[tuple[str, Any]]:
        fleet = self.daemon.state.fleet
        if fleet is None:
            return []
        return [(name, u) for name, r in fleet.nodes.items() for u in r.units]

    def ready(self, model: str | None = None) -> dict[tuple[str, int], str]:
        """(model, replica) → digest of every ready replica, as the daemon sees it."""
        return {(u.model, u.replica): u.digest for _, u in self.units()
                if u.state == "ready" and (model is None or u.model == model)}

    def unreachable(self) -> set[str]:
        fleet = self.daemon.state.fleet
        return {n for n, r in fleet.nodes.items() if not r.reachable} if fleet else set()

    async def until(self, check: Callable[[], Any], what: str) -> Any:
        deadline = asyncio.get_running_loop().time() + BOUND
        while not (result := check()):
            if asyncio.get_running_loop().time() > deadline:
                plan, fleet = self.daemon.state.plan, self.daemon.state.fleet
                errors = sorted(f"{n}: {r.error}" for n, r in fleet.nodes.items()
                                if not r.reachable)[:3] if fleet else []
                raise AssertionError(f"timed out waiting for {what}; plan "
                                     f"{plan.summary() if plan else None}; unreachable "
                                     f"{errors}; streaming {len(self.pool.streaming)}")
            await asyncio.sleep(0.2)
        return result

    async def rounds(self, count: int) -> None:
        """Let ``count`` more iterations of the loop run."""
        target = self.daemon.state.iterations + count
        await self.until(lambda: self.daemon.state.iterations >= target, f"{count} rounds")


@pytest.fixture(params=["direct", "relayed"])
async def simulated(request: pytest.FixtureRequest) -> AsyncIterator[Loop]:
    root = Path(tempfile.mkdtemp(prefix="llmgw-fs-", dir="/tmp"))  # short socket paths
    relayed = request.param == "relayed"
    sim = fleetsims.SimulatedFleet(root, NODES, load_delay=LOAD_DELAY, relay=relayed)
    stop = asyncio.Event()
    task = None
    try:
        await sim.start()
        directory = sim.write_cluster(fleetsims.models(MODELS, REPLICAS), drift_interval="1s")
        cluster = loading.load(directory)
        pool = pools.Pool(cluster, directory, simulated=sim.sockets, push=True,
                          relays=relays.advertised(sim.sockets) if relayed else None)
        daemon = Daemon(directory, cluster, agents=pool, ready_timeout=BOUND)
        task = asyncio.create_task(daemon.run(stop))
        yield Loop(sim, daemon, pool)
    finally:
        stop.set()
        if task is not None:
            await asyncio.wait_for(task, 60)
        await sim.aclose()
        shutil.rmtree(root, ignore_errors=True)


async def test_a_simulated_fleet_converges_follows_an_edit_and_survives_lost_nodes(
        simulated: Loop) -> None:
    loop = simulated
    wanted = MODELS * REPLICAS
    await loop.until(lambda: len(loop.ready()) == wanted, f"{wanted} replicas ready")

    # Steady state: the loop goes on (drift timer) and asks no node for a report.
    polled = loop.pool.polled
    await loop.rounds(3)
    assert loop.pool.polled == polled
    assert loop.daemon.state.plan is not None and not loop.daemon.state.plan.has_changes

    # An edit touching one model: its replicas are replaced, nothing else moves.
    before = loop.ready()
    edited = "m00003"
    fleetsims.write_models(loop.sim.cluster_dir, fleetsims.models(MODELS, REPLICAS,
                                                                  edited=[edited]))

    def replaced() -> bool:
        now = loop.ready(edited)
        old = {d for (m, _), d in before.items() if m == edited}
        return len(now) == REPLICAS and not set(now.values()) & old and \
            len(loop.ready()) == wanted

    await loop.until(replaced, f"{edited} replaced and ready")
    after = loop.ready()
    assert {k: d for k, d in after.items() if k[0] != edited} == \
        {k: d for k, d in before.items() if k[0] != edited}

    # 30 nodes lost at once, among them nodes with replicas: unknown, never placed twice.
    hosting = sorted({n for n, u in loop.units() if u.state == "ready"})
    lost = hosting[:10]
    lost += sorted(set(loop.sim.nodes) - set(hosting))[:30 - len(lost)]
    await loop.sim.lose(lost)
    await loop.until(lambda: loop.unreachable() == set(lost), "the lost nodes unreachable")
    await loop.rounds(2)
    served = {(u.model, u.replica) for _, u in loop.units()}
    assert len(served) == wanted  # each replica once: the lost ones remembered, not re-made
    assert sum(1 for _, u in loop.units()) == wanted

    # Back: each stream reopens with a full report, and the fleet is whole again.
    await loop.sim.restore(lost)
    await loop.until(lambda: not loop.unreachable() and len(loop.ready()) == wanted,
                     "the lost nodes back, every replica ready")
    assert loop.ready() == after
    transports = [loop.pool.transport(n) for n in loop.pool.nodes]
    if loop.sim.relay:  # every node through one connection, held all along
        assert all(isinstance(t, RelayedTransport) for t in transports)
        assert {t.connects for t in transports} == {1}
    else:
        assert not any(isinstance(t, RelayedTransport) for t in transports)
