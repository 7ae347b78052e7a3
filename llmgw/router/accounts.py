"""Who is asking and who pays: API key checks, budgets, and usage rows.

:class:`Accounts` authenticates a request's ``Authorization: Bearer`` key
against the store (one primary-key probe, constant-time digest compare; see
:mod:`llmgw.store.keys`), refuses projects at or over their budget, and
records one usage row per request. Spend per project is kept in memory, so
the budget check reads no database; it is reloaded from the store at every
flush, so spend charged by other routers sharing the store counts here too.
Rows are buffered and written in one transaction every ``flush_interval``
seconds (and on close), so a request never waits on a write. Every store call
is async (:mod:`llmgw.store.stores`): none blocks the event loop.

Budgets: a request for a project with a budget reserves its estimated cost
(:func:`estimate`, capped by the model's context length; a project's
``max_request_usd`` refuses a request whose estimate is above it) in the store
before it is sent — atomically across every
router sharing the store — and the reservation is settled, in the transaction
that writes the request's usage row, at the next flush; at the request's end
it already shrinks to the real cost. A project is refused
once what it spent plus what requests in flight reserved reaches its budget,
so spend stays under budget + one reservation, however many routers and
requests, as long as answers cost no more than their reservation (always, when
a client sets an output limit). A reservation belongs to this router while its
heartbeat beats (:mod:`llmgw.router.heartbeats`), which also records what each
request has produced so far: a router that dies mid-stream has its reservations
released, and what it recorded billed, by the next router that beats.

Budget periods (:mod:`llmgw.spec.budgets`): a project whose budget resets on a
calendar period (day, week, month in a time zone) is admitted against what it
spent in the current period only: usage rows with ``ts`` at or after the
period's start, by this router's clock (``clock``, injected in tests). A
request is billed to the period it arrived in: its reservation is taken with
its arrival time, counts only in that period, and its usage row carries that
``ts`` however late it is settled (or released). So within every period spend
stays under budget + one reservation per router, as above, and at the boundary
the new period starts empty: reservations of the old one neither block it nor
land in it. :attr:`Accounts.spent` holds each project's spend in its current
period (for ever, without a period).

What an answer without the engine's usage costs is decided by the router
(:meth:`llmgw.router.apps.Router`): a client that hung up mid-stream pays what
was served (:func:`unreported`); a successful answer whose usage cannot be read
pays its whole estimate.

Store outages (docs/ha.md): keys are checked against a cache
(:mod:`llmgw.router.keycaches`) and a project's budget, while the store cannot
be reached, against this router's local ledger: the spend it last loaded, plus
what it recorded since, plus what its requests in flight reserved (in the store
before the outage, or locally since).
Rows that cannot be written go to a file (:mod:`llmgw.router.usagebuffers`)
and are written on recovery, once each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw.router import heartbeats
from llmgw.router.catalogs import Catalog
from llmgw.router.errors import ApiError
from llmgw.router.keycaches import KeyCache, StoreHealth
from llmgw.router.settlements import Settlements
from llmgw.router.usagebuffers import UsageBuffer
from llmgw.store import keys
from llmgw.store.reservations import Owner, Progress
from llmgw.store.stores import Admission, Store, StoreError
from llmgw.store.usages import UsageRow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Principal:
    project: str | None  # None under `auth: none`
    key_id: str | None
    user: str | None = None  # a logged-in person (a page's request), not a key
    rpm: int | None = None  # the key's own rate limits (llmgw.router.ratelimits)
    tpm: int | None = None


ANONYMOUS = Principal(None, None)


@dataclass(frozen=True)
class Reservation:
    project: str | None  # None: nothing was reserved (no budget, or auth: none)
    amount: float = 0.0
    id: str | None = None  # the store's reservation
    local: bool = False  # taken on this router's ledger while the store was away


NOTHING = Reservation(None)
# A backstop only: a reservation is kept by its router's heartbeat (llmgw.router.heartbeats)
# and released within seconds of that router's death; past this, it is stale regardless.
RESERVATION_HOLD = 86400.0
DEFAULT_OUTPUT_TOKENS = 1024  # reserved for a request that sets no output limit
# What a model can read and produce when its profiles state no context length
# (max-model-len, ctx-size, context-length): the largest context common models serve.
DEFAULT_CONTEXT_TOKENS = 131072
MAX_CHOICES = 128  # `n` above this is refused (OpenAI's own limit)
_OUTPUT_LIMITS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def estimate(body_bytes: int, payload: dict[str, Any], embeddings: bool,
             context: int | None = None) -> tuple[int, int]:
    """Tokens to reserve: the body's bytes bound its prompt tokens (a token of a byte-level
    tokenizer covers at least one byte), plus its output limit times ``n`` choices. Each is
    capped by what the model can read or produce: its ``context`` length in tokens
    (:data:`DEFAULT_CONTEXT_TOKENS` when unknown), so ``max_tokens: 1000000000`` reserves
    one context, not a billion tokens."""
    window = context or DEFAULT_CONTEXT_TOKENS
    if embeddings:
        return min(body_bytes, window), 0
    limit = next((v for v in (payload.get(k) for k in _OUTPUT_LIMITS)
                  if isinstance(v, int) and not isinstance(v, bool) and v >= 0),
                 DEFAULT_OUTPUT_TOKENS)
    n = payload.get("n")
    choices = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
    return min(body_bytes, window), min(limit, window) * min(choices, MAX_CHOICES)


def unreported(body_bytes: int, relayed_events: int) -> tuple[int, int]:
    """Tokens to charge a request that ended without the engine's usage (the client hung
    up, or the engine broke mid-stream): what was served — its prompt (body bytes / 4, a
    typical token, not a bound) and one token per stream event relayed."""
    return -(-body_bytes // _BYTES_PER_TOKEN), relayed_events


_BYTES_PER_TOKEN = 4
_HOW_TO = "send `Authorization: Bearer <key>`; an operator creates keys with `llmgw keys create`"


class Accounts:
    def __init__(
        self, store: Store | None, catalog: Catalog, flush_interval: float = 1.0,
        router_id: str | None = None,
        heartbeat_interval: float = heartbeats.DEFAULT_INTERVAL,
        clock: Callable[[], float] = time.time,
        state_dir: Path | None = None,
        signals: Callable[[str, float], None] | None = None,
    ) -> None:
        if store is None and catalog.auth != "none":
            raise ValueError("auth: keys needs a store to check keys against")
        self.store = store
        self.catalog = catalog
        self.flush_interval = flush_interval
        self.router_id = router_id or f"router-{secrets.token_hex(6)}"
        # Unix time, by which usage rows are stamped and budget periods start (tests move it).
        self.clock = clock
        self.spent: dict[str, float] = {}
        # The period start each figure of ``spent`` counts from (absent: lifetime).
        self._counted_from: dict[str, float] = {}
        self._rows: list[UsageRow] = []
        self._settled: list[str | None] = []  # _settled[i]: the reservation of _rows[i]
        self._flusher: asyncio.Task[None] | None = None
        self._flushing = asyncio.Lock()
        # What each request in flight with a reservation has produced so far, by id.
        self._live: dict[str, Callable[[], tuple[int, int, float]]] = {}
        self.settlements = Settlements(store) if store is not None else None
        self.heartbeat = (heartbeats.Heartbeat(store, self.router_id, heartbeat_interval,
                                               self.progress)
                          if store is not None else None)
        # signals(name, value): store_up, buffered_rows, key_hit, key_miss (the metrics)
        self._signal = signals or (lambda name, value: None)
        self.health = StoreHealth(lambda up: self._signal("store_up", float(up)))
        self.keys = (KeyCache(store, self.health,
                              hit=lambda found: self._signal("key_hit" if found else "key_miss",
                                                             1.0))
                     if store is not None else None)
        self.buffer = (UsageBuffer(state_dir, self.router_id)
                       if store is not None and state_dir is not None else None)
        # project → USD this router's requests in flight reserved, in the store or on the
        # local ledger: what the local ledger holds while the store is away
        self._in_flight: dict[str, float] = {}

    async def authenticate(self, authorization: str | None) -> Principal:
        """The caller's project and key, or ApiError 401/403."""
        if self.catalog.auth == "none":
            return ANONYMOUS
        if not authorization:
            raise ApiError(401, f"missing API key: {_HOW_TO}", code="missing_api_key")
        scheme, _, token = authorization.partition(" ")
        # Only Bearer: a key sent under another scheme (Basic, Token, ...) was meant for
        # something else, or a client is guessing what this server accepts.
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, f"malformed Authorization header: {_HOW_TO}",
                           code="invalid_api_key")
        assert self.keys is not None
        presented = token.strip()
        key_id = keys.key_id_of(presented)
        try:
            row = await self.keys.row(key_id) if key_id is not None else None
        except StoreError as exc:
            # Not a known key, and nothing to check it against: not a 401, since the
            # key may well be good.
            self.health.failed(exc)
            raise ApiError(503, "the key store is unreachable and this key is not one this "
                           "router knows; retry shortly", code="store_unavailable",
                           type="server_error", headers={"Retry-After": "2"}) from None
        info = keys.check(presented, row)
        if info is None:
            raise ApiError(401, "invalid API key (unknown, mistyped or revoked)",
                           code="invalid_api_key")
        if info.project not in self.catalog.budgets:
            raise ApiError(403, f"this key's project {info.project!r} is not defined in the "
                           "cluster's projects", code="unknown_project")
        return Principal(info.project, info.id, rpm=info.rpm, tpm=info.tpm)

    async def reserve(self, principal: Principal, cost: float, model: str = "",
                      endpoint: str = "", stream: bool = False,
                      arrived: float | None = None) -> Reservation:
        """Hold ``cost`` USD of the caller's budget until :meth:`record`; ApiError 429 when
        what the project has spent in the budget's current period and requests of that
        period in flight on every router sharing the store have reserved already reaches
        its budget. The reservation is this router's (its heartbeat keeps it); ``model``,
        ``endpoint`` and ``stream`` say what to bill if this router dies before settling
        it. ``arrived``: the request's arrival by :attr:`clock` (default now), the ``ts``
        its usage row must carry: it picks the period."""
        project = principal.project
        cap = self.catalog.request_caps.get(project) if project is not None else None
        if cap is not None and cost > cap:
            raise ApiError(
                400, f"this request may cost up to {_usd(cost)} (its prompt's bytes and "
                f"max_tokens, capped by the model's context), more than project {project!r} "
                f"allows one request (max_request_usd {_usd(cap)}); lower max_tokens or n",
                code="request_over_cap", param="max_tokens")
        budget = self.catalog.budgets.get(project) if project is not None else None
        if project is None or budget is None or self.store is None:
            return NOTHING
        when = self.clock() if arrived is None else arrived
        period = self.catalog.period(project)
        owner = Owner(self.router_id, principal.key_id, model, endpoint, stream, principal.user,
                      when)
        admission = None
        if self.health.up:
            try:
                admission = await self.store.reserve(project, budget, cost, RESERVATION_HOLD,
                                                     owner, period.start(when))
            except StoreError as exc:
                self.health.failed(exc)
        if admission is None:
            admission = self._reserve_locally(project, budget, cost)
            if admission.id is not None:
                self._hold(project, cost)
                return Reservation(project, cost, None, local=True)
        if admission.id is None:
            in_flight = (f" (requests in flight hold {_usd(admission.reserved)} more)"
                         if admission.reserved > 0 else "")
            resets = period.resets(when)
            retry: dict[str, str] = {}
            if resets is None:
                what, then = "", "raise budget_usd in the cluster's projects to continue"
            else:
                # RFC 9110's delay in whole seconds, rounded up so that a client that waits
                # exactly this long arrives in the new period; a lifetime budget gets none,
                # since no wait will help
                retry = {"Retry-After": str(max(1, math.ceil(resets - when)))}
                what = " today" if period.kind == "day" else f" this {period.kind}"
                then = (f"it resets at {period.instant(resets)}, or raise budget.usd in "
                        "the cluster's projects")
            raise ApiError(
                429,
                f"project {project!r} is over its budget: spent {_usd(admission.spent)}{what} "
                f"of {_usd(budget)}{in_flight}; {then}",
                code="insufficient_quota", type="insufficient_quota", headers=retry,
            )
        self._hold(project, cost)
        return Reservation(project, cost, admission.id)

    def _reserve_locally(self, project: str, budget: float, cost: float) -> Admission:
        """The store is away: admit against the spend last loaded, plus what this router
        recorded since, plus what its requests in flight reserved (in the store before the
        outage, or here since), as the store would (the bound is in docs/ha.md)."""
        spent, held = self.spent_now(project), self._in_flight.get(project, 0.0)
        if spent + held >= budget:
            return Admission(None, spent, held)
        return Admission("local", spent, held)

    def _hold(self, project: str, cost: float) -> None:
        self._in_flight[project] = self._in_flight.get(project, 0.0) + cost

    def track(self, reservation: Reservation,
              produced: Callable[[], tuple[int, int, float]]) -> None:
        """While its request runs, ``produced()`` says what it has produced (prompt and
        completion tokens, USD): the heartbeat records it into the reservation."""
        if reservation.id is not None:
            self._live[reservation.id] = produced

    def untrack(self, reservation: Reservation) -> None:
        if reservation.id is not None:
            self._live.pop(reservation.id, None)

    def progress(self) -> list[Progress]:
        """What every tracked request has produced so far (the heartbeat's record)."""
        return [Progress(rid, *produced()) for rid, produced in list(self._live.items())]

    def record(self, row: UsageRow, reservation: Reservation | None = None) -> None:
        """Charge ``row`` to its project now; write it, and settle ``reservation``, at the
        next flush (in one transaction: see :meth:`Store.insert_usage`)."""
        if row.project is not None and row.cost_usd and self._counts(row):
            self.spent[row.project] = self.spent.get(row.project, 0.0) + row.cost_usd
        if self.store is not None:
            self._rows.append(row)
            self._settled.append(reservation.id if reservation is not None else None)

    async def settle(self, reservation: Reservation, cost: float) -> None:
        """Shrink ``reservation`` to what its request cost, at once: the next request of
        the project is admitted against the real figure, not the estimate."""
        if reservation.project is not None and reservation.amount:
            # record() counted its cost into spent already
            left = self._in_flight.get(reservation.project, 0.0) - reservation.amount
            self._in_flight[reservation.project] = max(left, 0.0)
        if reservation.local:
            return
        if reservation.id is None or self.settlements is None or not self.health.up:
            return  # the estimate holds until the row is written: the safe side
        try:
            await self.settlements.settle(reservation.id, cost)
        except StoreError as exc:
            self.health.failed(exc)

    async def flush(self) -> None:
        """Write buffered rows (one transaction), then reload spend from the store. One
        flush at a time: when it returns, every row recorded before it was called is
        written (or kept for the next, on a store error), even if the periodic flush was
        writing some of them meanwhile."""
        async with self._flushing:
            await self._flush()

    async def _flush(self) -> None:
        if self.store is None:
            return
        rows, self._rows = self._rows, []
        settled, self._settled = self._settled, []
        try:
            if self.buffer is not None:
                await self.buffer.drain(self.store)
            if rows or settled:
                await self.store.insert_usage(rows, settled)
            starts = self._starts()
            stored = await self.store.spend_by_project(starts)
        except StoreError as exc:
            # To disk, or kept for the next flush: a locked disk or a lost database must
            # not lose spend (their reservations keep holding the budget meanwhile).
            self.health.failed(exc)
            if not (rows or settled) or self.buffer is None or not self.buffer.append(
                    rows, settled):
                self._rows[:0] = rows
                self._settled[:0] = settled
            self._signal("buffered_rows", float(self._buffered()))
            return
        self.health.ok()
        self._signal("buffered_rows", float(self._buffered()))
        # Rows recorded while this flush awaited are in memory only: keep them on top.
        self._counted_from = {p: s for p, s in starts.items() if s is not None}
        pending: dict[str, float] = {}
        for row in [*self._rows, *(self.buffer.rows if self.buffer is not None else ())]:
            if row.project is not None and row.cost_usd and self._counts(row):
                pending[row.project] = pending.get(row.project, 0.0) + row.cost_usd
        for project in set(stored) | set(pending) | set(self._counted_from):
            self.spent[project] = stored.get(project, 0.0) + pending.get(project, 0.0)

    def _buffered(self) -> int:
        return len(self._rows) + (self.buffer.count if self.buffer is not None else 0)

    def _starts(self) -> dict[str, float | None]:
        """The current period's start of every project whose budget has one."""
        now = self.clock()
        return {p: period.start(now) for p, period in self.catalog.periods.items()}

    def _counts(self, row: UsageRow) -> bool:
        """Whether ``row`` falls in the period :attr:`spent` counts for its project."""
        since = self._counted_from.get(row.project) if row.project is not None else None
        return since is None or row.ts >= since

    def spent_now(self, project: str) -> float:
        """What ``project`` spent in its budget's current period, as last loaded (every
        ``flush_interval``): zero once a new period began, until the next flush."""
        since = self.catalog.period(project).start(self.clock())
        if since is not None and self._counted_from.get(project) != since:
            return sum(r.cost_usd for r in self._rows if r.project == project and r.ts >= since)
        return self.spent.get(project, 0.0)

    async def start(self) -> None:
        """Beat (releasing what dead routers left), load spend so far, then flush every
        ``flush_interval`` seconds."""
        if self._flusher is None and self.store is not None:
            if self.heartbeat is not None:
                await self.heartbeat.start()
            if self.keys is not None:
                await self.keys.start()
            try:
                starts = self._starts()
                self.spent = await self.store.spend_by_project(starts)
                self._counted_from = {p: s for p, s in starts.items() if s is not None}
            except StoreError as exc:
                log.error("cannot load spend from the store yet: %s", exc)
            self._flusher = asyncio.get_running_loop().create_task(self._flush_forever())

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        if self.keys is not None:
            await self.keys.close()
        await self.flush()
        if self.heartbeat is not None:
            await self.heartbeat.close()

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval)
            await self.flush()


def _usd(amount: float) -> str:
    """Dollars to the cent, or to the micro-dollar below a cent (token prices are tiny)."""
    return f"${amount:,.2f}" if amount >= 0.01 or amount == 0 else f"${amount:.6f}"
