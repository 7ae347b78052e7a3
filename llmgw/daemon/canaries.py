"""The daemon's side of rollout gates: canaries and drains in the route table, tallies in.

:class:`RouterTraffic` is the :class:`llmgw.applying.bakes.Traffic` of ``llmgw
serve``. It keeps two sets the daemon applies to every route table it builds
(:meth:`RouterTraffic.adjust`) — canaries with their share, and replicas being
drained — and republishes the table at once when either changes (to its own
router, and through the store to routers in other processes). Tallies are its
own router's plus, with a store, every other live router's
(:func:`llmgw.daemon.routetables.read_tallies`).

A drain waits until no router has a request in flight on the drained replicas,
bounded by :data:`DRAIN_TIMEOUT`; with a store it first waits
:data:`HA_SETTLE` seconds, for routers in other processes to pick the new
table up and report on it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import replace
from typing import Any

from llmgw.applying import bakes
from llmgw.daemon import routetables
from llmgw.router import tallies
from llmgw.router.apps import Router
from llmgw.router.routes import Endpoint
from llmgw.spec.models import Cluster
from llmgw.store.stores import Store, StoreError

log = logging.getLogger("llmgw.daemon")

DRAIN_TIMEOUT = 60.0  # seconds a drained replica's in-flight requests may take to finish
HA_SETTLE = 1.5  # seconds for other routers to apply a table and report (2 × their poll + ε)
DRAIN_POLL = 0.2


class RouterTraffic:
    routing = True

    def __init__(
        self,
        cluster: Callable[[], Cluster],
        republish: Callable[[], Awaitable[object]],
        router: Router | None,
        store: Store | None,
        router_id: str | None,
        *,
        drain_timeout: float = DRAIN_TIMEOUT,
    ) -> None:
        self._cluster = cluster
        self._republish = republish
        self.router = router
        self.store = store
        self.router_id = router_id
        self.drain_timeout = drain_timeout
        self.canaries: dict[str, float] = {}
        self.draining: set[str] = set()

    def url(self, node: str, port: int) -> str:
        return bakes.base_url(self._cluster(), node, port)

    def adjust(self, table: Mapping[str, list[Endpoint]]) -> dict[str, list[Endpoint]]:
        """``table`` with canaries given their share and drained replicas left out."""
        out: dict[str, list[Endpoint]] = {}
        for model, endpoints in table.items():
            kept = [replace(e, share=self.canaries.get(e.base_url)) for e in endpoints
                    if e.base_url not in self.draining]
            if kept:
                out[model] = kept
        return out

    def clear(self) -> None:
        """The apply is over: what was drained is gone, what baked was decided."""
        self.canaries.clear()
        self.draining.clear()

    async def share(self, url: str, share: float | None) -> None:
        if share is None:
            self.canaries.pop(url, None)
        else:
            self.canaries[url] = share
        await self._republish()

    async def tallies(self) -> Mapping[str, Mapping[str, Any]]:
        own = self.router.tallies() if self.router is not None else {}
        if self.store is None:
            return own
        try:
            others = await routetables.read_tallies(self.store, self.router_id)
        except StoreError as exc:
            log.warning("cannot read the routers' tallies (judging on this router's): %s", exc)
            return own
        return tallies.merge([own, others])

    async def drain(self, urls: Collection[str]) -> None:
        self.draining.update(urls)
        await self._republish()
        if self.store is not None:
            await asyncio.sleep(HA_SETTLE)
        deadline = time.monotonic() + self.drain_timeout
        while time.monotonic() < deadline:
            counts = await self.tallies()
            busy = sum(int(counts.get(url, {}).get("inflight", 0)) for url in urls)
            if not busy:
                return
            await asyncio.sleep(DRAIN_POLL)
        log.warning("requests still in flight on %s after %.0f s; removing it anyway",
                    ", ".join(sorted(urls)), self.drain_timeout)
