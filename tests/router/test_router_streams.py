"""Streams pass through event by event, as the engine sends them, usage handled."""

from __future__ import annotations

import json
import time

import aiohttp
import openai
import pytest
from support.stacks import Stack

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def test_chunks_arrive_when_the_engine_sends_them(stack: Stack) -> None:
    stack.route({"chat": [stack.upstreams[0]]})
    upstream = stack.upstreams[0]
    upstream.chunk_delays = [0.0, 0.4, 0.4, 0.4]
    c = openai.OpenAI(base_url=stack.url + "/v1", api_key=stack.key(), max_retries=0)
    arrived = []
    for _ in c.chat.completions.create(model="chat", messages=CHAT["messages"], stream=True):
        arrived.append(time.time())
    assert len(arrived) == 4 and len(upstream.sent_at) == 6  # 4 words, usage, [DONE]
    # Each chunk reached the client before the engine had even sent the next one:
    # nothing on the way held it back to batch it with later ones.
    for index in range(3):
        assert arrived[index] < upstream.sent_at[index + 1], index


async def test_stream_headers_and_bytes(stack: Stack) -> None:
    stack.route({"chat": [stack.upstreams[0]]})
    key = stack.key()
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        asked = {**CHAT, "stream_options": {"include_usage": True}}
        async with session.post(stack.url + "/v1/chat/completions", json=asked) as response:
            assert response.headers["X-Accel-Buffering"] == "no"
            assert response.headers["Content-Type"].startswith("text/event-stream")
            with_usage = await response.read()
        async with session.post(stack.url + "/v1/chat/completions", json=CHAT) as response:
            without = await response.read()
    events = [e for e in with_usage.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    assert json.loads(events[-2][6:])["usage"]["completion_tokens"] == 3
    # The client that did not ask sees the same stream minus the usage chunk only.
    assert [e for e in without.split(b"\n\n") if e] == events[:-2] + events[-1:]

    sent = [r.body for u in stack.upstreams for r in u.received]
    assert all(body["stream_options"] == {"include_usage": True} for body in sent)
    headers = [r.headers for u in stack.upstreams for r in u.received]
    assert not [h for h in headers if "Authorization" in h], "the client's key went upstream"
    rows = stack.rows()
    assert [r.completion_tokens for r in rows] == [3, 3]
    assert all(r.stream for r in rows)


async def test_responses_stream_usage_is_read(stack: Stack) -> None:
    c = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key=stack.key(), max_retries=0)
    stream = await c.responses.create(model="chat", input="hello there", stream=True)
    kinds = [event.type async for event in stream]
    await c.close()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    (row,) = stack.rows()
    assert row.endpoint == "/v1/responses" and row.completion_tokens == 3
    assert "stream_options" not in stack.upstreams[0].received[0].body


def test_an_engine_refusing_a_stream_answers_with_its_error(stack: Stack) -> None:
    stack.route({"chat": stack.upstreams})
    stack.upstreams[0].status = stack.upstreams[1].status = 400
    c = openai.OpenAI(base_url=stack.url + "/v1", api_key=stack.key(), max_retries=0)
    with pytest.raises(openai.BadRequestError, match="failing on purpose"):
        c.chat.completions.create(model="chat", messages=CHAT["messages"], stream=True)
    # A 4xx is the request's fault: the same request would fail anywhere, so no retry.
    assert sum(len(u.received) for u in stack.upstreams) == 1
