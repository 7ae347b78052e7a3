"""Routes from the leader to every router, demand from every router to the leader,
both through the store.

Why the store and not the leader's admin API: every router needs the store
anyway (keys, budgets, usage), so this adds no connection, no address to
configure and no dependency on which reconciler leads. A router that starts
while no reconciler answers still gets the last table the last leader
published. A router keeps routing on the routes it has when the store or the
leader is gone: nothing here ever empties a router's table on an error.

* The leader publishes ``{"routes": {model: [[url, node, replica], ...]}}``
  after every observation, fenced by its lease epoch
  (:meth:`Store.publish_routes`): a deposed leader's write is refused. A
  canary baking behind a rollout gate has a fourth item, its share. A top-level
  ``"load": {url: [load, scraped_at]}`` carries each replica's engine-reported
  load (requests running + waiting) where its agent scraped one; a reader
  that does not know the key ignores it.
* A top-level ``"upstreams"`` holds each upstream's summary (its URL, whether a
  key is sent, its models; never the key): ``llmgw plan`` compares the files
  with it. Routers do not route by it: each adds the upstreams of its own
  cluster files, with keys it reads itself (:mod:`llmgw.router.externals`).
* Each router polls it every ``interval`` (0.5 s) and applies a table with a
  newer sequence number, and writes its own demand (requests waiting, last
  use per model) under its id; the leader merges every router's demand heard
  from within 30 s into the scaling decision (:func:`merge`). The same record
  carries the router's per-replica tallies (:mod:`llmgw.router.tallies`),
  which a rollout gate adds up (:func:`read_tallies`), and its requests in
  flight per replica: each router reads the others' (:func:`read_signals`,
  skipping its own) and balances and caps on every router's load.

Usage::

    follower = Follower(store, router, router_id="host:1234:ab12")
    await follower.run(stop)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from llmgw.daemon.leaders import LEASE
from llmgw.fleet.types import Demand
from llmgw.router import tallies
from llmgw.router.apps import Router
from llmgw.router.routes import Endpoint
from llmgw.store.stores import Store, StoreError

log = logging.getLogger("llmgw.routes")
SIGNAL_MAX_AGE = 30.0  # a router not heard from for this long has stopped
# Other routers' requests in flight count for balancing and caps only this fresh: a router
# that died with requests in flight must not hold a replica's slots for 30 s.
IN_FLIGHT_MAX_AGE = 5.0


def encode(table: Mapping[str, Sequence[Endpoint]],
           upstreams: Mapping[str, Any] | None = None) -> str:
    """The table as published; ``upstreams``: their summaries (no key:
    :func:`llmgw.spec.upstreams.summary`), for ``llmgw plan`` to compare, not to route."""
    doc: dict[str, Any] = {"routes": {
        model: [[e.base_url, e.node, e.replica] + ([e.share] if e.share else [])
                for e in endpoints]
        for model, endpoints in sorted(table.items())
    }}
    load = {e.base_url: [e.load, e.load_at] for endpoints in table.values()
            for e in endpoints if e.load is not None}
    if load:
        doc["load"] = dict(sorted(load.items()))
    if upstreams:
        doc["upstreams"] = dict(upstreams)
    return json.dumps(doc, separators=(",", ":"))


def upstreams_of(doc: str) -> dict[str, Any] | None:
    """The upstreams' summaries in a published table (None: it has none, or it is not one)."""
    try:
        found = json.loads(doc).get("upstreams")
    except (ValueError, AttributeError):
        return None
    if not isinstance(found, dict):
        return None
    return {str(name): entry for name, entry in found.items() if isinstance(entry, dict)}


