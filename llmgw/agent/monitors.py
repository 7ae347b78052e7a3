"""The agent's view of its units over time: observe, probe, publish changes.

:class:`Monitor` turns the backend's process states and the readiness probes
into :class:`llmgw.fleet.Unit` values, every ``poll_interval`` and whenever
asked (after an apply). Each change of a unit's state, pid, digest or port
is published to every watcher (the ``WatchUnits`` stream), so the daemon
reacts without polling. A watcher that falls too far behind is dropped; it
reconnects and gets a fresh snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

import httpx

from llmgw.agent import listeners, readiness, unitlogs
from llmgw.agent.settings import ReadinessSettings
from llmgw.agent.units import Backend, Evidence, Observation
from llmgw.fleet.types import Unit

log = logging.getLogger(__name__)

FAILED_LOG_LINES = 50
WATCH_QUEUE = 1024
_NAME = re.compile(r"^llmgw-(?P<model>.+)-r(?P<replica>\d+)-s(?P<rank>\d+)\.service$")


Prober = Callable[[Observation], Awaitable[
    tuple["readiness.Probe | None", "listeners.Finding | None"]]]
"""Who holds a unit's port and what its engine answers; the real one asks the kernel and
HTTP, the fleet simulator's stand-in engines answer from memory."""


@dataclass(frozen=True)
class Event:
    unit: Unit
    removed: bool = False


def _key(unit: Unit) -> tuple[object, ...]:
    # The detail is left out: it carries countdowns that change every tick. A
    # fetch's progress is the exception: watchers (apply's live table) show it.
    progress = unit.detail if unit.state == "fetching" else ""
    return (unit.state, unit.pid, unit.digest, unit.port, progress, unit.port_holder)


class Monitor:
    """Unit states for one backend; ``run()`` refreshes them until cancelled."""

    def __init__(
        self, backend: Backend, settings: ReadinessSettings | None = None,
        client: httpx.AsyncClient | None = None, prober: Prober | None = None,
    ) -> None:
        self.backend = backend
        self.prober: Prober = prober or self._probe
        self.settings = settings or ReadinessSettings()
        # A prober of its own needs no HTTP client (each costs a TLS context to make).
        self._client = client if client is not None or prober is not None \
            else httpx.AsyncClient(trust_env=False)
        self.listeners = listeners.Listeners()
        self._units: dict[str, Unit] = {}
        self._watchers: set[asyncio.Queue[Event | None]] = set()
        self._refreshing = asyncio.Lock()
        self._wake = asyncio.Event()
        # A unit held back by the agent (waiting for its weights) is reported as
        # the overlay says, not as "stopped": name → (state, detail) or None.
        self.overlay: Callable[[str], tuple[str, str] | None] = lambda name: None

    @property
    def units(self) -> list[Unit]:
        return [self._units[name] for name in sorted(self._units)]

    async def refresh(self) -> list[Unit]:
        """Observe every unit now, probe the running ones, publish what changed."""
        async with self._refreshing:
            await self.backend.tick()
            observations = await self.backend.observe()
            probes = await asyncio.gather(*(self.prober(obs) for obs in observations))
            current: dict[str, Unit] = {}
            for obs, (found, listening) in zip(observations, probes, strict=True):
                current[obs.name] = await self._unit(obs, found, listening)
            for name, unit in current.items():
                before = self._units.get(name)
                if before is None or _key(before) != _key(unit):
                    self._publish(Event(unit))
            for name in self._units.keys() - current.keys():
                self._publish(Event(self._units[name], removed=True))
            self._units = current
            return self.units

    def poke(self) -> None:
        """Refresh soon (after an apply) rather than at the next interval."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:  # the monitor must outlive any one bad refresh
                log.exception("refreshing unit states failed; retrying")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.poll_interval)

    def end_watches(self) -> None:
        """End every watch stream (the agent is shutting down)."""
        for queue in list(self._watchers):
            self._drop(queue)

    async def close(self) -> None:
        self.end_watches()
        if self._client is not None:
            await self._client.aclose()

    async def watch(self) -> AsyncGenerator[Event, None]:
        """Every unit now, then each change as it happens."""
        queue: asyncio.Queue[Event | None] = asyncio.Queue(WATCH_QUEUE)
        for unit in self.units:
            queue.put_nowait(Event(unit))
        self._watchers.add(queue)
        try:
            while (event := await queue.get()) is not None:
                yield event
        finally:
            self._watchers.discard(queue)

    # ---- internals ----------------------------------------------------------

    def _publish(self, event: Event) -> None:
        for queue in list(self._watchers):
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                log.warning("a unit watcher fell %d events behind; dropping it", WATCH_QUEUE)
                self._drop(queue)

    def _drop(self, queue: asyncio.Queue[Event | None]) -> None:
        self._watchers.discard(queue)
        while not queue.empty():
            queue.get_nowait()
        queue.put_nowait(None)

    async def _probe(
        self, obs: Observation,
    ) -> tuple[readiness.Probe | None, listeners.Finding | None]:
        """Who listens on the unit's port, then, when it is the unit itself, the probes."""
        if obs.process == "stopped" or obs.labels is None or obs.labels.port is None:
            return None, None
        port = obs.labels.port
        listening = await asyncio.to_thread(
            self.listeners.check, port, obs.name, obs.pid, self.backend.unit_of)
        if obs.process != "running" or (listening.known and not listening.ours):
            return None, listening
        if self._client is None:
            self._client = httpx.AsyncClient(trust_env=False)
        found = await readiness.probe(self._client, port, self.settings.probe_timeout)
        return found, listening

    async def _unit(
        self, obs: Observation, found: readiness.Probe | None,
        listening: listeners.Finding | None = None,
    ) -> Unit:
        state, detail = readiness.state(obs, found, listening)
        held = self.overlay(obs.name) if obs.process in ("stopped", "failed") else None
        if held is not None:
            state, detail = held  # type: ignore[assignment]
        before = self._units.get(obs.name)
        if before is not None and before.state == state:
            since = before.since
        elif before is None and obs.since is not None:
            since = obs.since
        else:
            since = time.time()
        log_tail: list[str] = []
        # Why a unit failed, or why it is being restarted, is in its last lines.
        if state == "failed" or (obs.process == "activating" and obs.detail):
            with contextlib.suppress(KeyError, OSError, unitlogs.LogError):
                log_tail = await self.backend.logs(obs.name, unitlogs.Query(FAILED_LOG_LINES))
        if obs.labels is not None:
            labels = obs.labels
            model, replica, rank = labels.model, labels.replica, labels.rank
            digest, port, raw = labels.digest, labels.port, dict(labels.raw)
        else:
            match = _NAME.match(obs.name)
            model = match.group("model") if match else ""
            replica = int(match.group("replica")) if match else 0
            rank = int(match.group("rank")) if match else 0
            digest, port, raw = "", None, {}
        evidence = obs.evidence or Evidence()
        return Unit(
            name=obs.name, model=model, replica=replica, rank=rank, digest=digest, state=state,
            port=port, pid=obs.pid, since=since, log_tail=log_tail, detail=detail, labels=raw,
            restarts=evidence.restarts, last_exit=evidence.last_exit,
            last_exit_at=evidence.last_exit_at, crashes=list(evidence.crashes),
            stopped_by=evidence.stopped_by if state == "stopped" else "",
            written_by_llmgw=evidence.written,
            port_holder=listening.holder if listening is not None else "",
        )
