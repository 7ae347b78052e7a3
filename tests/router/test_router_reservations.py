"""Reservations that cannot strand: capped by the model's context and the project's
per-request cap, recorded as the stream goes, freed when their router stops beating."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from support.stacks import CPU, Stack, StackFactory, cluster

from llmgw.router import accounts, catalogs
from llmgw.spec.models import Cluster, Model
from llmgw.store.reservations import RELEASED_STATUS, Owner, Progress

OUTPUT = 2.0 / 1e6  # support.stacks prices `chat` output at $2 per Mtok
BILLION = 1_000_000_000


async def _until(condition: Callable[[], Awaitable[bool]], timeout: float = 30) -> None:
    async with asyncio.timeout(timeout):
        while not await condition():
            await asyncio.sleep(0.02)


# -- the caps, as data ----------------------------------------------------------------------

@pytest.mark.parametrize("payload, context, expected", [
    pytest.param({"max_tokens": BILLION}, 8192, (100, 8192), id="a billion: one context"),
    pytest.param({"max_tokens": BILLION}, None,
                 (100, accounts.DEFAULT_CONTEXT_TOKENS), id="context unknown: the default"),
    pytest.param({"max_tokens": 7}, 8192, (100, 7), id="under the context: as asked"),
    pytest.param({"max_tokens": 10, "n": BILLION}, 8192, (100, 10 * accounts.MAX_CHOICES),
                 id="n: at most 128 choices"),
])
def test_estimate_is_capped_by_the_context(payload: dict[str, Any], context: int | None,
                                           expected: tuple[int, int]) -> None:
    assert accounts.estimate(100, payload, False, context) == expected


def test_a_prompt_is_capped_by_the_context() -> None:
    assert accounts.estimate(10**7, {"max_tokens": 1}, False, 4096) == (4096, 1)
    assert accounts.estimate(10**7, {}, True, 4096) == (4096, 0)


@pytest.mark.parametrize("profiles, expected", [
    pytest.param([{"engine": "vllm", "gpu_class": "any", "args": {"max-model-len": 8192}}],
                 8192, id="vLLM max-model-len"),
    pytest.param([{**CPU[0], "args": {"ctx-size": 2048}}], 2048, id="llama.cpp ctx-size"),
    pytest.param([{**CPU[0], "args": {"c": "4096"}}], 4096, id="llama.cpp -c"),
    pytest.param([{"engine": "sglang", "gpu_class": "any", "args": {"context-length": 32768}},
                  {**CPU[0], "args": {"ctx-size": 2048}}], 32768, id="the longest profile"),
    pytest.param(CPU, None, id="not stated"),
])
def test_context_length_from_the_profiles(profiles: list[dict[str, Any]],
                                          expected: int | None) -> None:
    assert catalogs.context_tokens(Model.model_validate({"profiles": profiles})) == expected


def capped(cap: float | None, budget: float = 3.0) -> Cluster:
    spec = cluster(research=budget).model_dump(exclude_unset=True)
    spec["projects"]["research"]["max_request_usd"] = cap
    return Cluster.model_validate(spec)


@pytest.mark.parametrize("cap", [0, -1, "lots", 2e6])
def test_max_request_usd_is_validated(cap: object) -> None:
    with pytest.raises(ValueError, match="max_request_usd"):
        capped(cap)  # type: ignore[arg-type]


# -- through the router ---------------------------------------------------------------------

async def post(stack: Stack, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(stack.url + "/v1/chat/completions", json=body) as response:
            return response.status, await response.json()


BODY = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


async def test_a_billion_max_tokens_does_not_lock_out_the_project(
        make_stack: StackFactory) -> None:
    """The attack: one request with max_tokens 1e9 reserved $1,000,000 (here $2,000 at
    $2/Mtok) and every other key of its $3 project got 429 while it ran."""
    stack = make_stack(spec=cluster(research=3.0))
    stack.route({"chat": stack.upstreams})
    hold = asyncio.Event()
    stack.upstreams[0].hold = hold
    stack.route({"chat": [stack.upstreams[0]]})
    greedy = asyncio.ensure_future(post(stack, stack.key(), {**BODY, "max_tokens": BILLION}))
    await _until(lambda: _received(stack))
    (held,) = stack.run(stack.db.list_reservations())
    assert held.amount <= accounts.DEFAULT_CONTEXT_TOKENS * 2 * OUTPUT + 0.01
    stack.upstreams[0].hold = None
    stack.route({"chat": [stack.upstreams[1]]})
    status, _ = await post(stack, stack.key(), {**BODY, "max_tokens": 5})
    assert status == 200  # another key of the project still gets in
    hold.set()
    assert (await greedy)[0] == 200


async def _received(stack: Stack) -> bool:
    return bool(stack.upstreams[0].received)


@pytest.mark.parametrize("max_tokens, status", [(5, 200), (BILLION, 400), (100_000, 400)])
async def test_max_request_usd_refuses_a_request_that_may_cost_more(
        make_stack: StackFactory, max_tokens: int, status: int) -> None:
    stack = make_stack(spec=capped(0.01))  # $0.01 at $2/Mtok: 5,000 output tokens
    stack.route({"chat": stack.upstreams})
    got, answer = await post(stack, stack.key(), {**BODY, "max_tokens": max_tokens})
    assert got == status
    if status == 400:
        assert answer["error"]["code"] == "request_over_cap"
        assert "max_request_usd $0.01" in answer["error"]["message"]
        assert not [r for u in stack.upstreams for r in u.received]


async def test_n_over_128_is_refused(stack: Stack) -> None:
    got, answer = await post(stack, stack.key(), {**BODY, "max_tokens": 1, "n": 129})
    assert got == 400 and answer["error"]["param"] == "n"


async def test_a_stream_records_what_it_produced_as_it_goes(make_stack: StackFactory) -> None:
    stack = make_stack(spec=cluster(research=3.0), heartbeat_interval=0.05)
    upstream = stack.upstreams[0]
    upstream.chunk_delays = [0.0, 0.0, 0.0, 60.0, 0.0]
    stack.route({"chat": [upstream]})
    client = asyncio.ensure_future(post(stack, stack.key(),
                                        {**BODY, "max_tokens": 50, "stream": True}))

    async def recorded() -> bool:
        found = stack.run(stack.db.list_reservations())
        return bool(found) and found[0].used > 0 and found[0].router_alive

    await _until(recorded)
    (held,) = stack.run(stack.db.list_reservations())
    assert held.router == stack.router.accounts.router_id and held.model == "chat"
    client.cancel()


async def test_a_running_router_releases_a_dead_routers_reservations(
        make_stack: StackFactory) -> None:
    stack = make_stack(spec=cluster(research=3.0), heartbeat_interval=0.05)
    stack.route({"chat": stack.upstreams})
    owner = Owner("dead-router", None, "chat", "/v1/chat/completions", stream=True)
    stack.run(stack.db.beat("dead-router", 0.2))
    held = stack.run(stack.db.reserve("research", 3.0, 3.18, 86400, owner))
    assert held.id is not None
    stack.run(stack.db.beat("dead-router", 0.2, [Progress(held.id, 5, 30, 0.02)]))
    key = stack.key()
    assert (await post(stack, key, {**BODY, "max_tokens": 5}))[0] == 429
    # dead-router beats no more: the stack's router (beating every 0.05 s) frees it.
    await _until(lambda: _no_reservations(stack))
    assert (await post(stack, key, {**BODY, "max_tokens": 5}))[0] == 200
    released = [r for r in stack.rows() if r.status == RELEASED_STATUS]
    assert [(r.completion_tokens, r.cost_usd) for r in released] == [(30, 0.02)]


async def _no_reservations(stack: Stack) -> bool:
    return not stack.run(stack.db.list_reservations())

