"""Least outstanding requests; retry once before the first byte, never after."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import openai
import pytest
from support.stacks import Stack

BODY = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key=stack.key(), max_retries=0)


@pytest.mark.parametrize("failure", ["status 500", "status 503", "dropped", "refused"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_failure_before_first_byte_is_retried_on_another_replica(
    stack: Stack, failure: str, stream: bool
) -> None:
    bad, good = stack.upstreams
    if failure == "refused":
        stack.route({"chat": [closed_port(), good]})
    else:
        stack.route({"chat": [bad, good]})
        if failure == "dropped":
            bad.drop = True
        else:
            bad.status = int(failure.split()[1])
    c = client(stack)
    for _ in range(3):  # whichever replica is picked first, the answer comes from `good`
        if stream:
            text = "".join(ch.choices[0].delta.content or "" for ch in
                           c.chat.completions.create(**BODY, stream=True))
            assert text == "Hello from the"
        else:
            chat = c.chat.completions.create(**BODY)
            assert chat.id == "chatcmpl-u1"
    assert len(good.received) == 3
    assert {r.status for r in stack.rows()} == {200}
    scrape = stack.run(_get(stack.metrics_url))
    assert 'llmgw_upstream_retries_total{model="chat"}' in scrape


def test_no_retry_after_the_first_byte(stack: Stack) -> None:
    first, second = stack.upstreams
    first.drop_after_chunks = 1
    c = client(stack)
    seen = []
    with pytest.raises(openai.APIError, match="failed"):
        for chunk in c.chat.completions.create(**BODY, stream=True):
            seen.append(chunk.choices[0].delta.content)
    assert seen == ["Hello"]  # the client had this chunk: it must not get a second answer
    assert len(first.received) == 1 and second.received == []
    assert [r.status for r in stack.rows()] == [502]


def test_both_replicas_failing_gives_the_error(stack: Stack) -> None:
    for upstream in stack.upstreams:
        upstream.status = 500
    with pytest.raises(openai.InternalServerError, match="failing on purpose"):
        client(stack).chat.completions.create(**BODY)
    assert sum(len(u.received) for u in stack.upstreams) == 2  # one try, one retry, no more


def test_one_replica_refusing_is_a_502(make_stack) -> None:  # type: ignore[no-untyped-def]
    stack = make_stack(replicas=0)
    stack.route({"chat": [closed_port()]})
    with pytest.raises(openai.APIStatusError) as caught:
        client(stack).chat.completions.create(**BODY)
    assert caught.value.status_code == 502
    assert "failed" in caught.value.message


async def test_least_outstanding_requests(stack: Stack) -> None:
    first, second = stack.upstreams
    first.hold = asyncio.Event()
    second.hold = asyncio.Event()
    key = stack.key()
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        async def ask() -> int:
            async with session.post(stack.url + "/v1/chat/completions", json=BODY) as r:
                return r.status
        # Three requests held at the engines: 2 on one replica, 1 on the other at most.
        tasks = [asyncio.create_task(ask()) for _ in range(3)]
        await _until(lambda: len(first.received) + len(second.received) == 3)
        assert sorted([len(first.received), len(second.received)]) == [1, 2]
        busy, idle = (first, second) if len(first.received) == 2 else (second, first)
        stack.call(idle.hold.set)  # type: ignore[union-attr]
        await _until(lambda: sum(t.done() for t in tasks) == 1)
        # Now `idle` has none outstanding and `busy` two: the next two go to `idle`.
        more = [asyncio.create_task(ask()) for _ in range(2)]
        assert await asyncio.gather(*more) == [200, 200]
        assert len(idle.received) == 3 and len(busy.received) == 2
        stack.call(busy.hold.set)  # type: ignore[union-attr]
        assert await asyncio.gather(*tasks) == [200, 200, 200]


async def _until(condition, timeout: float = 10) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")


async def _get(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return await response.text()
