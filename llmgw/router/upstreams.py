"""Requests to engines on connections the router reads itself.

aiohttp's client hands a body over through a StreamReader: a future, a task
wake-up and per-piece bookkeeping between the engine's socket read and the
relay's write. For a stream of hundreds of small events that is most of the
router's cost per event. Here the engine's socket read *is* the relay: an
:class:`Connection` (an :class:`asyncio.Protocol`) parses the head
(:mod:`llmgw.router.framings`), then its ``data_received`` de-chunks the read
and calls the relay's sink in the same callback, which writes to the client's
transport — one write per read, however many chunks the read held. A plain
(non-streamed) answer takes the same path with a sink that collects the body,
so it too is read in the protocol's callbacks, with no StreamReader.

Why not take over aiohttp's connection after its headers: its parser may have
consumed part of a chunk already, and that state is not reachable. So the
connection is ours from the request on: :class:`Pool` opens connections
(``connect_timeout``, TLS for ``https``), keeps up to ``max_idle`` idle ones per
engine for ``idle_timeout`` seconds, and reuses one only after its previous
response ended exactly at the body's end on a keep-alive connection.

Flow control both ways: the sink returns False when the client's transport is
above its high-water mark; the connection then stops reading the engine (the
engine's socket buffer fills and it stops sending) until :meth:`Connection.resume`.
Before a sink is attached, at most ``EARLY_LIMIT`` bytes of payload are held.

Errors (the engine closing early, a framing error) end the body with an
exception; nothing here logs, and no message quotes the engine's bytes.

Usage::

    conn, reused = await pool.acquire(upstream.endpoint.base_url)
    conn.send(request_bytes)
    head = await conn.head
    ...  # conn.attach(sink); await conn.ended
    pool.release(conn)  # or conn.close()
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import cast

from yarl import URL

from llmgw.router import framings

EARLY_LIMIT = 1 << 20

Sink = Callable[[bytes], bool]  # payload -> whether to keep reading


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection to an engine, one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.head: asyncio.Future[framings.Head] = loop.create_future()
        self.ended: asyncio.Future[None] = loop.create_future()
        self.received = 0  # bytes of the current response read so far
        self.idle_since = 0.0
        self._buffer = b""  # the head, until it is whole
        self._body = framings.CLOSE
        self._left = 0  # LENGTH: bytes still to come
        self._dechunker: framings.Dechunker | None = None
        self._sink: Sink | None = None
        self._early: list[bytes] = []
        self._early_size = 0
        self._paused = False
        self._keep_alive = False
        self._lost = False
        self._waiter: asyncio.Future[None] | None = None  # first() waiting

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports are not asyncio's classes.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        dechunker, sink = self._dechunker, self._sink
        if dechunker is not None and sink is not None and dechunker.error is None:
            # The relay's path, once per read of a stream: decode, hand on, done.
            try:
                payload = dechunker.feed(data)
                if dechunker.error is None and not dechunker.done:
                    if payload and not sink(payload):
                        self.pause()
                    return
                self._chunked_end(dechunker, payload)
            except framings.FramingError as exc:
                self._fail(exc)
            except Exception as exc:  # noqa: BLE001 - a bug must end the stream, not the loop
                self._fail(ConnectionError(f"the relay failed ({type(exc).__name__})"))
            return
        self.received += len(data)
        try:
            if not self.head.done():
                self._buffer += data
                parsed = framings.parse_head(self._buffer)
                if parsed is None:
                    return
                head, start = parsed
                data, self._buffer = self._buffer[start:], b""
                self._start_body(head)
                self.head.set_result(head)
                if self.ended.done() or not data:
                    return
            if self.ended.done():
                self._keep_alive = False  # bytes after the body: never reuse
                return
            self._payload(data)
        except framings.FramingError as exc:
            self._fail(exc)
        except Exception as exc:  # noqa: BLE001 - the class only: a message may quote bytes
            self._fail(ConnectionError(f"the relay failed ({type(exc).__name__})"))

    def eof_received(self) -> bool:
        self._keep_alive = False
        if self.head.done() and self._body == framings.CLOSE:
            self._end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._keep_alive = False
        if self.head.done() and self._body == framings.CLOSE:
            self._end()
        self._fail(exc or ConnectionResetError("the engine closed the connection"))

    # the body

    def _start_body(self, head: framings.Head) -> None:
        self._body, self._keep_alive = head.body, head.keep_alive
        if head.body == framings.CHUNKED:
            self._dechunker = framings.Dechunker()
        elif head.body == framings.LENGTH:
            self._left = head.length
            if not head.length:
                self._end()
        elif head.body == framings.EMPTY:
            self._end()

    def _payload(self, data: bytes) -> None:
        dechunker = self._dechunker
        if dechunker is not None:
            data = dechunker.feed(data)
            if dechunker.error is not None or dechunker.done:
                self._chunked_end(dechunker, data)
                return
        elif self._body == framings.LENGTH:
            if len(data) >= self._left:
                if len(data) > self._left:
                    self._keep_alive = False
                    data = data[:self._left]
                self._left = 0
                self._deliver(data)
                self._end()
                return
            self._left -= len(data)
        self._deliver(data)

    def _chunked_end(self, dechunker: framings.Dechunker, payload: bytes) -> None:
        """The body's last payload, or what came before a framing error (raised after)."""
        self._deliver(payload)  # what came before an error still reaches the client
        if dechunker.error is not None:
            raise dechunker.error
        if dechunker.extra:
            self._keep_alive = False
        self._end()

    def _deliver(self, data: bytes) -> None:
        if not data:
            return
        sink = self._sink
        if sink is None:
            self._early.append(data)
            self._early_size += len(data)
            if self._early_size >= EARLY_LIMIT:
                self.pause()
            self._wake()
        elif not sink(data):
            self.pause()

    def _end(self) -> None:
        if not self.ended.done():
            self.ended.set_result(None)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if not self.head.done():
            self.head.set_exception(exc)
            self.head.exception()  # retrieved: a caller gone by now must not warn
        if not self.ended.done():
            self.ended.set_exception(exc)
            self.ended.exception()
        self._keep_alive = False
        self._wake()
        if self.transport is not None:
            self.transport.close()

    # for the relay

    def send(self, request: bytes) -> None:
        assert self.transport is not None
        self.transport.write(request)

    def early(self) -> bytes:
        """The payload that came before a sink was attached (taken: asked once)."""
        data = b"".join(self._early)
        self._early.clear()
        self._early_size = 0
        if self._sink is None:
            self.resume()
        return data

    async def first(self) -> bytes:
        """The payload that came so far, waiting for some; b"" when the body ended first."""
        if not self._early and not self.ended.done():
            self._waiter = self.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.early()

    def attach(self, sink: Sink) -> None:
        """From now on, payload goes to ``sink`` as it arrives."""
        self._sink = sink

    def pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self._lost:
            self._paused = False
            self.transport.resume_reading()

    @property
    def reusable(self) -> bool:
        return (self.ended.done() and self.ended.exception() is None and self._keep_alive
                and not self._lost and self.transport is not None
                and not self.transport.is_closing())

    def reset(self) -> None:
        """Ready for the next request on this connection."""
        self.head = self.loop.create_future()
        self.ended = self.loop.create_future()
        self.received = 0
        self._buffer, self._dechunker, self._sink = b"", None, None
        self._body, self._left = framings.CLOSE, 0
        self._early.clear()
        self._early_size = 0
        self.resume()

    def close(self) -> None:
        self._keep_alive = False
        if self.transport is not None:
            self.transport.close()


