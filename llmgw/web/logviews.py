"""/admin/logs/<model>/<replica>: one replica's engine log, for admins, following live.

The page shows the latest lines (or, with ``?previous=1``, the run before the
latest: what a crash ended); ``logs.js`` then follows
``/admin/logs/<model>/<replica>/events``, server-sent events that carry each
new line as the engine writes it (JSON arrays of strings, appended as text,
never as HTML). The lines come through the daemon's agents
(:class:`LogSource`, which the daemon provides): the agent bounds them and
masks the unit's secret values. A follow ends when the browser leaves: the
keep-alive comment every :data:`KEEPALIVE` seconds finds the connection
gone, and the agent's stream is cancelled with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Protocol

from aiohttp import web

if TYPE_CHECKING:
    from llmgw.web.pages import Pages

log = logging.getLogger(__name__)

LINES = 200  # the latest lines a page shows
KEEPALIVE = 15.0  # seconds between keep-alive comments of an idle follow
BATCH = 200  # most lines one event carries
MODEL = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class LogLines:
    """Lines of one unit's log: which unit ("gemma r0 s0 on gpu-01"), from where."""

    label: str
    source: str
    lines: tuple[str, ...]


class LogUnavailable(Exception):
    """The log cannot be shown; ``status`` is the HTTP status, the message says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class LogSource(Protocol):
    """What the daemon lends the pages to read a replica's log through its agent."""

    async def read(self, model: str, replica: int, shard: int | None, lines: int,
                   previous: bool) -> LogLines: ...

    def follow(self, model: str, replica: int, shard: int | None,
               lines: int) -> AsyncGenerator[LogLines, None]: ...


def install(pages: Pages, add: web.UrlDispatcher) -> None:
    add.add_get("/admin/logs/{model}/{replica}", partial(_page, pages))
    add.add_get("/admin/logs/{model}/{replica}/events", partial(_events, pages))


def _asked(pages: Pages, request: web.Request) -> tuple[LogSource, str, int, int | None]:
    pages.need(request, admin=True)
    model, replica = request.match_info["model"], request.match_info["replica"]
    shard = request.query.get("shard")
    if not MODEL.match(model) or not replica.isdigit() or len(replica) > 6 or (
            shard is not None and (not shard.isdigit() or len(shard) > 6)):
        raise web.HTTPBadRequest(text="a log is asked as /admin/logs/<model>/<replica>"
                                 "[?shard=<rank>]: a model name and numbers")
    if pages.logs is None:
        raise web.HTTPServiceUnavailable(text="this process reads no logs: they come through "
                                         "the agents of the daemon that leads")
    return pages.logs, model, int(replica), int(shard) if shard is not None else None


async def _page(pages: Pages, request: web.Request) -> web.StreamResponse:
    source, model, replica, shard = _asked(pages, request)
    previous = request.query.get("previous") == "1"
    try:
        found = await source.read(model, replica, shard, LINES, previous)
    except LogUnavailable as exc:
        raise _http(exc) from None
    query = f"?shard={shard}" if shard is not None else ""
    return pages.render(request, "admin_logs.html", found=found, model=model, replica=replica,
                        previous=previous, query=query,
                        events=f"/admin/logs/{model}/{replica}/events{query}")


def _http(exc: LogUnavailable) -> web.HTTPException:
    kinds: dict[int, type[web.HTTPException]] = {
        404: web.HTTPNotFound, 502: web.HTTPBadGateway, 503: web.HTTPServiceUnavailable}
    return kinds.get(exc.status, web.HTTPBadGateway)(text=str(exc))


async def _events(pages: Pages, request: web.Request) -> web.StreamResponse:
    source, model, replica, shard = _asked(pages, request)
    queue: asyncio.Queue[LogLines | LogUnavailable | None] = asyncio.Queue(maxsize=BATCH)

    async def pump() -> None:
        stream = source.follow(model, replica, shard, LINES)
        try:
            async for found in stream:
                await queue.put(found)  # a slow browser holds the agent back, bounded
            await queue.put(None)
        except LogUnavailable as exc:
            await queue.put(exc)
        except Exception:  # whatever broke, the page says so rather than wait for ever
            log.exception("following the log of %s r%d", model, replica)
            await queue.put(LogUnavailable(502, "the log stream broke; reload to try again"))
        finally:
            await stream.aclose()

    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-store"})
    await response.prepare(request)
    task = asyncio.create_task(pump())
    try:
        await response.write(_event("reset", []))  # a reconnect starts afresh
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), KEEPALIVE)
            except TimeoutError:
                await response.write(b": keep-alive\n\n")
                continue
            batch = [item]
            while len(batch) < BATCH and isinstance(batch[-1], LogLines) and not queue.empty():
                batch.append(queue.get_nowait())
            lines = [line for got in batch if isinstance(got, LogLines) for line in got.lines]
            if lines:
                await response.write(_event("message", lines))
            if batch[-1] is None:
                await response.write(_event("end", []))
                break
            if isinstance(batch[-1], LogUnavailable):
                await response.write(_event("failed", str(batch[-1])))
                break
    except ConnectionResetError:
        pass  # the browser left
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return response


def _event(kind: str, data: object) -> bytes:
    """One server-sent event; JSON data holds no newline, so one ``data:`` line."""
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()
