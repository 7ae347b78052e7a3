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
(:func:`estimate`) in the store before it is sent — atomically across every
router sharing the store — and the reservation is settled, in the transaction
that writes the request's usage row, at the next flush; at the request's end
it already shrinks to the real cost. A project is refused
once what it spent plus what requests in flight reserved reaches its budget,
so spend stays under budget + one reservation, however many routers and
requests, as long as answers cost no more than their reservation (always, when
a client sets an output limit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from llmgw.router.catalogs import Catalog
from llmgw.router.errors import ApiError
from llmgw.store import keys, usages
from llmgw.store.stores import Store, StoreError
from llmgw.store.usages import UsageRow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Principal:
    project: str | None  # None under `auth: none`
    key_id: str | None
    user: str | None = None  # a logged-in person (a page's request), not a key


ANONYMOUS = Principal(None, None)


@dataclass(frozen=True)
class Reservation:
    project: str | None  # None: nothing was reserved (no budget, or auth: none)
    amount: float = 0.0
    id: str | None = None  # the store's reservation


NOTHING = Reservation(None)
# How long a reservation holds if its router dies before settling it: longer than any
# request runs, so a live request's reservation never lapses under it.
RESERVATION_HOLD = 3600.0
DEFAULT_OUTPUT_TOKENS = 1024  # reserved for a request that sets no output limit
_OUTPUT_LIMITS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def estimate(body_bytes: int, payload: dict[str, Any], embeddings: bool) -> tuple[int, int]:
    """Tokens to reserve: the body's bytes bound its prompt tokens (a token of a byte-level
    tokenizer covers at least one byte), plus its output limit times ``n`` choices."""
    if embeddings:
        return body_bytes, 0
    limit = next((v for v in (payload.get(k) for k in _OUTPUT_LIMITS)
                  if isinstance(v, int) and not isinstance(v, bool) and v >= 0),
                 DEFAULT_OUTPUT_TOKENS)
    n = payload.get("n")
    choices = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
    return body_bytes, limit * choices
_HOW_TO = "send `Authorization: Bearer <key>`; an operator creates keys with `llmgw keys create`"


class Accounts:
    def __init__(
        self, store: Store | None, catalog: Catalog, flush_interval: float = 1.0
    ) -> None:
        if store is None and catalog.auth != "none":
            raise ValueError("auth: keys needs a store to check keys against")
        self.store = store
        self.catalog = catalog
        self.flush_interval = flush_interval
        self.spent: dict[str, float] = {}
        self._rows: list[UsageRow] = []
        self._settled: list[str] = []  # reservations whose rows are in _rows
        self._flusher: asyncio.Task[None] | None = None

    async def authenticate(self, authorization: str | None) -> Principal:
        """The caller's project and key, or ApiError 401/403."""
        if self.catalog.auth == "none":
            return ANONYMOUS
        if not authorization:
            raise ApiError(401, f"missing API key: {_HOW_TO}", code="missing_api_key")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, f"malformed Authorization header: {_HOW_TO}",
                           code="invalid_api_key")
        assert self.store is not None
        try:
            info = await keys.verify(self.store, token.strip())
        except StoreError as exc:
            log.error("cannot check an API key: %s", exc)
            raise ApiError(503, "the key store is unreachable; retry shortly",
                           code="store_unavailable", type="server_error",
                           headers={"Retry-After": "2"}) from None
        if info is None:
            raise ApiError(401, "invalid API key (unknown, mistyped or revoked)",
                           code="invalid_api_key")
        if info.project not in self.catalog.budgets:
            raise ApiError(403, f"this key's project {info.project!r} is not defined in the "
                           "cluster's projects", code="unknown_project")
        return Principal(info.project, info.id)

    async def reserve(self, principal: Principal, cost: float) -> Reservation:
        """Hold ``cost`` USD of the caller's budget until :meth:`record`; ApiError 429 when
        what the project has spent and requests in flight on every router sharing the
        store have reserved already reaches its budget."""
        project = principal.project
        budget = self.catalog.budgets.get(project) if project is not None else None
        if project is None or budget is None or self.store is None:
            return NOTHING
        try:
            admission = await self.store.reserve(project, budget, cost, RESERVATION_HOLD)
        except StoreError as exc:
            log.error("cannot reserve budget: %s", exc)
            raise ApiError(503, "the budget store is unreachable; retry shortly",
                           code="store_unavailable", type="server_error",
                           headers={"Retry-After": "2"}) from None
        if admission.id is None:
            raise ApiError(
                429,
                f"project {project!r} is over its budget: spent {_usd(admission.spent)} of "
                f"{_usd(budget)} (requests in flight hold {_usd(admission.reserved)} more); "
                "raise budget_usd in the cluster's projects to continue",
                code="insufficient_quota", type="insufficient_quota",
            )
        return Reservation(project, cost, admission.id)

    def record(self, row: UsageRow, reservation: Reservation | None = None) -> None:
        """Charge ``row`` to its project now; write it, and settle ``reservation``, at the
        next flush (in one transaction: see :meth:`Store.insert_usage`)."""
        if row.project is not None and row.cost_usd:
            self.spent[row.project] = self.spent.get(row.project, 0.0) + row.cost_usd
        if self.store is not None:
            self._rows.append(row)
            if reservation is not None and reservation.id is not None:
                self._settled.append(reservation.id)

    async def settle(self, reservation: Reservation, cost: float) -> None:
        """Shrink ``reservation`` to what its request cost, at once: the next request of
        the project is admitted against the real figure, not the estimate."""
        if reservation.id is None or self.store is None:
            return
        try:
            await self.store.settle_reservation(reservation.id, cost)
        except StoreError as exc:  # the estimate holds until the row is written: safe side
            log.warning("could not settle a reservation: %s", exc)

    async def flush(self) -> None:
        """Write buffered rows (one transaction), then reload spend from the store."""
        if self.store is None:
            return
        rows, self._rows = self._rows, []
        settled, self._settled = self._settled, []
        try:
            if rows or settled:
                await self.store.insert_usage(rows, settled)
            stored = await usages.spend_by_project(self.store)
        except StoreError as exc:
            # Keep them for the next flush: a locked disk or a lost database must not lose
            # spend (their reservations keep holding the budget meanwhile).
            self._rows[:0] = rows
            self._settled[:0] = settled
            log.error("could not write %d usage rows (will retry): %s", len(rows), exc)
            return
        # Rows recorded while this flush awaited are in memory only: keep them on top.
        pending: dict[str, float] = {}
        for row in self._rows:
            if row.project is not None and row.cost_usd:
                pending[row.project] = pending.get(row.project, 0.0) + row.cost_usd
        for project in set(stored) | set(pending):
            self.spent[project] = stored.get(project, 0.0) + pending.get(project, 0.0)

    async def start(self) -> None:
        """Load spend so far, then flush every ``flush_interval`` seconds."""
        if self._flusher is None and self.store is not None:
            try:
                self.spent = await usages.spend_by_project(self.store)
            except StoreError as exc:
                log.error("cannot load spend from the store yet: %s", exc)
            self._flusher = asyncio.get_running_loop().create_task(self._flush_forever())

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        await self.flush()

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval)
            await self.flush()


def _usd(amount: float) -> str:
    """Dollars to the cent, or to the micro-dollar below a cent (token prices are tiny)."""
    return f"${amount:,.2f}" if amount >= 0.01 or amount == 0 else f"${amount:.6f}"
