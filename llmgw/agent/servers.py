"""``llmgw agent serve``: the gRPC service on a unix socket, and its lifetime.

:class:`Agent` is the node side of the API, independent of gRPC: a backend,
a monitor of unit states, and a report collector. :class:`Service` maps the
gRPC methods onto it. :func:`serve` binds the socket (unix only: the way in
is SSH as a user allowed to open it, so its mode and group are the access
control), runs the monitor, and shuts down on SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import math
import os
import signal
import socket
import stat
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import httpx

from llmgw.agent import (
    commands,
    confines,
    fetchers,
    installs,
    messages,
    monitors,
    reports,
    scrapes,
    shutdowns,
    unitlogs,
)
from llmgw.agent.settings import Settings
from llmgw.agent.supervisors import Supervisor
from llmgw.agent.systemd import SystemdBackend
from llmgw.agent.units import Backend, UnitChange, UnitResult
from llmgw.discovery.fabrics import Declaration
from llmgw.fleet import deltas
from llmgw.fleet.deltas import Delta
from llmgw.fleet.types import NodeReport
from llmgw.hub import reclaims
from llmgw.proto import agent_pb2 as pb
from llmgw.proto import agent_pb2_grpc, conversions

log = logging.getLogger(__name__)

DEFAULT_LOG_LINES = 100
PROGRESS_INTERVAL = 0.25  # how often InstallEngine looks for news to send
# Pushed observations (WatchUnits with push): a full report at least this often, the
# faults (GPUs, PCI cards, fabrics) read again this often, fetches this often while one runs.
PUSH_BACKSTOP = 300.0
FACTS_INTERVAL = 60.0
FETCH_INTERVAL = 1.0


class ServeError(Exception):
    """The agent cannot start serving; the message says what to fix."""


def backend_for(settings: Settings, readonly: bool = False) -> Backend:
    """The unit backend the settings choose (``readonly``: observe only)."""
    if settings.backend_kind == "systemd":
        return SystemdBackend(settings.systemd, state_dir=Path(settings.state_dir) / "systemd",
                              readonly=readonly)
    return Supervisor(Path(settings.state_dir), settings.supervise, readonly=readonly)


class Agent:
    """The node agent without its transport: report, apply, logs, watch."""

    def __init__(self, settings: Settings, backend: Backend | None = None, *,
                 run: commands.Runner | None = None, prober: monitors.Prober | None = None,
                 scraper: scrapes.Loads | None = None,
                 facts_interval: float = FACTS_INTERVAL) -> None:
        """``run``, ``prober`` and ``scraper`` replace how commands run, how readiness is
        probed and how engines' loads are read: the fleet simulator's stand-ins."""
        self.settings = settings
        self.backend = backend if backend is not None else backend_for(settings)
        self.monitor = monitors.Monitor(self.backend, settings.readiness, prober=prober)
        self.collector = reports.Collector(settings, run=run)
        self.facts_interval = facts_interval
        self.fetcher = fetchers.Fetcher(Path(settings.state_dir), self._start, self.monitor.poke)
        self.installer = installs.Installer(settings.engines, self._installed, self._has_gpu,
                                            self.monitor.poke, group=settings.socket.group)
        self.monitor.overlay = self._overlay
        # Each report reads every ready engine's own load (its metrics endpoint).
        self.scraper: scrapes.Loads = scraper or scrapes.Scraper(
            httpx.AsyncClient(trust_env=False), settings.readiness.probe_timeout)
        self.stopping = asyncio.Event()  # set by SIGTERM, SIGINT or Shutdown
        self.on_exit: shutdowns.Decision | None = None  # what a Shutdown left to do
        # The weights directories the daemon last declared (its report request),
        # which path sources must resolve into; until it asks, the settings'.
        self.weights_dirs: tuple[str, ...] = settings.declaration().weights_dirs

    def _overlay(self, unit: str) -> tuple[str, str] | None:
        return self.installer.overlay(unit) or self.fetcher.overlay(unit)

    async def _start(self, changes: Sequence[UnitChange]) -> list[UnitResult]:
        """Start units whose weights just arrived."""
        results = await self.backend.apply(changes)
        self.monitor.poke()
        return results

    async def _installed(self, changes: Sequence[UnitChange]) -> list[UnitResult]:
        """Start units whose engine was just installed (their weights come next)."""
        return await self._start(await self.fetcher.admit(changes))

    async def _has_gpu(self) -> bool:
        return bool((await self.collector.gpus()).records)

    def declaration(self, asked: Declaration | None) -> Declaration:
        """What to check the node against: the daemon's declaration, else the settings'."""
        if asked is not None and asked.node:
            return asked
        return self.settings.declaration()

    async def report(self, asked: Declaration | None = None) -> NodeReport:
        units = await self.scraper.loads(await self.monitor.refresh())
        declaration = self.declaration(asked)
        if asked is not None and asked.node:
            self.weights_dirs = declaration.weights_dirs
        report = await self.collector.collect(declaration, units, self.backend.owns)
        specs = [(u.name, fetchers.spec_label(u.labels)) for u in units]
        # The declared directories, and any a unit's weights were fetched into.
        dirs = list(declaration.weights_dirs)
        for _, spec in specs:
            weights = spec.get("weights")
            if isinstance(weights, dict) and isinstance(weights.get("dir"), str) \
                    and weights["dir"] not in dirs:
                dirs.append(weights["dir"])
        cached = await asyncio.to_thread(fetchers.cached, dirs, specs)
        host = report.host.model_copy(update={
            "engines_dir": str(self.installer.root),
            "engines_free_bytes": await asyncio.to_thread(installs.free_bytes, self.installer.root),
            "installed_engines": await asyncio.to_thread(self.installer.installed),
            "engine_limits": await self.backend.engine_limits() or self.collector.own_limits(),
        }) if report.host is not None else None
        return report.model_copy(update={
            "fetches": [*self.fetcher.reports(), *self.installer.reports()],
            "cached_weights": cached, "host": host,
        })

    async def observations(self, asked: Declaration | None = None,
                           backstop: float = PUSH_BACKSTOP) -> AsyncGenerator[Delta, None]:
        """The node's observations as pushes: a full report first, then what changed.

        Unit changes wake it at once (the monitor's events; their content is not
        sent as such: what goes out is the difference between what was last sent and
        the units now, so nothing older overtakes what the daemon already has).
        Fetches are compared while one runs; the faults are read again every
        ``facts_interval`` and a change there sends a full report, as the backstop
        does every ``backstop`` seconds whatever changed.
        """
        wake = asyncio.Event()
        events = self.monitor.watch()

        async def listen() -> None:
            async for _ in events:
                wake.set()

        listener = asyncio.create_task(listen(), name="observations-wake")
        loop = asyncio.get_running_loop()
        try:
            report = await self.report(asked)
            sent, faults = _baseline(report), deltas.faults(report)
            full_at = facts_at = loop.time()
            yield deltas.full(report)
            while True:
                fetches = [*self.fetcher.reports(), *self.installer.reports()]
                busy = any(f.state in ("queued", "running") for f in fetches)
                now = loop.time()
                due = min(full_at + backstop, facts_at + self.facts_interval,
                          now + FETCH_INTERVAL if busy else math.inf)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), max(0.0, due - now))
                wake.clear()
                now = loop.time()
                if now >= facts_at + self.facts_interval or now >= full_at + backstop:
                    facts_at = now
                    report = await self.report(asked)
                    if now >= full_at + backstop or deltas.faults(report) != faults:
                        sent, faults, full_at = _baseline(report), deltas.faults(report), now
                        yield deltas.full(report)
                        continue
                current = sent.model_copy(update={
                    "units": self.monitor.units,
                    "fetches": [*self.fetcher.reports(), *self.installer.reports()]})
                delta = deltas.between(sent, current)
                if delta:
                    sent = current
                    yield delta
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
            await events.aclose()

    async def reclaim(self, weights_dirs: Sequence[str], remove: bool) -> list[reclaims.Reclaimed]:
        """Fetched weights no unit on this node names: removed, or (dry run) listed."""
        units = await self.monitor.refresh()
        dirs = list(weights_dirs) or list(self.settings.declaration().weights_dirs)
        found = []
        for directory in dirs:
            used: dict[str, list[str]] = {}
            for unit in units:
                weights = fetchers.spec_label(unit.labels).get("weights")
                if isinstance(weights, dict) and weights.get("dir") == directory:
                    used.setdefault(str(weights.get("source")), []).append(unit.name)
            found += await asyncio.to_thread(reclaims.reclaim, directory, used, remove)
        return found

    async def apply(self, changes: Sequence[UnitChange]) -> list[UnitResult]:
        refusals = await asyncio.to_thread(confines.refusals, changes, self.weights_dirs)
        admitted = await self.installer.admit([c for c in changes if c.name not in refusals])
        results = [*(UnitResult(name, ok=False, error=why) for name, why in refusals.items()),
                   *await self.backend.apply(await self.fetcher.admit(admitted))]
        for result in results:
            log.info("apply %s: %s", result.name,
                     "changed" if result.changed else "unchanged" if result.ok else result.error)
        self.monitor.poke()
        return results

    def log_query(self, lines: int, previous: bool = False,
                  since_seconds: float | None = None) -> unitlogs.Query:
        """The query as asked, the line count capped (0: the default); ``since_seconds``
        counts back from now on this node's clock. ValueError for a negative one."""
        if since_seconds is not None and not since_seconds >= 0:
            raise ValueError(f"since_seconds must be 0 or more, not {since_seconds}")
        wanted = min(lines or DEFAULT_LOG_LINES, self.settings.log_lines_max)
        since = time.time() - since_seconds if since_seconds is not None else None
        return unitlogs.Query(wanted, previous, since)

    async def logs(self, name: str, query: unitlogs.Query | int) -> list[str]:
        """A unit's log, bounded and masked; KeyError for a unit this node lacks."""
        if isinstance(query, int):
            query = self.log_query(query)
        return await self.backend.logs(name, query)

    @property
    def log_source(self) -> str:
        return "journal" if self.backend.kind == "systemd" else "supervise log"

    def hurry(self) -> None:
        """Stop at once: with ``stop_on_exit``, the supervise backend SIGKILLs its engines."""
        if isinstance(self.backend, Supervisor) and self.backend.settings.stop_on_exit:
            self.backend.hurry()
        self.fetcher.cancel()

    async def shutdown(self, *, uninstall: bool, dry_run: bool) -> shutdowns.Decision:
        """Stop for good, as ``node remove`` asks (:mod:`.shutdowns`); raises
        :class:`~llmgw.agent.shutdowns.ShutdownRefused` with nothing done."""
        units = [u.name for u in await self.monitor.refresh()]
        install = await asyncio.to_thread(shutdowns.find, self.settings)
        can_delete = install.prefix is not None and os.access(install.prefix.parent, os.W_OK)
        decision = shutdowns.decide(install, uninstall=uninstall, units=units,
                                    systemd=self.backend.kind == "systemd", dry_run=dry_run,
                                    can_delete=can_delete)
        if not dry_run:
            await shutdowns.disable(self.settings, decision)
            self.on_exit = decision
            self.stopping.set()  # the server's grace lets this answer go out first
        return decision

    async def close(self) -> None:
        await self.installer.close()
        await self.fetcher.close()
        await self.monitor.close()
        await self.scraper.close()
        await self.backend.close()


