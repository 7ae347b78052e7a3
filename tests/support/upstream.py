"""Real HTTP servers that answer like an OpenAI-compatible engine (vLLM's formats).

:class:`Upstream` is an aiohttp server with the engine endpoints the router
proxies, plus knobs the router's tests turn: answer a status, drop the
connection before the headers or in the middle of a stream, pace stream
chunks and record when each was sent, hold a request until released, count
requests whose client went away. It records every request it received.

``python tests/support/upstream.py --port N`` runs :func:`serve_fast`, a
minimal asyncio server with canned answers and nothing else in its path,
for the benchmark: the same upstream behind every row of the table. With
``--stream-chunks N`` it runs :func:`serve_streaming` instead: every answer
is a chat-completions stream of N chunks, each written on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class Upstream:
    name: str
    status: int | None = None  # answer this status instead of working
    drop: bool = False  # close the connection before any byte of an answer
    drop_after_chunks: int | None = None  # stream: close after this many chunks
    chunk_delays: list[float] = field(default_factory=list)  # pause before each chunk
    hold: asyncio.Event | None = None  # wait for this before answering
    delay: float = 0.0  # seconds each request takes before its answer
    delay_spread: float = 0.0  # ... give or take up to this much, drawn at random
    active: int = 0  # requests being answered now
    peak: int = 0  # the most answered at once
    omit_usage: bool = False  # answer without a usage object (an engine that reports none)
    reply: list[str] = field(default_factory=list)  # chat streams: these pieces, not WORDS
    linger: float = 0.0  # stream: pause after the last event before ending the body
    error_body: bytes | None = None  # with ``status``: answer this body (a recorded one)
    received: list[Received] = field(default_factory=list)
    health_status: int = 200  # what GET /health and /v1/models answer
    probes: list[dict[str, str]] = field(default_factory=list)  # their headers
    sent_at: list[float] = field(default_factory=list)  # time.time() of each stream chunk
    cancelled: int = 0  # requests whose client went away before the answer ended
    runner: web.AppRunner | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> Upstream:
        app = web.Application()
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                     "/v1/responses"):
            app.router.add_post(path, self._handle)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        self.runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def _health(self, request: web.Request) -> web.Response:
        self.probes.append(dict(request.headers))
        return web.json_response({}, status=self.health_status)

    async def _models(self, request: web.Request) -> web.Response:
        self.probes.append(dict(request.headers))
        if self.health_status != 200:
            return web.json_response({"error": {"message": "down"}}, status=self.health_status)
        return web.json_response({"object": "list", "data": [
            {"id": self.name, "object": "model", "created": 0, "owned_by": "test"}]})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(Received(request.path, dict(request.headers), body))
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            if self.hold is not None:
                await self.hold.wait()
            if self.delay:
                await asyncio.sleep(self.delay + random.uniform(-1, 1) * self.delay_spread)
            if self.drop:
                assert request.transport is not None
                request.transport.close()
                raise ConnectionResetError("dropped on purpose")
            if self.status is not None and self.error_body is not None:
                return web.Response(status=self.status, body=self.error_body,
                                    content_type="application/json")
            if self.status is not None:
                return web.json_response(
                    {"error": {"message": f"{self.name} failing on purpose", "type": "server_error",
                               "param": None, "code": None}}, status=self.status)
            if body.get("stream"):
                return await self._stream(request, body)
            answer = _answer(request.path, body, self.name)
            if self.omit_usage:
                answer.pop("usage")
            return web.json_response(answer)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1

    async def _stream(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        events = _stream_events(request.path, body, self.name, len(self.chunk_delays) or 3,
                                self.reply)
        sent = 0
        for index, event in enumerate(events):
            if index < len(self.chunk_delays):
                await asyncio.sleep(self.chunk_delays[index])
            if self.drop_after_chunks is not None and sent >= self.drop_after_chunks:
                assert request.transport is not None
                request.transport.close()
                raise ConnectionResetError("dropped mid-stream on purpose")
            await response.write(event)
            self.sent_at.append(time.time())
            sent += 1
        if self.linger:
            # As an engine that writes its last chunk apart from [DONE]: a client that
            # has [DONE] may be gone by then.
            await asyncio.sleep(self.linger)
        await response.write_eof()
        return response


def _words(body: dict[str, Any]) -> int:
    text = json.dumps(body.get("messages") or body.get("prompt") or body.get("input") or "")
    return max(1, len(text.split()))


WORDS = ["Hello", " from", " the", " engine", ".", " More", " words", " here"]


def _answer(path: str, body: dict[str, Any], name: str) -> dict[str, Any]:
    prompt = _words(body)
    if path == "/v1/embeddings":
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        return {"object": "list", "model": body["model"],
                "data": [{"object": "embedding", "index": i, "embedding": [0.5, -0.25, 0.125]}
                         for i, _ in enumerate(inputs)],
                "usage": {"prompt_tokens": prompt, "total_tokens": prompt}}
    completion = 5
    text = "".join(WORDS[:completion])
    usage = {"prompt_tokens": prompt, "completion_tokens": completion,
             "total_tokens": prompt + completion}
    if path == "/v1/responses":
        return {"id": f"resp-{name}", "object": "response", "created_at": 0, "model": body["model"],
                "status": "completed", "output": [{"type": "message", "id": "msg-1",
                "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}],
                "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
                "usage": {"input_tokens": prompt, "output_tokens": completion,
                          "total_tokens": prompt + completion,
                          "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens_details": {"reasoning_tokens": 0}}}
    if path == "/v1/completions":
        return {"id": f"cmpl-{name}", "object": "text_completion", "created": 0,
                "model": body["model"], "choices": [{"index": 0, "text": text,
                "finish_reason": "stop", "logprobs": None}], "usage": usage}
    return {"id": f"chatcmpl-{name}", "object": "chat.completion", "created": 0,
            "model": body["model"], "choices": [{"index": 0, "message": {"role": "assistant",
            "content": text}, "finish_reason": "stop"}], "usage": usage}


def _sse(doc: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(doc)}\n\n".encode()


def _stream_events(path: str, body: dict[str, Any], name: str, chunks: int,
                   reply: list[str] | None = None) -> list[bytes]:
    """vLLM's stream: content chunks, a usage chunk when asked for, then [DONE]; a chat
    stream's chunks are ``reply``'s pieces when it has any."""
    prompt = _words(body)
    model = body["model"]
    if path == "/v1/responses":
        events = [_sse({"type": "response.created", "response": {"id": f"resp-{name}",
                        "usage": None}}, "response.created")]
        events += [_sse({"type": "response.output_text.delta", "delta": WORDS[i % len(WORDS)]},
                        "response.output_text.delta") for i in range(chunks)]
        events.append(_sse({"type": "response.completed", "response": {
            "id": f"resp-{name}", "usage": {"input_tokens": prompt, "output_tokens": chunks,
                                            "total_tokens": prompt + chunks}}},
            "response.completed"))
        return events
    chat = path == "/v1/chat/completions"
    kind = "chat.completion.chunk" if chat else "text_completion"
    pieces = reply if chat and reply else [WORDS[i % len(WORDS)] for i in range(chunks)]
    chunks = len(pieces)
    events = []
    for i, word in enumerate(pieces):
        choice: dict[str, Any] = ({"index": 0, "delta": {"content": word}} if chat
                                  else {"index": 0, "text": word})
        choice["finish_reason"] = "stop" if i == chunks - 1 else None
        events.append(_sse({"id": f"chatcmpl-{name}", "object": kind, "created": 0,
                            "model": model, "choices": [choice]}))
    options = body.get("stream_options") or {}
    if options.get("include_usage"):
        events.append(_sse({"id": f"chatcmpl-{name}", "object": kind, "created": 0,
                            "model": model, "choices": [],
                            "usage": {"prompt_tokens": prompt, "completion_tokens": chunks,
                                      "total_tokens": prompt + chunks}}))
    events.append(b"data: [DONE]\n\n")
    return events


# -- the benchmark's upstream ---------------------------------------------------------------

_FAST_JSON = json.dumps(_answer("/v1/chat/completions", {"model": "bench", "messages": "hi"},
                                "fast")).encode()
_FAST_SSE = b"".join(_stream_events("/v1/chat/completions",
                                    {"model": "bench", "messages": "hi",
                                     "stream_options": {"include_usage": True}}, "fast", 8))


def _http(body: bytes, content_type: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: " + content_type + b"\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


_FAST_ANSWERS = (_http(_FAST_JSON, b"application/json"), _http(_FAST_SSE, b"text/event-stream"))


class _FastProtocol(asyncio.Protocol):
    """Keep-alive HTTP/1.1 with canned answers: the whole stream when the body asks for one."""

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            length = 0
            at = head.find(b"content-length:")
            if at >= 0:
                length = int(head[at + 15 : head.find(b"\r\n", at) if head.find(b"\r\n", at) > 0
                                   else len(head)])
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            stream = b'"stream":true' in body.replace(b" ", b"")
            assert self.transport is not None
            self.transport.write(_FAST_ANSWERS[1 if stream else 0])


async def serve_fast(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_FastProtocol, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


# -- the streaming benchmark's upstream -----------------------------------------------------

_CHUNKED_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")


def _framed(event: bytes) -> bytes:
    """One SSE event as one HTTP/1.1 chunk, the way vLLM's server (uvicorn) frames it."""
    return b"%x\r\n%b\r\n" % (len(event), event)


