"""Upstreams llmgw did not place (``upstreams:``): keys, health, and their route entries.

:class:`Externals` reads each upstream's key file when the catalog changes
(:meth:`configure`), probes each upstream (``GET <url><health.path>`` with its
key, bounded by ``health.timeout``; 1 s, 2 s, 4 s … apart while it is down, up
to ``health.max_backoff``; ``health.interval`` apart while it is up) and hands
the router the endpoints of the upstreams that are up (:meth:`endpoints`),
which it merges into the replicas' table: an upstream that is down, not yet
probed, or whose key file cannot be read is not routed.

The key is held here only. It goes out as ``Authorization: Bearer …`` on the
requests to its upstream (:meth:`authorization`) and nowhere else: not in a
log line, an error, the route table the leader publishes (the router adds
upstreams itself), a metric or a page.

Usage::

    externals = Externals(metrics, changed=router.reroute)
    externals.configure(catalog.upstreams)
    await externals.start()
    externals.endpoints()   # {"chat": [Endpoint("https://api.example.com", upstream="burst", ...)]}
    await externals.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp

from llmgw.metrics.instruments import RouterMetrics
from llmgw.router.catalogs import UpstreamEntry
from llmgw.router.routes import Endpoint
from llmgw.spec.upstreams import read_key

log = logging.getLogger("llmgw.upstreams")
FIRST_BACKOFF = 1.0


@dataclass
class _State:
    entry: UpstreamEntry
    key: str | None = None
    up: bool = False
    reason: str = "not probed yet"
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class Externals:
    def __init__(self, metrics: RouterMetrics, changed: Callable[[], None]) -> None:
        self.metrics = metrics
        self.changed = changed  # the set of routable upstreams changed: rebuild the table
        self._states: dict[str, _State] = {}
        self._session: aiohttp.ClientSession | None = None
        self._running = False

    def configure(self, entries: Mapping[str, UpstreamEntry]) -> None:
        """Use these upstreams from now on; an unchanged one keeps its health, a changed
        one (or its key file) is read and probed again."""
        for name in set(self._states) - set(entries):
            self._stop(self._states.pop(name))
            self.metrics.drop_upstream(name)
        for name, entry in entries.items():
            old = self._states.get(name)
            key, problem = _key(entry)
            if old is not None and old.entry == entry and old.key == key:
                continue
            if old is not None:
                self._stop(old)
            state = self._states[name] = _State(entry, key)
            if problem is not None:
                state.reason = problem
                log.error("upstream %s is not routed: %s", name, problem)
            self.metrics.upstream_state(name, False)
            if self._running and problem is None:
                state.task = asyncio.create_task(self._watch(state))
        self.changed()

    async def start(self) -> None:
        """Probe every upstream from now on (on the running loop)."""
        self._running = True
        for state in self._states.values():
            if state.task is None and not (state.entry.key_file and state.key is None):
                state.task = asyncio.create_task(self._watch(state))

    async def close(self) -> None:
        self._running = False
        tasks = [s.task for s in self._states.values() if s.task is not None]
        for state in self._states.values():
            self._stop(state)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()
            self._session = None

    def endpoints(self) -> dict[str, list[Endpoint]]:
        """Model key → the endpoints of the upstreams serving it that are up."""
        table: dict[str, list[Endpoint]] = {}
        for name, state in sorted(self._states.items()):
            if not state.up:
                continue
            entry = state.entry
            for model, (_, use) in sorted(entry.models.items()):
                table.setdefault(model, []).append(Endpoint(
                    entry.url, node=name, upstream=name, cap=entry.max_in_flight,
                    fallback=use == "fallback"))
        return table

    def authorization(self, name: str) -> str | None:
        """The ``Authorization`` header for upstream ``name``; None: it takes none."""
        state = self._states.get(name)
        return None if state is None or state.key is None else f"Bearer {state.key}"

    def model_name(self, name: str, model: str) -> str | None:
        """What upstream ``name`` calls model key ``model`` (the request's ``model``)."""
        state = self._states.get(name)
        found = state.entry.models.get(model) if state is not None else None
        return found[0] if found is not None else None

    def observed(self, name: str, failed: bool, seconds: float) -> None:
        """An attempt on upstream ``name`` ended (failed: a 5xx, a connection, a cut)."""
        if name in self._states:
            self.metrics.upstream_request(name, failed, seconds)

    def down(self, model: str) -> list[str]:
        """Why each upstream serving model key ``model`` is not routed: "name: reason"."""
        return [f"{name}: {state.reason}" for name, state in sorted(self._states.items())
                if not state.up and model in state.entry.models]

    def status(self) -> dict[str, tuple[bool, str]]:
        """Name → (up, why not): for logs and pages; never the key."""
        return {name: (s.up, s.reason) for name, s in sorted(self._states.items())}

    async def probe(self, name: str) -> tuple[bool, str]:
        """Probe upstream ``name`` once now: (up, why not)."""
        state = self._states[name]
        entry = state.entry
        headers = {"Accept-Encoding": "identity"}
        if state.key is not None:
            headers["Authorization"] = f"Bearer {state.key}"
        try:
            async with asyncio.timeout(entry.timeout):
                async with self._client().get(entry.url + entry.health_path,
                                              headers=headers, allow_redirects=False) as reply:
                    status = reply.status
        except TimeoutError:
            return False, f"no answer to GET {entry.health_path} within {entry.timeout:g} s"
        except (aiohttp.ClientError, OSError) as exc:
            # The class and the OS's words only: aiohttp's message names the URL, which
            # is fine, but nothing of a request header may reach a log.
            return False, f"cannot reach it ({_why(exc)})"
        if 200 <= status < 300:
            return True, ""
        return False, f"GET {entry.health_path} answered {status}"

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                cookie_jar=aiohttp.DummyCookieJar(), skip_auto_headers=("User-Agent",),
                auto_decompress=False)
        return self._session

    async def _watch(self, state: _State) -> None:
        name, entry = state.entry.name, state.entry
        delay = FIRST_BACKOFF
        while True:
            up, reason = await self.probe(name)
            if self._states.get(name) is not state:
                return  # reconfigured meanwhile
            if up != state.up or (not up and reason != state.reason):
                if up:
                    log.info("upstream %s is up (%s)", name, entry.url)
                else:
                    log.warning("upstream %s is down: %s", name, reason)
            was = state.up
            state.up, state.reason = up, reason
            self.metrics.upstream_state(name, up)
            if up != was:
                self.changed()
            if up:
                delay = FIRST_BACKOFF
                await asyncio.sleep(entry.interval)
            else:
                await asyncio.sleep(min(delay, entry.max_backoff))
                delay = min(delay * 2, entry.max_backoff)

    @staticmethod
    def _stop(state: _State) -> None:
        if state.task is not None:
            state.task.cancel()
            state.task = None


def _key(entry: UpstreamEntry) -> tuple[str | None, str | None]:
    """(the key, None) or (None, why it cannot be read); a message never holds the key."""
    if entry.key_file is None:
        return None, None
    try:
        key = read_key(entry.key_file)
    except OSError as exc:
        return None, f"cannot read its key file {entry.key_file}: {exc.strerror or _why(exc)}"
    except ValueError as exc:
        return None, f"its key file {entry.key_file}: {exc}"
    if not key:
        return None, f"its key file {entry.key_file} is empty"
    return key, None


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    return type(exc).__name__
