"""Forwarding one request to an engine: pick, retry before the first byte, relay.

:class:`Proxy` owns the pool of keep-alive engine connections every request
goes through (:mod:`llmgw.router.upstreams`, an :class:`asyncio.Protocol` per
connection): a stream's engine socket read is relayed to the client's
transport in the same callback, with flow control both ways; a plain answer is
collected whole in those callbacks (at most ``_MAX_ANSWER`` bytes) and sent
once. aiohttp's client, which plain requests went through before, spent about
an eighth of the router's time per request in its request and response
machinery (docs/benchmarks.md). ``forward`` picks the replica with the
fewest outstanding requests, or the least engine-reported load, under the
model's cap (a baking canary gets its share first:
:mod:`llmgw.router.routes`); a connection error or a 5xx *before any byte
reached the client* is retried once on another replica — after a canary, on
an old one. Each attempt is tallied per replica (``routes.tallies``). For
a stream that point is the first chunk: the client's response starts only
once the engine has sent one, so a replica dying between its headers and its
first token is still retried; after that, a failure ends the client's stream
with an OpenAI-style ``error`` event instead — and so does a stream that ends
without its last event (``[DONE]``, ``response.completed``): an engine that
closes a close-delimited body early has not finished, however clean the close.
A stream is complete once its last event was written to the client, not when
the engine ends its body: a client that closes on ``[DONE]`` (the openai SDK)
was served whole, and the pool reads the engine's tail (:mod:`upstreams`).

An engine's 5xx is judged before any retry (:mod:`llmgw.router.faults`): the
client's fault (``tools param requires --jinja flag``) is answered 400
``invalid_request_error`` with the engine's message and is not retried, since
every replica would refuse it alike; it is no failure in the replica's tallies.

Time to first byte is bounded per model (``routing.first_byte_timeout``): an
engine that accepts a request and never answers gets the client a 504, not a
wait without end. There is no bound after that: a generation may run for
minutes, and a client that gives up cancels it.

Cancellation: the app runs with handler cancellation, so a client that hangs
up cancels the handler task; the ``finally`` blocks close the upstream
connection, which is how an engine learns to abort the generation.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.http_writer import StreamWriter
from yarl import URL

from llmgw.router import faults, framings, streams, upstreams, usages
from llmgw.router.errors import ApiError
from llmgw.router.externals import Externals
from llmgw.router.routes import Routes, Upstream

_STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_FAILURES = (OSError, framings.FramingError)  # an engine connection failing
_MAX_DOCUMENT = 16 * 1024 * 1024  # a stream request answered with a document, at most
_MAX_ANSWER = 256 * 1024 * 1024  # a plain answer (a large batch of embeddings), at most


@dataclass
class Outcome:
    """What happened, for metrics and the usage row."""

    status: int = 0
    usage: usages.Usage | None = None
    first_byte_at: float | None = None  # loop time the client got its first byte
    retries: int = 0
    sent: bool = False  # the request reached an engine
    relayed: int = 0  # stream events relayed to the client
    relay: streams.Relay | None = None  # the stream's relay while it runs (live counts)
    # The answer is whole at the client: a stream's last event was written to it. A
    # client that hangs up after that (the openai SDK closes on [DONE]) left nothing.
    complete: bool = False
    engine_errors: list[faults.Fault] = field(default_factory=list)  # 5xx, per attempt
    upstream: str | None = None  # the upstream (``upstreams:``) of the last attempt, if one


class _Retry(Exception):
    """This replica failed before the first byte reached the client."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error