def streaming_events(chunks: int, usage: bool) -> list[bytes]:
    """The stream :func:`serve_streaming` sends, already framed: ``chunks`` content chunks
    of a chat completion, the usage chunk when asked for, ``[DONE]``, the last chunk."""
    body: dict[str, Any] = {"model": "bench", "messages": "hi"}
    if usage:
        body["stream_options"] = {"include_usage": True}
    events = _stream_events("/v1/chat/completions", body, "stream", chunks)
    return [_framed(event) for event in events] + [b"0\r\n\r\n"]


class _StreamingProtocol(asyncio.Protocol):
    """Keep-alive HTTP/1.1 answering every request with a stream written event by event.

    Each event is its own ``transport.write`` (with TCP_NODELAY, asyncio's default:
    its own ``send``) and the next one is written on the next turn of the loop, so
    the streams of all connections interleave as an engine's token loop does. The
    client's pace is respected: while the socket's buffer is full nothing is written.
    """

    def __init__(self, answers: tuple[list[bytes], list[bytes]]) -> None:
        self.answers = answers
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.queue: list[bytes] = []  # what is left of the stream being sent
        self.at = 0
        self.paused = False
        self.scheduled = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.queue, self.transport = [], None

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._schedule()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._next_request()

    def _next_request(self) -> None:
        if self.at < len(self.queue):
            return  # one answer at a time; a pipelined request waits for this one's end
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end].lower()
        at = head.find(b"content-length:")
        length = 0
        if at >= 0:
            stop = head.find(b"\r\n", at)
            length = int(head[at + 15 : stop if stop > 0 else len(head)])
        if len(self.buffer) < end + 4 + length:
            return
        body = self.buffer[end + 4 : end + 4 + length].replace(b" ", b"")
        self.buffer = self.buffer[end + 4 + length :]
        assert self.transport is not None
        self.transport.write(_CHUNKED_HEAD)
        self.queue, self.at = self.answers[b'"include_usage":true' in body], 0
        self._schedule()

    def _schedule(self) -> None:
        if not self.scheduled and not self.paused and self.at < len(self.queue):
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self._write_one)

    def _write_one(self) -> None:
        self.scheduled = False
        if self.transport is None or self.at >= len(self.queue):
            return
        self.transport.write(self.queue[self.at])
        self.at += 1
        if self.at < len(self.queue):
            self._schedule()
        else:
            self._next_request()


async def serve_streaming(port: int, chunks: int) -> None:
    """Answer every request on ``port`` with a stream of ``chunks`` content chunks."""
    answers = (streaming_events(chunks, usage=False), streaming_events(chunks, usage=True))
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _StreamingProtocol(answers), "127.0.0.1", port,
                                      backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--stream-chunks", type=int, default=0,
                        help="answer every request with a stream of this many chunks, "
                             "each written separately (the streaming benchmark)")
    options = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        if options.stream_chunks:
            asyncio.run(serve_streaming(options.port, options.stream_chunks))
        else:
            asyncio.run(serve_fast(options.port))