def decode(doc: str) -> dict[str, list[Endpoint]]:
    """The table in ``doc``; ValueError when it is not one (a newer llmgw's, say)."""
    try:
        parsed = json.loads(doc)
        routes = parsed["routes"]
        load = _loads(parsed.get("load"))
        return {str(model): [_loaded(_endpoint(*item), load) for item in endpoints]
                for model, endpoints in routes.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a routing table: {exc}") from None


def _loads(raw: object) -> dict[str, tuple[int, float | None]]:
    """The ``load`` key: url → (load, scraped at); an entry that is not one is left out,
    since a replica without a report is balanced on requests in flight, not refused."""
    if not isinstance(raw, dict):
        return {}
    found = {}
    for url, item in raw.items():
        if (isinstance(item, list) and len(item) == 2 and isinstance(item[0], int)
                and not isinstance(item[0], bool) and item[0] >= 0
                and (item[1] is None or isinstance(item[1], int | float))):
            found[str(url)] = (item[0], None if item[1] is None else float(item[1]))
    return found


def _loaded(endpoint: Endpoint, load: Mapping[str, tuple[int, float | None]]) -> Endpoint:
    found = load.get(endpoint.base_url)
    return endpoint if found is None else replace(endpoint, load=found[0], load_at=found[1])


def _endpoint(url: object, node: object, replica: object,
              share: object = None) -> Endpoint:
    canary = None if share is None else float(str(share))
    if canary is not None and not 0.0 < canary <= 1.0:
        raise ValueError(f"a share of {canary}")
    return Endpoint(str(url), str(node), None if replica is None else int(str(replica)),
                    canary)


def merge(demands: Iterable[Demand]) -> Demand:
    """Several routers' demand as one: waits, queues and requests in flight add up, the
    latest use, the largest want and the slowest first token win.

    Watching counts from the router that started last: before it, requests sent to it
    are unknown. A demand with no router behind it (``watched_since`` None) adds nothing.
    """
    waiting: dict[str, int] = {}
    last_used: dict[str, float] = {}
    wanted: dict[str, int] = {}
    queued: dict[str, int] = {}
    in_flight: dict[str, int] = {}
    replica_in_flight: dict[str, int] = {}
    first_token: dict[str, float] = {}
    watched: list[float] = []
    for d in demands:
        if d.watched_since is not None:
            watched.append(d.watched_since)
        for summed, part in ((waiting, d.waiting), (queued, d.queued),
                             (in_flight, d.in_flight), (replica_in_flight, d.replica_in_flight)):
            for key, n in part.items():
                summed[key] = summed.get(key, 0) + n
        for model, at in d.last_used.items():
            last_used[model] = max(at, last_used.get(model, at))
        for model, n in d.wanted.items():
            wanted[model] = max(n, wanted.get(model, n))
        for model, seconds in d.first_token_seconds.items():
            first_token[model] = max(seconds, first_token.get(model, seconds))
    return Demand(waiting=waiting, last_used=last_used, wanted=wanted, queued=queued,
                  in_flight=in_flight, replica_in_flight=replica_in_flight,
                  first_token_seconds=first_token,
                  watched_since=max(watched) if watched else None)


async def read_signals(store: Store, skip: str | None = None,
                       max_age: float = SIGNAL_MAX_AGE) -> Demand:
    """Every live router's demand, merged; ``skip`` leaves out one (the caller's own);
    ``max_age``: routers heard from within that many seconds."""
    found: list[Demand] = []
    for doc in await store.signals(max_age):
        try:
            record = json.loads(doc)
            if record.get("router") != skip:
                found.append(Demand.model_validate(record["demand"]))
        except (ValueError, KeyError, TypeError, AttributeError, ValidationError):
            continue  # a record this llmgw cannot read is no demand it can act on
    return merge(found)


async def read_tallies(store: Store, skip: str | None = None) -> dict[str, dict[str, Any]]:
    """Every live router's per-replica tallies, added up; ``skip`` leaves out one."""
    found = []
    for doc in await store.signals(SIGNAL_MAX_AGE):
        try:
            record = json.loads(doc)
            if record.get("router") != skip and isinstance(record.get("tallies"), dict):
                found.append(record["tallies"])
        except (ValueError, TypeError, AttributeError):
            continue
    return tallies.merge(found)


class Follower:
    """A router's link to the leader through the store: routes in, demand out."""

    def __init__(
        self, store: Store, router: Router, router_id: str, *,
        leading: Callable[[], bool] = lambda: False, interval: float = 0.5,
    ) -> None:
        self.store = store
        self.router = router
        self.router_id = router_id
        self.leading = leading  # in a process that leads, the loop updates routes itself
        self.interval = interval
        self.seen: tuple[int, int] | None = None  # (epoch, seq) of the table in force
        self._failing = False

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                await self.step()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval)
        finally:
            with contextlib.suppress(StoreError, TimeoutError):
                await asyncio.wait_for(self.store.drop_signals(self.router_id), 2)

    async def step(self) -> None:
        try:
            if not self.leading():
                await self._follow()
            others = await read_signals(self.store, skip=self.router_id,
                                        max_age=IN_FLIGHT_MAX_AGE)
            self.router.set_others(others.replica_in_flight)
            record = {"router": self.router_id,
                      "demand": self.router.demand().model_dump(mode="json"),
                      "tallies": self.router.tallies()}
            await self.store.put_signals(self.router_id, json.dumps(record))
        except StoreError as exc:
            if not self._failing:
                log.warning("store unreachable; routing on the last known routes: %s", exc)
            self._failing = True
            return
        if self._failing:
            log.info("store reachable again")
        self._failing = False

    async def _follow(self) -> None:
        published = await self.store.published_routes(LEASE)
        if published is None or (published.epoch, published.seq) == self.seen:
            return
        try:
            table = decode(published.doc)
        except ValueError as exc:
            log.error("ignoring the published routes (epoch %d): %s", published.epoch, exc)
            self.seen = (published.epoch, published.seq)
            return
        self.router.update_routes(table)
        self.seen = (published.epoch, published.seq)
        log.debug("routes from the leader (epoch %d, #%d): %s", published.epoch,
                  published.seq, ", ".join(f"{m}×{len(e)}" for m, e in table.items()) or "none")
