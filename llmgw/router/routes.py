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

A **canary** (an endpoint with a ``share``: a new replica baking behind a
rollout gate) gets that share of the model's requests, counted, not drawn at
random: with share 0.1, every tenth. Every other request, and a retry after a
canary failed, goes to the other replicas; the canary takes one only when no
other replica is left. Per-replica tallies for the gate are in ``tallies``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

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


@dataclass(eq=False)
class Upstream:
    endpoint: Endpoint
    outstanding: int = 0
    picked: int = field(default=0)  # total picks; breaks ties in round-robin order
    _urls: dict[str, URL] = field(default_factory=dict, repr=False)

    def url(self, path: str) -> URL:
        """The replica's URL for ``path``, parsed once (the client would re-parse a str)."""
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = URL(self.endpoint.base_url + path, encoded=True)
        return url


class Routes:
    def __init__(self) -> None:
        self._table: dict[str, list[Upstream]] = {}
        self._by_url: dict[str, Upstream] = {}
        self._ready_events: dict[str, asyncio.Event] = {}
        self._rings: dict[str, affinities.Ring[Upstream]] = {}
        self._canaries: dict[str, list[Upstream]] = {}
        self._counted: dict[str, int] = {}  # requests per model while it has a canary
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
                if upstream is None or upstream.endpoint != endpoint:
                    fresh = Upstream(Endpoint(url, endpoint.node, endpoint.replica,
                                              endpoint.share))
                    if upstream is not None:
                        fresh.outstanding = upstream.outstanding
                    upstream = fresh
                by_url[url] = upstream
                upstreams.append(upstream)
            if upstreams:
                table[model] = upstreams
        self._table, self._by_url = table, by_url
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

    def models(self) -> list[str]:
        """Models with at least one ready endpoint."""
        return sorted(self._table)

    def counts(self) -> dict[str, int]:
        return {model: len(upstreams) for model, upstreams in self._table.items()}

    def has(self, model: str) -> bool:
        return model in self._table

    def pick(
        self, model: str, exclude: Collection[Upstream] = (), *,
        affinity: str | None = None, load_factor: float = 1.25,
    ) -> Upstream | None:
        """The upstream of ``model`` to send a request to, not one in ``exclude``.

        With ``affinity`` (a prompt-prefix digest), the first replica on the
        model's ring from that digest whose load stays under ``load_factor`` ×
        the average; otherwise the one with the fewest outstanding requests,
        ties to the one picked least often, so equal replicas share work in
        turn instead of the first one taking every request of a quiet period.
        A canary gets its share first (see the module's docstring).
        """
        canaries = self._canaries.get(model)
        if canaries:
            chosen = self._canary(model, canaries, exclude)
            if chosen is not None:
                chosen.picked += 1
                return chosen
        if affinity is not None and model in self._rings:
            chosen = self._rings[model].pick(
                affinity, load=lambda u: u.outstanding, load_factor=load_factor,
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
            if best is None or (upstream.outstanding, upstream.picked) < (
                best.outstanding, best.picked
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
