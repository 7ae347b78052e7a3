"""The store interface on both implementations: SQLite and a real PostgreSQL.

Every test here runs twice (fixture ``store_settings``), so the two stores
answer the same questions the same way.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import asyncpg
import pytest
from support import nodes

from llmgw.spec.models import ClusterSettings, StoreSettings
from llmgw.store import keys, migrations, stores, usages
from llmgw.store.stores import Store, StoreError
from llmgw.store.usages import UsageRow


async def open_(settings: dict[str, str]) -> Store:
    return await stores.open_store(StoreSettings.model_validate(settings))


def row(project: str | None = "research", cost: float = 0.5, key_id: str | None = None,
        ts: float = 1000.0) -> UsageRow:
    return UsageRow(ts=ts, project=project, key_id=key_id, model="chat",
                    endpoint="/v1/chat/completions", status=200, prompt_tokens=3,
                    completion_tokens=4, latency_ms=12.5, cost_usd=cost, stream=True)


async def test_keys_round_trip(store_settings: dict[str, str]) -> None:
    store = await open_(store_settings)
    try:
        created = await keys.create(store, "research", "ci", now=100.0)
        assert await keys.verify(store, created.secret) == created.info
        assert await keys.verify(store, created.secret[:-1] + "x") is None
        assert await keys.verify(store, "llmgw_000000000000_" + "a" * 43) is None
        (listed,) = await keys.list_all(store)
        assert (listed.id, listed.project, listed.name, listed.last_used_at) == (
            created.info.id, "research", "ci", None)
        await usages.insert(store, [row(key_id=created.info.id, ts=150.0)])
        assert (await keys.list_all(store))[0].last_used_at == 150.0
        revoked = await keys.revoke(store, created.info.id, now=200.0)
        assert revoked is not None and revoked.revoked_at == 200.0
        assert (await keys.revoke(store, created.info.id, now=300.0)).revoked_at == 200.0  # type: ignore[union-attr]
        assert await keys.verify(store, created.secret) is None
        assert await keys.revoke(store, "nosuchkey000") is None
    finally:
        await store.close()


async def test_usage_rows_and_spend(store_settings: dict[str, str]) -> None:
    store = await open_(store_settings)
    try:
        assert await store.is_empty()
        await usages.insert(store, [row(), row(cost=0.25), row("other", 1.0), row(None, 0.0)])
        assert await usages.spend_by_project(store) == {"research": 0.75, "other": 1.0}
        recent = await usages.recent(store, 2)
        assert [r.project for r in recent] == [None, "other"]
        assert recent[1] == row("other", 1.0)  # every field comes back as it went in
        page = await store.usage_after(0, 3)
        assert len(page) == 3 and await store.usage_after(page[-1][0], 10) != []
        assert not await store.is_empty()
    finally:
        await store.close()


async def test_lease_epochs_and_release(store_settings: dict[str, str]) -> None:
    store = await open_(store_settings)
    try:
        first = await store.acquire_lease("leader", "a", 30)
        assert first is not None and first.epoch == 1 and 0 < first.remaining <= 30
        assert await store.acquire_lease("leader", "b", 30) is None  # held by a
        renewed = await store.acquire_lease("leader", "a", 30)
        assert renewed is not None and renewed.epoch == 1  # same holder: same epoch
        assert (await store.lease("leader")).holder == "a"  # type: ignore[union-attr]
        await store.release_lease("leader", "b")  # not b's: nothing happens
        assert await store.acquire_lease("leader", "b", 30) is None
        await store.release_lease("leader", "a")
        assert await store.lease("leader") is None
        taken = await store.acquire_lease("leader", "b", 30)
        assert taken is not None and taken.epoch == 2  # a new holder: the fence moves
        assert await store.acquire_lease("leader", "a", 30) is None
    finally:
        await store.close()


async def test_an_expired_lease_is_taken(store_settings: dict[str, str]) -> None:
    store = await open_(store_settings)
    try:
        assert await store.acquire_lease("leader", "a", 1) is not None
        while await store.lease("leader") is not None:  # expires by the database's clock
            await asyncio.sleep(0.1)
        taken = await store.acquire_lease("leader", "b", 30)
        assert taken is not None and taken.epoch == 2
    finally:
        await store.close()


async def test_two_stores_on_one_database_share_keys(store_settings: dict[str, str]) -> None:
    first, second = await open_(store_settings), await open_(store_settings)
    try:
        created = await keys.create(first, "research")
        assert await keys.verify(second, created.secret) is not None
        await keys.revoke(second, created.info.id)
        assert await keys.verify(first, created.secret) is None
    finally:
        await first.close()
        await second.close()


async def test_a_newer_schema_is_refused(store_settings: dict[str, str]) -> None:
    store = await open_(store_settings)
    assert await store.schema_version() == migrations.LATEST
    await store.close()
    newer = migrations.LATEST + 1
    if "path" in store_settings:
        with sqlite3.connect(store_settings["path"]) as conn:
            conn.execute(f"PRAGMA user_version = {newer}")
    else:
        target = stores.target_of(store_settings["url"], "", store_settings["password_file"])
        conn = await asyncpg.connect(target.dsn)
        await conn.execute("UPDATE llmgw_schema SET version = $1", newer)
        await conn.close()
    with pytest.raises(migrations.SchemaTooNew, match=f"schema version {newer}, newer"):
        await open_(store_settings)


async def test_old_sqlite_files_are_migrated(tmp_path: Path) -> None:
    """A version-1 file (written before the lease existed) opens and keeps its keys."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(migrations.MIGRATIONS[0].sqlite)
        conn.execute("PRAGMA user_version = 1")
        conn.execute("INSERT INTO keys VALUES ('abcdefabcdef', 'x', 'research', '', 1, NULL)")
    store = await open_({"path": str(path)})
    try:
        assert await store.schema_version() == migrations.LATEST
        assert [k.id for k in await keys.list_all(store)] == ["abcdefabcdef"]
        assert await store.acquire_lease("leader", "a", 5) is not None
    finally:
        await store.close()


