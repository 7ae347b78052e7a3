"""The route table: model → ready endpoints; least-outstanding or prefix-affine choice.

The daemon calls ``routes.update(model_to_endpoints)`` after each observation
(tests pass static endpoints). An :class:`Upstream` keeps its outstanding
request count across updates, keyed by base URL, so a replica that stays
ready keeps its load figure and requests still in flight on a replica that
left the table finish against the right counter.

Everything here runs on the router's event loop thread; nothing locks.

Usage::

    routes = Routes()
    routes.update({"llama": [Endpoint("http://10.0.0.11:18000", node="gpu-a-01", replica=0)]})
    upstream = routes.pick("llama")           # least outstanding, or None
    upstream = routes.pick("llama", affinity=affinities.key(body, 1024, 256))

With an ``affinity`` key, the replica comes from the model's hash ring with
bounded loads (:mod:`llmgw.router.affinities`), so requests sharing a prompt
prefix meet the engine that has it cached; without one, least outstanding.

**Load** is what balancing compares (:meth:`Upstream.load`): where the
engine reported its own (requests running plus waiting, scraped by the
agent and carried in the route table), that figure moved by how this
router's own requests in flight there changed since (one started since adds
one; one that was running at the report and has ended takes one off, so the
figure neither drifts up between reports nor forgets what it just sent);
otherwise least outstanding — this
router's requests in flight plus the other routers' (``set_others``: their
demand records, merged through the store). A **cap** (``routing.max_in_flight``)
counts requests in flight, this router's and the others': a replica at its
cap is not picked, and :meth:`Routes.free` says how many more the model's
replicas take (the admission queue's measure, :mod:`llmgw.router.admissions`).

A **canary** (an endpoint with a ``share``: a new replica baking behind a
rollout gate) gets that share of the model's requests, counted, not drawn at
random: with share 0.1, every tenth. Every other request, and a retry after a
canary failed, goes to the other replicas; the canary takes one only when no
other replica is left. Per-replica tallies for the gate are in ``tallies``.

An **upstream** (an endpoint with ``upstream`` set: one llmgw did not place) is
capped by its own ``cap``, not the model's. One that is a **fallback** of a
model is picked only when none of the model's other endpoints is left to try:
none is in the table, or each was tried for this request (a replica that failed
before its first byte). A replica at its cap is not "left out": the request
queues for it, as before, rather than spilling to the fallback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from yarl import URL

from llmgw.router import affinities
from llmgw.router.tallies import Tallies


@dataclass(frozen=True)
class Endpoint:
    """One ready replica's engine, as the router reaches it."""

    base_url: str  # http://127.0.0.1:18001, no trailing slash
    node: str = ""
    replica: int | None = None
    share: float | None = None  # a canary: the share of the model's requests it gets
    # The engine's own load (requests running + waiting) at its last scrape, and that
    # scrape's unix time; None: not reported. Not part of the endpoint's identity.
    load: int | None = field(default=None, compare=False)
    load_at: float | None = field(default=None, compare=False)
    # An upstream (``upstreams:``, llmgw.router.externals): its name, and its own cap
    # (None: none; a model's cap is about its engines). ``fallback``: for this model it
    # takes requests only while no replica is left to try (per model, so not identity).
    upstream: str = ""
    cap: int | None = field(default=None, compare=False)
    fallback: bool = field(default=False, compare=False)


@dataclass(eq=False)
class Upstream:
    endpoint: Endpoint
    outstanding: int = 0
    picked: int = field(default=0)  # total picks; breaks ties in round-robin order
    others: int = 0  # requests other routers have in flight here (their last records)
    reported: int | None = None  # the engine's own load at its last report
    reported_at: float | None = None
    at_report: int = 0  # this router's requests in flight here when the report came
    _urls: dict[str, URL] = field(default_factory=dict, repr=False)

    def url(self, path: str) -> URL:
        """The replica's URL for ``path``, parsed once (the client would re-parse a str)."""
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = URL(self.endpoint.base_url + path, encoded=True)
        return url

    def load(self) -> int:
        """What balancing compares: the engine's report moved by this router's change
        in flight since it, else every router's requests in flight."""
        if self.reported is not None:
            return max(0, self.reported + self.outstanding - self.at_report)
        return self.outstanding + self.others

    def in_flight(self) -> int:
        """Requests every router has in flight here: what a cap bounds."""
        return self.outstanding + self.others

    def begin(self) -> None:
        self.outstanding += 1

    def end(self) -> None:
        self.outstanding -= 1

    def report(self, endpoint: Endpoint) -> None:
        """Take the engine's load from a fresh table; a new scrape is the new baseline."""
        if endpoint.load_at != self.reported_at or endpoint.load != self.reported:
            self.reported, self.reported_at = endpoint.load, endpoint.load_at
            self.at_report = self.outstanding


