"""The router reads engines' sockets itself: cut and hostile chunked streams,
kept-alive engine connections (streamed and plain), plain answers in chunks and over
their bound, and a slow client holding the engine back."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import pytest
from support.stacks import Stack

BODY = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": True}
HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n")
EVENT = b'data: {"choices": [{"index": 0, "delta": {"content": "Hel"}}]}\n\n'
DONE = b"data: [DONE]\n\n"
SECRET = b"engine-bytes-secret"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


class Engine:
    """A raw HTTP/1.1 engine: answers each request on a connection with ``answer``."""

    def __init__(self, answer: bytes, *, close: bool = True) -> None:
        self.answer = answer
        self.close = close
        self.connections = 0
        self.requests = 0
        self.closed = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                await reader.readexactly(length)
                self.requests += 1
                writer.write(self.answer)
                await writer.drain()
                if self.close:
                    return
        finally:
            writer.close()
            self.closed.set()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()


async def post(stack: Stack) -> list[bytes]:
    headers = {"Authorization": f"Bearer {stack.key()}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(stack.url + "/v1/chat/completions", json=BODY) as response:
            assert response.status == 200
            return [e for e in (await response.read()).split(b"\n\n") if e]


def error_of(event: bytes) -> dict[str, str]:
    error: dict[str, str] = json.loads(event.removeprefix(b"data: "))["error"]
    return error


async def test_a_chunked_stream_cut_inside_a_chunk_ends_in_an_error_event(stack: Stack) -> None:
    engine = Engine(HEAD + chunk(EVENT) + b"40\r\n" + EVENT[:20])  # then closes
    stack.route({"chat": [stack.run(engine.start())]})
    events = await post(stack)
    stack.run(engine.stop())
    assert events[0] == EVENT.strip()
    assert error_of(events[-1])["code"] == "upstream_failed"
    assert [r.status for r in stack.rows()] == [502]


async def test_a_hostile_chunk_size_ends_the_stream_in_an_error_that_quotes_nothing(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    engine = Engine(HEAD + chunk(EVENT) + b"-" + SECRET + b"\r\n" + EVENT, close=False)
    stack.route({"chat": [stack.run(engine.start())]})
    events = await post(stack)
    assert events[0] == EVENT.strip()
    error = error_of(events[-1])
    assert error["code"] == "upstream_failed" and "chunk-size line" in error["message"]
    assert not any(SECRET in e for e in events)
    assert SECRET.decode() not in "\n".join(r.getMessage() for r in caplog.records)
    # The engine's connection is closed, not kept for another request.
    stack.run(asyncio.wait_for(engine.closed.wait(), 30))
    stack.run(engine.stop())


async def test_engine_connections_are_kept_alive_between_streams(stack: Stack) -> None:
    engine = Engine(HEAD + chunk(EVENT) + chunk(DONE) + b"0\r\n\r\n", close=False)
    stack.route({"chat": [stack.run(engine.start())]})
    for _ in range(3):
        assert await post(stack) == [EVENT.strip(), DONE.strip()]
    assert (engine.requests, engine.connections) == (3, 1)
    stack.run(engine.stop())


PLAIN = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
ANSWER = json.dumps({"object": "chat.completion", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "Hello"}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}).encode()


async def post_plain(stack: Stack) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {stack.key()}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(stack.url + "/v1/chat/completions", json=PLAIN) as response:
            return response.status, await response.read()


async def test_plain_answers_keep_their_engine_connection_and_bytes(stack: Stack) -> None:
    engine = Engine(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%b" % (len(ANSWER), ANSWER), close=False)
    stack.route({"chat": [stack.run(engine.start())]})
    for _ in range(3):
        assert await post_plain(stack) == (200, ANSWER)
    assert (engine.requests, engine.connections) == (3, 1)
    stack.run(engine.stop())


async def test_a_chunked_plain_answer_is_passed_on_whole(stack: Stack) -> None:
    half = len(ANSWER) // 2
    engine = Engine(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                    + chunk(ANSWER[:half]) + chunk(ANSWER[half:]) + b"0\r\n\r\n", close=False)
    stack.route({"chat": [stack.run(engine.start())]})
    assert await post_plain(stack) == (200, ANSWER)
    assert await post_plain(stack) == (200, ANSWER)
    assert engine.connections == 1  # a chunked body that ended cleanly is kept alive too
    stack.run(engine.stop())


async def test_a_plain_answer_over_its_bound_is_refused_and_its_connection_closed(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmgw.router import proxies

    monkeypatch.setattr(proxies, "_MAX_ANSWER", 64)
    engine = Engine(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000\r\n\r\n" + b" " * 1000, close=False)
    stack.route({"chat": [stack.run(engine.start())]})
    status, body = await post_plain(stack)
    assert status == 502
    assert json.loads(body)["error"]["message"].endswith("answered with a document over 64 bytes")
    stack.run(asyncio.wait_for(engine.closed.wait(), 10))  # not kept for another request
    stack.run(engine.stop())


class Flood:
    """An engine that streams ``total`` bytes of events and records how far it got."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.sent = 0
        self.closed = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(HEAD)
        event = chunk(b"data: " + b"x" * 4000 + b"\n\n")
        try:
            while self.sent < self.total:
                writer.write(event)
                self.sent += len(event)
                await writer.drain()
            writer.write(chunk(DONE) + b"0\r\n\r\n")
            await writer.drain()
            await reader.read()
        except ConnectionError:
            pass
        finally:
            writer.close()
            self.closed.set()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()


async def test_a_client_that_reads_nothing_holds_the_engine_back(stack: Stack) -> None:
    flood = Flood(total=256 << 20)
    stack.route({"chat": [stack.run(flood.start())]})
    host, port = stack.url.removeprefix("http://").split(":")
    body = json.dumps(BODY).encode()
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n"
                 b"Authorization: Bearer " + stack.key().encode() + b"\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    transport = writer.transport
    assert isinstance(transport, asyncio.ReadTransport)
    transport.pause_reading()  # the client reads nothing
    # The engine stops when the buffers between it and the client are full: wait until
    # what it sent stays put, then it must be far from done (without flow control the
    # router would read all 256 MiB into the client's write buffer).
    last = -1
    while flood.sent != last:
        last = flood.sent
        await asyncio.sleep(0.5)
    assert flood.sent < flood.total // 4
    writer.close()  # the client hangs up: the engine's connection is closed
    await writer.wait_closed()
    stack.run(asyncio.wait_for(flood.closed.wait(), 30))
    stack.run(flood.stop())


async def test_a_failing_sink_ends_the_body_with_an_error_that_names_only_its_class() -> None:
    from llmgw.router import upstreams

    flood = Flood(total=64 << 20)
    base = await flood.start()
    pool = upstreams.Pool(connect_timeout=5)
    conn, _ = await pool.acquire(base)
    conn.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\nContent-Length: 0\r\n\r\n")
    await conn.head
    assert await conn.first()

    def sink(payload: bytes) -> bool:
        raise ValueError(SECRET.decode())

    conn.attach(sink)
    with pytest.raises(ConnectionError) as caught:
        await asyncio.wait_for(conn.ended, 30)
    assert str(caught.value) == "the relay failed (ValueError)"
    pool.release(base, conn)  # not reusable: closed
    await asyncio.wait_for(flood.closed.wait(), 30)  # the engine saw the connection close
    assert flood.sent < flood.total
    await flood.stop()
