"""Pushed observations over real gRPC: the agent's stream and the pool's view of it.

Real agents (the fleet simulator's: fixture hardware, stand-in engines) on their own
unix sockets; the pool streams each node's pushes and keeps its view. The view must
be what a Report says, a stream starts (and so restarts) with a full report, and a
streaming node is not asked for reports.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_support import unit_name, unit_text

from llmgw.fleet.types import NodeReport
from llmgw.onboarding import fleetsims
from llmgw.proto.conversions import UnitChange
from llmgw.spec import loading
from llmgw.transport import pools

BOUND = 30.0


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[fleetsims.SimulatedFleet, pools.Pool, list[str]]]:
    root = Path(tempfile.mkdtemp(prefix="llmgw-push-", dir="/tmp"))
    sim = fleetsims.SimulatedFleet(root, 2, load_delay=0.2)
    await sim.start()
    directory = sim.write_cluster({})
    pool = pools.Pool(loading.load(directory), directory, simulated=sim.sockets, push=True)
    reasons: list[str] = []
    pool.push(lambda node, why: reasons.append(why))
    try:
        yield sim, pool, reasons
    finally:
        await pool.aclose()
        await sim.aclose()
        shutil.rmtree(root, ignore_errors=True)


async def until(check, what: str):  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + BOUND
    while not (result := await check() if asyncio.iscoroutinefunction(check) else check()):
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
    return result


def without_loads(report: NodeReport) -> list[object]:
    return [u.model_copy(update={"load": None}) for u in report.units]


async def test_the_view_follows_the_agent_as_its_reports_do(fleet) -> None:  # type: ignore[no-untyped-def]
    sim, pool, reasons = fleet
    node = sorted(sim.nodes)[0]
    await until(lambda: pool.streaming == set(sim.nodes), "both nodes streaming")
    polled = pool.polled
    change = UnitChange(unit_name("m1"), unit_text("m1", port=18001))
    results = await pool.call(node, lambda agent: agent.apply_units([change]))
    assert results[0].ok, results[0].error

    async def ready() -> bool:
        units = (await pool.fleet()).nodes[node].units
        return bool(units) and units[0].state == "ready"

    await until(ready, "the unit ready in the pushed view")
    assert pool.polled == polled  # read from the pushes: no node was asked
    view = (await pool.fleet()).nodes[node]
    asked = await pool.report(node)
    assert without_loads(view) == without_loads(asked)
    assert view.fetches == asked.fetches

    # Removed on the node: gone from the view, as from a report.
    await pool.call(node, lambda agent: agent.apply_units(
        [UnitChange(change.name, "", action="remove")]))
    await until(lambda: not pool._view[node].units, "the unit gone from the view")
    assert (await pool.report(node)).units == []


async def test_a_stream_begins_and_begins_again_with_a_full_report(fleet) -> None:  # type: ignore[no-untyped-def]
    sim, pool, reasons = fleet
    node = sorted(sim.nodes)[1]
    agent = await pool.client(node)
    pushes = agent.observe(pools.declared_for(pool.cluster, node))
    first = await anext(pushes)
    assert first.full and first.report is not None and first.report.gpus  # fixture hardware
    await pool.call(node, lambda a: a.apply_units(
        [UnitChange(unit_name("m2"), unit_text("m2", port=18002))]))
    second = await anext(pushes)
    assert not second.full and [u.name for u in second.units] == [unit_name("m2")]
    await pushes.aclose()

    await until(lambda: node in pool.streaming, "the node streaming")
    await sim.lose([node])
    await until(lambda: node not in pool.streaming, "the stream lost")
    assert f"{node}: its stream was lost" in reasons
    assert not (await pool.fleet()).nodes[node].reachable  # asked, since not streaming
    await sim.restore([node])
    await until(lambda: node in pool.streaming, "the stream reopened")
    assert reasons.count(f"{node}: reporting") == 2  # a full report at start and reconnect
    assert [u.name for u in pool._view[node].units] == [unit_name("m2")]