class Proxy:
    def __init__(self, routes: Routes, connect_timeout: float = 5.0,
                 freed: Callable[[str], None] = lambda _model: None,
                 externals: Externals | None = None) -> None:
        self.routes = routes
        self.externals = externals  # the upstreams' keys, names for models, metrics
        self.freed = freed  # a request on the model ended: its admission queue may move
        self.connect_timeout = connect_timeout
        self._pool = upstreams.Pool(connect_timeout)

    async def close(self) -> None:
        self._pool.close()

    async def forward(
        self,
        request: web.Request,
        model: str,
        body: bytes,
        *,
        stream: bool,
        strip_usage_chunk: bool,
        outcome: Outcome,
        on_retry: Callable[[], None],
        affinity: str | None = None,
        load_factor: float = 1.25,
        first_byte_timeout: float = 600.0,
        cap: int | None = None,
        replicas_only: bool = False,
    ) -> web.StreamResponse:
        """Send ``body`` to a ready replica of ``model`` and answer ``request`` with its reply.

        ``replicas_only``: never to an upstream (a LoRA adapter's request: only the
        model's replicas loaded it).

        ``affinity`` (a prompt-prefix digest) picks by prefix with bounded loads
        instead of least outstanding; a retry goes to the next replica on the ring.
        ``cap``: no replica gets more requests in flight than this (a retry finding
        every other replica full answers the first failure).
        """
        tried: list[Upstream] = []
        skipped = self.routes.upstreams_of(model) if replicas_only else []
        last_error: ApiError | None = None
        for _ in range(2):
            upstream = self.routes.pick(model, exclude=[*tried, *skipped], affinity=affinity,
                                        load_factor=load_factor, cap=cap)
            if upstream is None:
                break
            if tried:
                outcome.retries += 1
                on_retry()
            tried.append(upstream)
            # Tallied per replica for rollout gates; None: the client left, no verdict.
            url, failed, began = upstream.endpoint.base_url, None, time.monotonic()
            external = upstream.endpoint.upstream or None
            outcome.upstream = external
            sent, authorization = body, None
            if external is not None and self.externals is not None:
                sent = _renamed(body, self.externals.model_name(external, model))
                authorization = self.externals.authorization(external)
            self.routes.tallies.begin(url)
            try:
                response = await self._attempt(
                    request, upstream, sent, stream, strip_usage_chunk, outcome,
                    can_retry=len(self.routes.endpoints(model)) > len(tried) + len(skipped),
                    first_byte_timeout=first_byte_timeout, authorization=authorization,
                )
                failed = outcome.status >= 500
                return response
            except _Retry as retry:
                failed = True
                last_error = retry.error
            except ApiError as error:
                failed = error.status >= 500
                raise
            finally:
                if failed is None and outcome.complete:
                    failed = False  # served whole; the client left afterwards
                self.routes.tallies.end(url, failed=failed,
                                        ttft=(outcome.first_byte_at or time.monotonic()) - began)
                if external is not None and self.externals is not None:
                    self.externals.observed(external, bool(failed), time.monotonic() - began)
                self.freed(model)
        if last_error is not None:
            raise last_error
        raise ApiError(503, f"no ready replica of {model!r}", code="no_replica",
                       headers={"Retry-After": "1"})

    async def _attempt(
        self,
        request: web.Request,
        upstream: Upstream,
        body: bytes,
        stream: bool,
        strip_usage_chunk: bool,
        outcome: Outcome,
        can_retry: bool,
        first_byte_timeout: float,
        authorization: str | None = None,
    ) -> web.StreamResponse:
        if stream:
            return await self._attempt_stream(request, upstream, body, strip_usage_chunk,
                                              outcome, can_retry, first_byte_timeout,
                                              authorization)
        base = upstream.endpoint.base_url
        message = _request_bytes(upstream.url(request.path), body, authorization)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + first_byte_timeout
        conn: upstreams.Connection | None = None
        done = False
        upstream.begin()
        try:
            outcome.sent = True
            try:
                async with asyncio.timeout_at(deadline):
                    conn, head = await self._open(base, message)
                    content_type = head.headers.get("content-type", "application/json")
                    whole = await self._whole(upstream, conn, head, content_type, outcome,
                                              can_retry, limit=_MAX_ANSWER)
            except TimeoutError as exc:
                if loop.time() >= deadline:
                    raise _too_slow(upstream, first_byte_timeout) from exc
                raise _Retry(_unreachable(upstream, exc)) from exc
            except _FAILURES as exc:
                raise _Retry(_unreachable(upstream, exc)) from exc
            done = True
            return whole
        finally:
            upstream.end()
            if conn is not None:
                if done:
                    self._pool.release(base, conn)  # kept for the next request if it can be
                else:
                    # Failed, retried or cancelled (the client hung up): closing the
                    # connection is what tells the engine to stop generating.
                    conn.close()

    async def _attempt_stream(
        self,
        request: web.Request,
        upstream: Upstream,
        body: bytes,
        strip_usage_chunk: bool,
        outcome: Outcome,
        can_retry: bool,
        first_byte_timeout: float,
        authorization: str | None = None,
    ) -> web.StreamResponse:
        """A streaming request, on a connection the router reads itself (:mod:`upstreams`)."""
        base = upstream.endpoint.base_url
        message = _request_bytes(upstream.url(request.path), body, authorization)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + first_byte_timeout
        conn: upstreams.Connection | None = None
        done = False
        upstream.begin()
        try:
            outcome.sent = True
            relay = streams.Relay(strip_usage_chunk)
            outcome.relay = relay
            try:
                async with asyncio.timeout_at(deadline):
                    conn, head = await self._open(base, message)
                    content_type = head.headers.get("content-type", "application/json")
                    if head.status >= 500 or not content_type.startswith("text/event-stream"):
                        whole = await self._whole(upstream, conn, head, content_type, outcome,
                                                  can_retry)
                        done = True
                        return whole
                    out = b""
                    while not out:
                        data = await conn.first()
                        if not data:
                            break
                        out = relay.feed(data)
            except TimeoutError as exc:
                if loop.time() >= deadline:
                    raise _too_slow(upstream, first_byte_timeout) from exc
                raise _Retry(_unreachable(upstream, exc)) from exc
            except _FAILURES as exc:
                raise _Retry(_unreachable(upstream, exc)) from exc
            if not out and conn.ended.done() and conn.ended.exception() is not None:
                error = _unreachable(upstream, conn.ended.exception() or ConnectionError())
                if can_retry:
                    raise _Retry(error)
                raise error
            try:
                response = await self._pipe(request, conn, upstream, head.status,
                                            content_type, relay, out, outcome)
            finally:
                # Also when the client hung up (cancelled): what was served is charged.
                outcome.usage = relay.usage
                outcome.relayed = relay.events
            done = True
            return response
        finally:
            upstream.end()
            if conn is not None:
                if done:
                    self._pool.release(base, conn)
                else:
                    # Failed, retried or cancelled (the client hung up): closing the
                    # connection is what tells the engine to stop generating.
                    conn.close()

    async def _open(
        self, base: str, message: bytes
    ) -> tuple[upstreams.Connection, framings.Head]:
        """Send ``message`` and read the head; a reused connection that failed before
        answering (the engine closed it while idle) is replaced by a fresh one, once."""
        conn, reused = await self._pool.acquire(base)
        conn.send(message)
        try:
            return conn, await conn.head
        except BaseException as exc:
            conn.close()  # also on a timeout or cancellation: the engine must stop
            if not reused or conn.received or not isinstance(exc, _FAILURES):
                raise
        conn, _ = await self._pool.acquire(base, fresh=True)
        conn.send(message)
        try:
            return conn, await conn.head
        except BaseException:
            conn.close()
            raise

    async def _whole(
        self, upstream: Upstream, conn: upstreams.Connection, head: framings.Head,
        content_type: str, outcome: Outcome, can_retry: bool, limit: int = _MAX_DOCUMENT,
    ) -> web.Response:
        """A plain answer, or a stream request answered with a document (an error,
        usually): read it whole, at most ``limit`` bytes; a 5xx is judged
        (:func:`_judge`) before it is retried or passed on."""
        parts: list[bytes] = []
        size = 0

        def collect(data: bytes) -> bool:
            nonlocal size
            size += len(data)
            if size > limit:
                conn.close()
                return False
            parts.append(data)
            return True

        collect(conn.early())
        conn.attach(collect)
        await asyncio.shield(conn.ended)  # a timeout must not cancel the future itself
        if size > limit:
            raise ApiError(502, f"replica {_name(upstream)} answered with a document over "
                           f"{limit} bytes", code="upstream_failed")
        data = b"".join(parts)
        if head.status >= 500:
            _judge(upstream, head.status, data, outcome, can_retry)
        if head.status < 400 and head.body == framings.CLOSE and not _is_json(data):
            raise ApiError(502, f"replica {_name(upstream)} closed the connection "
                           "before its answer was complete", code="upstream_failed")
        outcome.status = head.status
        if head.status < 400:
            outcome.usage = usages.from_body(data)
        return web.Response(status=head.status, body=data,
                            headers={"Content-Type": content_type})

    async def _pipe(
        self,
        request: web.Request,
        conn: upstreams.Connection,
        upstream: Upstream,
        status: int,
        content_type: str,
        relay: streams.Relay,
        first: bytes,
        outcome: Outcome,
    ) -> web.StreamResponse:
        """Relay the stream: the first events through aiohttp (with the headers), the
        rest from the engine's reads straight to the client's transport (:class:`_Sink`)."""
        response = web.StreamResponse(
            status=status, headers={"Content-Type": content_type, **_STREAM_HEADERS}
        )
        outcome.status = status
        await response.prepare(request)
        failure: BaseException | None = None
        if first:
            outcome.first_byte_at = time.monotonic()
            await response.write(first)  # a client that hung up raises here: no retry
            outcome.complete = relay.finished
            writer, transport = request.writer, request.transport
            assert isinstance(writer, StreamWriter) and transport is not None
            sink = _Sink(relay, transport, request.protocol, writer.chunked, outcome)
            backlog = conn.early()
            conn.attach(sink)
            if backlog and not sink(backlog):
                conn.pause()
            ended = conn.ended
            # Done at the last event, not at the engine's end of the body: a client that
            # has [DONE] may close at once, and the engine's last chunk can come later.
            while not ended.done() and not outcome.complete:
                sink.stalled = stalled = asyncio.get_running_loop().create_future()
                await asyncio.wait((stalled, ended), return_when=asyncio.FIRST_COMPLETED)
                if stalled.done() and not outcome.complete:
                    if transport.is_closing():
                        raise ConnectionResetError("the client hung up")
                    await writer.drain()
                    conn.resume()
            if not outcome.complete:
                failure = ended.exception()
        elif conn.ended.done():
            failure = conn.ended.exception()
        if failure is None and not outcome.complete:
            rest = relay.finish()
            if rest:
                await response.write(rest)
            if not relay.finished:
                failure = ConnectionError("the stream ended before its last event")
        if failure is not None:
            # Bytes already reached the client: no retry. Say so in the stream, the way
            # OpenAI reports errors mid-stream, so clients raise instead of truncating.
            outcome.status = 502
            error = _unreachable(upstream, failure)
            event = {"error": {"message": error.message, "type": "server_error",
                               "param": None, "code": "upstream_failed"}}
            await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        else:
            outcome.complete = True
        try:
            await response.write_eof()
        except ConnectionResetError:
            if not outcome.complete:
                raise
            # The client read the last event and closed first: nothing of its answer is lost.
        return response


