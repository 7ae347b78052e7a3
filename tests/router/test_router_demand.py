"""On-demand models: wait, record demand, then 503 "model is loading"; unknown is 404."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from support.stacks import Stack, StackFactory

from llmgw.fleet.types import Demand

CODER = {"model": "Coder-7B", "messages": [{"role": "user", "content": "hi"}]}


async def post(stack: Stack, key: str, body: dict[str, object]) -> tuple[int, dict, dict]:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        async with session.post(stack.url + "/v1/chat/completions", json=body) as response:
            return response.status, dict(response.headers), await response.json()


async def test_request_waits_for_the_model_to_load(make_stack: StackFactory) -> None:
    stack = make_stack(wait_timeout=20)
    key = stack.key()
    before = time.time()
    task = asyncio.create_task(post(stack, key, CODER))
    # The router records the waiting request, under the model's key (not its served name).
    for _ in range(500):
        demand: Demand = stack.call(stack.router.demand)
        if demand.waiting:
            break
        await asyncio.sleep(0.01)
    assert demand.waiting == {"coder": 1} and demand.wanted == {"coder": 1}
    assert demand.last_used["coder"] >= before
    assert not task.done()
    stack.route({"coder": [stack.upstreams[0]]})  # the daemon saw a replica become ready
    status, _, answer = await task
    assert status == 200 and answer["choices"][0]["message"]["content"]
    assert stack.call(stack.router.demand).waiting == {}


@pytest.mark.parametrize("model, message", [
    ("Coder-7B", "model is loading"),  # min: 0, started on demand
    ("steady", "has no ready replica"),  # min: 1, none ready (starting or failed)
])
async def test_no_replica_in_time_is_503_with_retry_after(
    make_stack: StackFactory, model: str, message: str
) -> None:
    stack = make_stack(wait_timeout=0.2, retry_after=7)
    status, headers, answer = await post(stack, stack.key(), {**CODER, "model": model})
    assert status == 503 and headers["Retry-After"] == "7"
    assert message in answer["error"]["message"]
    # Only a model that starts on demand is "loading"; one at min >= 1 is down, not loading.
    assert ("model is loading" in answer["error"]["message"]) == (model == "Coder-7B")
    assert answer["error"]["code"] == "model_loading"
    assert stack.call(stack.router.demand).waiting == {}


async def test_unknown_model_is_404_never_loading(stack: Stack) -> None:
    status, headers, answer = await post(stack, stack.key(), {**CODER, "model": "gpt-17"})
    assert status == 404 and "Retry-After" not in headers
    assert answer["error"]["message"].startswith("model not found")
    assert answer["error"]["code"] == "model_not_found"
    assert "gpt-17" not in stack.call(stack.router.demand).last_used


async def test_every_request_refreshes_last_use(stack: Stack) -> None:
    key = stack.key()
    await post(stack, key, {**CODER, "model": "chat"})
    first = stack.call(stack.router.demand).last_used["chat"]
    await asyncio.sleep(0.01)
    await post(stack, key, {**CODER, "model": "chat"})
    assert stack.call(stack.router.demand).last_used["chat"] > first


async def test_models_lists_ready_and_on_demand(make_stack: StackFactory) -> None:
    stack = make_stack()
    key = stack.key()
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        async def listed() -> list[str]:
            async with session.get(stack.url + "/v1/models") as response:
                return [m["id"] for m in (await response.json())["data"]]
        assert await listed() == ["Coder-7B"]  # on demand: listed though nothing runs
        stack.route({"steady": [stack.upstreams[0]], "coder": [stack.upstreams[1]]})
        assert await listed() == ["Coder-7B", "steady"]  # once, by its served name
        stack.route({})
        assert await listed() == ["Coder-7B"]


def test_last_use_and_watching_survive_a_restart(make_stack: StackFactory) -> None:
    first = make_stack()
    first.route({"chat": first.upstreams})
    key = first.key()
    before = time.time()
    asyncio.run(post(first, key, {**CODER, "model": "chat"}))
    first.rows()  # flushed
    used = first.call(first.router.demand).last_used["chat"]
    assert used >= before
    second = make_stack()  # same store, a restarted router
    demand = second.call(second.router.demand)
    # The row's time: when the answer ended, a moment after the request arrived.
    assert used <= demand.last_used["chat"] <= time.time()
    assert demand.watched_since is not None and demand.watched_since >= demand.last_used["chat"]