class Routes:
    def __init__(self) -> None:
        self._table: dict[str, list[Upstream]] = {}
        self._by_url: dict[str, Upstream] = {}
        self._ready_events: dict[str, asyncio.Event] = {}
        self._rings: dict[str, affinities.Ring[Upstream]] = {}
        self._canaries: dict[str, list[Upstream]] = {}
        self._counted: dict[str, int] = {}  # requests per model while it has a canary
        self._fallbacks: dict[str, list[Upstream]] = {}  # per model: picked last
        self.tallies = Tallies()

    def update(self, model_to_endpoints: Mapping[str, Sequence[Endpoint]]) -> None:
        """Replace the whole table. Models absent from the mapping have no endpoint.

        Requests waiting for a model that now has endpoints are woken.
        """
        table: dict[str, list[Upstream]] = {}
        by_url: dict[str, Upstream] = {}
        for model, endpoints in model_to_endpoints.items():
            upstreams = []
            for endpoint in endpoints:
                url = endpoint.base_url.rstrip("/")
                upstream = by_url.get(url) or self._by_url.get(url)
                if upstream is None:
                    upstream = Upstream(replace(endpoint, base_url=url))
                elif upstream.endpoint != endpoint:
                    # The same replica, changed (a canary's share set or lifted): the same
                    # object, since a request in flight ends on the one it began on. A copy
                    # would keep that request's count for ever, and a replica at its cap
                    # would take no request again.
                    upstream.endpoint = replace(endpoint, base_url=url)
                upstream.report(endpoint)
                by_url[url] = upstream
                upstreams.append(upstream)
            if upstreams:
                table[model] = upstreams
        self._table, self._by_url = table, by_url
        self._fallbacks = {
            model: fallbacks for model, endpoints in model_to_endpoints.items()
            if (fallbacks := [by_url[e.base_url.rstrip("/")] for e in endpoints if e.fallback])}
        self._canaries = {model: canaries for model, upstreams in table.items()
                          if (canaries := [u for u in upstreams if u.endpoint.share])}
        self._counted = {m: n for m, n in self._counted.items() if m in self._canaries}
        self._rings = {
            model: affinities.Ring([u for u in upstreams if not u.endpoint.share] or upstreams,
                                   lambda u: u.endpoint.base_url)
            for model, upstreams in table.items()
        }
        self.tallies.prune(by_url)
        for model in list(self._ready_events):
            if model in table:
                self._ready_events.pop(model).set()

    def endpoints(self, model: str) -> list[Endpoint]:
        return [u.endpoint for u in self._table.get(model, ())]

    def has_replica(self, model: str) -> bool:
        """Whether ``model`` has an endpoint that is a replica, not an upstream."""
        return any(not u.endpoint.upstream for u in self._table.get(model, ()))

    def upstreams_of(self, model: str) -> list[Upstream]:
        """The model's endpoints that are upstreams (``upstreams:``), not replicas."""
        return [u for u in self._table.get(model, ()) if u.endpoint.upstream]

    def models(self) -> list[str]:
        """Models with at least one ready endpoint."""
        return sorted(self._table)

    def counts(self) -> dict[str, int]:
        return {model: len(upstreams) for model, upstreams in self._table.items()}

    def has(self, model: str) -> bool:
        return model in self._table

    def set_others(self, replica_in_flight: Mapping[str, int]) -> None:
        """Other routers' requests in flight by replica URL (absent: none)."""
        for url, upstream in self._by_url.items():
            upstream.others = max(0, int(replica_in_flight.get(url, 0)))

    def free(self, model: str, cap: int | None) -> int | None:
        """How many more requests ``model``'s replicas take under ``cap`` each; None: no cap."""
        upstreams = self._primaries(model)
        limits = [_limit(u, cap) for u in upstreams]
        if not upstreams or any(limit is None for limit in limits):
            return None
        return sum(max(0, (limit or 0) - u.in_flight()) for u, limit in zip(
            upstreams, limits, strict=True))

    def _primaries(self, model: str) -> list[Upstream]:
        """The model's endpoints but its fallbacks, unless only fallbacks are there."""
        upstreams = self._table.get(model, [])
        fallbacks = self._fallbacks.get(model)
        if not fallbacks:
            return upstreams
        return [u for u in upstreams if u not in fallbacks] or upstreams

    def in_flight(self) -> dict[str, int]:
        """Model → this router's requests in flight on its replicas (not on upstreams: the
        autoscaler divides this by ready replicas)."""
        return {model: n for model, upstreams in self._table.items()
                if (n := sum(u.outstanding for u in upstreams if not u.endpoint.upstream))}

    def replica_in_flight(self) -> dict[str, int]:
        """Replica URL → this router's requests in flight there (none left out)."""
        return {url: u.outstanding for url, u in self._by_url.items() if u.outstanding}

    def pick(
        self, model: str, exclude: Collection[Upstream] = (), *,
        affinity: str | None = None, load_factor: float = 1.25, cap: int | None = None,
    ) -> Upstream | None:
        """The upstream of ``model`` to send a request to, not one in ``exclude``.

        With ``affinity`` (a prompt-prefix digest), the first replica on the
        model's ring from that digest whose load stays under ``load_factor`` ×
        the average; otherwise the one with the least load (:meth:`Upstream.load`),
        ties to the one picked least often, so equal replicas share work in
        turn instead of the first one taking every request of a quiet period.
        A canary gets its share first (see the module's docstring). With ``cap``,
        a replica with that many requests in flight is not picked (None when all are).
        """
        tried = exclude
        fallbacks = self._fallbacks.get(model)
        if fallbacks and any(u not in exclude and u not in fallbacks
                             for u in self._table.get(model, ())):
            exclude = [*exclude, *fallbacks]  # a replica is left: not yet
        canaries = self._canaries.get(model)
        if canaries:
            chosen = self._canary(model, canaries, tried)
            if chosen is not None and (cap is None or chosen.in_flight() < cap):
                chosen.picked += 1
                return chosen
        full = [u for u in self._table.get(model, ())
                if (limit := _limit(u, cap)) is not None and u.in_flight() >= limit]
        if full:
            exclude = [*exclude, *full]
        if affinity is not None and model in self._rings:
            chosen = self._rings[model].pick(
                affinity, load=Upstream.load, load_factor=load_factor,
                allowed=lambda u: u not in exclude,
            )
            if chosen is not None:
                chosen.picked += 1
            return chosen
        best: Upstream | None = None
        upstreams: Sequence[Upstream] = self._table.get(model, ())
        if canaries:  # the others, unless no other is left
            allowed = [u for u in upstreams if u not in exclude]
            upstreams = [u for u in allowed if not u.endpoint.share] or allowed
        for upstream in upstreams:
            if upstream in exclude:
                continue
            if best is None or (upstream.load(), upstream.picked) < (
                best.load(), best.picked
            ):
                best = upstream
        if best is not None:
            best.picked += 1
        return best

    def _canary(self, model: str, canaries: list[Upstream],
                exclude: Collection[Upstream]) -> Upstream | None:
        """The canary whose turn it is, for a first attempt; None for the others."""
        if exclude:
            return None  # a retry goes to an old replica
        n = self._counted[model] = self._counted.get(model, 0) + 1
        share = min(1.0, sum(u.endpoint.share or 0.0 for u in canaries))
        turn = int(n * share)
        if turn == int((n - 1) * share):
            return None
        return canaries[turn % len(canaries)]  # several canaries take turns

    async def wait_ready(self, model: str, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``model`` to have an endpoint."""
        if model in self._table:
            return True
        event = self._ready_events.get(model)
        if event is None:
            event = self._ready_events[model] = asyncio.Event()
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass
        return model in self._table


def _limit(upstream: Upstream, cap: int | None) -> int | None:
    """The most requests in flight ``upstream`` takes: an upstream's own cap, a replica's
    the model's (None: no cap)."""
    return upstream.endpoint.cap if upstream.endpoint.upstream else cap
