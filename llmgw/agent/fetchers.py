"""Weights before engines: the agent's fetch queue and what it reports.

A unit whose spec names a fetched source (``weights`` in its
``X-Llmgw-Spec`` label: a hub repo or an URL, and the weights directory) is
not started until the weights are complete on this node:

* If they are (:func:`llmgw.hub.fetches.present`), the unit starts at once
  with ``LLMGW_WEIGHTS`` (the local path the engine opens), ``HF_HUB_CACHE``
  and ``HF_HUB_OFFLINE=1`` added to its env file: the engine never downloads.
* Otherwise its files are written but it stays stopped, reported as
  ``fetching``; one fetch per (weights directory, source) runs, however many
  units wait for it; when it completes every waiting unit starts. A failed
  fetch leaves its units ``failed`` with the reason, and is retried with a
  backoff when the reason may pass (a network error, not a sha mismatch).

What waits survives the agent: each waiting change is kept in
``<state_dir>/fetches/<unit>.json`` (paths of secrets, never values) and a
restarted agent resumes those fetches, which continue from the bytes on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from llmgw.agent import unitfiles
from llmgw.agent.unitfiles import UnitFileError
from llmgw.agent.units import UnitChange, UnitResult, write
from llmgw.fleet.types import CachedWeights, Fetch
from llmgw.hub import fetches
from llmgw.spec import sources
from llmgw.spec.sources import Source, SourceError

log = logging.getLogger(__name__)

SPEC_LABEL = "X-Llmgw-Spec"
WEIGHTS_VARIABLE = "LLMGW_WEIGHTS"
RETRY_FIRST, RETRY_MAX = 5.0, 300.0

Apply = Callable[[Sequence[UnitChange]], Awaitable[list[UnitResult]]]


@dataclass(frozen=True)
class Need:
    """What a unit needs fetched, read from its spec label."""

    source: Source
    weights_dir: str
    endpoint: str | None = None
    token_file: str | None = None
    margin: float = 0.05
    allowed_hosts: tuple[str, ...] = ()  # beyond public addresses and the endpoint's host

    @property
    def key(self) -> tuple[str, str]:
        return (self.weights_dir, self.source.text)


def spec_of(unit_text: str, name: str) -> dict[str, object]:
    try:
        raw = unitfiles.labels(unitfiles.parse(name, unit_text)).raw.get(SPEC_LABEL, "")
        spec = json.loads(raw) if raw else {}
    except (UnitFileError, ValueError):
        return {}
    return spec if isinstance(spec, dict) else {}


def spec_label(labels: dict[str, str]) -> dict[str, object]:
    """The shard spec a reported unit carries (empty when it has none or it is unreadable)."""
    try:
        spec = json.loads(labels.get(SPEC_LABEL, "") or "{}")
    except ValueError:
        return {}
    return spec if isinstance(spec, dict) else {}


def need(change: UnitChange) -> Need | None:
    """The fetch a unit needs before it starts, or None (a node path, or no spec)."""
    spec = spec_of(change.unit_text, change.name)
    weights, settings = spec.get("weights"), spec.get("fetch") or {}
    if not isinstance(weights, dict) or not isinstance(settings, dict):
        return None
    try:
        source = sources.parse(str(weights.get("source", "")))
    except SourceError:
        return None
    directory = weights.get("dir")
    if not source.fetched or not isinstance(directory, str) or not directory.startswith("/"):
        return None
    endpoint, token_file = settings.get("endpoint"), settings.get("token_file")
    margin = settings.get("disk_margin", 0.05)
    allowed = settings.get("allowed_hosts") or []
    return Need(
        source=source, weights_dir=directory,
        endpoint=endpoint if isinstance(endpoint, str) else None,
        token_file=token_file if isinstance(token_file, str) else None,
        margin=float(margin) if isinstance(margin, int | float) else 0.05,
        allowed_hosts=tuple(h for h in allowed if isinstance(h, str))
        if isinstance(allowed, list) else (),
    )


def with_weights(change: UnitChange, done: fetches.Fetched) -> UnitChange:
    """The change with the weights' local path in its env file."""
    env = {WEIGHTS_VARIABLE: done.path, "HF_HUB_OFFLINE": "1"}
    if done.commit:
        env["HF_HUB_CACHE"] = done.root
    return replace(change, env_text=change.env_text + unitfiles.render_env_file(env))


