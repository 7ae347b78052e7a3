"""Per-replica request tallies, for rollout gates: requests, errors, TTFT, in flight.

The proxy counts every attempt on a replica by its base URL: ``begin`` when it
is sent, ``end`` with whether it failed (a 5xx, a failed connection or a stream
cut short: the replica's fault, not the client's) and its time to first byte
(a stream's first event, or a whole answer that is not streamed). A client
that hangs up counts as neither.

``snapshot()`` is plain JSON data — routers in other processes send it with
their demand through the store (:mod:`llmgw.daemon.routetables`) — and
:func:`merge` adds several routers' snapshots up, so a gate in HA sees every
router's traffic. TTFT keeps the last :data:`SAMPLES` samples per replica:
bounded memory, and a median of recent traffic.

Everything here runs on the router's event loop; nothing locks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

SAMPLES = 256


@dataclass
class Tally:
    requests: int = 0
    errors: int = 0
    inflight: int = 0
    ttft: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLES))

    def document(self) -> dict[str, Any]:
        return {"requests": self.requests, "errors": self.errors, "inflight": self.inflight,
                "ttft": [round(t, 4) for t in self.ttft]}


class Tallies:
    def __init__(self) -> None:
        self._by_url: dict[str, Tally] = {}

    def begin(self, url: str) -> None:
        tally = self._by_url.get(url)
        if tally is None:
            tally = self._by_url[url] = Tally()
        tally.inflight += 1

    def end(self, url: str, *, failed: bool | None, ttft: float | None = None) -> None:
        """One attempt on ``url`` ended; ``failed`` None: the client left, no verdict."""
        tally = self._by_url.get(url)
        if tally is None:
            return
        tally.inflight = max(0, tally.inflight - 1)
        if failed is None:
            return
        tally.requests += 1
        if failed:
            tally.errors += 1
        elif ttft is not None:
            tally.ttft.append(ttft)

    def prune(self, keep: Collection[str]) -> None:
        """Forget replicas no longer routed to, once nothing is in flight on them (a new
        replica on a reused port starts from zero)."""
        for url in [u for u, t in self._by_url.items() if u not in keep and not t.inflight]:
            del self._by_url[url]

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {url: tally.document() for url, tally in sorted(self._by_url.items())}


def merge(snapshots: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Several routers' snapshots as one: counts add up, TTFT samples join.

    Entries that are not well-formed are skipped: they come from other processes.
    """
    merged: dict[str, dict[str, Any]] = {}
    for snapshot in snapshots:
        if not isinstance(snapshot, Mapping):
            continue
        for url, doc in snapshot.items():
            try:
                requests, errors = int(doc["requests"]), int(doc["errors"])
                inflight = int(doc.get("inflight", 0))
                ttft = [float(t) for t in doc.get("ttft", ())][:SAMPLES]
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
            into = merged.setdefault(str(url), {"requests": 0, "errors": 0, "inflight": 0,
                                                "ttft": []})
            into["requests"] += requests
            into["errors"] += errors
            into["inflight"] += inflight
            into["ttft"].extend(ttft)
    return merged
