"""The router's HTTP server: bounded connections, and no client bytes in any log.

aiohttp's own server logs a request it cannot parse (a space before a header's
colon, an obs-folded line, a bad chunk size) at ERROR with the parser's message,
which quotes the raw bytes — ``Authorization`` header and prompt included — and
answers in plain text. :func:`runner` builds an :class:`aiohttp.web.AppRunner`
whose connections differ in three ways:

* **Errors:** a request the parser refuses gets an OpenAI-shaped 400 and the
  connection is closed; an unexpected failure gets an OpenAI-shaped 500. The log
  says which exception class, and where in the code for a 500 — never the
  exception's message, which may quote the request.
* **Header timeout:** a connection must finish its request line and headers within
  ``header_timeout`` seconds of opening (and of the previous answer, when kept
  alive), or it is closed: half-sent headers cannot hold sockets forever.
* **Connection limit:** past ``max_connections`` open connections, a new one is
  answered ``503`` with ``Retry-After`` and closed at once, before the process runs
  out of descriptors (when ``accept()`` itself would fail and every client,
  ``/health`` included, would wait).

:func:`raise_open_files_limit` lifts the soft ``RLIMIT_NOFILE`` to the hard limit
at start, and :func:`connection_limit` keeps ``max_connections`` below it.

Usage::

    connections.raise_open_files_limit()
    runner = connections.runner(app, header_timeout=15, max_connections=4096)

``llmgw mirror serve`` runs its own application on the same connections
(``service=connections.MIRROR``): only the words of its refusals differ.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import traceback
from dataclasses import dataclass
from functools import cache
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from llmgw.router.errors import ApiError

log = logging.getLogger("llmgw.router")


@dataclass(frozen=True)
class Service:
    """Who answers on these connections: the name its refusals and log lines use."""

    name: str
    internal_error: str  # the message of a 500


ROUTER = Service("router", "internal error in the router; nothing was charged")
MIRROR = Service("mirror", "internal error in the mirror")


@cache
def _busy(service: Service) -> bytes:
    body = json.dumps({"error": {
        "message": f"the {service.name} has too many open connections; retry in 1 s",
        "type": "server_error", "param": None, "code": "too_many_connections"}}).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Retry-After: 1\r\nConnection: close\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


_LINGER = 1.0  # seconds a refused connection may still send before it is closed
_DESCRIPTORS_KEPT = 256  # for upstream connections, the store, logs: not for clients


def _where(exc: BaseException | None) -> str:
    """The innermost frame of ``exc``'s traceback, as file:line (no message)."""
    if exc is None or exc.__traceback__ is None:
        return "?"
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{frame.filename}:{frame.lineno}"


class _Handler(RequestHandler):
    """aiohttp's connection handler, with the limits and quiet errors above."""

    def __init__(self, manager: web.Server, *, max_connections: int, service: Service,
                 **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._max_connections = max_connections
        self._service = service
        self._refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        manager = self._manager
        if manager is not None and len(manager.connections) >= self._max_connections:
            self._refused = True
            assert isinstance(transport, asyncio.Transport)
            transport.write(_busy(self._service))
            # Half-close and drop what the client still sends for a moment: closing at
            # once with its request unread would reset the connection, and the client
            # would see the reset instead of the 503.
            if transport.can_write_eof():
                transport.write_eof()
            asyncio.get_running_loop().call_later(_LINGER, transport.close)
            return
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._refused:
            super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._refused:
            super().connection_lost(exc)

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        exc = exc if isinstance(exc, BaseException) else None
        log.error("%s connection failed: %s at %s (message withheld: it may quote the "
                  "request)", self._service.name, type(exc).__name__ if exc else "error",
                  _where(exc))

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """Answer a request aiohttp could not parse, or a handler's crash, in OpenAI's shape."""
        kind = type(exc).__name__ if exc is not None else "error"
        if status < 500:
            log.debug("refused a malformed HTTP request (%s)", kind)
            error = ApiError(status, f"malformed HTTP request ({kind}); nothing was done",
                             code="invalid_request")
        else:
            log.error("request failed: %s at %s (message withheld: it may quote the request)",
                      kind, _where(exc))
            error = ApiError(status, self._service.internal_error, code="internal_error")
        if request.writer.output_size > 0:
            raise ConnectionError("an answer was under way; closing the connection")
        response = error.response()
        response.force_close()
        return response


class _Server(web.Server):
    def __call__(self) -> RequestHandler:
        return _Handler(self, loop=self._loop, **self._kwargs)


class _Runner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _Server  # same state; only the handler it makes differs
        return server


def runner(app: web.Application, *, header_timeout: float, max_connections: int,
           service: Service = ROUTER) -> web.AppRunner:
    """An AppRunner for ``app`` with the limits above; a client hanging up cancels its handler."""
    return _Runner(app, access_log=None, handler_cancellation=True,
                   keepalive_timeout=header_timeout, max_connections=max_connections,
                   service=service)


def raise_open_files_limit() -> int:
    """Lift the soft RLIMIT_NOFILE to the hard one; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open files limit from %d to %d: %s",
                        soft, wanted, exc)
    return soft


def connection_limit(wanted: int, open_files: int) -> int:
    """``wanted`` client connections, or fewer so that descriptors are left for the rest."""
    return max(1, min(wanted, open_files - _DESCRIPTORS_KEPT))
