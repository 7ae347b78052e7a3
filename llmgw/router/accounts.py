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

Budgets are checked before a request is sent and charged after it answers:
requests in flight together can overshoot a budget by what they cost, never
more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

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


ANONYMOUS = Principal(None, None)
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

    def check_budget(self, principal: Principal) -> None:
        """ApiError 429 when the caller's project has spent its budget."""
        if principal.project is None:
            return
        budget = self.catalog.budgets.get(principal.project)
        if budget is None:
            return
        spent = self.spent.get(principal.project, 0.0)
        if spent >= budget:
            raise ApiError(
                429,
                f"project {principal.project!r} is over its budget: spent {_usd(spent)} of "
                f"{_usd(budget)}; raise budget_usd in the cluster's projects to continue",
                code="insufficient_quota", type="insufficient_quota",
            )

    def record(self, row: UsageRow) -> None:
        """Charge ``row`` to its project now; write it at the next flush."""
        if row.project is not None and row.cost_usd:
            self.spent[row.project] = self.spent.get(row.project, 0.0) + row.cost_usd
        if self.store is not None:
            self._rows.append(row)

    async def flush(self) -> None:
        """Write buffered rows (one transaction), then reload spend from the store."""
        if self.store is None:
            return
        rows, self._rows = self._rows, []
        try:
            if rows:
                await usages.insert(self.store, rows)
            stored = await usages.spend_by_project(self.store)
        except StoreError as exc:
            # Keep them for the next flush: a locked disk or a lost database must not lose
            # spend. In-memory spend goes on counting meanwhile.
            self._rows[:0] = rows
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
