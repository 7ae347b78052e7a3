"""``--workers N``: N router processes on one port (SO_REUSEPORT), one metrics view.

The parent starts N copies of ``llmgw serve --role router --worker-of PID``;
each binds the router address with ``SO_REUSEPORT``, so the kernel spreads
connections across them, and keeps its own keys/budgets/usage link to the
store and its own copy of the routes (:mod:`llmgw.daemon.routetables`). A
worker that exits is started again (after a second, so a crash loop does not
spin). Workers run ``python -P -m llmgw`` in ``/``, each in its own session:
nothing in the parent's working directory can run in their place, and the
parent alone decides when they stop (SIGTERM; SIGKILL on :meth:`Workers.kill`).

Metrics: prometheus-client's multiprocess mode. Every process gets
``PROMETHEUS_MULTIPROC_DIR`` (a fresh private directory); workers write their
samples there, and the parent serves them summed (counters, histograms),
live-summed (requests in flight, waiting) or max'ed (endpoints in the route
table) through :func:`registry_for_workers`. A dead worker's gauges are
dropped (``mark_process_dead``); its counters stay, as Prometheus expects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client import multiprocess as prom_multiprocess

log = logging.getLogger("llmgw.workers")
ENV = "PROMETHEUS_MULTIPROC_DIR"


def metrics_dir() -> Path:
    """A private directory for the workers' metric files, set in this process's env
    before any worker starts (children inherit it)."""
    path = Path(tempfile.mkdtemp(prefix="llmgw-metrics-"))
    os.environ[ENV] = str(path)
    return path


def registry_for_workers(path: Path) -> CollectorRegistry:
    registry = CollectorRegistry()
    prom_multiprocess.MultiProcessCollector(registry, path=str(path))  # type: ignore[no-untyped-call]
    return registry


class Workers:
    def __init__(self, count: int, argv: Sequence[str], metrics: Path) -> None:
        self.count = count
        self.argv = list(argv)
        self.metrics = metrics
        self.processes: list[asyncio.subprocess.Process | None] = [None] * count

    async def run(self, stop: asyncio.Event) -> None:
        """Keep ``count`` workers running until ``stop``; then SIGTERM them and wait."""
        tasks = [asyncio.create_task(self._keep(i, stop)) for i in range(self.count)]
        try:
            await stop.wait()
        finally:
            for process in self.processes:
                if process is not None and process.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        process.send_signal(signal.SIGTERM)
            try:
                await asyncio.gather(*tasks, return_exceptions=True)
            except asyncio.CancelledError:  # no more waiting: none may outlive the parent
                self.kill()
                raise
            finally:
                shutil.rmtree(self.metrics, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL every worker now (a second signal: stop at once)."""
        for process in self.processes:
            if process is not None and process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()

    async def _keep(self, index: int, stop: asyncio.Event) -> None:
        while not stop.is_set():
            # -P and cwd /: the parent's working directory is not on the worker's
            # sys.path, so a llmgw.py or llmgw/ there never runs instead of llmgw.
            # Its own session: a Ctrl-C reaches the parent, which stops the workers.
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-P", "-m", "llmgw", *self.argv,
                stdin=asyncio.subprocess.DEVNULL, cwd="/", start_new_session=True)
            self.processes[index] = process
            log.info("router worker %d started (pid %d)", index, process.pid)
            if stop.is_set():  # stopped while it was starting: run() sent it no SIGTERM
                process.send_signal(signal.SIGTERM)
            code = await process.wait()
            prom_multiprocess.mark_process_dead(  # type: ignore[no-untyped-call]
                process.pid, str(self.metrics))
            if stop.is_set():
                return
            log.warning("router worker %d (pid %d) exited with %s; starting it again",
                        index, process.pid, code)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
