"""Rate limits through real routers: the official ``openai`` client gets 429
``rate_limit_exceeded`` with ``Retry-After`` and OpenAI's ``x-ratelimit-*`` headers (both
stores), and the race: 500 concurrent requests over two routers on one PostgreSQL against
rpm 100 admit exactly as many as the limit allows; and the two bounds at once: an rpm limit
and a daily budget that resets during a 1,500-request run.

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
from support.waits import until, wait_until

from llmgw.router import Settings, keycaches
from llmgw.spec.models import Cluster
from llmgw.store import keys, usages

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


def test_a_keys_limits_changed_in_the_store_reach_a_running_router(
        tmp_path: Path, store_settings: dict[str, str], clients: Clients) -> None:
    """`llmgw keys limits` writes the store; a router that has the key cached applies the new
    limits within the revocation bound (the key's change notice on PostgreSQL, the re-read
    of cached keys on SQLite), with no restart: raised, it admits again; removed, the
    key's own headers go."""
    stack = Stack(tmp_path, limited(), Settings(), 1, store_settings)
    try:
        stack.route({"chat": stack.upstreams})
        pin(stack)
        created = stack.run(keys.create(stack.db, "research", "ci", rpm=1))
        client = clients(stack, created.secret)
        client.chat.completions.create(**BODY)  # type: ignore[call-overload]
        with pytest.raises(openai.RateLimitError):  # rpm 1: the key is cached, and refused
            client.chat.completions.create(**BODY)  # type: ignore[call-overload]

        stack.run(keys.set_limits(stack.db, created.info.id, 5, None))

        def answered() -> dict[str, str] | None:
            try:
                raw = client.chat.completions.with_raw_response.create(**BODY)  # type: ignore[call-overload]
            except openai.RateLimitError:
                return None
            return dict(raw.headers)

        bound = 3 * keycaches.REVOCATION_BOUND
        wait_until(lambda: (h := answered()) and h["x-ratelimit-limit-requests"] == "5",
                   timeout=bound)
        stack.run(keys.set_limits(stack.db, created.info.id, None, None))
        wait_until(lambda: (h := answered()) and "x-ratelimit-limit-requests" not in h,
                   timeout=bound)
        for _ in range(6):  # no limit of its own now: more than 5 in the same minute
            assert answered() is not None
    finally:
        stack.close()


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


async def test_the_race_with_an_rpm_limit_and_a_budget_period_that_resets_during_it(
        pg_stacks: StackFactory) -> None:
    """Both tenancy bounds at once, over two routers on one PostgreSQL: ``rpm: 100`` and a
    daily budget (Paris) worth 150 answers. One clock drives both routers' rate windows
    and budget periods. Three bursts of 500 concurrent requests: a minute where the rpm
    binds (exactly 100 answered), the next minute of the same day where the budget binds
    (exactly the 50 it has left), and the clock moved past midnight while that burst is
    still in flight, then a burst in the new day: a new minute and a new period, so the
    rpm binds again (exactly 100), the budget having reset to its whole amount."""
    import datetime as dt
    from zoneinfo import ZoneInfo

    midnight = dt.datetime(2026, 6, 3, tzinfo=ZoneInfo("Europe/Paris")).timestamp()
    limit, routers, per_answer = 100, 2, 5 * 2.0 / 1e6  # 5 output tokens at $2 per Mtok
    spec = Cluster.model_validate({
        "cluster": {"name": "lab"},
        "models": {"chat": {"profiles": CPU, "scaling": {"min": 1},
                            "pricing": {"input_per_mtok": 0.0, "output_per_mtok": 2.0}}},
        # 149.5 answers' worth: the 150th is admitted (spend before it is under budget),
        # the 151st is not, whatever the floating-point sums round to.
        "projects": {"research": {"rpm": limit, "budget": {
            "usd": 149.5 * per_answer, "period": "day", "timezone": "Europe/Paris"}}},
    })
    now = [midnight - 150.0]  # 30 s into a minute, two minutes before that one's day ends
    stacks = [pg_stacks(spec) for _ in range(routers)]
    for stack in stacks:
        stack.route({"chat": stack.upstreams})
        stack.router.limits.clock = lambda: now[0]
        stack.router.accounts.clock = lambda: now[0]
    headers = {"Authorization": f"Bearer {stacks[0].key()}"}
    answered: list[tuple[int, str | None]] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(headers=headers, connector=connector) as session:
        async def one(i: int) -> tuple[int, str | None]:
            url = stacks[i % routers].url + "/v1/chat/completions"
            async with session.post(url, json=BODY) as response:
                doc = await response.json()
                answer = response.status, doc["error"]["code"] if response.status != 200 else None
                answered.append(answer)
                return answer

        async def burst() -> list[tuple[int, str | None]]:
            return await asyncio.gather(*(one(i) for i in range(500)))

        first = await burst()
        now[0] = midnight - 90.0  # the next minute, the same day
        second = asyncio.ensure_future(burst())
        # Midnight while the second burst is in flight: once 400 of it were answered.
        await until(lambda: len(answered) >= 900, 120)
        now[0] = midnight + 30.0
        second_answers = await second
        third = await burst()
    answers = [*first, *second_answers, *third]
    assert set(answers) <= {(200, None), (429, "rate_limit_exceeded"),
                            (429, "insufficient_quota")}
    assert sum(1 for a in first if a[0] == 200) == limit  # the rpm bound, exactly
    for stack in stacks:
        stack.run(stack.router.accounts.flush())
    rows = stacks[0].run(usages.recent(stacks[0].db, 5000))
    assert sorted(r.status for r in rows) == sorted(status for status, _ in answers)
    assert all(r.cost_usd == pytest.approx(per_answer) for r in rows if r.status == 200)
    yesterday = [r for r in rows if r.ts < midnight and r.status == 200]
    today = [r for r in rows if r.ts >= midnight and r.status == 200]
    # The old day: 100 in its first minute (rpm), then the budget's 50 left (budget).
    assert len(yesterday) == 150
    # The new day: a fresh budget (150 answers' worth) and a fresh minute: the rpm binds.
    assert len(today) == limit
    by_minute: dict[int, int] = {}
    for r in [*yesterday, *today]:
        by_minute[int(r.ts // 60)] = by_minute.get(int(r.ts // 60), 0) + 1
    assert sorted(by_minute.values()) == [50, 100, 100]
    # Exact accounting: the store's spend of each day is that day's rows, to the cent's
    # millionth.
    store = stacks[0].db
    spent_today = stacks[0].run(store.spend_by_project({"research": midnight}))["research"]
    spent_both = stacks[0].run(store.spend_by_project({"research": midnight - 86400}))
    assert spent_today == pytest.approx(limit * per_answer, rel=1e-9)
    assert spent_both["research"] == pytest.approx(250 * per_answer, rel=1e-9)