class Service(agent_pb2_grpc.AgentServicer):
    """The gRPC methods of ``llmgw.agent.v1.Agent`` over an :class:`Agent`."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def Report(self, request: pb.ReportRequest, context: Any) -> pb.NodeReport:
        try:
            asked = messages.declaration_from_message(request)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return conversions.report_to_message(await self.agent.report(asked))

    async def ApplyUnits(
        self, request: pb.ApplyRequest, context: Any
    ) -> pb.ApplyResponse:
        changes: list[UnitChange] = []
        refused: dict[int, UnitResult] = {}
        for index, item in enumerate(request.units):
            try:
                changes.append(conversions.change_from_message(item))
            except ValueError as exc:
                refused[index] = UnitResult(item.name, ok=False, error=str(exc))
        applied = iter(await self.agent.apply(changes))
        results = [refused.get(i) or next(applied) for i in range(len(request.units))]
        return pb.ApplyResponse(results=[conversions.result_to_message(r) for r in results])

    def _log_query(self, request: pb.UnitLogsRequest) -> unitlogs.Query:
        since = request.since_seconds if request.HasField("since_seconds") else None
        return self.agent.log_query(request.lines, request.previous, since)

    async def UnitLogs(
        self, request: pb.UnitLogsRequest, context: Any
    ) -> pb.UnitLogsResponse:
        try:
            lines = await self.agent.logs(request.name, self._log_query(request))
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except KeyError:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no unit {request.name} on this node")
        except unitlogs.LogError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"cannot read the log of "
                                f"{request.name}: {exc}")
        return pb.UnitLogsResponse(lines=lines, source=self.agent.log_source)

    async def FollowUnitLogs(
        self, request: pb.UnitLogsRequest, context: Any
    ) -> AsyncIterator[pb.UnitLogsResponse]:
        """The latest lines, then each new one; ends when the client cancels (grpc
        cancels this generator, which closes the follower and its journalctl)."""
        try:
            query = self._log_query(request)
            if query.previous:
                raise ValueError("the run before the latest has ended: nothing to follow")
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        lines = self.agent.backend.follow(request.name, query)
        try:
            async for line in lines:
                yield pb.UnitLogsResponse(lines=[line], source=self.agent.log_source)
        except KeyError:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no unit {request.name} on this node")
        except unitlogs.LogError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"cannot read the log of "
                                f"{request.name}: {exc}")
        finally:
            await lines.aclose()

    async def WatchUnits(
        self, request: pb.WatchRequest, context: Any
    ) -> AsyncIterator[pb.UnitEvent]:
        if request.push:
            try:
                asked = messages.declaration_from_message(request.declared)
            except ValueError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            backstop = request.backstop_seconds if request.backstop_seconds > 0 \
                else PUSH_BACKSTOP
            pushes = self.agent.observations(asked, backstop)
            try:
                async for delta in pushes:
                    yield conversions.delta_to_message(delta)
            finally:
                await pushes.aclose()
            return
        async for event in self.agent.monitor.watch():
            yield pb.UnitEvent(unit=conversions.unit_to_message(event.unit), removed=event.removed)


    async def ReclaimWeights(
        self, request: pb.ReclaimRequest, context: Any
    ) -> pb.ReclaimResponse:
        items = await self.agent.reclaim(list(request.weights_dirs), request.remove)
        return pb.ReclaimResponse(items=[
            pb.Reclaimed(source=i.source, path=i.path, size_bytes=i.size_bytes,
                         removed=i.removed, kept_because=i.kept_because)
            for i in items
        ])


    async def InstallEngine(
        self, request: pb.EngineInstallRequest, context: Any
    ) -> AsyncIterator[pb.EngineInstallProgress]:
        try:
            wanted = installs.request(request.engine, request.version, binary=request.binary,
                                      requirements=request.requirements,
                                      index_url=request.index_url,
                                      extra_index_urls=list(request.extra_index_urls))
        except installs.InstallError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        progress = self.agent.installer.start(wanted)
        last = None
        while True:
            finished = progress.finished
            message = pb.EngineInstallProgress(
                fetch=conversions.to_message(installs.fetch_of(progress), pb.Fetch()),
                step=progress.step, path=progress.path)
            if message != last:
                yield message
                last = message
            if finished:
                return
            await asyncio.sleep(PROGRESS_INTERVAL)

    async def Shutdown(self, request: pb.ShutdownRequest, context: Any) -> pb.ShutdownResponse:
        try:
            decision = await self.agent.shutdown(uninstall=request.uninstall,
                                                 dry_run=request.dry_run)
        except shutdowns.ShutdownRefused as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return pb.ShutdownResponse(detail=decision.detail, removed=decision.removed,
                                   left=decision.left)


def _baseline(report: NodeReport) -> NodeReport:
    """What the daemon holds after a full report, as the agent compares it: the units as
    the monitor has them (a report's engine loads come with full reports only)."""
    return report.model_copy(update={
        "units": [u.model_copy(update={"load": None}) if u.load is not None else u
                  for u in report.units]})


def _prepare_socket(path: Path) -> None:
    """Make room for the socket: its directory exists, no stale socket is left."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    if not os.path.lexists(path):
        return
    if not stat.S_ISSOCK(path.lstat().st_mode):
        raise ServeError(f"{path} exists and is not a socket; refusing to replace it")
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # left by an agent that died: nobody listens
            return
    raise ServeError(f"another agent is already serving on {path}")


def _secure_socket(path: Path, settings: Settings) -> None:
    os.chmod(path, settings.socket.mode_bits)
    group = settings.socket.group
    if group is None:
        return
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise ServeError(
            f"socket group {group!r} does not exist: create it (groupadd --system {group}) "
            "or set socket.group to null"
        ) from None
    try:
        os.chown(path, -1, gid)
    except PermissionError as exc:
        raise ServeError(f"cannot give {path} to group {group}: {exc.strerror}") from None


async def start(agent: Agent) -> grpc.aio.Server:
    """Bind and start the gRPC server on the agent's socket (mode and group applied)."""
    path = Path(agent.settings.socket.path)
    _prepare_socket(path)
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServicer_to_server(Service(agent), server)
    # The socket is created by bind; a tight umask keeps it private until chmod.
    previous = os.umask(0o177)
    try:
        server.add_insecure_port(f"unix:{path}")
        await server.start()
    finally:
        os.umask(previous)
    try:
        _secure_socket(path, agent.settings)
    except ServeError:
        await server.stop(None)
        path.unlink(missing_ok=True)
        raise
    return server


async def serve(settings: Settings,
                ready: Callable[[], None] | None = None) -> shutdowns.Decision | None:
    """Serve until SIGTERM, SIGINT or Shutdown. Engines keep running unless stop_on_exit
    is set. Returns what a Shutdown left to do once nothing runs (:func:`shutdowns.finish`:
    ``llmgw agent serve`` does it as the process's last act).

    The signal handlers come first, so a signal during the start (while
    engines are being adopted) stops the agent in order too. A second signal
    stops at once: with stop_on_exit, every engine's group is SIGKILLed.
    """
    stopping = asyncio.Event()
    agent: Agent | None = None

    def on_signal() -> None:
        if stopping.is_set() and agent is not None:
            log.warning("second signal: stopping at once")
            agent.hurry()
        stopping.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        agent = Agent(settings)
        agent.stopping = stopping  # a Shutdown stops it like a signal
        return await _serve(agent, stopping, ready)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def _serve(agent: Agent, stopping: asyncio.Event,
                 ready: Callable[[], None] | None) -> shutdowns.Decision | None:
    settings = agent.settings
    server = await start(agent)
    await agent.fetcher.resume()
    agent.installer.sweep()
    monitor = asyncio.create_task(agent.monitor.run())
    log.info("llmgw agent serving on unix:%s (backend %s)", settings.socket.path,
             agent.backend.kind)
    if ready is not None:
        ready()
    try:
        await stopping.wait()
    finally:
        log.info("shutting down")
        agent.monitor.end_watches()  # open WatchUnits streams end now, not after the grace
        await server.stop(grace=2.0)
        monitor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await monitor
        await agent.close()
        with contextlib.suppress(FileNotFoundError):
            Path(settings.socket.path).unlink()
    return agent.on_exit
