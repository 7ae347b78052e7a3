"""The admission queue and engine-aware balancing, through real HTTP and the openai client.

A replica never gets more than its cap; a full queue and a queue timeout are
503s with ``Retry-After: 1``; under saturation a small project's wait stays
within twice its unloaded wait however fast a big one sends; balancing
follows the load engines report and other routers' requests in flight.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx
import openai
import pytest
from support.stacks import CPU, Stack, StackFactory
from support.waits import until

from llmgw.router import Endpoint
from llmgw.spec.models import Cluster

BODY: dict[str, Any] = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


def spec(**routing: Any) -> Cluster:
    return Cluster.model_validate({
        "cluster": {"name": "lab"},
        "models": {"chat": {"profiles": CPU, "scaling": {"min": 1, "max": 4},
                            "routing": routing}},
        "projects": {"research": {}, "small": {}},
    })


def aclient(stack: Stack, project: str = "research") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key=stack.key(project),
                              max_retries=0, timeout=60,
                              http_client=httpx.AsyncClient(limits=httpx.Limits(
                                  max_connections=1000, max_keepalive_connections=100)))


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[-1]


# One system prompt for all: prefix affinity would send every request to one replica.
SHARED = {"model": "chat", "messages": [{"role": "system", "content": "You help. " * 40},
                                        {"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("policy", ["least-outstanding", "prefix"])
async def test_a_replica_never_gets_more_than_its_cap(make_stack: StackFactory,
                                                      policy: str) -> None:
    stack = make_stack(spec(max_in_flight=2, policy=policy), replicas=2)
    stack.route({"chat": stack.upstreams})
    for upstream in stack.upstreams:
        upstream.delay = 0.2
    client = aclient(stack)
    answers = await asyncio.gather(*(client.chat.completions.create(**SHARED)
                                     for _ in range(12)))
    await client.close()
    assert len(answers) == 12
    assert [u.peak for u in stack.upstreams] == [2, 2]  # reached, never passed
    assert sum(len(u.received) for u in stack.upstreams) == 12
    scrape = httpx.get(stack.metrics_url).text
    assert 'llmgw_router_queue_wait_seconds_count{model="chat"}' in scrape
    assert 'llmgw_router_queue_depth{model="chat"} 0.0' in scrape


async def test_the_cap_defaults_to_the_engines_slots(make_stack: StackFactory) -> None:
    cluster = spec()
    cluster.models["chat"].profiles[0].args["parallel"] = 3
    stack = make_stack(cluster, replicas=1)
    stack.route({"chat": stack.upstreams})
    stack.upstreams[0].delay = 0.2
    client = aclient(stack)
    await asyncio.gather(*(client.chat.completions.create(**BODY) for _ in range(8)))
    await client.close()
    assert stack.upstreams[0].peak == 3


def _error(caught: pytest.ExceptionInfo[openai.APIStatusError]) -> tuple[int, str, str]:
    response = caught.value.response
    return (response.status_code, response.headers.get("retry-after", ""),
            response.json()["error"]["code"])


async def test_a_full_queue_is_a_503_queue_full_with_retry_after(
        make_stack: StackFactory) -> None:
    stack = make_stack(spec(max_in_flight=1, queue_limit=1), replicas=1)
    stack.route({"chat": stack.upstreams})
    hold = stack.upstreams[0].hold = stack.run(_event())
    client = aclient(stack)
    busy = asyncio.ensure_future(client.chat.completions.create(**BODY))
    queued = asyncio.ensure_future(client.chat.completions.create(**BODY))
    await until(lambda: stack.router.admissions.depth("chat") == 1)
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(**BODY)
    assert _error(caught) == (503, "1", "queue_full")
    assert caught.value.response.json()["error"]["type"] == "server_error"
    stack.loop.call_soon_threadsafe(hold.set)
    await asyncio.gather(busy, queued)  # the queued one was served once a slot freed
    await client.close()
    assert stack.upstreams[0].peak == 1


async def test_waiting_past_the_queue_timeout_is_a_503_queue_timeout(
        make_stack: StackFactory) -> None:
    stack = make_stack(spec(max_in_flight=1, queue_timeout="200ms"), replicas=1)
    stack.route({"chat": stack.upstreams})
    hold = stack.upstreams[0].hold = stack.run(_event())
    client = aclient(stack)
    busy = asyncio.ensure_future(client.chat.completions.create(**BODY))
    await until(lambda: len(stack.upstreams[0].received) == 1)
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(**BODY, stream=True)
    assert _error(caught) == (503, "1", "queue_timeout")
    assert "routing.queue_timeout" in caught.value.response.json()["error"]["message"]
    assert stack.router.admissions.depth("chat") == 0
    stack.loop.call_soon_threadsafe(hold.set)
    await busy
    await client.close()
    assert len(stack.upstreams[0].received) == 1  # the timed-out request never reached it
    statuses = sorted(r.status for r in stack.rows())
    assert statuses == [200, 503]


async def test_a_client_that_leaves_the_queue_is_not_sent(make_stack: StackFactory) -> None:
    stack = make_stack(spec(max_in_flight=1), replicas=1)
    stack.route({"chat": stack.upstreams})
    hold = stack.upstreams[0].hold = stack.run(_event())
    client = aclient(stack)
    busy = asyncio.ensure_future(client.chat.completions.create(**BODY))
    await until(lambda: len(stack.upstreams[0].received) == 1)
    leaving = asyncio.ensure_future(client.chat.completions.create(**BODY))
    await until(lambda: stack.router.admissions.depth("chat") == 1)
    leaving.cancel()  # the client hangs up while queued
    await until(lambda: stack.router.admissions.depth("chat") == 0)
    stack.loop.call_soon_threadsafe(hold.set)
    await busy
    await client.close()
    assert len(stack.upstreams[0].received) == 1


# Fairness: 4 replicas × 2 slots, each request 0.3-0.7 s: 16 requests/s at most. The big
# project sends 30/s, the small one 3/s (a tenth), so the big one's line grows all along.
# The spread keeps the slots from ending in step, as real generations do not.
SLOTS_DELAY, SPREAD, REPLICAS, CAP = 0.5, 0.2, 4, 2
SMALL_EVERY, SMALL_REQUESTS, BIG_PER_SMALL = 1 / 3, 15, 10


async def _timed(client: openai.AsyncOpenAI) -> float:
    began = time.monotonic()
    await client.chat.completions.create(**BODY)
    return time.monotonic() - began


async def _small(client: openai.AsyncOpenAI) -> list[float]:
    tasks = []
    for _ in range(SMALL_REQUESTS):
        tasks.append(asyncio.ensure_future(_timed(client)))
        await asyncio.sleep(SMALL_EVERY)
    return list(await asyncio.gather(*tasks))


async def test_a_small_project_keeps_its_wait_while_a_big_one_saturates(
        make_stack: StackFactory) -> None:
    stack = make_stack(spec(max_in_flight=CAP), replicas=REPLICAS)
    stack.route({"chat": stack.upstreams})
    for upstream in stack.upstreams:
        upstream.delay, upstream.delay_spread = SLOTS_DELAY, SPREAD
    small, big = aclient(stack, "small"), aclient(stack, "research")
    unloaded = await _small(small)

    flood: list[asyncio.Future[float]] = []

    async def big_sender(stop: asyncio.Event) -> None:
        while not stop.is_set():
            flood.append(asyncio.ensure_future(_timed(big)))
            await asyncio.sleep(SMALL_EVERY / BIG_PER_SMALL)

    stop = asyncio.Event()
    sender = asyncio.ensure_future(big_sender(stop))
    await asyncio.sleep(1.0)  # the big project's line is long before the small one asks
    loaded = await _small(small)
    stop.set()
    await sender
    depth = stack.router.admissions.depth("chat")
    big_done = [f.result() for f in flood if f.done() and not f.exception()]
    for pending in flood:
        pending.cancel()  # the big project's clients leave: they leave the queue
    await asyncio.gather(*flood, return_exceptions=True)
    await small.close()
    await big.close()

    ratio = p95(loaded) / p95(unloaded)
    print(f"\nsmall project p95 wait: unloaded {p95(unloaded):.3f} s, "
          f"loaded {p95(loaded):.3f} s, ratio {ratio:.2f} (bound 2); "
          f"big project median wait {statistics.median(big_done):.3f} s, "
          f"{depth} queued at the end")
    assert depth > 2 * REPLICAS * CAP  # saturated: the big project's line kept growing
    assert ratio <= 2.0
    await until(lambda: stack.router.admissions.depth("chat") == 0)
    assert max(u.peak for u in stack.upstreams) <= CAP


async def test_balancing_follows_the_load_engines_report(make_stack: StackFactory) -> None:
    stack = make_stack(spec(), replicas=2)
    busy, idle = stack.upstreams
    now = time.time()
    table = {"chat": [Endpoint(busy.url, "local", 0, load=5, load_at=now),
                      Endpoint(idle.url, "local", 1, load=0, load_at=now)]}
    stack.call(stack.router.update_routes, table)
    client = aclient(stack)
    for _ in range(5):  # one at a time: nothing is outstanding, only the reports differ
        await client.chat.completions.create(**BODY)
    assert (len(busy.received), len(idle.received)) == (0, 5)
    # The next report: the busy engine has drained; it takes the next requests.
    table = {"chat": [Endpoint(busy.url, "local", 0, load=0, load_at=now + 5),
                      Endpoint(idle.url, "local", 1, load=3, load_at=now + 5)]}
    stack.call(stack.router.update_routes, table)
    for _ in range(3):
        await client.chat.completions.create(**BODY)
    await client.close()
    assert (len(busy.received), len(idle.received)) == (3, 5)


async def test_balancing_and_caps_count_other_routers_requests(
        make_stack: StackFactory) -> None:
    stack = make_stack(spec(max_in_flight=2), replicas=2)
    stack.route({"chat": stack.upstreams})
    first, second = stack.upstreams
    stack.call(stack.router.set_others, {first.url: 1})  # another router has one on `first`
    client = aclient(stack)
    for _ in range(3):
        await client.chat.completions.create(**BODY)
    # One at a time: `second` is always the idler, since `first` has another router's request.
    assert (len(first.received), len(second.received)) == (0, 3)
    # Every slot taken by other routers: a request queues until their counts drop.
    stack.call(stack.router.set_others, {first.url: 2, second.url: 2})
    waiting = asyncio.ensure_future(client.chat.completions.create(**BODY))
    await until(lambda: stack.router.admissions.depth("chat") == 1)
    stack.call(stack.router.set_others, {first.url: 1, second.url: 2})
    await waiting
    await client.close()
    assert (len(first.received), len(second.received)) == (1, 3)


async def _event() -> asyncio.Event:
    return asyncio.Event()