def _read_token(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text().strip() or None
    except OSError as exc:
        raise fetches.FetchError(f"token_file {path}: cannot read it on this node: "
                                 f"{exc.strerror or exc}", retry=False) from None


class Fetcher:
    """Fetches for one agent: deduplicated, resumable, reported."""

    def __init__(self, state_dir: Path, apply: Apply, poke: Callable[[], None]) -> None:
        self._pending_dir = state_dir / "fetches"
        self._apply = apply
        self._poke = poke
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._progress: dict[tuple[str, str], fetches.Progress] = {}
        self._waiting: dict[str, tuple[tuple[str, str], UnitChange]] = {}
        self._failed: dict[str, str] = {}

    # ---- what units see ------------------------------------------------------

    def overlay(self, unit: str) -> tuple[str, str] | None:
        """A unit's state while it waits for weights: ("fetching"|"failed", detail)."""
        if unit in self._failed:
            return "failed", self._failed[unit]
        waiting = self._waiting.get(unit)
        if waiting is None:
            return None
        progress = self._progress.get(waiting[0])
        if progress is None:
            return "fetching", "queued"
        return "fetching", describe(progress)

    def reports(self) -> list[Fetch]:
        found = []
        for key, progress in sorted(self._progress.items()):
            units = sorted(u for u, (k, _) in self._waiting.items() if k == key)
            found.append(Fetch(
                kind="weights", target=progress.target,
                state=progress.state if progress.state in ("queued", "running", "done",
                                                           "failed") else "running",
                bytes_done=progress.bytes_done, bytes_total=progress.bytes_total,
                rate_bps=progress.rate_bps, error=progress.error, units=units,
                started_at=progress.started_at, updated_at=progress.updated_at,
            ))
        return found

    # ---- applying ------------------------------------------------------------

    async def admit(self, changes: Sequence[UnitChange]) -> list[UnitChange]:
        """What the backend applies now: ready units with their weights, waiting ones stopped."""
        now: list[UnitChange] = []
        for change in changes:
            wanted = need(change) if change.action == "start" else None
            if wanted is None:
                self._forget(change.name)
                now.append(change)
                continue
            done = await asyncio.to_thread(fetches.present, wanted.source, wanted.weights_dir)
            if done is not None:
                self._forget(change.name)
                now.append(with_weights(change, done))
                continue
            self._wait(change, wanted)
            now.append(replace(change, action="stop"))
        return now

    async def resume(self) -> None:
        """Restart the fetches a previous agent left waiting."""
        if not self._pending_dir.is_dir():
            return
        for path in sorted(self._pending_dir.glob("*.json")):
            try:
                data = json.loads(path.read_text())
                change = UnitChange(**data)
            except (OSError, ValueError, TypeError):
                path.unlink(missing_ok=True)
                continue
            wanted = need(change)
            if wanted is None:
                path.unlink(missing_ok=True)
                continue
            log.info("resuming the fetch of %s for %s", wanted.source.text, change.name)
            self._wait(change, wanted)

    def cancel(self) -> None:
        """Stop every download at its next chunk: a thread cannot be cancelled, and the
        agent's exit would wait for it (the default executor is joined at exit)."""
        for progress in self._progress.values():
            progress.cancelled = True

    async def close(self) -> None:
        self.cancel()
        for task in self._tasks.values():
            task.cancel()
        for task in list(self._tasks.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ---- internals -------------------------------------------------------------

    def _wait(self, change: UnitChange, wanted: Need) -> None:
        self._failed.pop(change.name, None)
        self._waiting[change.name] = (wanted.key, change)
        self._pending_dir.mkdir(parents=True, exist_ok=True)
        record = asdict(change)
        record["secret_env"] = dict(change.secret_env)
        write(self._pending_dir / f"{change.name}.json", json.dumps(record), mode=0o600)
        task = self._tasks.get(wanted.key)
        if task is None or task.done():
            self._progress[wanted.key] = fetches.Progress("weights", wanted.source.text)
            self._tasks[wanted.key] = asyncio.create_task(self._run(wanted))

    def _forget(self, unit: str) -> None:
        self._failed.pop(unit, None)
        if self._waiting.pop(unit, None) is not None:
            (self._pending_dir / f"{unit}.json").unlink(missing_ok=True)

    async def _run(self, wanted: Need) -> None:
        delay = RETRY_FIRST
        progress = self._progress[wanted.key]
        while True:
            try:
                token = _read_token(wanted.token_file)
                progress.error, progress.bytes_transferred = "", 0
                done = await asyncio.to_thread(
                    fetches.fetch, wanted.source, wanted.weights_dir, endpoint=wanted.endpoint,
                    token=token, progress=progress, margin=wanted.margin,
                    allowed_hosts=wanted.allowed_hosts,
                )
                break
            except fetches.FetchError as exc:
                progress.state, progress.error = "failed", str(exc)
                progress.updated_at = time.time()
                log.warning("fetch of %s failed: %s", wanted.source.text, exc)
                units = self._units_of(wanted.key)
                for unit in units:
                    self._failed[unit] = f"fetch failed: {exc}"
                self._poke()
                if not exc.retry:
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                for unit in units:
                    self._failed.pop(unit, None)
                progress.state = "running"
        changes = [change for unit, (key, change) in list(self._waiting.items())
                   if key == wanted.key]
        for change in changes:
            self._forget(change.name)
        if changes:
            results = await self._apply([with_weights(c, done) for c in changes])
            for result in results:
                if not result.ok:
                    log.warning("starting %s after its fetch failed: %s", result.name,
                                result.error)
        self._poke()

    def _units_of(self, key: tuple[str, str]) -> list[str]:
        return sorted(u for u, (k, _) in self._waiting.items() if k == key)


def describe(progress: fetches.Progress) -> str:
    """One line for a unit's detail: ``fetching 1.2 GB of 141 GB at 310 MB/s``."""
    if progress.state == "failed":
        return f"fetch failed: {progress.error}"
    if progress.waiting:
        return f"waiting for {progress.waiting}"
    if progress.bytes_total is None:
        return f"fetching {progress.target}: asking the source"
    text = (f"fetching {progress.target}: {fetches._human(progress.bytes_done)} of "
            f"{fetches._human(progress.bytes_total)}")
    if progress.rate_bps:
        text += f" at {fetches._human(int(progress.rate_bps))}/s"
    return text


def cached(weights_dirs: Iterable[str], specs: Iterable[tuple[str, dict[str, object]]],
           ) -> list[CachedWeights]:
    """What llmgw fetched into ``weights_dirs``, with the units whose spec names each."""
    users: dict[tuple[str, str], list[str]] = {}
    for unit, spec in specs:
        weights = spec.get("weights")
        if isinstance(weights, dict):
            key = (str(weights.get("dir", "")), str(weights.get("source", "")))
            users.setdefault(key, []).append(unit)
    found = []
    for directory in weights_dirs:
        for record in fetches.records(directory):
            found.append(CachedWeights(
                source=record.source, path=record.path, size_bytes=record.size_bytes,
                commit=record.commit, fetched_by=record.fetched_by,
                fetched_at=record.fetched_at or None,
                used_by=sorted(users.get((directory, record.source), [])),
            ))
    return found
