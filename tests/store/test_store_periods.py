"""Budget periods in the store, on both stores (SQLite, real PostgreSQL).

What a project spent is the usage rows at or after the period's start (``since``), and
what is reserved counts only reservations taken in the period (``Owner.ts`` at or after
``since``). Times are plain numbers the test picks: the store never reads the clock for
them, so a period ends when the test says.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from llmgw.spec.models import StoreSettings
from llmgw.store import databases, migrations, spends, stores
from llmgw.store.reservations import Owner
from llmgw.store.stores import Store
from llmgw.store.usages import UsageRow

DAY = 86400.0
T0 = 1_780_000_000.0 - 1_780_000_000.0 % DAY  # a UTC midnight


def row(ts: float, cost: float, project: str = "research") -> UsageRow:
    return UsageRow(ts=ts, project=project, key_id="key000000001", model="chat",
                    endpoint="/v1/chat/completions", status=200, prompt_tokens=1,
                    completion_tokens=2, latency_ms=3.0, cost_usd=cost)


def owner(ts: float) -> Owner:
    return Owner("router-a", "key000000001", "chat", "/v1/chat/completions", ts=ts)


async def open_(settings: dict[str, str]) -> Store:
    return await stores.open_store(StoreSettings.model_validate(settings))


async def test_spend_counts_only_the_periods_rows_and_resets_at_its_start(
        store_settings: dict[str, str]) -> None:
    store = await open_(store_settings)
    try:
        # Yesterday, and today: one row on the boundary, one a microsecond before it, one
        # in an unaligned instant (not a quarter hour), another project's.
        await store.insert_usage([
            row(T0 - 3600, 4.0), row(T0 - 1e-6, 2.0), row(T0, 1.0), row(T0 + 1234.5678, 0.5),
            row(T0 + 60, 9.0, project="other")])
        lifetime = await store.spend_by_project()
        assert lifetime == {"research": pytest.approx(7.5), "other": pytest.approx(9.0)}
        today = await store.spend_by_project({"research": T0})
        assert today == {"research": pytest.approx(1.5), "other": pytest.approx(9.0)}
        # Any start is exact, aligned to the buckets or not.
        for since, expected in [(T0 - 1e-6, 3.5), (T0 + 1e-6, 0.5), (T0 + 1234.5678, 0.5),
                                (T0 + 1234.5679, 0.0), (T0 - 3600, 7.5), (T0 - 3599, 3.5),
                                (T0 + DAY, 0.0)]:
            spent = (await store.spend_by_project({"research": since}))["research"]
            assert spent == pytest.approx(expected), since

        # Admission: $5 a day. Today's $1.50 leaves room; yesterday's $6 does not count.
        admitted = await store.reserve("research", 5.0, 3.5, 60, owner(T0 + 2000), since=T0)
        assert admitted.id is not None and admitted.spent == pytest.approx(1.5)
        refused = await store.reserve("research", 5.0, 0.1, 60, owner(T0 + 2001), since=T0)
        assert refused.id is None and refused.reserved == pytest.approx(3.5)
        # Lifetime (no since): everything counts, the reservation too.
        lifetime_view = await store.reserve("research", 100.0, 1.0, 60, owner(T0 + 2002))
        assert lifetime_view.spent == pytest.approx(7.5)
        assert lifetime_view.reserved == pytest.approx(3.5)
        await store.release_reservations([lifetime_view.id or ""])

        # The next day: nothing spent, and today's reservation (still in flight) counts in
        # today, not tomorrow: the project is admitted again at once.
        tomorrow = await store.reserve("research", 5.0, 5.0, 60, owner(T0 + DAY),
                                       since=T0 + DAY)
        assert tomorrow.id is not None
        assert (tomorrow.spent, tomorrow.reserved) == (0.0, 0.0)
        # Today's request settles late (after midnight): its row carries its arrival, so
        # it bills today; tomorrow still holds only its own reservation.
        await store.insert_usage([row(T0 + 2000, 2.5)], [admitted.id or ""])
        assert (await store.spend_by_project({"research": T0}))["research"] == pytest.approx(4.0)
        assert (await store.spend_by_project({"research": T0 + DAY}))["research"] == 0.0
        full = await store.reserve("research", 5.0, 0.2, 60, owner(T0 + DAY + 1),
                                   since=T0 + DAY)
        assert full.id is None and full.reserved == pytest.approx(5.0)
    finally:
        await store.close()


async def test_a_released_reservation_bills_the_period_it_was_taken_in(
        store_settings: dict[str, str]) -> None:
    """A router dies with a request of yesterday in flight; the sweep after midnight
    bills what it recorded to yesterday (its request's arrival), not today."""
    store = await open_(store_settings)
    try:
        await store.beat("router-a", 60)
        held = await store.reserve("research", 5.0, 1.0, 60, owner(T0 - 10), since=T0 - DAY)
        assert held.id is not None
        await store.beat("router-a", 60, [_progress(held.id, 0.75)])
        (released,) = await store.release_reservations([held.id])
        assert released.id == held.id
        (billed,) = await store.recent_usage(1)
        assert billed.ts == T0 - 10 and billed.cost_usd == pytest.approx(0.75)
        assert (await store.spend_by_project({"research": T0}))["research"] == 0.0
        spent = await store.spend_by_project({"research": T0 - DAY})
        assert spent["research"] == pytest.approx(0.75)
    finally:
        await store.close()


async def test_two_stores_admit_exactly_up_to_the_budget_in_each_period(
        store_settings: dict[str, str]) -> None:
    """40 reservations of $1 race from two stores against $10 a day; then, with those ten
    still in flight, 40 more after midnight: ten again, none blocked by yesterday's."""
    first, second = await open_(store_settings), await open_(store_settings)
    try:
        for since in (T0, T0 + DAY):
            admissions = await asyncio.gather(*[
                (first if i % 2 else second).reserve("research", 10.0, 1.0, 60,
                                                     owner(since + i), since=since)
                for i in range(40)])
            assert len([a for a in admissions if a.id is not None]) == 10, since
    finally:
        await first.close()
        await second.close()


def test_bucket_and_edge_are_exact_at_every_boundary() -> None:
    for ts in [0.0, 900.0, 899.9999999, T0, T0 - 1e-6, T0 + 1e-6, 1e9 + 0.1, 1780001234.5678]:
        start = spends.bucket(ts)
        assert start % spends.BUCKET == 0 and start <= ts < start + spends.BUCKET, ts
        cut = spends.edge(ts)
        assert cut % spends.BUCKET == 0 and cut - spends.BUCKET < ts <= cut, ts


async def test_the_migration_fills_the_buckets_from_existing_rows(tmp_path: Path) -> None:
    """A file written before budget periods: its usage rows land in their buckets, so the
    first period spend after the upgrade is already right."""
    path = tmp_path / "llmgw.db"
    step = next(m for m in migrations.MIGRATIONS if m.title.startswith("budget periods"))
    with sqlite3.connect(path) as conn:
        for m in migrations.MIGRATIONS:
            if m.version >= step.version:
                break
            for statement in m.sqlite.split(";"):
                if statement.strip():
                    conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {step.version - 1}")
        conn.executemany(
            "INSERT INTO usage (ts, project, key_id, model, endpoint, status, prompt_tokens, "
            "completion_tokens, latency_ms, cost_usd, stream) VALUES (?, ?, 'k', 'chat', "
            "'/v1/completions', 200, 1, 1, 1.0, ?, 0)",
            [(T0 - 1e-6, "research", 2.0), (T0, "research", 1.0),
             (T0 + 1234.5678, "research", 0.5), (T0 + 60, None, 8.0)])
    assert databases.version(sqlite3.connect(path)) == step.version - 1
    store = await open_({"path": str(path)})
    try:
        spent = await store.spend_by_project({"research": T0})
        assert spent["research"] == pytest.approx(1.5)
        spent = await store.spend_by_project({"research": T0 - 1e-6})
        assert spent["research"] == pytest.approx(3.5)
    finally:
        await store.close()


def _progress(rid: str, used: float):  # type: ignore[no-untyped-def]
    from llmgw.store.reservations import Progress
    return Progress(rid, 10, 20, used)
