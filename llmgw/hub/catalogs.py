"""Ask the hub how big each fetched source of a cluster is, for plans.

The planner is pure, so what the hub says is observed state like any
node's report: :func:`lookup` runs before planning and its answers ride in
``Fleet.sources``. A source that cannot be asked is not an error here: the
plan says "size unknown" and why, and the node's own check before fetching
still guards its disk.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from llmgw.fleet.types import SourceFacts
from llmgw.hub import fetches
from llmgw.hub.reaches import Reach
from llmgw.spec import sources
from llmgw.spec.models import Cluster

TIMEOUT = 5.0
TTL = 300.0  # a branch may move; a pinned commit's size never changes


def fetched_sources(cluster: Cluster) -> list[str]:
    """Every source in the cluster that a node fetches (hub repos and URLs)."""
    found = set()
    for model in cluster.models.values():
        for text in [model.source, *(p.source for p in model.profiles)]:
            if text and sources.parse(text).fetched:
                found.add(text)
    return sorted(found)


def ask(text: str, endpoint: str | None, timeout: float = TIMEOUT,
        reach: Reach | None = None) -> SourceFacts:
    """What the hub (or an URL's server) says of ``text``; a host ``reach`` refuses is not
    asked at all, and the answer says why."""
    try:
        remote = fetches.describe(sources.parse(text), endpoint, None, timeout, reach)
    except fetches.FetchError as exc:
        return SourceFacts(error=str(exc))
    return SourceFacts(size_bytes=remote.size, commit=remote.commit or None,
                       files=len(remote.files))


class Catalog:
    """Answers kept for a while, so a daemon's drift loop does not ask every minute."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, str | None, Reach], tuple[float, SourceFacts]] = {}

    def lookup(self, texts: Iterable[str], endpoint: str | None,
               allowed_hosts: Iterable[str] = ()) -> dict[str, SourceFacts]:
        now = time.monotonic()
        reach = Reach.of(allowed_hosts, endpoint)
        wanted = [t for t in texts if not self._fresh((t, endpoint, reach), now)]
        if wanted:
            with ThreadPoolExecutor(max_workers=min(8, len(wanted))) as pool:
                answers = pool.map(lambda t: ask(t, endpoint, reach=reach), wanted)
                for text, facts in zip(wanted, answers, strict=True):
                    self._known[(text, endpoint, reach)] = (now, facts)
        return {t: self._known[(t, endpoint, reach)][1] for t in texts
                if (t, endpoint, reach) in self._known}

    def _fresh(self, key: tuple[str, str | None, Reach], now: float) -> bool:
        known = self._known.get(key)
        if known is None:
            return False
        pinned = sources.parse(key[0]).pinned and known[1].error is None
        return pinned or now - known[0] < TTL