class Pool:
    """Connections to engines by base URL: opened on demand, idle ones reused."""

    def __init__(self, connect_timeout: float, *, max_idle: int = 256,
                 idle_timeout: float = 4.0) -> None:
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        # Below common engines' keep-alive (llama-server: 5 s), so an idle connection
        # is dropped by us before the engine closes it under a request.
        self.idle_timeout = idle_timeout
        self._idle: dict[str, list[Connection]] = {}
        self._tails: set[Connection] = set()  # released before their body ended

    async def acquire(self, base_url: str, fresh: bool = False) -> tuple[Connection, bool]:
        """A connection to ``base_url``, and whether it was used before (never if ``fresh``)."""
        idle = None if fresh else self._idle.get(base_url)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            transport = conn.transport
            if (transport is not None and not transport.is_closing()
                    and now - conn.idle_since < self.idle_timeout):
                conn.reset()
                return conn, True
            conn.close()
        loop = asyncio.get_running_loop()
        url = URL(base_url)
        secure = url.scheme == "https"
        if url.host is None or url.port is None:
            raise OSError("the replica's URL has no host")
        async with asyncio.timeout(self.connect_timeout):
            _, conn = await loop.create_connection(
                lambda: Connection(loop), url.host, url.port,
                ssl=True if secure else None)
        return conn, False

    def release(self, base_url: str, conn: Connection) -> None:
        """Keep ``conn`` for the next request if its response ended cleanly; else close it.

        A stream is released once its last event was relayed, which may be before
        the engine ends the body (its last chunk): the tail is then read here, for
        at most ``idle_timeout`` seconds, and the connection kept if it ends cleanly.
        """
        if not conn.ended.done():
            self._tails.add(conn)
            timer = conn.loop.call_later(self.idle_timeout, conn.close)

            def ended(_: object) -> None:
                timer.cancel()
                self._tails.discard(conn)
                self.release(base_url, conn)

            conn.ended.add_done_callback(ended)
            conn.resume()  # paused by a slow client, perhaps: the tail must be read
            return
        idle = self._idle.setdefault(base_url, [])
        if conn.reusable and len(idle) < self.max_idle:
            conn.idle_since = time.monotonic()
            idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conn in list(self._tails):
            conn.close()
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
