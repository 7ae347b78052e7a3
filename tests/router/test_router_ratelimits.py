"""Rate limits through real routers: the official ``openai`` client gets 429
``rate_limit_exceeded`` with ``Retry-After`` and OpenAI's ``x-ratelimit-*`` headers (both
stores), and the race: 500 concurrent requests over two routers on one PostgreSQL against
rpm 100 admit exactly as many as the limit allows.

The routers' rate-limit clock is pinned to the middle of a minute (``limits.clock``), so
no run straddles a window's boundary, whatever this machine's load."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from support import postgres
from support.stacks import CPU, Stack, StackFactory
from support.waits import until

from llmgw.router import Settings
from llmgw.spec.models import Cluster
from llmgw.store import keys

BODY = {"model": "chat", "messages": [{"role": "user", "content": "one two three"}],
        "max_tokens": 5}
MIDDLE = 29_700_000 * 60.0 + 30.0  # half a minute in


Clients = Callable[[Stack, str], openai.OpenAI]


@pytest.fixture
def clients() -> Iterator[Clients]:
    """openai clients on a stack, closed (their sockets with them) when the test ends."""
    made: list[openai.OpenAI] = []

    def make(stack: Stack, key: str) -> openai.OpenAI:
        made.append(openai.OpenAI(base_url=stack.url + "/v1", api_key=key, max_retries=0))
        return made[-1]

    yield make
    for client in made:
        client.close()


def limited(**research: Any) -> Cluster:
    return Cluster.model_validate({
        "cluster": {"name": "lab"},
        "models": {"chat": {"profiles": CPU, "scaling": {"min": 1},
                            "pricing": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}},
        "projects": {"research": research, "other": {}},
    })


def pin(stack: Stack) -> None:
    stack.router.limits.clock = lambda: MIDDLE


def rate_limited(stack: Stack) -> dict[tuple[str, str], float]:
    return {(s.labels["project"], s.labels["kind"]): s.value
            for metric in stack.registry.collect() if metric.name == "llmgw_rate_limited"
            for s in metric.samples if s.name.endswith("_total")}


def test_the_openai_client_gets_429_with_retry_after_and_the_headers(
        make_stack: StackFactory, clients: Clients) -> None:
    stack = make_stack(spec=limited(rpm=2))
    stack.route({"chat": stack.upstreams})
    pin(stack)
    client = clients(stack, stack.key())
    raw = client.chat.completions.with_raw_response.create(**BODY)  # type: ignore[call-overload]
    assert raw.parse().choices[0].message.content
    trio = [raw.headers[f"x-ratelimit-{h}-requests"] for h in ("limit", "remaining", "reset")]
    assert trio == ["2", "1", "30s"]
    assert "x-ratelimit-limit-tokens" not in raw.headers  # no tpm: no tokens trio
    client.chat.completions.create(**BODY)  # type: ignore[call-overload]
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(**BODY)  # type: ignore[call-overload]
    error = caught.value
    assert error.status_code == 429 and error.code == "rate_limit_exceeded"
    assert error.type == "requests"
    assert error.response.headers["Retry-After"] == "30"
    assert error.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert "Limit 2, Used 2" in error.message
    # Another project is not limited by research's minute; metrics count research's refusal.
    other = clients(stack, stack.key("other"))
    assert other.chat.completions.create(**BODY).choices  # type: ignore[call-overload]
    assert rate_limited(stack) == {("research", "requests"): 1.0}
    assert sum(len(u.received) for u in stack.upstreams) == 3


def test_a_keys_own_tpm_is_enforced_and_corrected_to_real_usage(
        make_stack: StackFactory, clients: Clients) -> None:
    stack = make_stack(spec=limited())
    stack.route({"chat": stack.upstreams})
    pin(stack)
    created = stack.run(keys.create(stack.db, "research", "ci", tpm=400))
    client = clients(stack, created.secret)
    # The estimate is the body's bytes plus max_tokens (about 105 tokens); the upstream's
    # usage is 3 + 5 = 8, so each answer gives back the rest and many fit in 400.
    for _ in range(8):
        raw = client.chat.completions.with_raw_response.create(**BODY)  # type: ignore[call-overload]
    assert raw.headers["x-ratelimit-limit-tokens"] == "400"
    assert "x-ratelimit-limit-requests" not in raw.headers
    with pytest.raises(openai.RateLimitError) as caught:  # 1000 output tokens cannot fit
        client.chat.completions.create(**{**BODY, "max_tokens": 1000})  # type: ignore[call-overload]
    assert (caught.value.code, caught.value.type) == ("rate_limit_exceeded", "tokens")
    assert rate_limited(stack) == {("research", "tokens"): 1.0}


@pytest.fixture
def pg_stacks(tmp_path: Path, postgres_db: postgres.Database) -> Iterator[StackFactory]:
    made: list[Stack] = []

    def make(spec: Cluster) -> Stack:
        stack = Stack(tmp_path, spec, Settings(), 1, postgres_db.settings)
        made.append(stack)
        return stack

    yield make
    for stack in made:
        stack.close()


async def test_the_race_500_requests_over_two_routers_on_postgresql(
        pg_stacks: StackFactory) -> None:
    limit, routers = 100, 2
    spec = limited(rpm=limit)
    stacks = [pg_stacks(spec) for _ in range(routers)]
    for stack in stacks:
        stack.route({"chat": stack.upstreams})
        pin(stack)
    headers = {"Authorization": f"Bearer {stacks[0].key()}"}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(headers=headers, connector=connector) as session:
        async def one(i: int) -> tuple[int, str | None]:
            url = stacks[i % routers].url + "/v1/chat/completions"
            async with session.post(url, json=BODY) as response:
                doc = await response.json()
                code = doc["error"]["code"] if response.status != 200 else None
                return response.status, code

        answers = await asyncio.gather(*(one(i) for i in range(500)))
    admitted = sum(1 for status, _ in answers if status == 200)
    refused = [a for a in answers if a[0] != 200]
    # The bound: at most one request per router beyond the limit, and no
    # under-admission...
    assert limit <= admitted <= limit + routers, admitted
    # ...and this implementation's own: the store admits all or nothing, so exactly.
    assert admitted == limit
    assert set(refused) == {(429, "rate_limit_exceeded")}
    assert sum(len(u.received) for s in stacks for u in s.upstreams) == admitted
    counted = sum(rate_limited(s).get(("research", "requests"), 0.0) for s in stacks)
    assert counted == 500 - limit


async def test_a_request_refused_for_its_rate_reserves_no_budget(
        make_stack: StackFactory, clients: Clients) -> None:
    stack = make_stack(spec=limited(rpm=1, budget_usd=1.0))
    stack.route({"chat": stack.upstreams})
    pin(stack)
    held = stack.upstreams[0].hold = asyncio.Event()  # the first request stays in flight
    stack.upstreams[1].hold = held
    client = clients(stack, stack.key())
    first = threading.Thread(target=client.chat.completions.create, kwargs=BODY)
    first.start()
    await until(lambda: len(stack.run(stack.db.list_reservations())) == 1, 30)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(**BODY)  # type: ignore[call-overload]
    assert len(stack.run(stack.db.list_reservations())) == 1  # the first one's only
    stack.loop.call_soon_threadsafe(held.set)
    first.join(30)
    rows = stack.rows()
    assert sorted(r.status for r in rows) == [200, 429]
    assert stack.run(stack.db.list_reservations()) == []
    spent = stack.run(stack.db.spend_by_project())["research"]
    assert spent == pytest.approx(sum(r.cost_usd for r in rows if r.status == 200))
