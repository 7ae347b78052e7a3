"""A stream is complete once its last event reached the client, not when the engine closes.

The official openai SDK closes its connection as soon as it reads ``data: [DONE]``.
An engine may end its body (the last chunk) a moment after it wrote [DONE]; a
router that waited for that end counted the finished stream as a client hang-up
(499). The test upstream's ``linger`` is that moment, made long enough that the
SDK is always gone first.
"""

from __future__ import annotations

import asyncio
import urllib.request

import aiohttp
import openai
from prometheus_client.parser import text_string_to_metric_families
from support.stacks import Stack
from support.waits import until

MESSAGES = [{"role": "user", "content": "hi"}]
STREAMS = 20


def requests_by_status(stack: Stack) -> dict[str, float]:
    text = urllib.request.urlopen(stack.metrics_url).read().decode()  # noqa: S310
    return {s.labels["status"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "llmgw_requests_total" and s.labels["model"] == "chat"}


def test_streams_the_openai_sdk_finished_are_recorded_200(stack: Stack) -> None:
    stack.route({"chat": [stack.upstreams[0]]})
    upstream = stack.upstreams[0]
    upstream.linger = 0.3  # the engine ends its body 0.3 s after [DONE]
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key=stack.key(), max_retries=0)
    for _ in range(STREAMS):
        pieces = [c.choices[0].delta.content
                  for c in client.chat.completions.create(model="chat", messages=MESSAGES,
                                                          stream=True) if c.choices]
        assert "".join(p or "" for p in pieces) == "Hello from the"
    rows = stack.rows()
    assert [r.status for r in rows] == [200] * STREAMS
    assert [r.completion_tokens for r in rows] == [3] * STREAMS  # the usage chunk was read
    assert requests_by_status(stack) == {"200": float(STREAMS)}
    # The router read each body to its end rather than cutting the engine off.
    tallies = stack.call(stack.router.routes.tallies.snapshot)
    assert tallies[upstream.url]["errors"] == 0
    assert tallies[upstream.url]["requests"] == STREAMS


async def test_the_engine_is_let_finish_its_body_after_the_last_event(stack: Stack) -> None:
    stack.route({"chat": [stack.upstreams[0]]})
    upstream = stack.upstreams[0]
    upstream.linger = 0.3
    key = stack.key()
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        async with session.post(stack.url + "/v1/chat/completions",
                                json={"model": "chat", "messages": MESSAGES,
                                      "stream": True}) as response:
            body = await response.read()  # ends before the engine's body does
    assert body.endswith(b"data: [DONE]\n\n")
    await asyncio.sleep(0.6)  # past the engine's linger: it ended its body by now
    assert upstream.cancelled == 0
    await until(lambda: bool(stack.rows()))
    assert [r.status for r in stack.rows()] == [200]


async def test_a_client_gone_before_the_last_event_is_still_499(stack: Stack) -> None:
    stack.route({"chat": [stack.upstreams[0]]})
    upstream = stack.upstreams[0]
    upstream.chunk_delays = [0.0, 0.0, 30.0]
    key = stack.key()
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        response = await session.post(stack.url + "/v1/chat/completions",
                                      json={"model": "chat", "messages": MESSAGES,
                                            "stream": True})
        await response.content.readuntil(b"\n\n")
        response.close()
    await until(lambda: upstream.cancelled == 1)
    await until(lambda: bool(stack.rows()))
    assert [r.status for r in stack.rows()] == [499]
