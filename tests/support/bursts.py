"""Load in phases through the router with the official ``openai`` client, and what it met.

A run is a list of phases, one after the other, against one model:

* :class:`Steady` — an open loop: one streamed completion every ``1 / rate`` seconds,
  whether or not the earlier ones have finished (what independent users send);
* :class:`Burst` — a closed loop: ``concurrency`` streams open at once, each one followed
  by the next as soon as it ends (a batch job, or many users at once);
* :class:`Quiet` — nothing new is sent; what is in flight finishes.

A phase lasts ``seconds``, or until its ``until()`` holds, whichever is first; the last
phase's requests are awaited before :meth:`Load.run` returns. Every request is recorded
as an :class:`Outcome`: its phase, when it started, its time to first token (the first
chunk with text), its HTTP status and, when it failed, why. A stream that ends without a
``finish_reason`` failed: the client saw a cut answer. Nothing is retried
(``max_retries=0``): a failure is recorded, never hidden.

Usage::

    load = bursts.Load(f"{router}/v1", "gemma3-270m")
    outcomes = await load.run([bursts.Steady(rate=1, seconds=8),
                               bursts.Burst(concurrency=8, seconds=30, until=scaled.is_set),
                               bursts.Quiet(seconds=5)])
    assert not [o for o in outcomes if not o.ok]
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import openai

PROMPT = "Write a short story about a lighthouse keeper and the sea. Once upon a time,"


def never() -> bool:
    return False


@dataclass(frozen=True)
class Steady:
    rate: float  # requests started per second
    seconds: float
    name: str = "steady"
    until: Callable[[], bool] = field(default=never, compare=False)


@dataclass(frozen=True)
class Burst:
    concurrency: int  # streams open at once
    seconds: float
    name: str = "burst"
    until: Callable[[], bool] = field(default=never, compare=False)


@dataclass(frozen=True)
class Quiet:
    seconds: float
    name: str = "quiet"
    until: Callable[[], bool] = field(default=never, compare=False)


Phase = Steady | Burst | Quiet


@dataclass(frozen=True)
class Outcome:
    """One request: times are ``time.monotonic()`` seconds (``first_token`` is relative
    to ``started``); ``status`` is None when no HTTP answer came."""

    phase: str
    started: float
    first_token: float | None
    finished: float
    status: int | None
    chunks: int
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200


class Load:
    """Streamed completions for ``model`` through ``base_url`` (the router's ``/v1``)."""

    def __init__(self, base_url: str, model: str, *, api_key: str = "unused",
                 prompt: str = PROMPT, max_tokens: int = 32, timeout: float = 120.0) -> None:
        self.model = model
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0,
                                         timeout=timeout)
        self.outcomes: list[Outcome] = []
        self.phase: str | None = None  # the phase running now, for watchers
        # Phase → when it began and when it ended (a burst: once its last stream ended).
        self.spans: dict[str, tuple[float, float]] = {}

    async def run(self, phases: Sequence[Phase]) -> list[Outcome]:
        """Every phase in turn; returns every request's outcome once all have ended."""
        pending: set[asyncio.Task[None]] = set()
        try:
            for phase in phases:
                self.phase = phase.name
                begun = time.monotonic()
                deadline = begun + phase.seconds
                if isinstance(phase, Steady):
                    await self._steady(phase, deadline, pending)
                elif isinstance(phase, Burst):
                    await self._burst(phase, deadline, pending)
                else:
                    await _until(phase.until, deadline)
                self.spans[phase.name] = (begun, time.monotonic())
            if pending:
                await asyncio.gather(*pending)
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await self.client.close()
            self.phase = None
        return sorted(self.outcomes, key=lambda o: o.started)

    async def _steady(self, phase: Steady, deadline: float,
                      pending: set[asyncio.Task[None]]) -> None:
        # Evenly spaced starts rather than random ones: the same load on every run.
        gap = 1.0 / phase.rate
        due = time.monotonic()
        while time.monotonic() < deadline and not phase.until():
            self._spawn(phase.name, pending)
            due += gap
            await asyncio.sleep(max(0.0, due - time.monotonic()))

    async def _burst(self, phase: Burst, deadline: float,
                     pending: set[asyncio.Task[None]]) -> None:
        def over() -> bool:
            return time.monotonic() >= deadline or phase.until()

        async def stream_after_stream() -> None:
            while not over():
                await self.one(phase.name)

        streams = [asyncio.create_task(stream_after_stream()) for _ in range(phase.concurrency)]
        try:
            await asyncio.gather(*streams)
        finally:
            for task in streams:
                task.cancel()

    def _spawn(self, phase: str, pending: set[asyncio.Task[None]]) -> None:
        task = asyncio.create_task(self.one(phase))
        pending.add(task)
        task.add_done_callback(pending.discard)

    async def one(self, phase: str) -> None:
        """One streamed completion, recorded whatever happens to it."""
        started = time.monotonic()
        first: float | None = None
        chunks = 0
        finished_reason: str | None = None
        status: int | None = None
        error: str | None = None
        try:
            stream = await self.client.completions.create(
                model=self.model, prompt=self.prompt, max_tokens=self.max_tokens, stream=True)
            status = 200  # the client raises for any other status before the first chunk
            async for chunk in stream:
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                if choice.text and first is None:
                    first = time.monotonic() - started
                chunks += 1
                finished_reason = choice.finish_reason or finished_reason
            if finished_reason is None:
                error = "the stream ended without a finish_reason"
        except openai.APIStatusError as exc:
            status, error = exc.status_code, f"{exc.status_code}: {exc.message}"
        except openai.APIError as exc:  # no HTTP answer: refused, reset, timed out
            error = f"{type(exc).__name__}: {exc}"
        self.outcomes.append(Outcome(phase, started, first, time.monotonic(), status, chunks,
                                     error))


async def _until(check: Callable[[], bool], deadline: float) -> None:
    while time.monotonic() < deadline and not check():
        await asyncio.sleep(0.05)


def first_tokens(outcomes: Sequence[Outcome]) -> list[float]:
    """The times to first token of the requests that had one."""
    return [o.first_token for o in outcomes if o.first_token is not None]


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile (0.5: the median), interpolated; NaN for no values."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(fraction * 100) - 1]


def failures(outcomes: Sequence[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if not o.ok]
