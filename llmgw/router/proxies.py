"""Forwarding one request to an engine: pick, retry before the first byte, relay.

:class:`Proxy` owns the one :class:`aiohttp.ClientSession` (a pooled,
keep-alive connector) every request goes through. ``forward`` picks the
replica with the fewest outstanding requests; a connection error or a 5xx
*before any byte reached the client* is retried once on another replica. For
a stream that point is the first chunk: the client's response starts only
once the engine has sent one, so a replica dying between its headers and its
first token is still retried; after that, a failure ends the client's stream
with an OpenAI-style ``error`` event instead — and so does a stream that ends
without its last event (``[DONE]``, ``response.completed``): an engine that
closes a close-delimited body early has not finished, however clean the close.

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
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from llmgw.router import streams, usages
from llmgw.router.errors import ApiError
from llmgw.router.routes import Routes, Upstream

_UPSTREAM_HEADERS = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
_STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass
class Outcome:
    """What happened, for metrics and the usage row."""

    status: int = 0
    usage: usages.Usage | None = None
    first_byte_at: float | None = None  # loop time the client got its first byte
    retries: int = 0
    sent: bool = False  # the request reached an engine
    relayed: int = 0  # stream events relayed to the client


class _Retry(Exception):
    """This replica failed before the first byte reached the client."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error


class Proxy:
    def __init__(self, routes: Routes, connect_timeout: float = 5.0) -> None:
        self.routes = routes
        self.connect_timeout = connect_timeout
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=0, keepalive_timeout=60, enable_cleanup_closed=False
            )
            # No total or read timeout: a generation may legitimately run for minutes;
            # a client that gives up cancels us instead.
            timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=self.connect_timeout, connect=self.connect_timeout
            )
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=timeout, auto_decompress=False,
                skip_auto_headers=("User-Agent",),
                # Engines set no cookies worth keeping; skipping the jar saves work per request.
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

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
    ) -> web.StreamResponse:
        """Send ``body`` to a ready replica of ``model`` and answer ``request`` with its reply.

        ``affinity`` (a prompt-prefix digest) picks by prefix with bounded loads
        instead of least outstanding; a retry goes to the next replica on the ring.
        """
        tried: list[Upstream] = []
        last_error: ApiError | None = None
        for _ in range(2):
            upstream = self.routes.pick(model, exclude=tried, affinity=affinity,
                                        load_factor=load_factor)
            if upstream is None:
                break
            if tried:
                outcome.retries += 1
                on_retry()
            tried.append(upstream)
            try:
                return await self._attempt(
                    request, upstream, body, stream, strip_usage_chunk, outcome,
                    can_retry=len(self.routes.endpoints(model)) > len(tried),
                    first_byte_timeout=first_byte_timeout,
                )
            except _Retry as retry:
                last_error = retry.error
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
    ) -> web.StreamResponse:
        url = upstream.url(request.path)
        upstream.outstanding += 1
        reply: aiohttp.ClientResponse | None = None
        done = False
        deadline = asyncio.get_running_loop().time() + first_byte_timeout
        try:
            outcome.sent = True
            try:
                async with asyncio.timeout_at(deadline):
                    reply = await self._client().post(url, data=body, headers=_UPSTREAM_HEADERS)
            except TimeoutError as exc:
                if asyncio.get_running_loop().time() >= deadline:
                    raise _too_slow(upstream, first_byte_timeout) from exc
                raise _Retry(_unreachable(upstream, exc)) from exc
            except aiohttp.ClientConnectionError as exc:
                raise _Retry(_unreachable(upstream, exc)) from exc
            if reply.status >= 500 and can_retry:
                raise _Retry(ApiError(reply.status, f"replica {_name(upstream)} answered "
                                      f"{reply.status}"))
            content_type = reply.headers.get("Content-Type", "application/json")
            if stream and content_type.startswith("text/event-stream"):
                response = await self._relay(
                    request, reply, upstream, content_type, strip_usage_chunk, outcome,
                    can_retry, deadline, first_byte_timeout,
                )
                done = True
                return response
            try:
                async with asyncio.timeout_at(deadline):
                    data = await reply.read()
            except TimeoutError as exc:
                raise _too_slow(upstream, first_byte_timeout) from exc
            except aiohttp.ClientError as exc:
                raise _Retry(_unreachable(upstream, exc)) from exc
            if reply.status < 400 and _close_delimited(reply) and not _is_json(data):
                # Ended by closing the connection, so a cut-short answer looks whole at
                # the HTTP level; only the document can tell.
                raise ApiError(502, f"replica {_name(upstream)} closed the connection "
                               "before its answer was complete", code="upstream_failed")
            outcome.status = reply.status
            if reply.status < 400:
                outcome.usage = usages.from_body(data)
            done = True
            return web.Response(
                status=reply.status, body=data, headers={"Content-Type": content_type}
            )
        finally:
            upstream.outstanding -= 1
            if reply is not None:
                if done:
                    reply.release()  # back to the pool for the next request
                else:
                    # Failed, retried or cancelled (the client hung up): closing the
                    # connection is what tells the engine to stop generating.
                    reply.close()

    async def _relay(
        self,
        request: web.Request,
        reply: aiohttp.ClientResponse,
        upstream: Upstream,
        content_type: str,
        strip_usage_chunk: bool,
        outcome: Outcome,
        can_retry: bool,
        deadline: float,
        first_byte_timeout: float,
    ) -> web.StreamResponse:
        relay = streams.Relay(strip_usage_chunk)
        try:
            async with asyncio.timeout_at(deadline):
                first = await reply.content.readany()
        except TimeoutError as exc:
            raise _too_slow(upstream, first_byte_timeout) from exc
        except aiohttp.ClientError as exc:
            error = _unreachable(upstream, exc)
            if can_retry:
                raise _Retry(error) from exc
            raise error from exc
        try:
            return await self._relay_events(request, reply, upstream, content_type, relay,
                                            first, outcome)
        finally:
            # Also when the client hung up (cancelled): what was served is charged.
            outcome.usage = relay.usage
            outcome.relayed = relay.events

    async def _relay_events(
        self,
        request: web.Request,
        reply: aiohttp.ClientResponse,
        upstream: Upstream,
        content_type: str,
        relay: streams.Relay,
        first: bytes,
        outcome: Outcome,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            status=reply.status, headers={"Content-Type": content_type, **_STREAM_HEADERS}
        )
        outcome.status = reply.status
        await response.prepare(request)
        failure: BaseException | None = None
        # The loop runs once per read of the engine's stream (often one event each): it
        # holds only what it calls, and logs, times and counts nothing per event.
        feed, write, read = relay.feed, response.write, reply.content.readany
        chunk = first
        while chunk:
            out = feed(chunk)
            if out:
                if outcome.first_byte_at is None:
                    outcome.first_byte_at = time.monotonic()
                await write(out)  # a client that hung up raises here: no retry
            try:
                chunk = await read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                failure = exc
                break
        if failure is None:
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
        await response.write_eof()
        return response


def _name(upstream: Upstream) -> str:
    endpoint = upstream.endpoint
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


def _close_delimited(reply: aiohttp.ClientResponse) -> bool:
    """A body that ends when the connection closes: no length, not chunked."""
    headers = reply.headers
    return "Content-Length" not in headers and "chunked" not in headers.get(
        "Transfer-Encoding", "").lower()


def _is_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except (ValueError, RecursionError):
        return False
    return True