class _Sink:
    """The engine's payload, read by read: through the relay, onto the client's transport.

    Runs inside the engine connection's ``data_received``: one call and at most one
    write per read, however many events it holds. Returns False (the engine
    connection stops reading) when the client's transport is past its high-water
    mark or closing, and wakes the handler through ``stalled``. Once the stream's
    last event is written, the answer is complete (``outcome.complete``, set here,
    in the same callback, so a client that closes right after cannot make it a
    499); the handler is woken, and what the engine sends after that is dropped.
    """

    __slots__ = ("relay", "transport", "protocol", "chunked", "outcome", "stalled")

    def __init__(self, relay: streams.Relay, transport: asyncio.BaseTransport,
                 protocol: Any, chunked: bool, outcome: Outcome) -> None:
        self.relay = relay
        self.transport = transport
        self.protocol = protocol
        self.chunked = chunked
        self.outcome = outcome
        self.stalled: asyncio.Future[None] | None = None

    def __call__(self, payload: bytes) -> bool:
        if self.outcome.complete:
            return True  # the body's tail after the last event: nothing for the client
        transport = self.transport
        if transport.is_closing():
            return self._stall()
        relay = self.relay
        out = relay.feed(payload)
        if out:
            if self.chunked:
                transport.write(b"%x\r\n%b\r\n" % (len(out), out))  # type: ignore[attr-defined]
            else:
                transport.write(out)  # type: ignore[attr-defined]
        if relay.finished:
            self.outcome.complete = True
            self._stall()  # wakes the handler, which ends the client's answer
            return True
        if self.protocol.writing_paused:
            return self._stall()
        return True

    def _stall(self) -> bool:
        stalled = self.stalled
        if stalled is not None and not stalled.done():
            stalled.set_result(None)
        return False


