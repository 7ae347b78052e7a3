"""Who is asking and who pays: API key checks, budgets, and usage rows.

:class:`Accounts` authenticates a request's ``Authorization: Bearer`` key
against the store (one primary-key probe, constant-time digest compare; see
:mod:`llmgw.store.keys`), refuses projects at or over their budget, and
records one usage row per request. Spend per project is loaded from the store
once and then kept in memory, so the budget check reads no database. Rows are
buffered and written in one transaction every ``flush_interval`` seconds (and
on close), so a request never waits on a disk write.

Budgets are checked before a request is sent and charged after it answers:
requests in flight together can overshoot a budget by what they cost, never
more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from dataclasses import dataclass

from llmgw.router.catalogs import Catalog
from llmgw.router.errors import ApiError
from llmgw.store import keys, usages
from llmgw.store.usages import UsageRow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Principal:
    project: str | None  # None under `auth: none`
    key_id: str | None
    user: str | None = None  # a logged-in person (a page's request), not a key


ANONYMOUS = Principal(None, None)
_HOW_TO = "send `Authorization: Bearer <key>`; an operator creates keys with `llmgw keys create`"


class Accounts:
    def __init__(
        self, store: sqlite3.Connection | None, catalog: Catalog, flush_interval: float = 1.0
    ) -> None:
        if store is None and catalog.auth != "none":
            raise ValueError("auth: keys needs a store to check keys against")
        self.store = store
        self.catalog = catalog
        self.flush_interval = flush_interval
        self.spent: dict[str, float] = usages.spend_by_project(store) if store else {}
        self._rows: list[UsageRow] = []
        self._flusher: asyncio.Task[None] | None = None

    def authenticate(self, authorization: str | None) -> Principal:
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
        info = keys.verify(self.store, token.strip())
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

    def flush(self) -> None:
        """Write buffered rows (one transaction)."""
        rows, self._rows = self._rows, []
        if rows and self.store is not None:
            try:
                usages.insert(self.store, rows)
            except sqlite3.Error:
                # Keep them for the next flush: a locked or full disk must not lose spend.
                self._rows[:0] = rows
                log.exception("could not write %d usage rows; will retry", len(rows))

    def start(self) -> None:
        if self._flusher is None and self.store is not None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_forever())

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        self.flush()

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval)
            self.flush()


def _usd(amount: float) -> str:
    """Dollars to the cent, or to the micro-dollar below a cent (token prices are tiny)."""
    return f"${amount:,.2f}" if amount >= 0.01 or amount == 0 else f"${amount:.6f}"
