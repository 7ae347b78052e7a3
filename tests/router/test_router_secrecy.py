"""Nothing a client sends is logged, stored or exported, on any error path.

Marker strings ride in the key and in the body of requests that take every way
out of the router: bad JSON, JSON nested too deep, 401, 403, unknown model,
413, 429, requests the HTTP parser refuses, an engine that fails or cannot be
reached, a client that hangs up. Then every log record (all loggers, DEBUG),
every byte of the SQLite files and the metrics scrape are searched for them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.request

import aiohttp
import pytest
from support import nodes
from support.stacks import Stack, StackFactory, cluster

KEY_MARK = "KEYMARK-7f3a9c"
BODY_MARK = "BODYMARK-5e21d4"
MARKS = (KEY_MARK, BODY_MARK)


async def _until(condition, timeout: float = 10) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")


def body(**extra: object) -> bytes:
    return json.dumps({"model": "chat", "messages": [{"role": "user", "content": BODY_MARK}],
                       **extra}).encode()


async def post(stack: Stack, key: str, data: bytes, path: str = "/v1/chat/completions",
               ) -> tuple[int, dict[str, object]]:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(stack.url + path, data=data) as response:
            return response.status, await response.json()


async def raw(stack: Stack, request: bytes) -> tuple[int, dict[str, object]]:
    """Send bytes no HTTP client library would; the status and JSON body answered."""
    port = int(stack.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await reader.read()  # the router closes the connection after a parse error
    writer.close()
    head, _, payload = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)


def hostile_requests(key: str) -> list[tuple[str, bytes]]:
    start = b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\n"
    data = body()
    length = b"Content-Length: %d\r\n" % len(data)
    auth = f"Authorization: Bearer {key}\r\n".encode()
    return [
        ("space before a header's colon",
         start + f"Authorization : Bearer {KEY_MARK}\r\n".encode() + length + b"\r\n" + data),
        ("obs-fold", start + auth + f"X-Note: a\r\n {KEY_MARK}\r\n".encode() + length
         + b"\r\n" + data),
        ("bad chunk size", start + auth + b"Transfer-Encoding: chunked\r\n\r\n"
         + f"{BODY_MARK}\r\n".encode() + data + b"\r\n0\r\n\r\n"),
        ("bad request line", f"POST /v1/{KEY_MARK} HTTP/1.1 extra\r\n\r\n".encode()),
        ("header too long", start + auth + b"X-Long: " + BODY_MARK.encode() * 1000 + b"\r\n\r\n"),
    ]


@pytest.fixture
def secrets_stack(make_stack: StackFactory) -> Stack:
    stack = make_stack(spec=cluster(research=None, broke=0.0), max_body_bytes=300_000)
    stack.route({"chat": stack.upstreams, "coder": [f"http://127.0.0.1:{nodes.free_port()}"]})
    return stack


async def test_no_client_bytes_in_logs_database_or_metrics(
    secrets_stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, every level
    stack = secrets_stack
    key, broke = stack.key(), stack.key("broke")
    gone = stack.key("old-project")
    answers: list[tuple[str, int, dict[str, object]]] = []

    async def expect(what: str, status: int, got: tuple[int, dict[str, object]]) -> None:
        answers.append((what, *got))
        assert got[0] == status, what
        error = got[1]["error"]
        assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}

    await expect("bad JSON", 400, await post(stack, key, b'{"model": "chat", "x": "'
                                             + BODY_MARK.encode()))
    deep = b'{"model": "chat", "m": "' + BODY_MARK.encode() + b'", "x": ' + b"[" * 100_000
    await expect("nested 100,000 deep", 400, await post(stack, key, deep + b"]" * 100_000 + b"}"))
    await expect("unknown key", 401, await post(stack, f"llmgw_{KEY_MARK}", body()))
    await expect("project gone", 403, await post(stack, gone, body()))
    await expect("unknown model", 404, await post(stack, key, body(model=f"m-{BODY_MARK}")))
    await expect("too large", 413, await post(stack, key, body(pad="x" * 300_001)))
    await expect("over budget", 429, await post(stack, broke, body()))
    await expect("non-boolean stream", 400, await post(stack, key, body(stream=BODY_MARK)))
    for what, request in hostile_requests(key):
        await expect(what, 400, await raw(stack, request))

    # The engine fails, then cannot be reached at all.
    for upstream in stack.upstreams:
        upstream.status = 500
    await expect("engine fails", 500, await post(stack, key, body()))
    for upstream in stack.upstreams:
        upstream.status = None
    coder = json.dumps({"model": "coder", "prompt": BODY_MARK}).encode()
    await expect("engine unreachable", 502, await post(stack, key, coder,
                                                       path="/v1/completions"))

    # A client hangs up while the engine works.
    stack.route({"chat": [stack.upstreams[0]]})
    stack.upstreams[0].hold = asyncio.Event()
    before = len(stack.upstreams[0].received)
    task = asyncio.create_task(post(stack, key, body()))
    await _until(lambda: len(stack.upstreams[0].received) > before)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await _until(lambda: stack.upstreams[0].cancelled == 1)
    rows = stack.rows()  # flushed: every row is in the files now
    assert 499 in [row.status for row in rows]

    logged = "\n".join(
        f"{r.name} {r.levelname} {r.getMessage()} {r.exc_text or ''} {r.stack_info or ''}"
        for r in caplog.records)
    for mark in MARKS:
        assert mark not in logged, f"{mark} was logged"
    for table in ("usage", "keys"):
        for value in stack.table_values(table):
            assert not [mark for mark in MARKS if mark in value], f"stored in {table}"
    for path in stack.db_path.parent.glob("llmgw.db*"):  # SQLite: every page, WAL included
        raw_bytes = path.read_bytes()
        for mark in MARKS:
            assert mark.encode() not in raw_bytes, f"{mark} is stored in {path.name}"
    scrape = urllib.request.urlopen(stack.metrics_url).read().decode()  # noqa: S310
    for mark in MARKS:
        assert mark not in scrape, f"{mark} is in a metric"