def _judge(upstream: Upstream, status: int, body: bytes, outcome: Outcome,
           can_retry: bool) -> None:
    """An engine's 5xx: a client fault is answered 400 here, not retried (every replica
    would refuse it alike); a server fault is retried while another replica is left."""
    fault = faults.classify(status, body)
    outcome.engine_errors.append(fault)
    if fault.client:
        raise ApiError(400, fault.message or f"the engine refused the request ({status})",
                       code=fault.reason, type="invalid_request_error")
    if can_retry:
        raise _Retry(ApiError(status, f"replica {_name(upstream)} answered {status}"))


def _request_bytes(url: URL, body: bytes, authorization: str | None = None) -> bytes:
    target = url.raw_path_qs
    if not target.isprintable() or " " in target or not target.isascii():
        raise ApiError(400, "the request path cannot be forwarded", code="invalid_request")
    # The key was checked when it was read (no space, line break or control character).
    auth = f"Authorization: {authorization}\r\n" if authorization else ""
    return (f"POST {target} HTTP/1.1\r\nHost: {url.raw_authority}\r\n{auth}"
            f"Content-Type: application/json\r\nAccept-Encoding: identity\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def _renamed(body: bytes, name: str | None) -> bytes:
    """The request for an upstream: its ``model`` is the upstream's name for the model."""
    if name is None:
        return body
    payload = json.loads(body)  # parsed once already by the router: valid JSON
    if payload.get("model") == name:
        return body
    payload["model"] = name
    return json.dumps(payload, separators=(",", ":")).encode()


def _name(upstream: Upstream) -> str:
    endpoint = upstream.endpoint
    if endpoint.upstream:
        return f"of upstream {endpoint.upstream} ({endpoint.base_url})"
    where = endpoint.base_url
    if endpoint.node:
        where = f"{endpoint.node} ({endpoint.base_url})"
    return f"r{endpoint.replica} on {where}" if endpoint.replica is not None else where


def _unreachable(upstream: Upstream, exc: BaseException) -> ApiError:
    reason = str(exc) or type(exc).__name__
    return ApiError(502, f"replica {_name(upstream)} failed: {reason}", code="upstream_failed")


def _too_slow(upstream: Upstream, timeout: float) -> ApiError:
    return ApiError(504, f"replica {_name(upstream)} sent nothing within {timeout:g} s "
                    "(the model's routing.first_byte_timeout)", code="upstream_timeout",
                    type="server_error")


def _is_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except (ValueError, RecursionError):
        return False
    return True
