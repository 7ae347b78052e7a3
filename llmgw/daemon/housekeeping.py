"""Deleting what must not be kept: conversations past retention, ended sessions, audit
entries older than ``cluster.audit.retention``.

The daemon runs :func:`purge_forever` beside its loop. A project's retention
comes from the cluster in force at each pass, so shortening it (or removing
``conversations:``) deletes the now-overdue rows at the next pass; the audit
log's likewise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from llmgw.spec.models import Cluster
from llmgw.store import audits, conversations, sessions
from llmgw.store.stores import Store, StoreError

log = logging.getLogger("llmgw.daemon")
PURGE_INTERVAL = 60.0


def retention_of(cluster: Cluster) -> dict[str, float]:
    """Project → seconds it keeps conversations, for projects that keep them."""
    return {name: project.conversations.retention for name, project in cluster.projects.items()
            if project.conversations is not None}


async def purge_once(store: Store, cluster: Cluster, now: float) -> int:
    """One pass; how many conversations were deleted."""
    gone = await conversations.purge(store, retention_of(cluster), now)
    await sessions.purge_expired(store, now)
    await audits.purge(store, cluster.cluster.audit.retention, now)
    if gone:
        log.info("deleted %d conversations past their project's retention", gone)
    return gone


async def purge_forever(store: Store, cluster: Callable[[], Cluster],
                        interval: float = PURGE_INTERVAL,
                        clock: Callable[[], float] = time.time,
                        stop: asyncio.Event | None = None) -> None:
    """Purge now and every ``interval`` seconds until ``stop`` is set."""
    stop = stop or asyncio.Event()
    while not stop.is_set():
        try:
            await purge_once(store, cluster(), clock())
        except StoreError:
            log.exception("could not purge conversations; will retry")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