async def test_a_slow_sqlite_call_does_not_block_the_loop(tmp_path: Path) -> None:
    """While another process holds the write lock, the store's call waits on its thread."""
    path = tmp_path / "llmgw.db"
    store = await open_({"path": str(path)})
    blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        pending = asyncio.ensure_future(usages.insert(store, [row()]))
        ticks = 0
        for _ in range(20):  # the loop keeps turning while the insert waits for the lock
            await asyncio.sleep(0.01)
            ticks += 1
        assert ticks == 20 and not pending.done()
        blocker.execute("COMMIT")
        await pending
        assert await usages.spend_by_project(store) == {"research": 0.5}
    finally:
        blocker.close()
        await store.close()


async def test_unreachable_postgres_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="cannot connect to the store"):
        await open_({"url": f"postgresql://llmgw@127.0.0.1:{nodes.free_port()}/llmgw"})


@pytest.mark.parametrize(("url", "error"), [
    ("postgresql://llmgw:hunter2@db/llmgw", "must not hold a password"),
    ("mysql://db/llmgw", "should match pattern"),
    ("postgresql://db/llmgw\nx", "should match pattern"),
])
def test_bad_urls_are_refused_by_the_spec(url: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        ClusterSettings.model_validate({"name": "lab", "store": {"url": url}})


def test_the_password_comes_from_its_file(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("p@ss:/word\n")
    target = stores.target_of("postgresql://llmgw@db:5432/llmgw", "", str(secret))
    assert target.display == "postgresql://llmgw@db:5432/llmgw"
    assert target.dsn == "postgresql://llmgw:p%40ss%3A%2Fword@db:5432/llmgw"
    with pytest.raises(ValueError, match="cannot read store.password_file"):
        stores.target_of("postgresql://llmgw@db/llmgw", "", str(tmp_path / "missing"))


async def test_reservations_admit_exactly_up_to_the_budget_across_stores(
        store_settings: dict[str, str]) -> None:
    """Two routers' stores race 40 reservations of $1 against a $10 budget: exactly ten
    get in (each admitted while spent + reserved < budget), whoever wins the races."""
    first, second = await open_(store_settings), await open_(store_settings)
    try:
        admissions = await asyncio.gather(*[
            (first if i % 2 else second).reserve("research", 10.0, 1.0, 60) for i in range(40)])
        admitted = [a for a in admissions if a.id is not None]
        assert len(admitted) == 10
        refused = [a for a in admissions if a.id is None]
        assert all(a.spent + a.reserved >= 10.0 for a in refused)
        # Settling with the usage rows moves the cost from reserved to spent, all at once.
        await first.settle_reservation(admitted[0].id or "", 0.25)
        await first.insert_usage([row(cost=0.25)], [admitted[0].id or ""])
        assert (await first.spend_by_project())["research"] == 0.25
        again = await second.reserve("research", 10.0, 1.0, 60)
        assert again.id is not None and again.spent == 0.25 and again.reserved == 9.0
    finally:
        await first.close()
        await second.close()


async def test_settling_holds_the_cost_not_the_estimate(store_settings: dict[str, str]) -> None:
    """A request that ended holds what it cost until its row is written, not its estimate."""
    store = await open_(store_settings)
    try:
        first = await store.reserve("research", 1.0, 0.4, 60)
        await store.reserve("research", 1.0, 0.4, 60)
        await store.settle_reservation(first.id or "", 0.1)
        assert (await store.reserve("research", 1.0, 0.0, 60)).reserved == pytest.approx(0.5)
    finally:
        await store.close()


async def test_settling_a_batch_holds_each_ones_cost(store_settings: dict[str, str]) -> None:
    """settle_reservations (one round trip) shrinks every reservation it names to its own
    cost, as settle_reservation one at a time would, and leaves the others alone."""
    store = await open_(store_settings)
    try:
        held = [await store.reserve("research", 10.0, 1.0, 60) for _ in range(3)]
        await store.settle_reservations([(held[0].id or "", 0.25), (held[1].id or "", 0.5)])
        # 0.25 + 0.5 + the untouched 1.0
        assert (await store.reserve("research", 10.0, 0.0, 60)).reserved == pytest.approx(1.75)
    finally:
        await store.close()


async def test_a_dead_routers_reservation_lapses(store_settings: dict[str, str]) -> None:
    store = await open_(store_settings)
    try:
        held = await store.reserve("research", 1.0, 5.0, 1)  # more than the whole budget
        assert held.id is not None
        assert (await store.reserve("research", 1.0, 0.1, 60)).id is None
        while (await store.reserve("research", 1.0, 0.1, 60)).id is None:
            await asyncio.sleep(0.1)  # lapses by the database's clock, nobody settles it
    finally:
        await store.close()


@pytest.mark.parametrize(("url", "path"), [
    ("sqlite:state/llmgw.db", "state/llmgw.db"),
    ("sqlite:///srv/llmgw/llmgw.db", "/srv/llmgw/llmgw.db"),
])
def test_sqlite_urls_name_a_file(url: str, path: str) -> None:
    StoreSettings(url=url)  # the spec accepts both spellings
    target = stores.target_of(url, "ignored.db")
    assert target.kind == "sqlite" and target.path == Path(path)
