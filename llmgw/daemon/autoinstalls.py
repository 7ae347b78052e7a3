"""``engines.<engine>.install: auto``: the daemon installs an engine version on every
GPU node that can run it, and says per node why not.

At each iteration, once the convergence service has observed the fleet, the
reconciler calls :meth:`AutoInstalls.consider` with the cluster and that
fleet. For every engine declared ``install: auto`` and every node, the pure
check (:func:`llmgw.engines.installables.check`: GPUs, driver, compute
capability, Python, free disk, a C compiler) decides; a node that passes
and lacks the version gets an install in the background, through the same
path as ``llmgw engine install`` (:func:`llmgw.onboarding.engineinstalls.install`:
the node's agent builds a venv from the cluster directory's hash-pinned
``engines/<engine>-<version>.txt``, moves it into place once it runs, and
reports its progress as a fetch). Nothing here waits for an install: the
iteration goes on, as it does while weights are fetched, and the next one
sees the version installed (the finished install wakes the loop).

A failed install is tried again after a backoff (``transport/backoffs``:
doubling from a minute up to an hour, jittered), never in a tight loop; a
node without a GPU is skipped, not a fault; every other node's state says
why (``NodeInstall.line``), for ``llmgw status`` and the admin API.
Idempotent: a version installed is left alone, and an install in flight is
never started twice (the agent joins a second request to the first, too).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llmgw.engines import installables
from llmgw.fleet.types import Fleet
from llmgw.onboarding import engineinstalls
from llmgw.spec.models import Cluster
from llmgw.transport import pools
from llmgw.transport.backoffs import Backoff

log = logging.getLogger("llmgw.daemon.installs")

RETRY_BASE = 60.0
RETRY_CAP = 3600.0
Key = tuple[str, str, str]  # (engine, version, node)


@dataclass(frozen=True)
class NodeInstall:
    """Where one engine version stands on one node, as the daemon sees it."""

    engine: str
    version: str
    node: str
    # installed | installing | waiting (a failure, retried later) | skip | cannot | unknown
    state: str
    reason: str
    fix: str = ""
    failures: int = 0

    @property
    def line(self) -> str:
        fix = f" (fix: {self.fix})" if self.fix else ""
        return f"{self.engine} {self.version} on {self.node}: {self.state}: {self.reason}{fix}"

    def doc(self) -> dict[str, Any]:
        return {**asdict(self), "line": self.line}


class AutoInstalls:
    """The daemon's background installs of ``install: auto`` engine versions."""

    def __init__(self, pool: pools.Pool, directory: Path, *,
                 clock: Callable[[], float] = time.monotonic,
                 wake: Callable[[str], None] = lambda _: None,
                 retry_base: float = RETRY_BASE, retry_cap: float = RETRY_CAP,
                 rng: random.Random | None = None) -> None:
        self.pool = pool
        self.directory = directory
        self.clock = clock
        self.wake = wake
        self.retry_base, self.retry_cap = retry_base, retry_cap
        self.rng = rng or random.Random()
        self._tasks: dict[Key, asyncio.Task[None]] = {}
        self._progress: dict[Key, str] = {}
        self._backoffs: dict[Key, Backoff] = {}
        self._failed: dict[Key, str] = {}
        self.states: list[NodeInstall] = []

    def consider(self, cluster: Cluster, fleet: Fleet) -> list[NodeInstall]:
        """Decide for every node and ``install: auto`` engine; start the installs due.
        Returns (and keeps in :attr:`states`) each node's state."""
        found: list[NodeInstall] = []
        for engine, declared in cluster.engines.declared():
            if declared.install != "auto":
                continue
            version = declared.version
            try:
                wanted = engineinstalls.from_requirements(
                    engine, version,
                    engineinstalls.requirements_path(self.directory, engine, version),
                    index_url=declared.index_url or "")
            except engineinstalls.WantedError as exc:
                found += [NodeInstall(engine, version, node, "cannot", str(exc),
                                      "write the requirements file (docs/engines.md)")
                          for node in sorted(cluster.nodes)]
                continue
            for node in sorted(cluster.nodes):
                found.append(self._one(wanted, node, fleet))
        self.states = found
        return found

    def _one(self, wanted: engineinstalls.Wanted, node: str, fleet: Fleet) -> NodeInstall:
        key = (wanted.engine, wanted.version, node)
        backoff = self._backoffs.setdefault(key, Backoff(
            self.retry_base, self.retry_cap, self.clock, self.rng))

        def state(state: str, reason: str, fix: str = "") -> NodeInstall:
            return NodeInstall(wanted.engine, wanted.version, node, state, reason, fix,
                               backoff.failures)

        task = self._tasks.get(key)
        if task is not None and not task.done():
            return state("installing", self._progress.get(key, "starting"))
        verdict = installables.check(wanted.engine, wanted.version, node, fleet.nodes.get(node))
        if verdict.state != "install":
            if verdict.state == "installed":
                backoff.succeeded()
            return state(verdict.state, verdict.reason, verdict.fix)
        wait = backoff.wait()
        if wait > 0:
            return state("waiting", f"the last install failed ({self._failed.get(key, '?')}); "
                         f"trying again in {wait:.0f}s", "see `llmgw engine list`")
        self._progress[key] = "starting"
        self._tasks[key] = asyncio.create_task(self._install(key, wanted, backoff),
                                               name=f"install {wanted.target} on {node}")
        log.info("installing %s on %s: %s", wanted.target, node, verdict.reason)
        return state("installing", "starting")

    async def _install(self, key: Key, wanted: engineinstalls.Wanted, backoff: Backoff) -> None:
        node = key[2]

        def say(line: str) -> None:
            text = line.removeprefix(f"{node}  ")
            if text != self._progress.get(key):
                log.info("%s on %s: %s", wanted.target, node, text)
            self._progress[key] = text

        try:
            outcome = (await engineinstalls.install(self.pool, [node], wanted, say))[node]
            state, detail = outcome.state, outcome.detail
        except Exception as exc:  # a bug, not the node's fault: said, and tried again later
            log.error("installing %s on %s broke", wanted.target, node, exc_info=exc)
            state, detail = "failed", f"{type(exc).__name__}: {exc}"
        if state in ("done", "already", "skipped"):
            backoff.succeeded()
            self._failed.pop(key, None)
            self.wake(f"{wanted.target} installed on {node}")
            return
        delay = backoff.failed()
        self._failed[key] = detail
        log.warning("installing %s on %s failed (%d times), trying again in %.0fs: %s",
                    wanted.target, node, backoff.failures, delay, detail)

    def busy(self) -> bool:
        return any(not t.done() for t in self._tasks.values())

    async def wait(self) -> None:
        """Until the installs under way have ended (tests, and a daemon stopping)."""
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def aclose(self) -> None:
        """Stop following installs (the agents finish them on their own)."""
        for task in self._tasks.values():
            task.cancel()
        for task in list(self._tasks.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task
