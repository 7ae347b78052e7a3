"""Budgets hold: reservations under concurrency, streams charged, no way around usage."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import aiohttp
import openai
import pytest
from support.stacks import Stack, StackFactory, cluster

from llmgw.router import accounts, connections

INPUT, OUTPUT = 1.0 / 1e6, 2.0 / 1e6  # support.stacks prices `chat` at $1 and $2 per Mtok
BODY = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


async def _until(condition: Callable[[], bool], timeout: float = 30) -> None:
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")


def reservation_of(data: bytes, output_tokens: int) -> float:
    """What the router must reserve: body bytes as prompt tokens, plus the output limit."""
    return len(data) * INPUT + output_tokens * OUTPUT


# -- the estimate, as data ------------------------------------------------------------------

@pytest.mark.parametrize("payload, expected", [
    pytest.param({"max_tokens": 7}, (100, 7), id="max_tokens"),
    pytest.param({"max_completion_tokens": 9, "max_tokens": 7}, (100, 9), id="newer name first"),
    pytest.param({"max_output_tokens": 11}, (100, 11), id="responses"),
    pytest.param({"max_tokens": 7, "n": 3}, (100, 21), id="n choices"),
    pytest.param({}, (100, accounts.DEFAULT_OUTPUT_TOKENS), id="no limit: the default"),
    pytest.param({"max_tokens": "7", "n": True}, (100, accounts.DEFAULT_OUTPUT_TOKENS),
                 id="not integers: the default"),
])
def test_estimate(payload: dict[str, object], expected: tuple[int, int]) -> None:
    assert accounts.estimate(100, payload, False) == expected


def test_estimate_of_embeddings_has_no_output() -> None:
    assert accounts.estimate(100, {"max_tokens": 7}, True) == (100, 0)


@pytest.mark.parametrize("body_bytes, relayed, expected", [
    (0, 0, (0, 0)), (1, 0, (1, 0)), (8, 3, (2, 3)), (9, 3, (3, 3)),
])
def test_what_was_served(body_bytes: int, relayed: int, expected: tuple[int, int]) -> None:
    assert accounts.unreported(body_bytes, relayed) == expected


# -- through the router ---------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("stream", "true"), ("stream", 1), ("stream", "yes"), ("stream", {}),
    ("stream_options", "include_usage"), ("stream_options", [True]),
])
async def test_only_json_booleans_stream(stack: Stack, field: str, value: object) -> None:
    key = stack.key()
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        async with session.post(stack.url + "/v1/chat/completions",
                                json={**BODY, field: value}) as response:
            assert response.status == 400
            error = (await response.json())["error"]
    assert error["param"] == field and error["code"] == "invalid_type"
    assert error["type"] == "invalid_request_error"
    assert not [r for u in stack.upstreams for r in u.received]


async def test_a_client_hanging_up_mid_stream_pays_for_what_it_got(
    make_stack: StackFactory,
) -> None:
    stack = make_stack(spec=cluster(research=1.0))
    stack.route({"chat": [stack.upstreams[0]]})
    upstream = stack.upstreams[0]
    upstream.chunk_delays = [0.0, 0.0, 30.0, 0.0]
    data = json.dumps({**BODY, "stream": True}).encode()
    headers = {"Authorization": f"Bearer {stack.key()}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(headers=headers) as session:
        response = await session.post(stack.url + "/v1/chat/completions", data=data)
        await response.content.readuntil(b"\n\n")
        await response.content.readuntil(b"\n\n")
        response.close()  # two tokens in, before the engine's usage chunk
    await _until(lambda: upstream.cancelled == 1)
    await _until(lambda: bool(stack.rows()))
    (row,) = stack.rows()
    assert row.status == 499
    assert row.completion_tokens == 2 and row.prompt_tokens == -(-len(data) // 4)
    assert row.cost_usd == pytest.approx(row.prompt_tokens * INPUT + 2 * OUTPUT)
    assert stack.router.accounts.spent["research"] == pytest.approx(row.cost_usd)


async def test_an_answer_without_usage_is_charged_its_reservation(
    make_stack: StackFactory,
) -> None:
    stack = make_stack(spec=cluster(research=1.0))
    stack.route({"chat": stack.upstreams})
    for upstream in stack.upstreams:
        upstream.omit_usage = True
    data = json.dumps(BODY).encode()
    headers = {"Authorization": f"Bearer {stack.key()}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(stack.url + "/v1/chat/completions", data=data) as response:
            assert response.status == 200
    (row,) = stack.rows()
    assert row.status == 200 and row.prompt_tokens is None
    assert row.cost_usd == pytest.approx(reservation_of(data, 5))


def test_budget_zero_refuses_the_first_request(make_stack: StackFactory) -> None:
    stack = make_stack(spec=cluster(research=0.0))
    stack.route({"chat": stack.upstreams})
    c = openai.OpenAI(base_url=stack.url + "/v1", api_key=stack.key(), max_retries=0)
    with pytest.raises(openai.RateLimitError) as caught:
        c.chat.completions.create(**BODY)  # type: ignore[call-overload]
    assert caught.value.code == "insufficient_quota"
    assert not [r for u in stack.upstreams for r in u.received]


BUDGET = 0.0005  # a few reservations' worth: several requests may be in flight at once


async def test_300_concurrent_requests_overshoot_by_one_reservation_at_most(
    make_stack: StackFactory,
) -> None:
    connections.raise_open_files_limit()  # 300 clients, 300 server sockets, upstreams
    stack = make_stack(spec=cluster(research=BUDGET))
    stack.route({"chat": stack.upstreams})
    hold = asyncio.Event()  # every admitted request waits at the engine: all in flight at once
    for upstream in stack.upstreams:
        upstream.hold = hold
    data = json.dumps(BODY).encode()
    headers = {"Authorization": f"Bearer {stack.key()}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(headers=headers, connector=connector) as session:

        async def ask() -> int:
            async with session.post(stack.url + "/v1/chat/completions", data=data) as answer:
                await answer.read()
                return answer.status

        tasks = [asyncio.create_task(ask()) for _ in range(300)]
        held = lambda: sum(len(u.received) for u in stack.upstreams)  # noqa: E731
        await _until(lambda: sum(t.done() for t in tasks) + held() == 300)
        stack.loop.call_soon_threadsafe(hold.set)
        statuses = await asyncio.gather(*tasks)
    assert statuses.count(200) == held() and statuses.count(429) == 300 - held()
    assert held() >= 2, "requests were in flight together, or the test shows nothing"
    spent = sum(row.cost_usd for row in stack.rows())
    assert spent <= BUDGET + reservation_of(data, 5)
    assert stack.router.accounts.spent["research"] == pytest.approx(spent)


@pytest.mark.parametrize("period, zone, now, wait", [
    pytest.param("day", "UTC", "2026-06-03T23:59:30+00:00", 30, id="a day: to midnight"),
    pytest.param("day", "Europe/Paris", "2026-06-03T21:00:00.2+00:00", 3600,
                 id="a day in Paris: rounded up to whole seconds"),
    pytest.param("month", "UTC", "2026-06-30T12:00:00+00:00", 12 * 3600, id="a month"),
])
async def test_a_period_budget_refusal_says_when_to_retry(
    make_stack: StackFactory, period: str, zone: str, now: str, wait: int,
) -> None:
    """An exhausted budget with a period is answered with the wait until it resets, as
    Retry-After (whole seconds, rounded up); a lifetime budget (the test above) gets none."""
    import datetime as dt

    from llmgw.spec.models import Cluster

    spec = Cluster.model_validate({
        "cluster": {"name": "lab"},
        "models": {"chat": {"profiles": cluster().models["chat"].profiles,
                            "scaling": {"min": 1},
                            "pricing": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}},
        "projects": {"research": {"budget": {"usd": 0.0, "period": period,
                                             "timezone": zone}}},
    })
    stack = make_stack(spec=spec)
    stack.route({"chat": stack.upstreams})
    instant = dt.datetime.fromisoformat(now).timestamp()
    stack.router.accounts.clock = lambda: instant
    stack.router.limits.clock = lambda: instant
    headers = {"Authorization": f"Bearer {stack.key()}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(stack.url + "/v1/chat/completions", json=BODY) as response:
            assert response.status == 429
            assert (await response.json())["error"]["code"] == "insufficient_quota"
            assert response.headers["Retry-After"] == str(wait)


async def test_a_lifetime_budget_refusal_has_no_retry_after(make_stack: StackFactory) -> None:
    stack = make_stack(spec=cluster(research=0.0))
    stack.route({"chat": stack.upstreams})
    headers = {"Authorization": f"Bearer {stack.key()}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(stack.url + "/v1/chat/completions", json=BODY) as response:
            assert response.status == 429
            assert "Retry-After" not in response.headers
