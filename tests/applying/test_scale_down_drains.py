"""A scale-down destroy (``Change.drain``) drains on a real router before its units stop.

A real router sends a request to the replica being scaled down, whose upstream
holds it. The execution takes the replica out of the routes, waits for that
request, and only then asks the agent to remove the unit: the client gets its
answer, and no new request reaches the replica meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import openai
import pytest
from support.stacks import Stack, cluster

from llmgw.applying import executions
from llmgw.daemon.canaries import RouterTraffic
from llmgw.planning.types import Change, ObservedShard, Plan
from llmgw.router import Endpoint, Settings
from llmgw.transport.agent_client import UnitChange, UnitResult


class Agent:
    """The agent side of a remove: what it was asked, and what was in flight then."""

    def __init__(self, in_flight: Callable[[], int]) -> None:
        self.in_flight = in_flight
        self.removed: list[tuple[str, int]] = []  # (unit, requests in flight at the call)

    async def apply_units(self, units: Sequence[UnitChange]) -> list[UnitResult]:
        for unit in units:
            self.removed.append((unit.name, self.in_flight()))
        return [UnitResult(unit.name, True, True) for unit in units]


class Agents:
    max_parallel = 4
    call_timeout = 10.0

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def call(self, node: str, fn: Callable[[Any], Awaitable[Any]], *,
                   timeout: float | None = None) -> Any:
        return await fn(self.agent)

    async def client(self, node: str) -> Any:
        return self.agent


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, cluster(), Settings(), 2)
    yield s
    s.close()


@pytest.mark.parametrize("drain", [True, False], ids=["drained", "not-drained"])
def test_a_scale_down_waits_for_the_request_in_flight_before_the_remove(
    stack: Stack, drain: bool,
) -> None:
    gone, kept = stack.upstreams
    gone.hold = stack.run(_event())
    table = {"chat": [Endpoint(gone.url, "local", 0), Endpoint(kept.url, "local", 1)]}

    async def republish() -> None:
        stack.router.update_routes(traffic.adjust(table))

    traffic = RouterTraffic(lambda: cluster(), republish, stack.router, None, None,
                            drain_timeout=30)
    stack.call(stack.router.update_routes, table)
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key=stack.key(), max_retries=0)
    pool = concurrent.futures.ThreadPoolExecutor(2)
    asked = [pool.submit(client.chat.completions.create, model="chat",
                         messages=[{"role": "user", "content": "hi"}]) for _ in range(2)]
    _until(lambda: len(gone.received) == 1 and asked[0].done() + asked[1].done() == 1,
           lambda: f"{gone.received} {kept.received} {[a.done() and a.exception() for a in asked]}")

    def in_flight() -> int:
        return int(stack.router.tallies().get(gone.url, {}).get("inflight", 0))

    agent = Agent(in_flight)
    shard = ObservedShard("local", "llmgw-chat-r0-s0.service", 0, "d", "ready", gone.port)
    change = Change("destroy", "chat", 0, ("scale chat 2 → 1",), removes=(shard,), drain=drain)
    plan = Plan(cluster="t", now=0.0, revision=None, changes=(change,))
    run = asyncio.run_coroutine_threadsafe(executions.execute(
        plan, Agents(agent), gating=executions.Gating({}, {}, traffic)), stack.loop)
    if drain:
        # Out of the routes first; the remove waits for the request the replica holds.
        _until(lambda: [e.base_url for e in stack.call(stack.router.routes.endpoints, "chat")]
               == [kept.url])
        assert agent.removed == []
    else:
        _until(lambda: bool(agent.removed))
    stack.call(gone.hold.set)
    outcome = run.result(30)
    answers = [a.result(30) for a in asked]
    pool.shutdown()
    assert outcome.ok and len(answers) == 2
    assert agent.removed == [("llmgw-chat-r0-s0.service", 0 if drain else 1)]


async def _event() -> asyncio.Event:
    return asyncio.Event()


def _until(condition: Callable[[], bool], said: Callable[[], str] = lambda: "",
           timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"the condition never held: {said()}"
        time.sleep(0.02)
