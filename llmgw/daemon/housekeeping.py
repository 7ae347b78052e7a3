"""Deleting what must not be kept: conversations past retention, ended sessions.

The daemon runs :func:`purge_forever` beside its loop. A project's retention
comes from the cluster in force at each pass, so shortening it (or removing
``conversations:``) deletes the now-overdue rows at the next pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable

from llmgw.spec.models import Cluster
from llmgw.store import conversations, sessions

log = logging.getLogger("llmgw.daemon")
PURGE_INTERVAL = 60.0


def retention_of(cluster: Cluster) -> dict[str, float]:
    """Project → seconds it keeps conversations, for projects that keep them."""
    return {name: project.conversations.retention for name, project in cluster.projects.items()
            if project.conversations is not None}


def purge_once(store: sqlite3.Connection, cluster: Cluster, now: float) -> int:
    """One pass; how many conversations were deleted."""
    gone = conversations.purge(store, retention_of(cluster), now)
    sessions.purge_expired(store, now)
    if gone:
        log.info("deleted %d conversations past their project's retention", gone)
    return gone


async def purge_forever(store: sqlite3.Connection, cluster: Callable[[], Cluster],
                        interval: float = PURGE_INTERVAL,
                        clock: Callable[[], float] = time.time,
                        stop: asyncio.Event | None = None) -> None:
    """Purge now and every ``interval`` seconds until ``stop`` is set."""
    stop = stop or asyncio.Event()
    while not stop.is_set():
        try:
            purge_once(store, cluster(), clock())
        except sqlite3.Error:
            log.exception("could not purge conversations; will retry")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
