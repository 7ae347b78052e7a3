"""Each ready engine's own load, read from its metrics endpoint for a report.

:class:`Scraper` asks every READY unit that serves HTTP (rank 0 with a port)
for ``/metrics`` once per report, in parallel up to ``parallel`` engines at a
time, each within ``timeout`` seconds and ``MAX_BYTES``, and parses the answer
with :mod:`llmgw.discovery.enginemetrics`. It keeps each unit's last token
counter (with the pid it came from: a restarted engine starts from zero), so
the next report has a rate. A scrape that fails leaves the figures absent and
says why in the load's ``error``; it never fails the report.

Usage::

    scraper = scrapes.Scraper(client, timeout=2.0)
    units = await scraper.loads(units)   # each ready unit with its .load
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import httpx

from llmgw.discovery import enginemetrics
from llmgw.fleet.types import EngineLoad, Unit

PARALLEL = 8


def scraped(unit: Unit) -> bool:
    """Whether a report reads this unit's engine: ready, rank 0, an HTTP port."""
    return unit.state == "ready" and unit.rank == 0 and unit.port is not None


class Loads(Protocol):
    """What a report asks of a scraper (the fleet simulator's engines have no metrics)."""

    async def loads(self, units: Sequence[Unit]) -> list[Unit]: ...

    async def close(self) -> None: ...


class Scraper:
    def __init__(self, client: httpx.AsyncClient, timeout: float,
                 parallel: int = PARALLEL, clock: Callable[[], float] = time.time) -> None:
        self._client = client
        self._timeout = timeout
        self._gate = asyncio.Semaphore(parallel)
        self._clock = clock
        # unit name → (pid, token counter, unix time) of its last scrape with a counter.
        self._counters: dict[str, tuple[int | None, float, float]] = {}

    async def loads(self, units: Sequence[Unit]) -> list[Unit]:
        """``units`` with ``load`` set on each one a report reads (see :func:`scraped`)."""
        wanted = [u for u in units if scraped(u) and u.engine in enginemetrics.NAMES]
        found = await asyncio.gather(*(self._load(u) for u in wanted))
        by_name = {u.name: load for u, load in zip(wanted, found, strict=True)}
        for name in self._counters.keys() - {u.name for u in units}:
            del self._counters[name]
        return [u.model_copy(update={"load": by_name[u.name]}) if u.name in by_name else u
                for u in units]

    async def close(self) -> None:
        await self._client.aclose()

    async def _load(self, unit: Unit) -> EngineLoad:
        engine = unit.engine
        assert engine is not None and unit.port is not None
        async with self._gate:
            at = self._clock()
            try:
                text = await self._get(unit.port)
                figures = enginemetrics.read(engine, text)
            except (httpx.HTTPError, TimeoutError, enginemetrics.NotMetrics, _Refused) as exc:
                return EngineLoad(scraped_at=at, error=_why(exc))
        kept = self._counters.get(unit.name)
        before = (kept[1], kept[2]) if kept is not None and kept[0] == unit.pid else None
        if figures.tokens_total is not None:
            self._counters[unit.name] = (unit.pid, figures.tokens_total, at)
        return enginemetrics.load(figures, at, before)

    async def _get(self, port: int) -> str:
        url = f"http://127.0.0.1:{port}{enginemetrics.PATH}"
        async with asyncio.timeout(self._timeout):
            async with self._client.stream("GET", url, timeout=self._timeout) as answer:
                if answer.status_code != 200:
                    raise _Refused(f"{enginemetrics.PATH} answered {answer.status_code}")
                body = bytearray()
                async for chunk in answer.aiter_bytes():
                    body += chunk
                    if len(body) > enginemetrics.MAX_BYTES:
                        raise _Refused(f"{enginemetrics.PATH} answered more than "
                                       f"{enginemetrics.MAX_BYTES // 1024} KiB")
        return body.decode("utf-8", "replace")


class _Refused(Exception):
    """The endpoint answered, but not with metrics llmgw reads."""


def _why(exc: BaseException) -> str:
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return f"{enginemetrics.PATH}: no answer in time"
    if isinstance(exc, httpx.HTTPError):
        return f"{enginemetrics.PATH}: {type(exc).__name__}"
    return str(exc)
