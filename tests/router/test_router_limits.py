"""The router stays responsive under abuse and faults: slow clients, too many of them,
a locked store, engines that never answer or cut their answers short."""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
from support.stacks import CPU, Stack, StackFactory
from support.waits import until

from llmgw.router import connections
from llmgw.spec.models import Cluster
from llmgw.store import usages

BODY = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
HALF = b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nAuthoriz"


async def get(stack: Stack, path: str) -> int:
    async with aiohttp.ClientSession() as session:
        async with session.get(stack.url + path) as response:
            return response.status


def port(stack: Stack) -> int:
    return int(stack.url.rsplit(":", 1)[1])


async def test_half_sent_headers_are_dropped_and_extra_connections_answered(
    make_stack: StackFactory,
) -> None:
    stack = make_stack(header_timeout=5.0, max_connections=20)
    sockets = []
    for _ in range(30):  # the same mechanism as 1,100 sockets against 1,024 descriptors
        reader, writer = await asyncio.open_connection("127.0.0.1", port(stack))
        writer.write(HALF)
        sockets.append((reader, writer))
    # (A bound on the test itself, not a timing assertion: without the header timeout
    # these reads would wait forever.)
    answers = [await asyncio.wait_for(reader.read(), 60) for reader, _ in sockets]
    for writer in (w for _, w in sockets):
        writer.close()
    # Past the limit: an answer at once, not a connection left waiting for a descriptor.
    busy = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
    assert busy, "no connection past the limit was answered"
    error = json.loads(busy[0].partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "too_many_connections" and b"Retry-After: 1" in busy[0]
    # Within the limit: closed by the server once the header timeout passed (read() ended).
    # (Exactly 10 are refused unless opening 30 sockets took longer than the timeout.)
    assert answers.count(b"") >= 20 and len(busy) + answers.count(b"") == 30
    assert await get(stack, "/health") == 200


async def test_a_slow_body_gets_408(make_stack: StackFactory) -> None:
    stack = make_stack(body_timeout=0.5)
    stack.route({"chat": stack.upstreams})
    hang = asyncio.Event()

    async def trickle() -> AsyncIterator[bytes]:
        yield b'{"model": '
        await hang.wait()  # the rest never comes

    headers = {"Authorization": f"Bearer {stack.key()}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(stack.url + "/v1/chat/completions", data=trickle()) as response:
            assert response.status == 408
            assert (await response.json())["error"]["code"] == "request_timeout"
    hang.set()
    assert not [r for u in stack.upstreams for r in u.received]


def test_open_files_limit_is_raised_to_the_hard_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    script = ("import resource; from llmgw.router import connections; "
              "print(connections.raise_open_files_limit(), "
              "resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    lowered = min(256, hard)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard)),
    ).stdout.split()
    assert out[0] == out[1] and int(out[0]) == (hard if hard != resource.RLIM_INFINITY else
                                                int(out[0]))
    assert int(out[0]) > lowered or hard == lowered


@pytest.mark.parametrize("wanted, open_files, limit", [
    (4096, 1024, 768), (4096, 1 << 20, 4096), (4096, 100, 1),
])
def test_connection_limit_leaves_descriptors(wanted: int, open_files: int, limit: int) -> None:
    assert connections.connection_limit(wanted, open_files) == limit


async def test_a_locked_store_stalls_nothing_and_loses_no_row(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    if stack.db.kind != "sqlite":
        pytest.skip("another process's write lock on the file is SQLite's failure mode")
    caplog.set_level(logging.WARNING, logger="llmgw.router.keycaches")
    key = stack.key()
    locker = sqlite3.connect(stack.db_path, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")  # another process's write transaction
    try:
        c = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key=key, max_retries=0)
        assert (await c.chat.completions.create(**BODY)).choices  # type: ignore[call-overload]
        await c.close()
        # The background flush tries, fails on the lock, keeps the row (one line says the
        # store is away); meanwhile the loop answers.
        await until(lambda: "the store is unreachable" in caplog.text, timeout=30)
        assert "database is locked" in caplog.text
        assert await get(stack, "/health") == 200
        assert stack.run(usages.recent(stack.db)) == []
    finally:
        locker.rollback()
        locker.close()
    # Kept and retried by the background flush (the test does not flush): written once.
    await until(lambda: len(stack.run(usages.recent(stack.db))) == 1, timeout=30)
    # Several more flushes: no second copy.
    accounts, flushed = stack.router.accounts, []
    flush = accounts.flush

    async def counted() -> None:
        await flush()
        flushed.append(True)

    accounts.flush = counted  # type: ignore[method-assign]
    await until(lambda: len(flushed) >= 3, timeout=30)
    assert [r.status for r in stack.run(usages.recent(stack.db))] == [200]


async def test_rows_are_written_in_the_background(stack: Stack) -> None:
    c = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key=stack.key(), max_retries=0)
    await c.chat.completions.create(**BODY)  # type: ignore[call-overload]
    await c.close()
    # No flush called here: only the router's own flusher can write it.
    await until(lambda: len(stack.run(usages.recent(stack.db))) == 1, timeout=30)


def slow_cluster(timeout: str) -> Cluster:
    return Cluster.model_validate({
        "cluster": {"name": "lab"},
        "models": {"chat": {"profiles": CPU, "routing": {"first_byte_timeout": timeout}}},
        "projects": {"research": {}},
    })


@pytest.mark.parametrize("stream", [False, True])
async def test_an_engine_that_never_answers_gets_504(
    make_stack: StackFactory, stream: bool
) -> None:
    stack = make_stack(spec=slow_cluster("1s"))
    stack.route({"chat": stack.upstreams})
    for upstream in stack.upstreams:
        upstream.hold = asyncio.Event()  # accepts, never answers
    c = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key=stack.key(), max_retries=0,
                           timeout=60)  # bounds the test; the router's bound is 1 s
    with pytest.raises(openai.APIStatusError) as caught:
        await c.chat.completions.create(**BODY, stream=stream)  # type: ignore[call-overload]
    await c.close()
    assert caught.value.status_code == 504
    assert caught.value.code == "upstream_timeout"
    assert "first_byte_timeout" in caught.value.message
    (row,) = stack.rows()
    assert row.status == 504


class CutShort:
    """An engine that answers with a close-delimited body and closes it early."""

    def __init__(self, head: bytes, body: bytes) -> None:
        self.answer = head + b"\r\n" + body
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        writer.write(self.answer)
        await writer.drain()
        writer.close()  # no length, not chunked: closing is the only end there is

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()


STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n"
JSON_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
EVENT = b'data: {"choices": [{"index": 0, "delta": {"content": "Hel"}}]}\n\n'


async def test_a_stream_cut_short_ends_in_an_error_event(stack: Stack) -> None:
    engine = CutShort(STREAM_HEAD, EVENT + EVENT)  # and no [DONE]
    stack.route({"chat": [stack.run(engine.start())]})
    headers = {"Authorization": f"Bearer {stack.key()}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(stack.url + "/v1/chat/completions",
                                json={**BODY, "stream": True}) as response:
            events = [e for e in (await response.read()).split(b"\n\n") if e]
    stack.run(engine.stop())
    assert events[:2] == [EVENT.strip(), EVENT.strip()]
    error = json.loads(events[-1].removeprefix(b"data: "))["error"]
    assert error["code"] == "upstream_failed" and "before its last event" in error["message"]
    assert [r.status for r in stack.rows()] == [502]


async def test_a_whole_close_delimited_stream_ends_cleanly(stack: Stack) -> None:
    engine = CutShort(STREAM_HEAD, EVENT + b"data: [DONE]\n\n")
    stack.route({"chat": [stack.run(engine.start())]})
    headers = {"Authorization": f"Bearer {stack.key()}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(stack.url + "/v1/chat/completions",
                                json={**BODY, "stream": True}) as response:
            events = [e for e in (await response.read()).split(b"\n\n") if e]
    stack.run(engine.stop())
    assert events == [EVENT.strip(), b"data: [DONE]"]


async def test_a_plain_answer_cut_short_is_502(stack: Stack) -> None:
    engine = CutShort(JSON_HEAD, b'{"id": "x", "choices": [{"index": 0, "mess')
    stack.route({"chat": [stack.run(engine.start())]})
    headers = {"Authorization": f"Bearer {stack.key()}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(stack.url + "/v1/chat/completions", json=BODY) as response:
            assert response.status == 502
            assert "before its answer was complete" in (await response.json())["error"]["message"]
    stack.run(engine.stop())
