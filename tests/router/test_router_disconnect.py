"""A client that hangs up cancels its request at the engine."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from support.stacks import Stack

BODY = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


async def _until(condition, timeout: float = 10) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")


async def test_hanging_up_while_waiting_cancels_upstream(stack: Stack) -> None:
    stack.route({"chat": [stack.upstreams[0]]})
    upstream = stack.upstreams[0]
    upstream.hold = asyncio.Event()  # never set: the engine is "generating"
    key = stack.key()
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        task = asyncio.create_task(session.post(stack.url + "/v1/chat/completions", json=BODY))
        await _until(lambda: len(upstream.received) == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await _until(lambda: upstream.cancelled == 1)
    await _until(lambda: bool(stack.rows()))
    assert [r.status for r in stack.rows()] == [499]


async def test_hanging_up_mid_stream_cancels_upstream(stack: Stack) -> None:
    stack.route({"chat": [stack.upstreams[0]]})
    upstream = stack.upstreams[0]
    upstream.chunk_delays = [0.0, 30.0, 0.0]
    key = stack.key()
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        response = await session.post(stack.url + "/v1/chat/completions",
                                       json={**BODY, "stream": True})
        first = await response.content.readuntil(b"\n\n")
        assert b"Hello" in first
        response.close()  # hang up after the first token
    await _until(lambda: upstream.cancelled == 1)
    await _until(lambda: bool(stack.rows()))
    assert [r.status for r in stack.rows()] == [499]
    assert len(upstream.sent_at) == 1
