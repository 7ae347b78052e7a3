"""Least outstanding requests; retry once before the first byte, never after."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import openai
import pytest
from support.stacks import Stack
from support.waits import until

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
    slow, fast = stack.upstreams
    slow.hold = asyncio.Event()  # `slow` is busy generating until released
    key = stack.key()
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        async def ask() -> int:
            async with session.post(stack.url + "/v1/chat/completions", json=BODY) as r:
                return r.status
        held = asyncio.create_task(ask())  # both idle: the first in the table takes it
        await until(lambda: len(slow.received) == 1)
        # `fast` has served many more requests, but none is outstanding there, while one is
        # on `slow`: every new request goes to `fast`, not in turn to both.
        for _ in range(5):
            assert await asyncio.wait_for(ask(), 10) == 200
        assert len(slow.received) == 1 and len(fast.received) == 5
        stack.call(slow.hold.set)
        assert await held == 200
        # Both idle again: ties go to the replica picked less often.
        assert await ask() == 200
        assert len(slow.received) == 2


async def _get(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return await response.text()
